// fsdp-cpp: out-of-memory diagnosis — which term of the FSDP guide's ledger
// overflowed the per-rank budget (fsdp::memory::set_limit, --max-memory).
//
// The counting allocator calls the explainer when an allocation would pass
// the limit. The engine labels its own big allocations (the all-gather output
// of a unit, its unsharded gradients), so the message can say what was being
// allocated; everything else in a forward or backward is activations and
// temporaries. No allocation happens here beyond the message itself.
#include <sstream>

#include "fsdp/memory.h"
#include "unit/engine.h"

namespace fsdp::detail {

thread_local const char* g_alloc_purpose = nullptr;
thread_local const Unit* g_alloc_unit = nullptr;

std::string explain_oom(const Engine& st, int64_t requested, const memory::Stats& s) {
  using memory::format_bytes;
  int64_t shards = 0, grads = 0, unsharded = 0, unsharded_grads = 0;
  const Unit* biggest = nullptr;
  std::string gathered;
  // Only what the allocator holds: `other` is its current minus these, and
  // a host-shared unit's `full` (with, in fp32, the shard in it) and its
  // gradients written in peer memory lie in memfds, not in the allocator.
  for (auto& u : st.units) {
    const bool shard_in_full = u->host_shared && u->param_dtype == torch::kFloat32;
    shards += u->shard.defined() && !shard_in_full ? u->shard.numel() * 4 : 0;
    grads += u->shard_grad.defined() ? u->shard_grad.numel() * 4 : 0;
    if (!u->keeps_unsharded && u->state() != UnitState::SHARDED) {
      if (!u->host_shared) unsharded += u->padded_numel * static_cast<int64_t>(c10::elementSize(u->param_dtype));
      gathered += (gathered.empty() ? "'" : ", '") + u->display_name() + "'";
    }
    if (u->full_grad.defined() && !u->grads_in_peer_memory)
      unsharded_grads += u->full_grad.numel() * u->full_grad.element_size();
    if (!biggest || u->padded_numel > biggest->padded_numel) biggest = u.get();
  }
  const int64_t other = s.current - shards - grads - unsharded - unsharded_grads;
  std::ostringstream os;
  os << "FSDP ledger on rank " << st.rank() << " of " << st.world() << " ("
     << to_string(st.opts.strategy) << ") at the failure:\n";
  const bool sharded = st.opts.strategy != ShardingStrategy::NO_SHARD;
  os << (sharded ? "  resident shards P/N + G/N      " : "  resident replicas P + G (NO_SHARD: nothing is sharded)  ")
     << format_bytes(shards + grads) << "\n";
  os << "  unsharded units (P_block)      " << format_bytes(unsharded)
     << (gathered.empty() ? "" : "  [" + gathered + "]") << "\n";
  os << "  unsharded gradients            " << format_bytes(unsharded_grads) << "\n";
  os << (sharded ? "  optimizer state O/N" : "  optimizer state O") << " + activations A + temporaries  " << format_bytes(other)
     << "\n";
  std::string term;
  if (g_alloc_purpose && g_alloc_unit) {
    os << "  failed allocation: " << format_bytes(requested) << " for the " << g_alloc_purpose << " of unit '"
       << g_alloc_unit->display_name() << "' (P_block)\n";
    term = "P_block";
  } else if (st.depth > 0 || st.callback_queued) {
    os << "  failed allocation: " << format_bytes(requested) << " inside a "
       << (st.callback_queued ? "backward" : "forward") << " pass: activations A / temporaries\n";
    term = "A";
  } else {
    os << "  failed allocation: " << format_bytes(requested) << " outside forward and backward (e.g. the "
       << "optimizer creating its state O, or the resident shards)\n";
    term = "O";
  }
  os << "Remedies (the FSDP guide's): ";
  if (term == "P_block")
    os << "wrap finer so the largest unit ('" << (biggest ? biggest->display_name() : std::string()) << "', "
       << format_bytes(biggest ? biggest->padded_numel * static_cast<int64_t>(c10::elementSize(biggest->param_dtype)) : 0)
       << " unsharded) is smaller; use bf16 parameters (halves P_block); lower limit_all_gathers / turn off prefetch";
  else if (term == "A")
    os << "a smaller batch or sequence (activations scale with them); bf16 compute; finer wrapping frees "
          "parameters sooner";
  else if (!sharded && st.world() > 1)
    os << "FULL_SHARD: it shards parameters, gradients and optimizer state, (P+G+O)/N, so the "
       << format_bytes(shards + grads) << " of P + G held here become about "
       << format_bytes((shards + grads) / st.world()) << " and O shrinks the same way (Adam keeps 2 values per "
       << "parameter); more ranks; SGD instead of Adam halves O";
  else
    os << "FULL_SHARD (shards parameters, gradients and optimizer state: (P+G+O)/N); more ranks; SGD instead of "
          "Adam halves O";
  if (st.opts.strategy != ShardingStrategy::FULL_SHARD && term != "O") os << "; switch to FULL_SHARD";
  os << ". `fsdp plan` predicts each term for a given budget.";
  return os.str();
}

}  // namespace fsdp::detail
