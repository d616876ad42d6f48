// fsdp-cpp: how the records of include/fsdp/watchdog.h travel through the
// store: the heartbeat and verdict as JSON (their to_json/parse), the last
// collective a rank entered as one line.
// defines: format_entered, parse_entered
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/watchdog.h"

namespace fsdp::comm {

// "seq|wall|step|phase|what", the value of a seq/<r> key (written as a
// collective is entered: this process's step and phase now), and back
// (`comm`: the communicator the key belongs to).
std::string format_entered(uint64_t seq, const std::string& what);
std::optional<watchdog::Entered> parse_entered(const std::string& value, int comm);

}  // namespace fsdp::comm
