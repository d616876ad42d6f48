// fsdp-cpp: the planner -- the FSDP guide's ledger and traffic formulas
// (docs/GUIDE.md), before a run.
//
// defines: plan::Optimizer, plan::UnitSpec, plan::PlanOptions, plan::UnitPlan,
//          plan::Traffic, plan::Plan, plan::Recompute, plan::make_plan, plan::traffic,
//          plan::Candidate, plan::CommCost, plan::comm_cost, plan::CandidateFit,
//          plan::Recommendation, plan::recommend, plan::units_from,
//          plan::measure_loopback_bandwidth, plan::parse_bandwidth, plan::parse_flop_rate,
//          plan::TierTraffic, plan::tier_traffic, plan::compare_tiers, plan::tiers_str,
//          plan::kQuantSecondsPerElement, plan::CompressedTraffic, plan::CompressionAdvice,
//          plan::compression_advice
//
// Needs only the standard library (no torch): a planner runs where no engine
// is linked in. GPT-mini described by its flags is cli/gpt/plan_gpt.h.
//
// The core takes a list of units {name, numel} and an activation estimate, so
// it plans a real wrapped model as well as a model described by flags:
//   auto plan = fsdp::plan::make_plan(fsdp::plan::units_from(model->units()), A, opts);
//   std::printf("%s", plan.str().c_str());
//
// All quantities are per rank, in bytes (element counts where named numel).
//   P, G, O   resident parameters (fp32 master), gradients, optimizer state
//             (state_per_param: Adam 2 values per parameter, SGD with momentum 1, plain SGD 0)
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
//             with no_sync accumulation (PlanOptions::no_sync) every unit's
//             unsharded gradient (accumulated) is held at those moments of
//             the last micro-step instead of the root's and G_block
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
//             micro_steps (every micro-step gathers and reduces; under no_sync
//             only the last one reduces).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/strategy.h"

namespace fsdp {
struct UnitInfo;  // fully_shard.h
}

