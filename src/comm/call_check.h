// fsdp-cpp: FSDP_DEBUG=detail — every rank learns every rank's call before
// any byte of it moves.
// defines: CallMismatch, check_same_call
//
// Before each collective the ranks all-gather a fixed-size record of the
// call (kind, dtype, element count, root, reduce op, label, compressible mark) on the
// collective's own slots (slots::kCallCheck, so it can never match a
// message of the collective itself). A difference becomes one
// CollectiveError on every rank (they all see the same records) listing
// each rank's call, instead of a hang or a silently wrong sum. Costs one
// ring all-gather of 80 bytes per rank.
#pragma once

#include "comm/checks.h"
#include "comm/diagnosis.h"
#include "comm/ring.h"
#include "fsdp/comm.h"

namespace fsdp::comm {

// Thrown by check_same_call; already the final message (no diagnosis).
class CallMismatch : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// Collective over the communicator `w` runs on (its own mesh): throws
// CallMismatch on every rank when the ranks' calls at w.seq differ.
void check_same_call(const Wire& w, const CallShape& shape, const Naming& names);

}  // namespace fsdp::comm
