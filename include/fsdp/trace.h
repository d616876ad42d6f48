// fsdp-cpp: the trace recorder (what every rank did, when) and its readers.
//
// defines: trace::Options, trace::start, trace::stop, trace::enabled, trace::Span,
//          FSDP_TRACE_SPAN, trace::counter, trace::instant, trace::set_metadata,
//          trace::set_thread_name, trace::merge, report::analyze, report::write_html
//
// Recording (one process = one rank):
//   fsdp::trace::start(dir, rank, world);            // nothing is recorded before
//   fsdp::trace::set_metadata("units", units_json);  // see the schema below
//   { fsdp::trace::Span s("all_gather", "comm", {{"unit", "blocks.3"}, {"bytes", n}}); ... }
//   FSDP_TRACE_SPAN("optimizer_step", "optim");
//   fsdp::trace::counter("memory", {{"current", c}, {"peak", p}});
//   fsdp::trace::stop();                             // writes DIR/trace-rank<R>.json
//   fsdp::trace::merge(dir);                         // rank 0, after all ranks stopped
//
// Cost when disabled: enabled() is one relaxed atomic load; a Span does that
// check and nothing else, but its args are a json object that the CALLER
// builds before the check. On hot paths build args only when recording:
//   fsdp::trace::Span s("all_gather", "comm");
//   if (s.active()) s.arg("unit", name).arg("bytes", n);
// All functions are thread-safe; the communication thread records too. Events
// are kept in memory until stop() (at most Options::max_events; later events
// are dropped and counted in the file's otherData.dropped_events).
//
// ---------------------------------------------------------------------------
// THE FILE FORMAT (schema "fsdp-trace/1")
// DIR/trace-rank<R>.json is a Chrome trace-event JSON object:
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
// It opens in Perfetto (ui.perfetto.dev) and chrome://tracing. ts and dur are
// microseconds on the wall clock (system_clock, advanced by steady_clock
// within a run) so files of ranks on different hosts line up.
//   pid = rank; tid = a small number per thread in order of first event, with
//   a thread_name metadata event ("compute" for the thread that called start(),
//   otherwise "thread <tid>" unless set_thread_name() named it, e.g. "comm").
//
// Events the engine and the trainers emit (name, cat, args). The report reads
// exactly these; names outside the list are drawn but not interpreted.
//   cat "step":     "step"              {"step": int, "loss"?: number, "tokens"?: int}
//                   one span around each optimizer step (forward + backward +
//                   optimizer); the report slices everything else by these.
//   cat "forward":  "forward"           {"unit": unit name ("" = root)}
//   cat "backward": "backward"          {"unit": unit name}
//                   "recompute"         {"unit", "module": the checkpointed module's path}
//                   (activation checkpointing: its forward again, inside the unit's backward)
//   cat "comm":     "all_gather"        {"unit", "bytes": int, "phase"?: "forward"|"backward"|"prefetch"}
//                   "reduce_scatter"    {"unit", "bytes"}
//                   "all_reduce"        {"unit" or "label", "bytes"}
//                   "broadcast", "barrier"  {"label"?, "bytes"?}
//                   bytes = bytes THIS RANK SENT for the collective (what
//                   CommCounters::bytes_sent counts), so a step's sum is the
//                   rank's traffic, comparable to 3P*(N-1)/N and 2P*(N-1)/N.
//                   Spans on the communication thread time the collective
//                   itself; a span on the compute thread named "wait" with
//                   {"unit"} shows time blocked on it (optional).
//   cat "optim":    "optimizer_step", "clip_grad_norm"   {}
//   cat "ckpt":     "save", "load"      {"path": str, "bytes": int, "step"?: int}
//                   instant "checkpoint" {"path", "step"} is also accepted.
//   cat "ft":       instant "quorum"    {"quorum", "step", "groups": [int], "group",
//                                        "committed": bool, "dropped": why, "healed",
//                                        "heal_seconds", "heal_wait_seconds"}
//                   span "heal"         {"group", "quorum", "step", "source", "receiving",
//                                        "bytes", "wait_ms"}
//                   span "all_reduce across replica groups"
//                   (replica groups, fsdp/replicas.h: each quorum a rank took part in,
//                   each heal; the report draws participation per group and the heals)
//   counter "memory"  {"current": bytes, "peak": bytes}  (fsdp::memory::stats();
//                   recorded automatically at each span end when
//                   Options::sample_memory and the counting allocator is installed)
//   other counters    {"value": number} or any series -> drawn as-is in Perfetto.
//
// Metadata: set_metadata(key, value) puts value under otherData[key]. The
// report uses (all optional; missing parts of the page say what is missing):
//   "world": int, "rank": int (start() sets both),
//   "strategy": "FULL_SHARD" | "SHARD_GRAD_OP" | "NO_SHARD",
//   "param_dtype": "fp32" | "bf16",            // unsharded / all-gather dtype
//   "param_bytes_per_elem": 4 | 2,             // of param_dtype
//   "master_bytes_per_elem": 4,                // the sharded fp32 master copy
//   "reduce_bytes_per_elem": 4 | 2,            // gradient reduction dtype
//   "optimizer": "adamw" | "sgd" | ... | "other",  // the optimizer table's kind
//   "optimizer_state_per_param": 2 (Adam) | 1 (SGD+momentum) | 0 | ...,
//             // both recorded by FullyShardedModel::ledger(&opt) from what the
//             // optimizer keeps (averaged over its groups); absent, the report
//             // says O is not recorded
//   "units": [ {"index": int, "name": str ("" = root),
//               "numel": int, "padded_numel": int, "shard_numel": int,
//               "unsharded_bytes": int, "shard_bytes": int,
//               "params": [ {"name": str (unwrapped model's name),
//                            "shape": [int...],
//                            "offset": int,   // first element in the unit's flat buffer
//                            "numel": int} ] } ],
//             // rank r owns flat elements [r*shard_numel, (r+1)*shard_numel)
//   "ledger": {"P_full", "P", "G", "O", "P_block", "P_block_unit", "A",
//              "predicted_rest", "predicted_peak", "notes"}   // fsdp::Ledger's fields, bytes,
//             // this rank's values; the memory chart draws the two predictions.
//   "plan": the planner's json (fsdp::plan::Plan::to_json()), optional.
//   "model": str (e.g. "gpt L=6 d=256"), "command": str, anything else: shown raw.
// start() also stores "schema", "rank", "world", "clock_origin_us",
// "dropped_events". merge() writes DIR/trace.json with every rank's events
// (pid = rank, process_name "rank R") and otherData {"schema", "merged": true,
// "ranks": [rank 0's otherData, rank 1's, ...]}.
// ---------------------------------------------------------------------------
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>