// The planner: the FSDP guide's ledger and traffic, predicted from unit sizes.
// Also a strategy chosen under a memory budget; the formulas are in plan.h.
namespace fsdp::plan {

// The optimizer decides O, the state kept per parameter (state_per_param):
// a kind of the one table of what each optimizer keeps (docs/DESIGN.md,
// "Optimizer state"; the ledger and the checkpoints read the same table),
// with the options that change it.
struct Optimizer {
  // The table's name of the kind: sgd, adam, adamw, adagrad or rmsprop.
  std::string type = "adam";
  bool momentum = false;  // SGD, RMSprop: momentum > 0 (libtorch's default is 0)
  bool amsgrad = false;   // Adam, AdamW: a third tensor (max_exp_avg_sq)
  bool centered = false;  // RMSprop: grad_avg besides square_avg
};
// What parse_optimizer reads back: "adam", "adamw-amsgrad", "sgd-momentum",
// "sgd-plain", "rmsprop-momentum-centered", ...
std::string to_string(const Optimizer& o);
// A kind of the table, with options as suffixes: adam|adamw[-amsgrad],
// sgd (with momentum, the common case)|sgd-momentum|sgd-plain, adagrad,
// rmsprop[-momentum][-centered]. Throws fsdp::Error naming what it reads
// (LBFGS too: its state is one history for the whole model, not per parameter).
Optimizer parse_optimizer(const std::string& text);
// The state tensors a parameter holds, by the table: Adam 2 (3 with
// amsgrad), SGD with momentum 1, plain SGD 0, Adagrad 1, RMSprop 1 to 3.
int state_per_param(const Optimizer& o);

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
  Optimizer optimizer;  // Adam
  int micro_steps = 1;   // gradient accumulation steps per optimizer step
  // Micro-steps 0..K-2 under FullyShardedModel::no_sync (DESIGN.md,
  // "Gradient accumulation"): every unit keeps its unsharded gradient (param
  // dtype, padded) from its first backward to the last micro-step's reduce,
  // the peak counts them all (Plan::accumulated), and a step reduces once.
  bool no_sync = false;
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
  // Compute time per optimizer step (every micro-step, forward and backward)
  // in seconds: what the collectives can hide behind (comm_cost); 0: unknown.
  double compute_seconds = 0;
  // Checkpoints saved in the background (CheckpointOptions::async): their
  // snapshot, this rank's parameter shards and optimizer state, is held
  // while training goes on (Plan::C).
  bool async_checkpoint = false;
  // O as a running job measured it (bytes per rank): what the ledger
  // (FullyShardedModel::ledger) plans with; -1: state_per_param(optimizer) x P.
  int64_t optimizer_state_bytes = -1;
  // Ranks of one host keep one copy of each unit in memory they all map
  // (CommOptions::share_host_memory, FSDP_SHARE_HOST; docs/COMM.md
  // "Host-shared units"), where the run's collective path allows it (asked of
  // path::choose with the facts above). false (the default): each rank
  // keeps its own copies, as with FSDP_SHARE_HOST=off or on GPUs; `fsdp plan`
  // (--share-host), the ledger and the examples set it as their run does.
  bool share_host = false;
  // FSDP_COMPRESS of the run planned: off, int8, int4 or fp8 (docs/COMM.md,
  // "Compression on the tiers"). Not off: where path::choose compresses a
  // communicator's collectives (asked with these facts), comm_cost weighs
  // them quantized, and tier_traffic predicts them beside the exact ones
  // (TierTraffic::compressed). off (the default): every byte exact.
  std::string compress = "off";
  // Seconds one rank spends per element it quantizes or decodes (the
  // compressed collectives' compute, beside the link's time); 0:
  // kQuantSecondsPerElement (`fsdp plan --quant-rate` sets 1 / its rate).
  double quant_seconds_per_element = 0;
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
  // options.no_sync with micro_steps > 1: every unit's unsharded gradient,
  // held from the first micro-step's backward to the last one's reduce (part
  // of `working`); 0 otherwise.
  int64_t accumulated = 0;
  // A background checkpoint's snapshot (options.async_checkpoint): this
  // rank's fp32 parameter shards and optimizer state; 0 otherwise.
  int64_t C = 0;
  // Host-shared units (options.share_host; one host, or each of `hosts`): every unit's
  // parameters in the compute dtype, once per host, mapped by host_ranks
  // ranks; not the allocator's (peak leaves them out, and in fp32 the
  // master shards, which are slices of it). 0: none.
  int64_t shared_per_host = 0;
  // The ranks that map shared_per_host (the host's: N / hosts, or HYBRID's shard group).
  int host_ranks = 1;
  // Host-shared units reducing in the parameter dtype: each rank's
  // gradients at the peak (the root's and the reducing unit's, or the
  // accumulated ones), written in its peer memory where the reduce sums
  // them; not the allocator's (the working set leaves them out). 0: none.
  int64_t peer_grads = 0;
  // The predicted peak: rest + working set + A (+ C), at peak_at: what the
  // allocator holds (host-shared: less the shared memory above).
  int64_t peak = 0;
  // A rank's whole share: peak + peer_grads + shared_per_host / host_ranks.
  int64_t rank_peak() const { return peak + peer_grads + (host_ranks > 0 ? shared_per_host / host_ranks : 0); }
  // A host's: host_ranks x (peak + peer_grads) + shared_per_host.
  int64_t host_peak() const { return static_cast<int64_t>(host_ranks) * (peak + peer_grads) + shared_per_host; }
  Traffic traffic;                                  // for options.strategy
  Traffic full_shard, shard_grad_op, no_shard;      // all three, for comparison
  double comm_seconds = 0;                          // traffic / bandwidth (0 when unknown)

  std::string str() const;      // the table `fsdp plan` prints
  std::string to_json() const;  // a JSON object (what `fsdp plan --json` embeds)
};

