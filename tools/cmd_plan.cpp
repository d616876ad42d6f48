// `fsdp plan --model gpt ...`: the FSDP guide's ledger and traffic for a model, before running it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "cli_checks.h"
#include "usage.h"
#include "command.h"
#include "common/collective_path.h"
#include "fsdp/config.h"
#include "host_probe.h"
#include "fsdp/fully_shard.h"
#include "fsdp/memory.h"
#include "fsdp/plan.h"
#include "gpt/plan_gpt.h"  // GPT-mini's units and activations (cli/gpt, the fsdp_gpt_spec library)

namespace {

using namespace fsdp::plan;
using gpt::ActivationEstimate;
using gpt::gpt_activations;
using gpt::gpt_candidates;
using gpt::gpt_flops;
using gpt::gpt_released;
using gpt::gpt_units;
using gpt::GptShape;

// What `--share-host auto` plans: whether the CPU ranks `fsdp run` starts
// here keep one copy of each unit per host, decided by the run's own rule
// (path::choose; the planner then asks path::host_shared_unit per strategy)
// on the environment as the run reads it (FSDP_SHARE_HOST, FSDP_TRANSPORT,
// FSDP_TIERS) and on what this host allows (host_probe.h), and why.
struct ShareHost {
  bool on = false;
  std::string why;
};
ShareHost share_host_here(const fsdp::config::EnvConfig& env, int world, int hosts, bool sharded) {
  if (world == 1) return {false, "one rank: nothing to share"};
  if (!sharded) return {false, "NO_SHARD keeps a whole replica on every rank"};
  fsdp::path::Facts f;
  f.transport = env.transport;
  f.tiers = env.tiers;
  f.ranks = world;
  f.share_host = env.share_host.value_or(true);
  if (hosts > 1) f.hosts_differ = "the ranks are on " + std::to_string(hosts) + " hosts";
  // Only where it would be used, as the run probes only then.
  if (f.share_host && f.transport != "tcp" && (hosts == 1 || f.tiers)) {
    const fsdp::tools::SiblingProbe probe = fsdp::tools::probe_siblings();
    if (hosts == 1) f.cma_blocked = probe.cma_blocked;
    f.share_blocked = !probe.cma_blocked.empty() ? probe.cma_blocked : probe.share_blocked;
  }
  const fsdp::path::Choice c = fsdp::path::choose(f);
  return {c.host_shared, c.reason};
}

int cmd_plan(int argc, char** argv) {
  std::string model = "gpt", strategy = "full", wrap = "block", dtype = "fp32", optimizer = "adamw", ac = "none";
  std::string budget_text, budget_rss_text, fixed_text, bandwidth_text, intra_text, inter_text, compute_text;
  GptShape s;
  int world = 2, micro_steps = 1, prefetch = 0, hosts = 1, shard_group = 0, replicas = 0;
  bool as_json = false, measure = false, save_async = false, no_sync = false;
  CLI::App app{"Predict per-rank memory (P, G, O, P_block, A, peak) and traffic per step for a model, "
               "and recommend a strategy under a memory budget (the FSDP guide's ledger and decision tree)",
               "fsdp plan"};
  app.add_option("--model", model, "model family (gpt: GPT-mini of docs/GPT_MINI.md)")->capture_default_str();
  app.add_option("--layers", s.layers, "L: transformer blocks")->capture_default_str()->check(fsdp::cli::integer(0, 10000));
  app.add_option("--dim", s.dim, "d: width")->capture_default_str()->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--heads", s.heads, "h: attention heads")->capture_default_str()->check(fsdp::cli::integer(1, 1 << 20));
  std::string attention = "matmul";
  app.add_option("--attention", attention, "matmul|sdpa: GPT-mini's attention (gpt --attention)")
      ->capture_default_str()
      ->check(CLI::IsMember({"matmul", "sdpa"}));
  std::string logits = "held";
  app.add_option("--logits", logits,
                 "held|dropped: whether the training loop keeps the logits [B,T,V] alive through backward (held: a "
                 "`logits` variable still in scope; dropped: gpt's own loop, which plans itself so)")
      ->capture_default_str()
      ->check(CLI::IsMember({"held", "dropped"}));
  app.add_option("--vocab", s.vocab, "V: vocabulary")->capture_default_str()->check(fsdp::cli::integer(1, 1 << 24));
  app.add_option("--seq", s.seq, "T: context length")->capture_default_str()->check(fsdp::cli::integer(1, 1 << 24));
  app.add_option("--batch", s.batch, "B: micro-batch per rank")->capture_default_str()->check(fsdp::cli::integer(1, 1 << 24));
  app.add_option("--world,-n", world, "N: ranks")->capture_default_str()->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--strategy", strategy,
                 "full|grad-op|none|hybrid|hybrid-zero2|auto (auto needs --budget; with --budget a strategy given "
                 "here is the only one weighed)")
      ->capture_default_str();
  app.add_option("--hosts", hosts, "H: hosts, N/H ranks each: traffic and time per tier for every strategy")
      ->capture_default_str()
      ->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--shard-group", shard_group, "hybrid: ranks per shard group (0: one host, N/H)")
      ->capture_default_str()
      ->check(fsdp::cli::integer(0, 1 << 20));
  app.add_option("--replicas", replicas,
                 "R replica groups of --world ranks each (fsdp/replicas.h, gpt --replicas): the traffic between "
                 "groups per step and per heal")
      ->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--intra-bw", intra_text, "link rate per rank inside a host, e.g. 10GB/s");
  app.add_option("--inter-bw", inter_text, "link rate of one host to the others, e.g. 1Gbit/s");
  app.add_option("--wrap", wrap, "block|none|size:N (N parameters)")->capture_default_str();
  app.add_option("--dtype", dtype, "compute / communication dtype: fp32|bf16")->capture_default_str();
  app.add_option("--ac", ac,
                 "activation checkpointing: none|block|every:K (blocks keep their input and recompute in backward)")
      ->capture_default_str();
  app.add_option("--optimizer", optimizer,
                 "what O counts, a kind of the optimizer table: adam|adamw[-amsgrad], sgd (with momentum)|sgd-plain, "
                 "adagrad, rmsprop[-momentum][-centered]")
      ->capture_default_str();
  app.add_option("--micro-steps", micro_steps, "gradient accumulation steps per optimizer step")
      ->capture_default_str()
      ->check(fsdp::cli::integer(1, 1 << 20));
  app.add_flag("--no-sync", no_sync,
               "with --micro-steps K: micro-steps 0..K-2 under no_sync (gpt --accum does so): one reduce per step, "
               "every unit's unsharded gradient held until the last micro-step");
  app.add_flag("--save-async", save_async,
               "checkpoints saved in the background: count their snapshot (C = P + O of a rank) in the peak");
  app.add_option("--prefetch", prefetch, "units all-gathered ahead of the computing one")
      ->capture_default_str()
      ->check(fsdp::cli::integer(0, 10000));
  app.add_option("--budget", budget_text,
                 "memory per rank for the tensors (the ledger's peak), e.g. 2GiB: recommend a strategy and wrapping: of "
                 "those that fit, the least "
                 "communication that cannot hide behind compute (with --hosts > 1 HYBRID too)");
  app.add_option("--budget-rss", budget_rss_text,
                 "memory per rank for the whole process (its VmHWM), e.g. 700MiB: the tensors get what the fixed "
                 "part (libtorch, malloc's heap, stacks) leaves, and the answer says the --max-memory to run with; "
                 "with --budget too, the smaller of the two");
  app.add_option("--fixed", fixed_text,
                 "with --budget-rss: the fixed part a run measured (gpt --rank-memory prints fixed=), instead of "
                 "this process's libtorch at start plus an allowance");
  app.add_option("--compute", compute_text,
                 "achieved FLOP/s per rank, e.g. 400TFLOP/s or 4e14: the recommendation also weighs the "
                 "communication the compute time cannot cover (needs link rates)");
  app.add_option("--bandwidth", bandwidth_text, "link rate per rank for time estimates, e.g. 2GB/s");
  app.add_flag("--measure", measure, "measure this host's loopback TCP rate and use it as --bandwidth");
  std::string share_host = "auto";
  app.add_option("--share-host", share_host,
                 "auto|on|off: ranks of one host share one copy of each unit (host-shared units); auto: what CPU "
                 "ranks that fsdp run starts here do (on, unless FSDP_SHARE_HOST=off or FSDP_TRANSPORT=tcp); off: "
                 "each rank keeps its own, as on GPUs")
      ->capture_default_str();
  std::string compress_text, quant_rate_text;
  app.add_option("--compress", compress_text,
                 "off|int8|int4|fp8: the FSDP_COMPRESS of the run (docs/COMM.md, \"Compression on the tiers\"): with "
                 "--hosts H > 1 each strategy's bytes across hosts and comm time compressed beside the exact ones, "
                 "and whether it pays; the recommendation (--budget) weighs the compressed collectives. Default: "
                 "FSDP_COMPRESS when set, else int8 and int4 compared (the recommendation then weighs exact bytes)");
  app.add_option("--quant-rate", quant_rate_text,
                 "elements per second one rank quantizes or decodes, e.g. 2e9 (default: 1 / 6.5 ns, measured with "
                 "comm/quantize.h on this project's 2-core CPU machine; a GPU is far faster)");
  app.add_flag("--json", as_json, "print JSON instead of tables");
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return *rc;
  // Everything below checks the user's input: a bad value is a usage error (exit 2).
  PlanOptions o;
  std::optional<fsdp::ShardingStrategy> chosen;  // none: auto
  std::vector<std::string> formats;  // compressions the tier table compares
  std::string compress_from;         // where o.compress came from ("": nowhere, int8 and int4 compared)
  int64_t budget = 0;
  std::optional<ProcessBudget> process;
  try {
    if (model != "gpt") throw fsdp::UsageError("--model: expected gpt, found '" + model + "'");
    if (dtype != "fp32" && dtype != "bf16") throw fsdp::UsageError("--dtype: expected fp32|bf16, found '" + dtype + "'");
    s.sdpa = attention == "sdpa";
    s.caller_holds_logits = logits == "held";
    s.validate();
    // The planner counts bytes in int64: keep every term far from overflowing.
    const long double P = (long double)s.num_params(), B = s.batch, T = s.seq, V = s.vocab, h = s.heads,
                      d = s.dim, L = s.layers;
    const long double terms[] = {P * 16, B * h * T * T * 8 * (L + 1), B * T * V * 16,
                                 B * T * d * 64 * (L + 1)};
    for (long double t : terms)
      if (t > (long double)(int64_t(1) << 60))
        throw fsdp::UsageError(
            "--layers/--dim/--heads/--vocab/--seq/--batch: this model's memory terms exceed 2^60 bytes "
            "(an exabyte per rank), beyond what the planner computes; expected smaller values");
    o.world = world;
    o.param_bytes = dtype == "bf16" ? 2 : 4;
    o.optimizer = parse_optimizer(optimizer);
    o.micro_steps = micro_steps;
    o.no_sync = no_sync;
    o.prefetch = prefetch;
    o.async_checkpoint = save_async;
    if (share_host != "auto" && share_host != "on" && share_host != "off")
      throw fsdp::UsageError("--share-host: expected auto|on|off, found '" + share_host + "'");
    if (!bandwidth_text.empty()) parse_bandwidth(bandwidth_text);  // checked here, used below
    o.hosts = hosts;
    o.shard_group = shard_group;
    if (!intra_text.empty()) o.intra_bandwidth = parse_bandwidth(intra_text);
    if (!inter_text.empty()) o.inter_bandwidth = parse_bandwidth(inter_text);
    if (world % hosts != 0)
      throw fsdp::UsageError("--hosts " + std::to_string(hosts) + " must divide --world " + std::to_string(world) +
                             " (every host runs the same number of ranks)");
    if (shard_group > 0 && world % shard_group != 0)
      throw fsdp::UsageError("--shard-group " + std::to_string(shard_group) + " must divide --world " +
                             std::to_string(world));
    if (strategy != "auto") {
      try {
        chosen = fsdp::parse_strategy(strategy);
      } catch (const fsdp::Error&) {
        throw fsdp::Error("--strategy: expected full|grad-op|none|hybrid|hybrid-zero2|auto, found '" + strategy + "'");
      }
    }
    if (!budget_text.empty()) {
      try {
        budget = fsdp::cli::parse_bytes(budget_text);
      } catch (const fsdp::Error& e) {
        throw fsdp::UsageError(std::string("--budget: ") + e.what());
      }
    }
    if (!fixed_text.empty() && budget_rss_text.empty())
      throw fsdp::UsageError("--fixed is the fixed part of a process budget: give --budget-rss too");
    if (!budget_rss_text.empty()) {
      int64_t rss = 0, fixed = 0;
      try {
        rss = fsdp::cli::parse_bytes(budget_rss_text);
      } catch (const fsdp::Error& e) {
        throw fsdp::UsageError(std::string("--budget-rss: ") + e.what());
      }
      if (!fixed_text.empty()) {
        try {
          fixed = fsdp::cli::parse_bytes(fixed_text);
        } catch (const fsdp::Error& e) {
          throw fsdp::UsageError(std::string("--fixed: ") + e.what());
        }
      }
      process = process_budget(rss, resident_now(), fixed);
      // The tensors' share (at least a byte: nothing then fits, and the answer says why).
      const int64_t share = std::max<int64_t>(1, process->tensors());
      budget = budget > 0 ? std::min(budget, share) : share;
    }
    if (!chosen && budget <= 0)
      throw fsdp::UsageError("--strategy auto needs --budget (e.g. --budget 2GiB) or --budget-rss to decide.");
    gpt_units(s, wrap);  // checks --wrap
    gpt::recompute_every(ac);  // checks --ac
    if (!compute_text.empty()) o.compute_seconds = gpt_flops(s, ac, micro_steps) / parse_flop_rate(compute_text);
    // Compression: --compress, else the environment's FSDP_COMPRESS (the run's), else int8 and int4 compared.
    if (!compress_text.empty()) {
      if (compress_text != "off" && compress_text != "int8" && compress_text != "int4" && compress_text != "fp8")
        throw fsdp::UsageError("--compress: expected off, int8, int4 or fp8 (FSDP_COMPRESS's values), found '" +
                               compress_text + "'");
      o.compress = compress_text;
      compress_from = "--compress " + compress_text;
    } else if (const std::string env = fsdp::config::read_env().compress; !env.empty()) {
      o.compress = env;
      compress_from = "FSDP_COMPRESS=" + env + " in the environment";
    }
    if (!compress_from.empty())
      formats = o.compress == "off" ? std::vector<std::string>{} : std::vector<std::string>{o.compress};
    else
      formats = {"int8", "int4"};
    if (!quant_rate_text.empty()) {
      double rate = 0;
      size_t used = 0;
      try {
        rate = std::stod(quant_rate_text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != quant_rate_text.size() || !(rate > 0) || !std::isfinite(rate))
        throw fsdp::UsageError("--quant-rate: expected elements per second, a number > 0 such as 2e9, found '" +
                               quant_rate_text + "'");
      o.quant_seconds_per_element = 1 / rate;
    }
  } catch (const fsdp::UsageError&) {
    throw;
  } catch (const fsdp::Error& e) {
    throw fsdp::UsageError(e.what());
  }
  if (measure) o.bandwidth = measure_loopback_bandwidth();
  if (!bandwidth_text.empty()) o.bandwidth = parse_bandwidth(bandwidth_text);
  // Host-shared units: what the run would do here unless told (and said either way).
  std::string share_line;
  if (share_host == "auto") {
    const bool sharded = !chosen || *chosen != fsdp::ShardingStrategy::NO_SHARD;
    const ShareHost here = share_host_here(fsdp::config::read_env(), world, hosts, sharded);
    o.share_host = here.on;
    share_line = std::string("host-shared units: ") + (here.on ? "on" : "off") +
                 ", as the CPU ranks fsdp run starts here (--share-host auto): " + here.why +
                 (here.on ? ". --share-host off plans each rank's own copy, as on GPUs" : "") + "\n";
  } else {
    o.share_host = share_host == "on";
    share_line = "host-shared units: " + share_host + " (--share-host " + share_host + ")\n";
  }

  ActivationEstimate act = gpt_activations(s, o.param_bytes, ac);
  char head[256];
  std::snprintf(head, sizeof head, "GPT-mini L=%lld d=%lld h=%lld V=%lld T=%lld, batch %lld per rank: %.3f M parameters\n",
                (long long)s.layers, (long long)s.dim, (long long)s.heads, (long long)s.vocab, (long long)s.seq,
                (long long)s.batch, s.num_params() / 1e6);

  nlohmann::json j;
  std::string text = head;
  text += "activations A = " + fsdp::memory::format_bytes(act.total) + ": " + act.str() + "\n";
  text += share_line;
  j["share_host"] = {{"on", o.share_host}, {"asked", share_host}, {"line", share_line.substr(0, share_line.size() - 1)}};
  if (measure) text += "measured loopback TCP: " + format_bandwidth(o.bandwidth) + "\n";
  if (o.compute_seconds > 0) {
    char c[160];
    std::snprintf(c, sizeof c, "compute per step: %.3g FLOP at %s = %.1f ms\n", gpt_flops(s, ac, micro_steps),
                  compute_text.c_str(), 1e3 * o.compute_seconds);
    text += c;
  }
  text += "\n";
  Plan plan;
  if (chosen) {
    o.strategy = *chosen;
    plan = make_plan(gpt_units(s, wrap), act.total, o, gpt_released(s, wrap, o.param_bytes, ac),
                     gpt::gpt_recompute(s, wrap, o.param_bytes, ac));
    text += plan.str();
    j["plan"] = nlohmann::json::parse(plan.to_json());
    j["wrap"] = wrap;
    if (replicas > 0) {
      ReplicaTraffic rt;
      try {
        rt = replica_traffic(plan, replicas);
      } catch (const fsdp::Error& e) {
        throw fsdp::UsageError(std::string("--replicas: ") + e.what());
      }
      text += rt.str();
      j["replicas"] = {{"groups", rt.replicas}, {"mean_bytes", rt.mean}, {"heal_bytes", rt.heal},
                       {"rate", rt.rate}, {"mean_seconds", rt.mean_seconds}, {"heal_seconds", rt.heal_seconds}};
    }
  }
  if (replicas > 0 && !chosen)
    throw fsdp::UsageError("--replicas plans one group's strategy: give --strategy full|grad-op|none");
  const bool tiered = hosts > 1 || o.intra_bandwidth > 0 || o.inter_bandwidth > 0;
  if (tiered) {
    // Bytes and times per tier for every strategy; the choice is the recommendation's (with --budget).
    const auto tiers = compare_tiers(gpt_units(s, wrap), o, hosts > 1 ? formats : std::vector<std::string>{});
    text += tiers_str(tiers, o);
    if (hosts > 1 && !compress_from.empty()) text += "  (compression: " + compress_from + ")\n";
    if (budget <= 0) text += "  (a recommendation weighs memory too: --strategy auto --budget SIZE)\n";
    nlohmann::json rows = nlohmann::json::array();
    for (auto& r : tiers.rows) {
      nlohmann::json row = {{"strategy", fsdp::to_string(r.strategy)}, {"intra_bytes", r.intra},
                            {"inter_bytes", r.inter}, {"rest", r.rest}, {"comm_seconds", r.seconds}};
      // The first format compared, flat; every one under "compressed".
      row["compress"] = r.compressed.empty() ? "off" : r.compressed.front().compress;
      row["inter_bytes_compressed"] = r.compressed.empty() ? r.inter : r.compressed.front().inter;
      row["comm_seconds_compressed"] = r.compressed.empty() ? r.seconds : r.compressed.front().seconds;
      nlohmann::json each = nlohmann::json::array();
      for (auto& c : r.compressed)
        each.push_back({{"compress", c.compress}, {"applies", c.applies}, {"why", c.why}, {"inter_bytes", c.inter},
                        {"quantized", c.quantized}, {"decoded", c.decoded}, {"quant_seconds", c.quant_seconds},
                        {"comm_seconds", c.seconds}});
      row["compressed"] = each;
      const CompressionAdvice a = compression_advice(r);
      row["compression_pays"] = a.pays;
      row["compression_advice"] = a.line;
      rows.push_back(row);
    }
    j["tiers"] = {{"hosts", hosts}, {"shard_group", o.group()}, {"intra_bandwidth", o.intra_bandwidth},
                  {"inter_bandwidth", o.inter_bandwidth}, {"formats", tiers.formats},
                  {"quant_seconds_per_element",
                   o.quant_seconds_per_element > 0 ? o.quant_seconds_per_element : kQuantSecondsPerElement},
                  {"rows", rows}};
  }
  // Whether compression pays for the strategy planned (the one recommended
  // with --budget, its wrapping): the line after the verdict.
  auto compression_for = [&](fsdp::ShardingStrategy strategy, const std::string& units_wrap) {
    if (hosts <= 1 || formats.empty()) return;
    const auto c = compare_tiers(gpt_units(s, units_wrap), o, formats);
    for (auto& r : c.rows) {
      if (r.strategy != strategy) continue;
      const CompressionAdvice a = compression_advice(r);
      text += "compression: " + a.line + "\n";
      j["compression"] = {{"strategy", fsdp::to_string(strategy)}, {"wrap", units_wrap}, {"pays", a.pays},
                          {"compress", a.compress}, {"exact_seconds", a.exact_seconds},
                          {"compressed_seconds", a.compressed_seconds}, {"line", a.line}};
    }
  };
  if (budget > 0) {
    // --strategy X given: X alone is weighed; auto (or no --strategy): every strategy.
    const bool only = chosen && app.count("--strategy") > 0;
    Recommendation r = recommend(gpt_candidates(s, o.param_bytes, ac), act.total, o, budget,
                                 only ? chosen : std::nullopt);
    if (!chosen) {
      text += (tiered ? "\n" : "") + r.plan.str();
      j["plan"] = nlohmann::json::parse(r.plan.to_json());
      j["wrap"] = r.wrap;
    }
    if (process) {
      text += "\n" + process->str() + "\n";
      j["process_budget"] = {{"rss", process->rss},           {"at_start", process->at_start},
                             {"runtime", process->runtime},   {"fixed", process->fixed()},
                             {"given", process->given},       {"tensors", process->tensors()},
                             {"max_memory_mib", process->tensors() >> 20}};
    }
    text += "\n" + r.table + "\n" + r.why + "\n=> " + r.verdict() + "\n";
    compression_for(r.strategy, r.wrap);
    const bool timed = r.comm.timed;
    nlohmann::json rows = nlohmann::json::array();
    for (auto& f : r.candidates)
      rows.push_back({{"strategy", fsdp::to_string(f.strategy)}, {"wrap", f.wrap}, {"units", f.units},
                      {"prefetch", f.prefetch}, {"fits", f.fits}, {"peak", f.peak}, {"rest", f.rest},
                      {"total_comm", f.comm.total}, {"exposed", f.comm.exposed},
                      {"exposed_min", f.comm.exposed_min}});
    j["recommendation"] = {{"fits", r.fits}, {"strategy", fsdp::to_string(r.strategy)}, {"wrap", r.wrap},
                           {"prefetch", r.prefetch}, {"why", r.why}, {"budget", budget}, {"peak", r.plan.peak},
                           {"rule", r.rule}, {"comm_unit", timed ? "seconds" : "bytes"},
                           {timed ? "exposed_seconds" : "exposed_bytes", r.comm.exposed},
                           {"total_comm", r.comm.total}, {"compute_seconds", o.compute_seconds},
                           {"candidates", rows}};
  }
  if (budget <= 0 && chosen) compression_for(*chosen, wrap);
  j["model"] = {{"family", "gpt"}, {"layers", s.layers}, {"dim", s.dim}, {"heads", s.heads}, {"vocab", s.vocab},
                {"seq", s.seq}, {"batch", s.batch}, {"num_params", s.num_params()}};
  j["activations"] = {{"total", act.total}, {"per_block", act.per_block}, {"attention", act.attention},
                      {"head", act.head}, {"backward_transient", act.backward_transient},
                      {"checkpointed", act.checkpointed}, {"saved_per_checkpointed", act.saved_per_checkpointed},
                      {"at_recompute", act.at_recompute}};
  j["ac"] = ac;
  if (as_json)
    std::printf("%s\n", j.dump(2).c_str());
  else
    std::printf("%s", text.c_str());
  return 0;
}

}  // namespace

FSDP_COMMAND(plan, "predict memory per rank and traffic per step; recommend a strategy for a budget", cmd_plan);
