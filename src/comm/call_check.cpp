// fsdp-cpp: the FSDP_DEBUG=detail call check (see call_check.h).
#include "comm/call_check.h"

#include <cstring>
#include <vector>

#include "comm/mesh.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

// One rank's call as exchanged by the detail check: fixed layout, same host
// architecture on every rank (Gloo moves raw bytes).
struct CallRecord {
  uint64_t seq;
  int32_t kind, dtype, root, reduce_op;
  int64_t numel;
  char label[47];     // truncated, NUL-terminated
  uint8_t lossy;      // CallShape::compressible: the ranks must agree, or one
                      // would send quantized bytes another reads as exact
};
static_assert(sizeof(CallRecord) == 80, "CallRecord must have no hidden padding");

CallRecord record_of(const CallShape& s, uint64_t seq) {
  CallRecord r;
  std::memset(&r, 0, sizeof r);
  r.seq = seq;
  r.kind = static_cast<int32_t>(s.kind);
  r.dtype = static_cast<int32_t>(s.dtype);
  r.root = s.root;
  r.reduce_op = s.reduce_op;
  r.numel = s.numel;
  r.lossy = s.compressible ? 1 : 0;
  std::strncpy(r.label, s.label.c_str(), sizeof r.label - 1);
  return r;
}

bool same_call(const CallRecord& a, const CallRecord& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.numel == b.numel && a.root == b.root &&
         a.reduce_op == b.reduce_op && a.lossy == b.lossy;
}

std::string describe_record(const CallRecord& r) {
  if (r.kind < 0 || r.kind >= static_cast<int>(CollectiveKind::kCount)) return detail::cat("kind ", r.kind, "?");
  auto kind = static_cast<CollectiveKind>(r.kind);
  std::string out = detail::cat(to_string(kind), " '", r.label, "' #", r.seq);
  if (kind == CollectiveKind::BARRIER) return out;
  out += detail::cat(" (", dtype_name(static_cast<c10::ScalarType>(r.dtype)), ", ", r.numel, " elements");
  if (r.reduce_op >= 0) out += r.reduce_op == static_cast<int>(ReduceOp::SUM) ? ", SUM" : ", AVG";
  if (r.root >= 0) out += detail::cat(", root ", r.root);
  if (r.lossy) out += ", compressible";
  return out + ")";
}

}  // namespace

void check_same_call(const Wire& w, const CallShape& shape, const Naming& names) {
  const int n = w.mesh->size;
  std::vector<CallRecord> all(n);
  all[w.mesh->rank] = record_of(shape, w.seq);
  std::vector<int64_t> offset(n), count(n, sizeof(CallRecord));
  for (int j = 0; j < n; ++j) offset[j] = j * static_cast<int64_t>(sizeof(CallRecord));
  ring_all_gather(w, all.data(), offset, count, slots::kCallCheck);
  bool same = true;
  for (int q = 1; q < n; ++q) same &= same_call(all[q], all[0]);
  if (same) return;
  std::string msg = detail::cat("FSDP_DEBUG=detail: ranks issued different collectives at #", w.seq, " in a ",
                                names.group.empty() ? "world" : "group", " of ", n, " (", names.describe, "):");
  for (int q = 0; q < n; ++q)
    msg += detail::cat("\n  ", names.name_of(q), ": ", describe_record(all[q]),
                       same_call(all[q], all[0]) ? "" : "   <-- differs from rank 0");
  msg += "\nExpected every rank to issue the same kind, dtype, element count, root, reduce op and "
         "compressible mark at each sequence number. What to do: find where the differing rank's code path diverges "
         "(a rank-dependent branch, an uneven shard size, a skipped unit) and make every rank issue "
         "the same collectives in the same order.";
  throw CallMismatch(msg);
}

}  // namespace fsdp::comm