// Replica groups (fsdp/replicas.h): R groups of plan.options.world ranks,
// each one launch sharding its own copy (FULL_SHARD, SHARD_GRAD_OP or
// NO_SHARD). What crosses between the groups, per rank:
//   mean  every committed step, the mean of the rank's gradient shard over
//         the groups, in fp32 (the optimizer's shards' gradients): a ring
//         all-reduce sends 2(R-1)/R of it (between groups on one host,
//         cross-memory attach reads the same bytes instead)
//   heal  once per (re)joining group, each of its ranks receives its
//         parameter shard and optimizer state from one rank of a source
//         group: P + O (the module's buffers beside; GPT-mini has none);
//         the source's rank sends as much for every group it heals
struct ReplicaTraffic {
  // R: the replica groups.
  int replicas = 1;
  int64_t mean = 0;         // bytes a rank sends per committed step
  int64_t heal = 0;         // bytes a healing rank receives (and its source sends)
  double rate = 0;          // bytes/s per rank the times assume; 0: unknown
  double mean_seconds = 0;  // mean / rate (0: unknown)
  double heal_seconds = 0;  // heal / rate (0: unknown)
  std::string str() const;  // the lines `fsdp plan --replicas R` prints
};
// Throws fsdp::Error for R < 1 or a HYBRID plan (replica groups are
// HYBRID_SHARD's replicas launched apart: plan the group's own strategy).
// The rate: a host's link (inter_bandwidth) shared by the group's ranks on
// it, else bandwidth per rank.
ReplicaTraffic replica_traffic(const Plan& plan, int replicas);

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
//     (One host: the replicas' all-reduce stays inside it too.)
//
// Compressed (PlanOptions::compress, FSDP_COMPRESS; docs/COMM.md,
// "Compression on the tiers"): each communicator of the strategy (the
// world's; HYBRID's shard group and replica group) is asked of path::choose
// with the plan's facts and the compression. Where it compresses, the
// collective's cross-host hop sends quantized bytes, wire(n) = ceil(n/256)
// fp32 scales + the payload (n bytes; int4: ceil(n/2)), blocks restarting at
// each block or chunk (comm/quantize.h's wire_bytes), per call of a unit
// (m = its padded numel / the communicator's ranks, h its hosts):
//   all_gather      (h-1) wire_w(m); quantizes m, decodes h m elements.
//                   Host-shared units' all-gathers stay exact
//                   (path::host_shared_unit).
//   reduce_scatter  (h-1) wire_g(m); quantizes h m, decodes 2 h m (its
//                   peers' contributions and, for error feedback, what it
//                   sent).
//   all_reduce      (NO_SHARD's gradients, HYBRID's replicas) of n elements:
//                   rank 0's chunk c = ring_chunks(n, ranks per host)[0], cut
//                   in h chunks e = ring_chunks(c, h): a quantized
//                   reduce-scatter (all-to-all, grads' format) and a
//                   quantized all-gather (ring, int8), sum over k != 0 of
//                   wire_g(e_k) + sum over k != 1 of wire_int8(e_k);
//                   quantizes c + e_0, decodes 2c + h e_0.
// (wire_w: the parameters' format, int8 or fp8, the same bytes; wire_g: the
// gradients', int8 or int4.) Time: the same tiers' time of the exact
// intra bytes and these inter bytes, plus (quantized + decoded) x
// PlanOptions::quant_seconds_per_element. Elsewhere the bytes stay exact.

// Seconds one rank spends quantizing or decoding one fp32 element with
// comm/quantize.h on one CPU core, as measured on this project's machine (the
// measurement beside its definition, src/plan/tier_traffic.cpp); a GPU's or
// another CPU's: `fsdp plan --quant-rate`.
extern const double kQuantSecondsPerElement;

