// fsdp-cpp: the planner -- the FSDP guide's ledger and traffic formulas
// (docs/GUIDE.md), before a run.
//
// defines: plan::Optimizer, plan::UnitSpec, plan::PlanOptions, plan::UnitPlan,
//          plan::Traffic, plan::Plan, plan::Recompute, plan::make_plan, plan::traffic,
//          plan::Candidate, plan::StrategyFit, plan::Recommendation, plan::recommend,
//          plan::units_from, plan::measure_loopback_bandwidth, plan::parse_bandwidth,
//          plan::TierTraffic, plan::tier_traffic, plan::compare_tiers, plan::tiers_str
//
// Needs only the standard library (no torch): a planner runs where no engine
// is linked in. GPT-mini described by its flags is examples/gpt/plan_gpt.h.
//
// The core takes a list of units {name, numel} and an activation estimate, so
// it plans a real wrapped model as well as a model described by flags:
//   auto plan = fsdp::plan::make_plan(fsdp::plan::units_from(model->units()), A, opts);
//   std::printf("%s", plan.str().c_str());
//
// All quantities are per rank, in bytes (element counts where named numel).
//   P, G, O   resident parameters (fp32 master), gradients, optimizer state
//             (Adam 2 values per parameter, SGD with momentum 1, plain SGD 0)
//   rest      P + G + O                       (FULL_SHARD: (P+G+O)_full / N)
//   P_block   the largest unit unsharded, in the compute dtype
//   G_block   its unsharded gradient before the reduce-scatter
//   A         activations kept for backward (+ the head's transient gradients);
//             with activation checkpointing the larger of that (the saved
//             inputs of the checkpointed modules instead of their
//             activations) and the activations alive while the first
//             checkpointed module recomputes in backward
//   peak      rest + working set + A, where the working set is
//               FULL_SHARD     the largest of these moments (measured on the
//                              engine, tests/test_plan_accuracy.cpp):
//                 backward start   root unit + P_block * (1 + prefetch)
//                 worst recompute  the same + the gradients alive then (only
//                                  with activation checkpointing; Recompute)
//                 first reduce     the same + the root's gradient + G_block
//                                  in flight + the ring's staging
//                                  - the activations already released
//               SHARD_GRAD_OP  every unit unsharded (kept from forward to backward) + G_block
//               NO_SHARD       nothing extra (fp32), the compute-dtype copy otherwise
//   traffic   bytes this rank SENDS per optimizer step (ring algorithms):
//               FULL_SHARD     AG forward + AG backward + RS = 3P * (N-1)/N
//               SHARD_GRAD_OP  AG forward + RS                = 2P * (N-1)/N
//               NO_SHARD       all-reduce                     = 2P * (N-1)/N
//               HYBRID_SHARD   inside the shard group of S:   3P * (S-1)/S,
//                              the all-reduce across R = N/S: 2 (R-1)/R * P/S
//               HYBRID_SHARD_ZERO2  2P * (S-1)/S and the same all-reduce
//             (HYBRID's memory terms are FULL_SHARD's / SHARD_GRAD_OP's at
//             world size S: P, G, O divided by S, not N)
//             with P = padded numel * bytes of the collective's dtype, times
//             micro_steps (every micro-step gathers and reduces).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/strategy.h"

namespace fsdp {
struct UnitInfo;  // fully_shard.h
}

