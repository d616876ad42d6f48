// fsdp-cpp: the ledger — the FSDP guide's terms measured on this rank, and the
// planner's prediction for the same run.
//
// defines: FullyShardedModel::ledger, Ledger::str
//
// P, G and O are read from the units' tensors and the optimizer's state
// (what each optimizer keeps: optim/optimizer_state.h); A, A_recompute and
// the peak from the allocator of the job's device (memory_source.h); C from
// the kept background save. The prediction is the planner's
// (plan::make_plan, the one place a peak is computed) for this run's units,
// strategy, dtypes and prefetch, given the measured O, A and A_recompute.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "fsdp/memory.h"
#include "fsdp/plan.h"
#include "optim/optimizer_state.h"
#include "unit/engine.h"

namespace fsdp {

namespace {

int64_t tensor_bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

// What the planner is asked for this run: its strategy over the shard group
// (HYBRID: S of N), the dtypes, the units gathered ahead, and the terms
// measured here that a plan otherwise estimates (O, A, a background save).
plan::PlanOptions plan_options(const detail::Engine& e, const Ledger& l) {
  const FsdpOptions& o = e.opts;
  plan::PlanOptions po;
  po.world = e.world();
  po.strategy = o.strategy;
  if (is_hybrid(o.strategy)) po.shard_group = e.shard_world();
  const torch::ScalarType pd = o.mixed_precision.param_dtype.value_or(torch::kFloat32);
  po.param_bytes = static_cast<int>(c10::elementSize(pd));
  po.reduce_bytes = static_cast<int>(c10::elementSize(o.mixed_precision.reduce_dtype.value_or(pd)));
  // limit_all_gathers units unsharded at once, the computing one included.
  const bool prefetch = o.forward_prefetch || o.backward_prefetch != BackwardPrefetch::NONE;
  po.prefetch = prefetch ? o.limit_all_gathers - 1 : 0;
  po.optimizer_state_bytes = l.O;
  // What the run does, not what it might: its units share the host's memory or not.
  po.share_host = false;
  for (auto& u : e.units) po.share_host = po.share_host || u->host_shared;
  po.async_checkpoint = l.C > 0;
  // Micro-steps under no_sync: every unit's unsharded gradient is held
  // through the last one's backward. (How many micro-steps a step has only
  // changes the traffic, which the ledger does not plan.)
  if (e.accumulated_no_sync) {
    po.no_sync = true;
    po.micro_steps = 2;
  }
  // Its hosts, when they are of equal size (the tiers; the planner's shape).
  if (!is_hybrid(o.strategy) && l.host_ranks > 0 && e.world() % l.host_ranks == 0)
    po.hosts = e.world() / l.host_ranks;
  return po;
}

}  // namespace

Ledger FullyShardedModel::ledger(const torch::optim::Optimizer* opt) const {
  engine_->wait_pending();
  Ledger l;
  l.world_size = engine_->world();
  l.strategy = to_string(engine_->opts.strategy);
  for (auto& u : engine_->units) {
    l.total_numel += u->numel;
    l.P_full += u->numel * 4;
    l.P += tensor_bytes(u->shard);
    if (u->keeps_unsharded && !u->full_is_shard) l.P += tensor_bytes(u->full);
    l.G += tensor_bytes(u->shard_grad);
    if (u->host_shared) l.shared_per_host += tensor_bytes(u->full);
    const int64_t block = u->padded_numel * static_cast<int64_t>(c10::elementSize(u->param_dtype));
    if (block > l.P_block) {
      l.P_block = block;
      l.P_block_unit = u->display_name();
    }
    if (opt)
      for (auto& s : u->params()) l.O += detail::optimizer_state_bytes(*opt, s.shard_view);
  }
  l.A = engine_->activation_bytes;
  l.A_recompute = engine_->recompute_bytes;
  l.C = engine_->snapshot_bytes;
  const detail::MemoryReading ms = engine_->memory_source->read();
  l.memory_source = engine_->memory_source->name();
  l.peak = ms.peak;
  l.current = ms.current;
  l.cached = ms.cached;
  l.process = memory::process_memory();
  l.rss_peak = l.process.vmhwm;
  const CommCounters sent = engine_->comm->counters();
  l.sent_intra_host = sent.total_bytes_intra_host();
  l.sent_inter_host = sent.total_bytes_inter_host();
  l.shard_group_size = engine_->shard_world();
  l.peer_memory = engine_->shard_comm->peer_memory_bytes();  // the units' communicator's (HYBRID: S ranks)
  {
    const std::vector<int> host = engine_->shard_comm->hosts();  // the units' communicator's (HYBRID: S ranks)
    const int mine = host.at(engine_->shard_comm->rank());
    l.host_ranks = static_cast<int>(std::count(host.begin(), host.end(), mine));
  }
  // The planner's formulas with this run's units and the terms measured
  // above: one formula for the peak, whether asked before a run (fsdp plan)
  // or during it (here). A recompute's activations come on top of what
  // forward kept. A measurement that cannot be is said, and planned as 0:
  // the run it measures is not failed for it.
  if (l.A < 0)
    l.notes.push_back("A measured " + memory::format_bytes(l.A) + " (" + std::to_string(l.A) +
                      " bytes): the root forward ended holding less than it began with, so something beside "
                      "training freed memory meanwhile (on a GPU: a background save's device copies); the "
                      "plan below counts A as 0");
  if (l.A_recompute < 0)
    l.notes.push_back("A_recompute measured " + memory::format_bytes(l.A_recompute) + "; the plan counts it as 0");
  const int64_t A = std::max<int64_t>(0, l.A);
  plan::Recompute recompute;
  if (l.A_recompute > 0) recompute.activation_bytes = A + l.A_recompute;
  try {
    const plan::Plan p = plan::make_plan(plan::units_from(units()), A, plan_options(*engine_, l), 0, recompute);
    l.predicted_rest = p.rest;
    l.predicted_peak = p.peak;
  } catch (const std::exception& e) {
    l.notes.push_back(std::string("no prediction: the planner refused this run's terms: ") + e.what());
  }
  trace::set_metadata("ledger", {{"P_full", l.P_full}, {"P", l.P}, {"G", l.G}, {"O", l.O}, {"P_block", l.P_block},
                                 {"P_block_unit", l.P_block_unit}, {"A", l.A}, {"A_recompute", l.A_recompute}, {"C", l.C},
                                 {"predicted_rest", l.predicted_rest}, {"shared_per_host", l.shared_per_host},
                                 {"peer_memory", l.peer_memory},
                                 {"predicted_peak", l.predicted_peak}, {"notes", l.notes}});
  // What the optimizer keeps per parameter, by the optimizer table: the
  // report's shard map draws O with it.
  if (opt) {
    const detail::OptimizerKind* k = detail::kind_of(*opt);
    const double per_param = detail::state_tensors_per_param(*opt);
    trace::set_metadata("optimizer", k ? k->type : "other");
    if (per_param >= 0) trace::set_metadata("optimizer_state_per_param", per_param);
  }
  if (l.process.at_start > 0) {
    const memory::ProcessMemory& m = l.process;
    trace::set_metadata("process_memory", {{"vmhwm", m.vmhwm}, {"at_start", m.at_start}, {"code_since", m.code_since},
                                           {"tensors", m.tensors}, {"comm", m.comm}, {"cache", m.cache},
                                           {"malloc_used", m.malloc_other}, {"malloc_free", m.malloc_free},
                                           {"unexplained", m.unexplained}, {"sample", m.sample},
                                           {"elsewhere", m.elsewhere}, {"comm_high", m.comm_high},
                                           {"shared", m.shared}, {"pss", m.pss}});
  }
  return l;
}

std::string Ledger::str() const {
  using memory::format_bytes;
  std::ostringstream os;
  auto row = [&](const std::string& k, int64_t v, const std::string& note) {
    os << "  " << std::left << std::setw(10) << k << std::right << std::setw(14) << format_bytes(v) << "   "
       << note << "\n";
  };
  os << "ledger (this rank, " << strategy << ", N=" << world_size
     << (shard_group_size > 0 && shard_group_size < world_size ? ", shard group S=" + std::to_string(shard_group_size)
                                                               : std::string())
     << ", " << total_numel << " params)\n";
  row("P_full", P_full, "unsharded parameters (fp32)");
  row("P", P, "parameters resident here (shards; replicas for NO_SHARD)");
  row("G", G, "gradients resident here");
  row("O", O, "optimizer state here");
  // HYBRID shards over its group: the guide's divisor is S there.
  const std::string div = shard_group_size > 0 && shard_group_size < world_size ? "S" : "N";
  row("P+G+O", P + G + O, "model state at rest  | guide: (P+G+O)/" + div + " = " + format_bytes(predicted_rest));
  if (shared_per_host > 0)
    row("shared", shared_per_host,
        "host-shared units: every unit's parameters once per host, mapped by its " + std::to_string(host_ranks) +
            " ranks (this rank's share " + format_bytes(shared_per_host / std::max(1, host_ranks)) +
            "; not in the allocator's peak)");
  if (peer_memory > 0)
    row("peer_mem", peer_memory,
        "host-shared units: this rank's blocks its peers read the gradients from, kept for the next backward "
        "(not in the allocator's peak)");
  row("P_block", P_block, "largest unit unsharded: '" + P_block_unit + "'");
  row("A", A, "activations of the last forward (measured)");
  if (A_recompute > 0) row("A_recomp", A_recompute, "activations of one recompute in backward (activation checkpointing)");
  if (C > 0) row("C", C, "snapshot of the last background checkpoint save, held while it writes");
  row("peak", peak, "measured peak (" + memory_source + ") | planned: (P+G+O)/" + div + " + the units gathered then + A" +
                        (A_recompute > 0 ? " + A_recomp" : "") + (C > 0 ? " + C" : "") + " = " +
                        format_bytes(predicted_peak));
  row("cached", cached, "freed blocks the allocator keeps for reuse (not in the terms above)");
  if (rss_peak > 0 && process.at_start > 0)
    row("VmHWM", rss_peak,
        "the process's resident high-water mark: " + format_bytes(process.at_start) + " at start (libtorch), " +
            format_bytes(process.tensors + process.comm + process.cache) + " allocator (tensors, comm, cache), " +
            format_bytes(process.fixed() - process.at_start) + " else");
  else if (rss_peak > 0)
    row("VmHWM", rss_peak, "the process's resident high-water mark (libraries, cache included)");
  row("sent", sent_intra_host + sent_inter_host,
      "bytes sent so far by tier: intra-host " + format_bytes(sent_intra_host) + ", inter-host " +
          format_bytes(sent_inter_host));
  for (const std::string& n : notes) os << "  note: " << n << "\n";
  return os.str();
}

}  // namespace fsdp