// One strategy's step under one FSDP_COMPRESS value, as the run sends it.
struct CompressedTraffic {
  // The FSDP_COMPRESS value: int8, int4 or fp8.
  std::string compress;
  // Whether any of the strategy's collectives crosses hosts quantized.
  bool applies = false;
  // Which collectives travel quantized, or why none does (path::choose's reason).
  std::string why;
  // Bytes rank 0 sends across hosts per step: quantized where compressed, exact elsewhere.
  int64_t inter = 0;
  // Elements rank 0 quantizes and decodes per step.
  int64_t quantized = 0, decoded = 0;
  // (quantized + decoded) x the seconds per element.
  double quant_seconds = 0;
  // Communication time per step: the tiers' time of intra and `inter`, plus
  // quant_seconds; 0 when a rate is unknown.
  double seconds = 0;
};

// One strategy's bytes per step inside a host and across hosts, and their time.
struct TierTraffic {
  // The strategy.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  int64_t intra = 0, inter = 0;  // bytes sent per step by the rank above, every byte exact
  int64_t rest = 0;              // its (P+G+O) at rest (memory side of the trade)
  double seconds = 0;            // communication time per step, exact; 0 when a rate is unknown
  // The same step compressed, one per FSDP_COMPRESS value compared (none: off).
  std::vector<CompressedTraffic> compressed;
};
// One strategy's TierTraffic for these units, over opts.hosts hosts;
// compressed with opts.compress (unless off).
TierTraffic tier_traffic(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& opts);
// The strategies side by side across hosts: bytes and time per tier. It
// picks nothing; recommend() does, for every path that recommends.
struct TierComparison {
  // One per strategy, FULL_SHARD first.
  std::vector<TierTraffic> rows;
  // The FSDP_COMPRESS values every row's `compressed` holds, in order.
  std::vector<std::string> formats;
};
// Every strategy's TierTraffic for these units, each compressed with every
// one of `formats` (int8, int4, fp8; empty: opts.compress unless off).
// Throws fsdp::Error naming a format it does not know.
TierComparison compare_tiers(const std::vector<UnitSpec>& units, const PlanOptions& opts,
                             const std::vector<std::string>& formats = {});
std::string tiers_str(const TierComparison& c, const PlanOptions& opts);  // the table `fsdp plan --hosts` prints

// Whether compression pays for one strategy: the format whose predicted
// communication per step is the shortest, where it is shorter than the
// exact one by more than 1%.
struct CompressionAdvice {
  // The strategy.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  // Whether FSDP_COMPRESS=compress shortens the step (by more than 1%).
  bool pays = false;
  // The format that pays most ("" where none pays).
  std::string compress;
  // Communication per step exact and with `compress` (or the best format
  // weighed); seconds, 0 when a rate is unknown.
  double exact_seconds = 0, compressed_seconds = 0;
  // "FULL_SHARD: FSDP_COMPRESS=int4 pays: ..." or "...: compression does not pay: ...".
  std::string line;
};
// The advice for one row of compare_tiers (its `compressed` weighed).
CompressionAdvice compression_advice(const TierTraffic& row);

