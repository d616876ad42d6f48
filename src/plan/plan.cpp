// fsdp-cpp: the planner's formulas (see include/fsdp/plan.h for the ledger).
#include "fsdp/plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "plan/names.h"
#include "common/collective_path.h"
#include "common/optimizer_table.h"
#include "common/ring_math.h"
#include "common/shard_math.h"
#include "common/traffic_math.h"

namespace fsdp::plan {

std::vector<UnitSpec> units_from(const std::vector<UnitInfo>& infos) {
  std::vector<UnitSpec> out;
  for (auto& u : infos) out.push_back({u.name, u.numel});
  return out;
}

std::string to_string(const Optimizer& o) {
  std::string s = o.type;
  if (o.type == "sgd") return o.momentum ? "sgd-momentum" : "sgd-plain";
  if (o.type == "rmsprop" && o.momentum) s += "-momentum";
  if (o.type == "rmsprop" && o.centered) s += "-centered";
  if ((o.type == "adam" || o.type == "adamw") && o.amsgrad) s += "-amsgrad";
  return s;
}

Optimizer parse_optimizer(const std::string& t) {
  const char* expected = "adam|adamw[-amsgrad], sgd|sgd-momentum|sgd-plain, adagrad, rmsprop[-momentum][-centered]";
  // The kind first, then its options as suffixes.
  const size_t dash = t.find('-');
  Optimizer o;
  o.type = t.substr(0, dash);
  std::string rest = dash == std::string::npos ? "" : t.substr(dash);
  const optim_table::Row* row = optim_table::find(o.type);
  if (row && !row->per_parameter)
    throw Error("--optimizer: '" + t + "' (" + row->cls + ") keeps one state for the whole model, not a state per "
                "parameter, so no plan can shard or size it; expected " + expected);
  if (!row) throw Error("--optimizer: expected " + std::string(expected) + ", found '" + t + "'");
  o.momentum = o.type == "sgd";  // SGD: with momentum unless -plain; RMSprop: without unless -momentum
  auto take = [&](const char* suffix) {
    const std::string s = suffix;
    if (rest.compare(0, s.size(), s) != 0) return false;
    rest = rest.substr(s.size());
    return true;
  };
  if (o.type == "sgd") {
    if (take("-plain")) o.momentum = false;
    else take("-momentum");
  } else if (o.type == "adam" || o.type == "adamw") {
    o.amsgrad = take("-amsgrad");
  } else if (o.type == "rmsprop") {
    o.momentum = take("-momentum");
    o.centered = take("-centered");
  }
  if (!rest.empty()) throw Error("--optimizer: expected " + std::string(expected) + ", found '" + t + "'");
  return o;
}

int state_per_param(const Optimizer& o) {
  const optim_table::Row* row = optim_table::find(o.type);
  FSDP_USER_CHECK(row != nullptr && row->per_parameter, "plan: optimizer '", o.type,
                  "' is not a kind of the optimizer table with a state per parameter (sgd, adam, adamw, adagrad, "
                  "rmsprop)");
  optim_table::Settings s;
  s.momentum = o.momentum;
  s.amsgrad = o.amsgrad;
  s.centered = o.centered;
  return static_cast<int>(row->held(s).size());
}

void PlanOptions::validate() const {
  FSDP_USER_CHECK(world >= 1, "plan: --world must be >= 1, found ", world);
  FSDP_USER_CHECK(param_bytes == 2 || param_bytes == 4, "plan: param dtype bytes must be 2 (bf16) or 4 (fp32), found ",
                  param_bytes);
  FSDP_USER_CHECK(reduce_bytes == 0 || reduce_bytes == 2 || reduce_bytes == 4,
                  "plan: reduce dtype bytes must be 2 or 4, found ", reduce_bytes);
  FSDP_USER_CHECK(micro_steps >= 1, "plan: micro_steps must be >= 1, found ", micro_steps);
  FSDP_USER_CHECK(prefetch >= 0, "plan: prefetch must be >= 0, found ", prefetch);
  FSDP_USER_CHECK(optimizer_state_bytes >= -1, "plan: optimizer_state_bytes must be >= 0 (or -1: from the optimizer), found ",
                  optimizer_state_bytes);
  FSDP_USER_CHECK(bandwidth >= 0, "plan: bandwidth must be >= 0, found ", bandwidth);
  FSDP_USER_CHECK(intra_bandwidth >= 0 && inter_bandwidth >= 0, "plan: --intra-bw and --inter-bw must be >= 0");
  FSDP_USER_CHECK(hosts >= 1 && world % hosts == 0, "plan: --hosts must divide --world (every host runs the same "
                  "number of ranks); found ", hosts, " hosts for a world of ", world);
  FSDP_USER_CHECK(shard_group >= 0 && (shard_group == 0 || world % shard_group == 0),
                  "plan: --shard-group must divide --world; found ", shard_group, " for a world of ", world);
  FSDP_USER_CHECK(compress == "off" || compress == "int8" || compress == "int4" || compress == "fp8",
                  "plan: --compress: expected off, int8, int4 or fp8 (FSDP_COMPRESS's values), found '", compress,
                  "'");
  FSDP_USER_CHECK(quant_seconds_per_element >= 0, "plan: the seconds per quantized element must be >= 0 (0: ",
                  "the measured default), found ", quant_seconds_per_element);
}

Traffic traffic(ShardingStrategy s, int64_t padded, const PlanOptions& o) {
  // Integer math on the padded numel keeps the numbers exact (common/traffic_math.h).
  const traffic::Bytes b = traffic::per_step(s, padded, o.world, is_hybrid(s) ? o.group() : o.world, o.micro_steps,
                                             o.param_bytes, o.reduce(), o.no_sync ? 1 : -1);
  Traffic t;
  t.all_gather = b.all_gather;
  t.reduce_scatter = b.reduce_scatter;
  t.all_reduce = b.all_reduce;
  return t;
}

// The reduce-scatter ring's staging (src/comm/ring.cpp), cut as the ring
// cuts it (common/ring_math.h) at the default piece size: the largest over
// the units.
static int64_t ring_staging_bytes(const std::vector<UnitPlan>& units, const PlanOptions& o) {
  int64_t staging = 0;
  for (auto& u : units)
    staging = std::max(staging, ring::reduce_scatter_staging_bytes(u.shard_numel, o.reduce(), o.world,
                                                                   ring::kDefaultPieceBytes));
  return staging;
}

Plan make_plan(const std::vector<UnitSpec>& units, int64_t activation_bytes, const PlanOptions& opts,
               int64_t released_activation_bytes, const Recompute& recompute) {
  opts.validate();
  FSDP_USER_CHECK(!units.empty(), "plan: expected at least one unit, found none.");
  if (is_hybrid(opts.strategy)) {
    // The memory of FULL_SHARD (ZERO2: SHARD_GRAD_OP) at world size S; the
    // traffic adds the replicas' all-reduce.
    PlanOptions inner = opts;
    inner.world = opts.group();
    inner.shard_group = 0;
    inner.hosts = 1;
    inner.strategy = opts.strategy == ShardingStrategy::HYBRID_SHARD ? ShardingStrategy::FULL_SHARD
                                                                     : ShardingStrategy::SHARD_GRAD_OP;
    Plan p = make_plan(units, activation_bytes, inner, released_activation_bytes, recompute);
    p.options = opts;
    p.traffic = traffic(opts.strategy, p.padded_numel, opts);
    p.comm_seconds = opts.bandwidth > 0 ? p.traffic.total() / opts.bandwidth : 0;
    return p;
  }
  Plan p;
  p.options = opts;
  const int64_t N = opts.world;
  const bool no_shard = opts.strategy == ShardingStrategy::NO_SHARD;
  const int k = state_per_param(opts.optimizer);
  int64_t largest = -1;
  for (auto& u : units) {
    FSDP_USER_CHECK(u.numel >= 0, "plan: unit '", u.name, "' has negative numel ", u.numel);
    UnitPlan up;
    up.name = u.name;
    up.numel = u.numel;
    // Padded for every strategy (the engine leaves NO_SHARD unpadded: at
    // most N-1 elements per unit apart).
    up.padded_numel = shard::padded_numel(u.numel, opts.world);
    up.shard_numel = shard::shard_numel(u.numel, opts.world);
    up.unsharded_bytes = up.padded_numel * opts.param_bytes;
    up.shard_bytes = up.shard_numel * opts.master_bytes;
    p.numel += up.numel;
    p.padded_numel += up.padded_numel;
    if (up.padded_numel > largest) {
      largest = up.padded_numel;
      p.P_block = up.unsharded_bytes;
      p.G_block = up.padded_numel * opts.reduce();
      p.P_block_unit = up.name;
    }
    p.units.push_back(std::move(up));
  }
  p.P_full = p.numel * opts.master_bytes;
  const int64_t resident_numel = no_shard ? p.padded_numel : p.padded_numel / N;
  p.P = resident_numel * opts.master_bytes;
  p.G = p.P;
  p.O = opts.optimizer_state_bytes >= 0 ? opts.optimizer_state_bytes : k * p.P;
  p.rest = p.P + p.G + p.O;
  FSDP_USER_CHECK(activation_bytes >= 0 && recompute.activation_bytes >= 0, "plan: negative activation bytes");
  p.A_start = activation_bytes;
  p.A_recompute = recompute.activation_bytes;
  p.A = activation_bytes;
  // Gradients alive at the worst recompute: by default the root's (its
  // head's gradients exist from the start of backward until the root
  // reduces at the end), with one unit all of its gradient (an upper bound).
  const int64_t root_grad = p.units.size() == 1 ? 0 : p.units[0].padded_numel * opts.param_bytes;
  // no_sync accumulation: every unit's unsharded gradient (param dtype) is
  // held through the last micro-step's backward; the root's and the
  // reducing unit's gradients are among them, and the reduce input is that
  // buffer itself, or a copy in the reduce dtype (`convert`).
  if (opts.no_sync && opts.micro_steps > 1) p.accumulated = p.padded_numel * opts.param_bytes;
  const int64_t convert = opts.reduce() != opts.param_bytes ? p.G_block : 0;
  // The gradients alive when the first reduce of the last backward is
  // issued: the root's and the finished unit's, or every unit's.
  const int64_t grads_at_reduce = p.accumulated > 0 ? p.accumulated + convert : root_grad + p.G_block;
  p.recompute_grad = recompute.activation_bytes == 0 ? 0
                     : recompute.grad_bytes >= 0 ? recompute.grad_bytes
                     : p.accumulated > 0         ? p.accumulated
                     : p.units.size() == 1       ? p.G_block
                                                 : root_grad;
  // The worst recompute's moment, when it tops the others: working set
  // `base` (the units gathered then) + the gradients + A_recompute.
  // The next recompute, with the finished unit's gradient in flight.
  const int64_t next_A = recompute.released_bytes < 0
                             ? 0
                             : std::max<int64_t>(0, recompute.activation_bytes - recompute.released_bytes);
  auto consider_recompute = [&](int64_t base, int64_t A) {
    if (A > 0 && base + p.recompute_grad + A > p.working + p.A) {
      p.working = base + p.recompute_grad;
      p.A = A;
      p.peak_at = "recompute";
    }
  };
  // Host-shared units: the one decision, with the planner's facts (its
  // ranks on `hosts` hosts of equal size, memory readable inside a host).
  path::Facts facts;
  facts.ranks = opts.world;
  facts.share_host = opts.share_host;
  if (opts.hosts > 1) facts.hosts_differ = detail::cat("the ranks are on ", opts.hosts, " hosts");
  // (HYBRID came here as its inner strategy over the shard group.)
  const bool host_shared =
      path::host_shared_unit({opts.strategy, /*on_cpu=*/true, p.numel, opts.world, path::choose(facts).host_shared});
  int64_t in_shared = 0;  // of rest, what lies in the shared memory (fp32: the master shards)
  if (host_shared) {
    p.shared_per_host = p.padded_numel * opts.param_bytes;
    p.host_ranks = static_cast<int>(N / opts.hosts);  // across hosts: each host's ranks (the tiers)
    if (opts.param_bytes == opts.master_bytes) in_shared = p.P;
    // Nothing gathered is the allocator's: autograd's gradients of the root
    // (alive through backward) and of the unit about to reduce, until they
    // are copied into the memory the peers read (src/unit/unit.cpp).
    // Across hosts (the tiers, src/comm/tiers.cpp) a reduce also stages the
    // host's sums of the H chunks a rank forwards, and the inter ring's pieces.
    if (opts.hosts > 1)
      for (auto& u : p.units)
        p.staging = std::max(p.staging, opts.hosts * u.shard_numel * opts.reduce() +
                                            ring::reduce_scatter_staging_bytes(u.shard_numel, opts.reduce(),
                                                                               opts.hosts, ring::kDefaultPieceBytes));
    // Gradients reduced in the parameter dtype are written where the
    // reduce sums them (src/unit/unit.cpp, grads_in_peer_memory): the
    // root's, the reducing unit's and the accumulated ones all lie in the
    // rank's peer memory, none in the allocator (what autograd makes of one
    // parameter before adding it there is not counted, as elsewhere).
    // With a cast on the way they are the allocator's until the reduce.
    const bool grads_in_peer = path::grads_in_peer_memory(host_shared, opts.reduce() == opts.param_bytes);
    if (grads_in_peer) p.recompute_grad = 0;
    const int64_t held = p.accumulated > 0 ? p.accumulated : root_grad + p.G_block;
    if (grads_in_peer) p.peer_grads = held;
    const int64_t grads = grads_in_peer ? 0 : held;
    const int64_t at_reduce =
        p.staging + (p.units.size() == 1 && p.accumulated == 0
                         ? (grads_in_peer ? 0 : p.G_block) - activation_bytes
                         : grads - std::min(released_activation_bytes, activation_bytes));
    // (A reduce copies the accumulated gradients into the peers' memory,
    // cast on the way: nothing of the allocator's.) They are held from the
    // start of the last backward.
    const int64_t at_start = grads_in_peer ? 0 : p.accumulated;
    p.working = std::max<int64_t>({0, at_reduce, at_start});
    p.peak_at = at_reduce > at_start ? "first reduce-scatter" : "backward start";
    // (The finished unit's gradients have left the allocator by the next
    // recompute: copied to peer memory, freed.)
    consider_recompute(0, recompute.activation_bytes);
  }
  if (!host_shared) switch (opts.strategy) {
    case ShardingStrategy::FULL_SHARD: {
      // Two moments compete for the peak (the engine: src/unit/grad_reduce.cpp,
      // src/comm/ring.cpp):
      //  backward start: every activation alive, the root unit (the model's
      //    own parameters, here the head) and the computing unit plus the
      //    prefetched ones unsharded;
      //  the first reduce-scatter: the unit that finished backward handed
      //    its gradients to the reduce (G_block, in flight) and the ring's
      //    staging buffers exist, the next unit is gathered, the root keeps
      //    its unsharded gradients until backward ends; the activations of
      //    the units already done are gone (`released`).
      //  With a single unit the reduce happens when every activation is
      //  gone: its parameters are resharded first, its gradient is copied
      //  into the flat reduce buffer (2 x G_block for a moment), then the
      //  ring's staging joins the buffer.
      std::vector<int64_t> sizes;
      for (size_t i = 1; i < p.units.size(); ++i) sizes.push_back(p.units[i].unsharded_bytes);
      std::sort(sizes.rbegin(), sizes.rend());
      int64_t gathered = p.units[0].unsharded_bytes;
      for (int i = 0; i <= opts.prefetch && i < (int)sizes.size(); ++i) gathered += sizes[i];
      p.staging = ring_staging_bytes(p.units, opts);
      //  With activation checkpointing a third: the worst recompute, the
      //    saved inputs and one module's recomputed activations alive, the
      //    units of backward start gathered and the gradients begun.
      const int64_t at_start = gathered + p.accumulated;  // + A
      int64_t at_reduce;                                  // + A
      if (p.units.size() == 1) {
        at_reduce = p.accumulated > 0 ? p.accumulated + std::max(convert, p.staging) - activation_bytes
                                      : p.G_block + std::max(p.G_block, p.staging) - activation_bytes;
      } else {
        at_reduce = gathered + grads_at_reduce + p.staging - std::min(released_activation_bytes, activation_bytes);
      }
      p.working = std::max(at_start, at_reduce);
      p.peak_at = at_start >= at_reduce ? "backward start" : "first reduce-scatter";
      consider_recompute(gathered, recompute.activation_bytes);
      // (Without the ring's staging: measured, the recompute's peak and the
      // ring's buffers do not coincide.)
      if (p.units.size() > 1 && opts.prefetch > 0)
        consider_recompute(gathered + (p.accumulated > 0 ? convert : p.G_block), next_A);
      break;
    }
    case ShardingStrategy::SHARD_GRAD_OP: {
      const int64_t all = p.padded_numel * opts.param_bytes;
      p.working = all + (p.accumulated > 0 ? p.accumulated + convert : p.G_block);
      p.peak_at = "backward start";
      consider_recompute(all, recompute.activation_bytes);
      if (p.units.size() > 1) consider_recompute(all + (p.accumulated > 0 ? convert : p.G_block), next_A);
      break;
    }
    case ShardingStrategy::NO_SHARD: {
      const int64_t copy = opts.param_bytes != opts.master_bytes ? p.padded_numel * opts.param_bytes : 0;
      p.working = copy + p.accumulated;
      p.peak_at = "backward start";
      consider_recompute(copy, recompute.activation_bytes);
      if (p.units.size() > 1) consider_recompute(copy + (p.accumulated > 0 ? convert : p.G_block), next_A);
      break;
    }
    case ShardingStrategy::HYBRID_SHARD:
    case ShardingStrategy::HYBRID_SHARD_ZERO2:
      break;  // planned above, as their inner strategy at world size S
  }
  // A background save writes each byte once: NO_SHARD's ranks each save
  // 1/N of the replica (src/state/state_dict.cpp).
  if (opts.async_checkpoint) p.C = no_shard ? (p.P + p.O + N - 1) / N : p.P + p.O;
  p.peak = p.rest - in_shared + p.working + p.A + p.C;
  p.full_shard = traffic(ShardingStrategy::FULL_SHARD, p.padded_numel, opts);
  p.shard_grad_op = traffic(ShardingStrategy::SHARD_GRAD_OP, p.padded_numel, opts);
  p.no_shard = traffic(ShardingStrategy::NO_SHARD, p.padded_numel, opts);
  p.traffic = traffic(opts.strategy, p.padded_numel, opts);
  p.comm_seconds = opts.bandwidth > 0 ? p.traffic.total() / opts.bandwidth : 0;
  return p;
}

namespace {

std::string b(int64_t x) { return fsdp::memory::format_bytes(x); }

std::string line(const char* label, const std::string& value, const std::string& note = "") {
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-30s %14s   %s\n", label, value.c_str(), note.c_str());
  return buf;
}

std::string millions(int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f M", n / 1e6);
  return buf;
}

}  // namespace

std::string Plan::str() const {
  std::ostringstream os;
  const auto& o = options;
  const int k = state_per_param(o.optimizer);
  os << "plan: " << strategy_name(o.strategy) << ", world N = " << o.world
     << (is_hybrid(o.strategy) ? ", shard groups of S = " + std::to_string(o.group()) + " (the terms below are /S)"
                               : std::string())
     << ", " << units.size()
     << " unit(s), " << (o.param_bytes == 2 ? "bf16" : "fp32") << " compute, optimizer " << to_string(o.optimizer)
     << (o.micro_steps > 1 ? ", " + std::to_string(o.micro_steps) + " micro-steps" + (o.no_sync ? " (no_sync)" : "")
                           : "")
     << "\n";
  os << "\nmodel\n";
  os << line("parameters", millions(numel), "padded to multiples of N: " + millions(padded_numel));
  os << line("P (fp32, whole model)", b(P_full), "the FSDP guide's P = num_params x 4 B");
  os << "\nper rank (every rank the same)\n";
  const bool ns = o.strategy == ShardingStrategy::NO_SHARD;
  os << line("P  params resident", b(P), ns ? "full replica" : "P/N (fp32 master shard)");
  os << line("G  grads resident", b(G), ns ? "full replica" : "G/N");
  os << line("O  optimizer state", b(O),
             o.optimizer_state_bytes >= 0 ? std::string("as measured") : std::to_string(k) + " x P" + (ns ? "" : "/N"));
  os << line("rest = P + G + O", b(rest), ns ? "" : "(P+G+O)/N, the FSDP guide's ledger");
  os << line("P_block (largest unit)", b(P_block), "unit " + (P_block_unit.empty() ? std::string("<root>") : P_block_unit));
  const std::string grads = accumulated > 0 ? "accumulated grads" : "grads in flight";
  std::string wnote = peak_at == "recompute"
                          ? "at the worst recompute: the units gathered + " + b(recompute_grad) + " of gradients"
                      : shared_per_host > 0
                          ? (peak_at == "backward start"
                                 ? "at backward start: " + std::string(accumulated > 0 ? "the accumulated grads; " : "") +
                                       "the units gathered lie in host-shared memory"
                                 : "at the first reduce-scatter: " + grads + " + staging " + b(staging) +
                                       " - activations freed (the units gathered lie in host-shared memory)")
                      : o.strategy == ShardingStrategy::FULL_SHARD
                          ? (peak_at == "backward start" && units.size() == 1
                                 ? "at backward start: the one unit unsharded" +
                                       std::string(accumulated > 0 ? " + its accumulated grads" : "")
                                 : peak_at == "backward start"
                                 ? "at backward start: root unit + P_block x " + std::to_string(1 + o.prefetch) +
                                       (accumulated > 0 ? " + accumulated grads" : "")
                                 : "at the first reduce-scatter: gathered units + " + grads + " + ring staging " +
                                       b(staging) + " - activations freed")
                      : o.strategy == ShardingStrategy::SHARD_GRAD_OP
                          ? "all units unsharded fwd->bwd + " +
                                std::string(accumulated > 0 ? "accumulated grads" : "grad of one unit")
                          : (working ? (accumulated > 0 ? "compute-dtype copy (if any) + accumulated grads"
                                                        : "compute-dtype copy")
                                     : "none (computes on the replica)");
  os << line("working set at the peak", b(working), wnote);
  if (accumulated > 0)
    os << line("  of which accumulated", b(accumulated),
               "no_sync: every unit's unsharded gradient, held until the last micro-step reduces it");
  os << line("A  activations", b(A),
             A_recompute > 0 ? "at the " + peak_at + " (activation checkpointing: " + b(A_start) +
                                   " kept by forward, " + b(A_recompute) + " during the worst recompute)"
                             : "");
  if (C > 0) os << line("C  checkpoint snapshot", b(C), "P + O of this rank, held while a background save writes");
  os << line("predicted peak", b(peak),
               std::string(C > 0 ? "rest + working + A + C" : "rest + working + A") +
                   (shared_per_host > 0 ? " (the allocator's; host-shared memory below)" : ""));
  if (shared_per_host > 0) {
    os << line("host-shared units", b(shared_per_host),
               detail::cat("every unit once per host, mapped by its ", host_ranks, " ranks (docs/COMM.md)"));
    if (peer_grads > 0)
      os << line("gradients in peer memory", b(peer_grads),
                 "per rank, written where the reduce sums them: the root's and one unit's, or the accumulated");
    os << line("per rank, its share", b(rank_peak()),
               peer_grads > 0 ? "predicted peak + gradients in peer memory + host-shared / ranks of the host"
                              : "predicted peak + host-shared / ranks of the host");
    os << line("per host", b(host_peak()), peer_grads > 0 ? "ranks x (predicted peak + gradients in peer memory) + host-shared"
                                                          : "ranks x predicted peak + host-shared");
  }
  os << "\ntraffic per step, bytes sent per rank (N = " << o.world << ")\n";
  auto tl = [&](const char* name, const Traffic& t, const char* formula) {
    std::string note = formula;
    if (o.bandwidth > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "  ~%.1f ms at %s", 1e3 * t.total() / o.bandwidth,
                    format_bandwidth(o.bandwidth).c_str());
      note += buf;
    }
    return line(name, b(t.total()), note);
  };
  os << tl("FULL_SHARD", full_shard, "3P(N-1)/N: AG fwd + AG bwd + RS");
  os << tl("SHARD_GRAD_OP", shard_grad_op, "2P(N-1)/N: AG fwd + RS");
  os << tl("NO_SHARD (DDP)", no_shard, "2P(N-1)/N: all-reduce");
  if (is_hybrid(o.strategy))
    os << tl(strategy_name(o.strategy), traffic,
             o.strategy == ShardingStrategy::HYBRID_SHARD ? "3P(S-1)/S in the group + 2(R-1)/R P/S across"
                                                          : "2P(S-1)/S in the group + 2(R-1)/R P/S across");
  if (o.bandwidth <= 0) os << "  (communication time: pass --bandwidth 2GB/s or --measure)\n";
  os << "\nunits\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-4s %-22s %12s %12s %12s %12s\n", "#", "unit", "numel", "padded", "shard",
                "unsharded");
  os << buf;
  for (size_t i = 0; i < units.size(); ++i) {
    auto& u = units[i];
    std::snprintf(buf, sizeof buf, "  %-4zu %-22s %12lld %12lld %12lld %12s\n", i,
                  u.name.empty() ? "<root>" : u.name.c_str(), (long long)u.numel, (long long)u.padded_numel,
                  (long long)u.shard_numel, b(u.unsharded_bytes).c_str());
    os << buf;
  }
  return os.str();
}