// The planner: the FSDP guide's ledger and traffic, predicted from unit sizes.
// Also a strategy chosen under a memory budget; the formulas are in plan.h.
namespace fsdp::plan {

// The optimizer decides O, the state kept per parameter (state_per_param).
enum class Optimizer { ADAM, SGD_MOMENTUM, SGD };
// "adam", "sgd-momentum", "sgd-plain".
const char* to_string(Optimizer o);
// adam|adamw|sgd|sgd-momentum (sgd = SGD with momentum, the common case); throws fsdp::Error.
Optimizer parse_optimizer(const std::string& text);
int state_per_param(Optimizer o);  // Adam 2, SGD with momentum 1, plain SGD 0

// One unit to plan: what the formulas need of it.
struct UnitSpec {
  std::string name;  // module path, "" = root
  // Its original parameters (before padding).
  int64_t numel = 0;
};

// What a plan assumes about the run: ranks, strategy, dtypes, optimizer, links.
struct PlanOptions {
  // Ranks (N).
  int world = 1;
  // The strategy planned.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  int param_bytes = 4;   // compute / all-gather dtype: fp32 4, bf16 2
  int reduce_bytes = 0;  // gradient reduction dtype; 0 = param_bytes
  int master_bytes = 4;  // the sharded master copy (always fp32 in fsdp-cpp)
  // Decides O.
  Optimizer optimizer = Optimizer::ADAM;
  int micro_steps = 1;   // gradient accumulation steps per optimizer step
  int prefetch = 0;      // units gathered ahead (FsdpOptions::forward_prefetch / backward_prefetch)
  double bandwidth = 0;  // bytes/s per rank for the time estimate; 0 = unknown
  // Two tiers: H hosts of N/H consecutive ranks; the links inside a host
  // (bytes/s per rank) and between hosts (bytes/s of one host's link, shared
  // by its ranks); 0 = unknown (then `bandwidth` for both).
  int hosts = 1;
  // The two links' rates in bytes/s (hosts); 0: unknown.
  double intra_bandwidth = 0, inter_bandwidth = 0;
  // HYBRID_SHARD*: ranks per shard group; 0: N / hosts (one host).
  int shard_group = 0;
  // The shard group's size S: shard_group, else the ranks of one host.
  int group() const { return shard_group > 0 ? shard_group : world / hosts; }
  // Throws fsdp::Error naming the field.
  void validate() const;
  // Bytes per element of the gradient reduction: reduce_bytes, else param_bytes.
  int reduce() const { return reduce_bytes > 0 ? reduce_bytes : param_bytes; }
};

// One unit as planned: padded to a multiple of N and split into shards.
struct UnitPlan {
  // Module path, "" = root.
  std::string name;
  // Its original parameters.
  int64_t numel = 0;
  int64_t padded_numel = 0;     // multiple of the world size
  int64_t shard_numel = 0;      // padded / N
  int64_t unsharded_bytes = 0;  // padded * param_bytes
  int64_t shard_bytes = 0;      // shard * master_bytes
};

// Bytes one rank sends per optimizer step, by collective (plan.h's formulas).
struct Traffic {
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;  // bytes sent per rank per step
  // The three together.
  int64_t total() const { return all_gather + reduce_scatter + all_reduce; }
};

// The ledger predicted for one run: memory per rank and traffic per step.
struct Plan {
  // What it assumes.
  PlanOptions options;
  // Per unit, the root first.
  std::vector<UnitPlan> units;
  // The model's parameters, before and after padding every unit.
  int64_t numel = 0, padded_numel = 0;
  int64_t P_full = 0;  // numel * master_bytes: the FSDP guide's P
  // Bytes per rank at rest: parameters, gradients, optimizer state, their sum.
  int64_t P = 0, G = 0, O = 0, rest = 0;
  // The largest unit unsharded (compute dtype), and its unsharded gradient.
  int64_t P_block = 0, G_block = 0;
  // That unit's name.
  std::string P_block_unit;
  int64_t working = 0;  // unsharded parameters / gradients at the peak (see above)
  int64_t staging = 0;  // the reduce-scatter ring's buffers (FULL_SHARD's working set counts them)
  std::string peak_at;  // "backward start", "recompute" or "first reduce-scatter"
  int64_t A = 0;        // activations at the peak
  int64_t A_start = 0;      // activations when backward starts (what forward kept)
  int64_t A_recompute = 0;  // activations during the worst recompute (activation checkpointing; 0: none)
  int64_t recompute_grad = 0;  // gradients alive beside them (beyond the units gathered)
  // The predicted peak: rest + working set + A, at peak_at.
  int64_t peak = 0;
  Traffic traffic;                                  // for options.strategy
  Traffic full_shard, shard_grad_op, no_shard;      // all three, for comparison
  double comm_seconds = 0;                          // traffic / bandwidth (0 when unknown)