// ---------------------------------------------------------------------------
// Communication that cannot hide behind compute (what recommend() weighs).
//
// Every collective of a step costs its bytes through the tiers as
// tier_traffic counts them: intra / intra_bw + (ranks sharing a host's link)
// x inter / inter_bw. Without the rates (intra_bandwidth and, across hosts,
// inter_bandwidth, else `bandwidth` for both) the same sum with rate 1: bytes,
// the inter-host ones weighted by the ranks sharing the link.
//   one unit: everything is exposed (nothing to prefetch, its one reduce
//     waits for the whole backward);
//   K >= 2 units, prefetch >= 1: each unit's collectives run while its
//     neighbours compute, except at the ends: forward cannot compute before
//     the root (units[0]) and the first unit it runs (units[1]) are
//     gathered, and backward ends with their reduces (HYBRID: with the
//     replicas' all-reduce). exposed_min = those all-gathers + those reduces;
//   with a compute time (PlanOptions::compute_seconds) and the rates:
//     exposed = max(exposed_min, total - compute): what the compute cannot
//     cover; without it exposed = exposed_min (communication beyond compute
//     is not weighed).
// micro_steps: every micro-step gathers and reduces, the same at each.
// With PlanOptions::compress the collectives a communicator compresses cost
// their quantized bytes, and with the rates the time they quantize and
// decode too ("Compressed" above).
struct CommCost {
  // Seconds (the rates are known), else bytes weighted as above.
  bool timed = false;
  // Every collective of the step.
  double total = 0;
  // The first all-gathers of forward and the last reduces of backward (total with one unit).
  double first_gather = 0, last_reduce = 0;
  // What no prefetch hides: first_gather + last_reduce (total with one unit).
  double exposed_min = 0;
  // What recommend() minimizes: max(exposed_min, total - compute) when both are times, else exposed_min.
  double exposed = 0;
  // Whether the compute time took part (timed and PlanOptions::compute_seconds > 0).
  bool compute_weighed = false;
};
// One strategy's CommCost for these units (units[0] the root, the others in
// forward order), under opts (world, hosts, rates, dtypes, micro_steps,
// compute_seconds).
CommCost comm_cost(ShardingStrategy s, const std::vector<UnitSpec>& units, const PlanOptions& opts);

// ---------------------------------------------------------------------------
// Choosing a strategy and a wrapping (the FSDP guide's decision tree as one
// rule; docs/GUIDE.md, "Choosing"):
//   1. candidates: every strategy the run allows (NO_SHARD, SHARD_GRAD_OP,
//      FULL_SHARD; HYBRID_SHARD_ZERO2 and HYBRID_SHARD too across hosts,
//      hosts > 1, or with a shard group smaller than N; only the one asked
//      for when `only` is set) with every wrapping, coarse to fine; a
//      wrapping of K >= 2 units is planned with prefetch max(1, prefetch);
//   2. memory: those whose peak is at most 90% of the budget fit (the
//      allocator's fragmentation and small buffers are not in the ledger);
//      no budget (0): all do. None fits: FULL_SHARD (or `only`) with the
//      finest wrapping, and which term dominates;
//   3. among those that fit, the least exposed communication (comm_cost);
//      within 1% of it the least total communication, within 1% of that the
//      lowest peak, then the first of NO_SHARD, SHARD_GRAD_OP, FULL_SHARD,
//      HYBRID_SHARD_ZERO2, HYBRID_SHARD, the coarser wrapping first.

// One wrapping for recommend() to try: the units it makes.
struct Candidate {
  std::string wrap;  // e.g. "none", "block", "size:65536" (coarse to fine)
  // The units it makes, the root first.
  std::vector<UnitSpec> units;
  int64_t released = 0;  // make_plan's released_activation_bytes
  Recompute recompute;   // make_plan's recompute (activation checkpointing)
};

// One (strategy, wrapping) as recommend() weighed it.
struct CandidateFit {
  // The strategy.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  // The wrapping (Candidate::wrap).
  std::string wrap;
  // Its units (K).
  int units = 0;
  // The prefetch its plan assumes: max(1, PlanOptions::prefetch) with K >= 2.
  int prefetch = 0;
  // Whether its peak is at most 90% of the budget (always, without a budget).
  bool fits = false;
  int64_t peak = 0;  // its plan's peak
  int64_t rest = 0;  // (P+G+O) per rank at rest
  // Its communication per step, and what of it cannot hide.
  CommCost comm;
};