#include "fsdp/detail/trace.h"

// The trace recorder: what every thread of a rank did, and when.
// Written as Chrome trace JSON; the file format is in trace.h.
namespace fsdp::trace {

// How much a trace keeps in memory and what it samples.
struct Options {
  // Events kept in memory; beyond this they are dropped (and counted).
  size_t max_events = 1u << 20;
  // At each span end, record counter "memory" {current, peak} from
  // fsdp::memory::stats() when the counting allocator is installed.
  bool sample_memory = true;
};

// Starts recording for this process (rank). Creates DIR. Throws fsdp::Error
// when DIR cannot be created or a trace is already running.
void start(const std::string& dir, int rank, int world, const Options& opts = {});
// Writes DIR/trace-rank<R>.json (temp file + rename) and stops recording.
// Returns the path, "" when no trace was running. Idempotent.
std::string stop();
// Whether a trace is recording: one relaxed atomic load, for hot paths.
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Names the calling thread's track ("comm", "compute", ...).
void set_thread_name(const std::string& name);

// A complete ("X") event from construction to destruction, on this thread.
class Span {
 public:
  // Starts the span when a trace is recording; `args` become the event's args.
  Span(const char* name, const char* cat, nlohmann::json args = nullptr);
  // The same, with a name made at run time.
  Span(std::string name, const char* cat, nlohmann::json args = nullptr);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // Whether it records: build costly args only then.
  bool active() const { return active_; }
  // Adds an argument (ignored when not active). Chainable.
  template <class T>
  Span& arg(const char* key, T&& value) {
    if (active_) args_[key] = std::forward<T>(value);
    return *this;
  }
  // Ends the span now instead of at destruction (idempotent).
  void end();

 private:
  bool active_ = false;
  std::string name_;
  const char* cat_ = "";
  double ts_us_ = 0;
  nlohmann::json args_;
};

// One counter sample: a track named `name` with one series per key.
void counter(const std::string& name, const nlohmann::json& series);
void counter(const std::string& name, double value);  // series {"value": value}
// A zero-duration ("i") event on this thread.
void instant(const std::string& name, const char* cat, const nlohmann::json& args = nullptr);
// Stored under otherData[key] in this rank's file; a later call replaces it.
// Allowed before start() too (kept for the next start()).
void set_metadata(const std::string& key, const nlohmann::json& value);

// Merges DIR/trace-rank*.json into DIR/trace.json (one process track per
// rank). Returns its path. Throws fsdp::Error when DIR has no rank files or a
// file is not a trace.
std::string merge(const std::string& dir);

}  // namespace fsdp::trace

// Pastes two tokens (FSDP_TRACE_CAT's second step).
#define FSDP_TRACE_CAT2(a, b) a##b
// Pastes two tokens after expanding them: a span variable named per __LINE__.
#define FSDP_TRACE_CAT(a, b) FSDP_TRACE_CAT2(a, b)
// A span until the end of the enclosing scope.
#define FSDP_TRACE_SPAN(name, cat) \
  ::fsdp::trace::Span FSDP_TRACE_CAT(fsdp_trace_span_, __LINE__)(name, cat)

// The HTML report of a trace (`fsdp report`).
namespace fsdp::report {

// Reads a trace: DIR with trace-rank*.json files, or one merged trace.json.
// Returns the report's data model (what the HTML draws; also handy in tests):
//   {"world", "strategy", "units": [...], "ranks": [{"rank", "meta",
//    "spans": [[ts_ms, dur_ms, lane, name, unit, bytes], ...],
//    "memory": [[ts_ms, current, peak], ...] (downsampled, peaks kept),
//    "steps": [{"step", "t0", "t1", "ag_bytes", "rs_bytes", "ar_bytes",
//               "other_bytes", "total_bytes", "peak_mem"}],
//    "ckpt": [...], "peak": bytes}],
//    "traffic_lines": {"full_3p", "grad_op_2p", "ddp_2p"}, "warnings": [...]}
// Times are milliseconds from the earliest event of any rank. Throws
// fsdp::Error when nothing readable is found.
nlohmann::json analyze(const std::string& path);

// Writes one self-contained HTML file (no network access needed) for the
// data model of analyze(). Returns the number of bytes written.
int64_t write_html(const nlohmann::json& model, const std::string& out_path,
                   const std::string& title = "fsdp-cpp report");

}  // namespace fsdp::report
