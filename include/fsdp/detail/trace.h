// fsdp-cpp, implementation detail of fsdp/trace.h: the flag
// trace::enabled() reads inline. Not public API: include fsdp/trace.h
// instead.
//
// defines: trace::detail::g_enabled
#pragma once

#include <atomic>

namespace fsdp::trace::detail {

// Whether a trace is recording (set by trace::start and trace::stop).
extern std::atomic<bool> g_enabled;

}  // namespace fsdp::trace::detail