ReplicaTraffic replica_traffic(const Plan& plan, int replicas) {
  const auto& o = plan.options;
  FSDP_USER_CHECK(replicas >= 1, "replica groups: expected R >= 1, found ", replicas);
  FSDP_USER_CHECK(!is_hybrid(o.strategy), "replica groups: the plan is ", strategy_name(o.strategy),
                  "; replica groups are HYBRID_SHARD's replicas launched apart: plan the group's own strategy "
                  "(full, grad-op or none) with --world = ranks per group");
  ReplicaTraffic r;
  r.replicas = replicas;
  const int64_t shard_fp32 = plan.P / o.master_bytes * 4;  // the optimizer's shards' gradients, in fp32
  r.mean = replicas > 1 ? 2 * (replicas - 1) * shard_fp32 / replicas : 0;
  r.heal = plan.P + plan.O;
  const int per_host = std::max(1, o.world / std::max(1, o.hosts));
  r.rate = o.inter_bandwidth > 0 ? o.inter_bandwidth / per_host : o.bandwidth;
  if (r.rate > 0) {
    r.mean_seconds = r.mean / r.rate;
    r.heal_seconds = r.heal / r.rate;
  }
  return r;
}

std::string ReplicaTraffic::str() const {
  std::ostringstream os;
  os << "\nreplica groups: R = " << replicas << " groups of these ranks (fsdp/replicas.h), bytes per rank\n";
  auto timed = [&](double s) {
    if (rate <= 0) return std::string();
    char buf[64];
    std::snprintf(buf, sizeof buf, "  ~%.1f ms at %s", 1e3 * s, format_bandwidth(rate).c_str());
    return std::string(buf);
  };
  os << line("mean across groups", b(mean),
             "per committed step: 2(R-1)/R x the fp32 gradient shard" + timed(mean_seconds));
  os << line("heal from a peer", b(heal), "once per (re)joining group, received: P + O" + timed(heal_seconds));
  if (rate <= 0) os << "  (time: pass --inter-bw (a host's link) or --bandwidth)\n";
  return os.str();
}