// What recommend() chose, and why.
struct Recommendation {
  // Whether the choice fits the budget (false: nothing does; `why` says what to change).
  bool fits = false;
  // The strategy chosen.
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  // Its wrapping (Candidate::wrap).
  std::string wrap;
  // The prefetch its plan assumes (1 where the run asked 0 and the wrapping has K >= 2 units).
  int prefetch = 0;
  // The plan of that strategy, wrapping and prefetch.
  Plan plan;
  // The pick's communication (its row of `candidates`).
  CommCost comm;
  // The budget weighed (0: none).
  int64_t budget = 0;
  // The candidates that fit, one row each, the pick marked; then what does not fit.
  std::string table;
  std::string why;  // plain words, several lines
  // How it was chosen: "exposed_comm", or "nothing_fits".
  std::string rule = "exposed_comm";
  // Every (strategy, wrapping) weighed, in the tie-break order.
  std::vector<CandidateFit> candidates;
  // "recommended: S with --wrap W [--prefetch 1]" or "closest (does NOT fit): ...": the `=>` line.
  std::string verdict() const;
};

// A strategy and a wrapping for `budget` bytes per rank (0: no budget), by
// the rule above (candidates coarse to fine; `only`: that strategy alone).
Recommendation recommend(const std::vector<Candidate>& candidates_coarse_to_fine, int64_t activation_bytes,
                         const PlanOptions& base, int64_t budget,
                         std::optional<ShardingStrategy> only = std::nullopt);

// ---------------------------------------------------------------------------
// A process budget (fsdp plan --budget-rss): what a rank's whole process may
// hold (its VmHWM). The tensors get what is left once the fixed part is set
// aside: what a process holds beside the counting allocator's footprint
// (memory::ProcessMemory::fixed: libtorch's code and data, malloc's heap,
// thread stacks). The run passes the tensors' share to the allocator as its
// limit (gpt --max-memory, memory::set_limit), which keeps tensors and cache
// together inside it.
struct ProcessBudget {
  int64_t rss = 0;       // the whole process's budget per rank
  int64_t at_start = 0;  // libtorch's code and data at start
  int64_t runtime = 0;   // the rest of the fixed part: code paged in later, malloc's heap, stacks
  bool given = false;    // the fixed part was given (--fixed: what a run printed), not estimated
  // What the process holds beside the allocator: at_start + runtime.
  int64_t fixed() const { return at_start + runtime; }
  // What the tensors get, the allocator's limit: rss - fixed (0 where nothing is left).
  int64_t tensors() const { return rss > fixed() ? rss - fixed() : 0; }
  std::string str() const;  // the lines `fsdp plan --budget-rss` prints
};
// The allowance for the fixed part beyond libtorch at start, when the run's
// own is not given: make scale (GPT 85.7 M, 8 ranks, one thread each)
// measured 28-31 MiB (library code paged in during training 22 MiB, malloc's
// heap under 1 MiB, stacks and the rest 3-5 MiB, VmHWM between samples 1-3
// MiB); twice that. More threads, another model or another libtorch build
// can need more: give a run's own with --fixed.
constexpr int64_t kRuntimeAllowance = int64_t(64) << 20;
// `rss`: the process budget. `fixed` > 0: the fixed part as a run measured it
// (gpt --rank-memory prints fixed=); 0: this process's resident size
// (`at_start`: the same libtorch, loaded) + kRuntimeAllowance.
ProcessBudget process_budget(int64_t rss, int64_t at_start, int64_t fixed = 0);
// This process's resident size now (VmRSS), 0 where unknown.
int64_t resident_now();

// ---------------------------------------------------------------------------
// Bandwidth.

// Sends `bytes` through a loopback TCP connection on this host and returns
// bytes/s (what ranks on one machine get from Gloo's TCP transport, at best).
double measure_loopback_bandwidth(int64_t bytes = int64_t(256) << 20);
// "2GB/s", "500MiB/s", "10Gbit/s", "1e9" (bytes/s); throws fsdp::Error.
double parse_bandwidth(const std::string& text);
// "1.25 GB/s", "500.0 MB/s", "900 B/s" (decimal units), for tables.
std::string format_bandwidth(double bytes_per_s);
// Achieved FLOP/s per rank: "400TFLOP/s", "400 TFLOPS", "4e14"; throws fsdp::Error.
double parse_flop_rate(const std::string& text);

}  // namespace fsdp::plan