  std::string str() const;      // the table `fsdp plan` prints
  std::string to_json() const;  // a JSON object (what `fsdp plan --json` embeds)
};

// The worst recompute of backward, for the peak (activation checkpointing).
//
// Activation checkpointing: the moment of backward when a checkpointed
// module recomputes with the most alive (for GPT with a unit per block the
// first recompute: every saved input, the block's activations again; with
// one unit the gradients computed so far count too, autograd keeps them
// until that unit's single reduce).
// With several units the next recompute can be worse: the unit that just
// finished backward hands its gradient (G_block) to a reduce-scatter still
// in flight while the next one recomputes (SHARD_GRAD_OP and NO_SHARD
// at worst; FULL_SHARD with backward prefetch, where no all-gather waits
// behind that reduce-scatter), and only the finished module's kept bytes
// are gone (`released_bytes`).
struct Recompute {
  int64_t activation_bytes = 0;  // activations alive then; 0: no activation checkpointing
  int64_t grad_bytes = -1;       // gradients alive then beyond the working set; -1: the root
                                 // unit's gradient (several units) or the unit's whole gradient (one)
  int64_t released_bytes = -1;   // activations freed before the next recompute; -1: all (there is none)
};

// Pads every unit to a multiple of N and applies the formulas above.
// units[0] is the root. released_activation_bytes: activations freed before
// the second unit's backward starts (those of the unit computed last in
// forward and of what follows it, e.g. GPT's last block and head); 0 when
// unknown (the plan then errs high). With activation checkpointing,
// activation_bytes is what forward keeps (the saved inputs instead of the
// checkpointed modules' activations) and `recompute` the worst recompute;
// without, recompute is {}.
Plan make_plan(const std::vector<UnitSpec>& units, int64_t activation_bytes, const PlanOptions& opts,
               int64_t released_activation_bytes = 0, const Recompute& recompute = {});
// One strategy's bytes per rank per step for `padded_numel` parameters.
Traffic traffic(ShardingStrategy s, int64_t padded_numel, const PlanOptions& opts);

// The units of a wrapped model (FullyShardedModel::units(); include
// fsdp/fully_shard.h to call it).
std::vector<UnitSpec> units_from(const std::vector<UnitInfo>& infos);

// ---------------------------------------------------------------------------
// Two tiers: what one step sends inside a host and between hosts, and how
// long that takes, for a strategy over opts.hosts hosts (ranks in host order,
// as `fsdp run --nnodes` numbers them).
//   FULL_SHARD, SHARD_GRAD_OP, NO_SHARD over H > 1 hosts of S ranks: the
//     collectives compose two tiers (inside each host, then between the
//     ranks of the same local index, docs/COMM.md), so every rank sends
//     (H-1)/(N-1) of its traffic across and the rest inside; the S ranks of
//     a host share its link: time = intra / intra_bw + S x inter / inter_bw.
//   HYBRID_SHARD*: intra = the shard group's all-gathers and reduce-scatter,
//     inter = the shard's all-reduce across replicas, every rank; the S ranks
//     of a host share its link, so time = intra / intra_bw + S x inter / inter_bw.

// One strategy's bytes per step inside a host and across hosts, and their time.
struct TierTraffic {
  // The strategy.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  int64_t intra = 0, inter = 0;  // bytes sent per step by the rank above
  int64_t rest = 0;              // its (P+G+O) at rest (memory side of the trade)
  double seconds = 0;            // communication time per step; 0 when a rate is unknown
};
// One strategy's TierTraffic for these units, over opts.hosts hosts.
TierTraffic tier_traffic(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& opts);
// The strategies side by side across hosts, and the one to pick.
// Every strategy, FULL_SHARD first; `best` is HYBRID_SHARD when the
// inter-host link dominates (it cuts FULL_SHARD's communication time by a
// fifth or more; without rates: fewer bytes cross hosts), else FULL_SHARD.
struct TierComparison {
  // One per strategy, FULL_SHARD first.
  std::vector<TierTraffic> rows;
  // The pick.
  ShardingStrategy best = ShardingStrategy::FULL_SHARD;
  // Why, in words.
  std::string why;
};
// Every strategy's TierTraffic for these units, and the pick.
TierComparison compare_tiers(const std::vector<UnitSpec>& units, const PlanOptions& opts);
std::string tiers_str(const TierComparison& c, const PlanOptions& opts);  // the table `fsdp plan --hosts` prints

// ---------------------------------------------------------------------------
// Choosing a strategy and a wrapping under a memory budget (the FSDP guide's
// decision tree): the model fits replicated -> NO_SHARD (least traffic, no
// gathers); else it fits with parameters unsharded through the step ->
// SHARD_GRAD_OP (2P instead of 3P); else FULL_SHARD with the coarsest wrapping
// that fits (fewer, larger collectives); nothing fits -> the finest wrapping
// and what to change. A plan fits when its peak is at most 90% of the budget
// (the allocator's fragmentation and small buffers are not in the ledger).
//
// Across hosts (PlanOptions::hosts > 1; HYBRID's shard group
// PlanOptions::group()) HYBRID_SHARD_ZERO2 and HYBRID_SHARD join, each
// strategy with its coarsest wrapping that fits, and among the strategies
// that fit:
//   both links' rates known (intra_bandwidth and inter_bandwidth, or
//     bandwidth for both): the least communication time per step
//     (tier_traffic's seconds), rule "comm_time";
//   no rates, a HYBRID variant fits: the fewest bytes crossing each host's
//     link per step (StrategyFit::host_inter; a tie: fewer bytes inside),
//     rule "inter_host_bytes";
//   else (no HYBRID variant fits, or nothing fits): the tree's choice, rule
//     "tree".
// Ties go to the earlier of NO_SHARD, SHARD_GRAD_OP, FULL_SHARD,
// HYBRID_SHARD_ZERO2, HYBRID_SHARD. With one host the tree alone decides, as
// without hosts (rule "tree", `strategies` empty).

// One wrapping for recommend() to try: the units it makes.
struct Candidate {
  std::string wrap;  // e.g. "none", "block", "size:65536" (coarse to fine)
  // The units it makes, the root first.
  std::vector<UnitSpec> units;
  int64_t released = 0;  // make_plan's released_activation_bytes
  Recompute recompute;   // make_plan's recompute (activation checkpointing)
};

// One strategy as recommend() weighed it across hosts.
struct StrategyFit {
  // The strategy.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  std::string wrap;        // its coarsest wrapping that fits (the finest when none does)
  // Whether that wrapping fits the budget.
  bool fits = false;
  int64_t peak = 0;        // its plan's peak with that wrapping
  int64_t rest = 0;        // (P+G+O) per rank at rest
  TierTraffic tiers;       // its traffic per tier and communication time with that wrapping
  int64_t host_inter = 0;  // bytes each host sends across per step: HYBRID S x tiers.inter
                           // (the S ranks of a host share its link), else tiers.inter (the
                           // ring's one crossing rank)
};

// What recommend() chose, and why.
struct Recommendation {
  // Whether the choice fits the budget (false: nothing does; `why` says what to change).
  bool fits = false;
  // The strategy chosen.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  // Its wrapping (Candidate::wrap).
  std::string wrap;
  // The plan of that strategy and wrapping.
  Plan plan;
  std::string why;  // plain words, several lines
  // How it was chosen (see above): "tree", "comm_time" or "inter_host_bytes".
  std::string rule = "tree";
  ShardingStrategy one_host_choice = ShardingStrategy::FULL_SHARD;  // what the tree alone picks
  std::vector<StrategyFit> strategies;  // hosts > 1: all five, in the tie-break order
};

// A strategy and a wrapping for `budget` bytes per rank, by the rules of
// plan.h (candidates coarse to fine).
Recommendation recommend(const std::vector<Candidate>& candidates_coarse_to_fine, int64_t activation_bytes,
                         const PlanOptions& base, int64_t budget);

// ---------------------------------------------------------------------------
// Bandwidth.

// Sends `bytes` through a loopback TCP connection on this host and returns
// bytes/s (what ranks on one machine get from Gloo's TCP transport, at best).
double measure_loopback_bandwidth(int64_t bytes = int64_t(256) << 20);
// "2GB/s", "500MiB/s", "10Gbit/s", "1e9" (bytes/s); throws fsdp::Error.
double parse_bandwidth(const std::string& text);
// "1.25 GB/s", "500.0 MB/s", "900 B/s" (decimal units), for tables.
std::string format_bandwidth(double bytes_per_s);

}  // namespace fsdp::plan