std::string Plan::to_json() const {
  auto tj = [](const Traffic& t) {
    return nlohmann::json{{"all_gather", t.all_gather}, {"reduce_scatter", t.reduce_scatter},
                          {"all_reduce", t.all_reduce}, {"total", t.total()}};
  };
  nlohmann::json us = nlohmann::json::array();
  for (auto& u : units)
    us.push_back({{"name", u.name}, {"numel", u.numel}, {"padded_numel", u.padded_numel},
                  {"shard_numel", u.shard_numel}, {"unsharded_bytes", u.unsharded_bytes},
                  {"shard_bytes", u.shard_bytes}});
  return nlohmann::json{{"strategy", strategy_name(options.strategy)},
          {"world", options.world},
          {"param_bytes_per_elem", options.param_bytes},
          {"reduce_bytes_per_elem", options.reduce()},
          {"master_bytes_per_elem", options.master_bytes},
          {"optimizer", to_string(options.optimizer)},
          {"optimizer_state_per_param", state_per_param(options.optimizer)},
          {"micro_steps", options.micro_steps},
          {"prefetch", options.prefetch},
          {"numel", numel},
          {"padded_numel", padded_numel},
          {"P_full", P_full},
          {"P", P},
          {"G", G},
          {"O", O},
          {"rest", rest},
          {"P_block", P_block},
          {"G_block", G_block},
          {"P_block_unit", P_block_unit},
          {"working", working},
          {"staging", staging},
          {"peak_at", peak_at},
          {"A", A},
          {"A_start", A_start},
          {"A_recompute", A_recompute},
          {"recompute_grad", recompute_grad},
          {"no_sync", options.no_sync},
          {"accumulated", accumulated},
          {"C", C},
          {"peak", peak},
          {"shared_per_host", shared_per_host},
          {"host_ranks", host_ranks},
          {"peer_grads", peer_grads},
          {"rank_peak", rank_peak()},
          {"host_peak", host_peak()},
          {"traffic", tj(traffic)},
          {"traffic_by_strategy",
           {{"FULL_SHARD", tj(full_shard)}, {"SHARD_GRAD_OP", tj(shard_grad_op)}, {"NO_SHARD", tj(no_shard)}}},
          {"bandwidth_bytes_per_s", options.bandwidth},
          {"comm_seconds", comm_seconds},
          {"units", us}}.dump();
}

}  // namespace fsdp::plan
