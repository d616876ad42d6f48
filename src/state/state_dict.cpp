// fsdp-cpp: checkpoint — the model's and optimizer's shards as checkpoint
// slices (include/fsdp/state_dict.h; the file format is src/checkpoint/).
//
// A shard view is elements [lo, hi) of its flattened original parameter, the
// exact notion of ckpt::Slice, so every strategy saves and loads the same
// way and resharding N -> M is the checkpoint layer's interval overlap.
//
// Error feedback's residuals (Communicator::residuals; CommOptions::compress)
// are each rank's own: saved per rank (ckpt's per_rank section) as
// "residual/<communicator>/<buffer key>", and given back only to the same
// rank of a run that would key its buffers alike (same world size,
// strategy, compression and units); otherwise dropped with a note.
#include <chrono>
#include <cstdio>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/file_io.h"
#include "compat/torch_compat.h"
#include "state/hf_names.h"
#include "fsdp/progress.h"
#include "fsdp/state_dict.h"
#include "comm/fail_together.h"
#include "common/shard_math.h"
#include "optim/optimizer_state.h"
#include "unit/engine.h"
#include "unit/engine_access.h"

namespace fsdp {
namespace {

using detail::EngineAccess;
using detail::ParamSlot;

// Distinct slots in canonical order.
std::vector<const ParamSlot*> slots(const FullyShardedModel& m) { return EngineAccess(m).slots(); }

// Whether this rank writes shards at all: HYBRID's replica groups other than
// the first save empty slices (hf::owned_range says which elements).
bool writes_shards(const FullyShardedModel& m) { return !m.replica_group() || m.replica_group()->rank() == 0; }

std::pair<int64_t, int64_t> saved_range(const FullyShardedModel& m, const ParamSlot& s) {
  return detail::hf::owned_range(m, s);
}

using detail::OptimizerKind;

// The optimizer's name in a checkpoint ("none" without one).
const char* type_of(const OptimizerKind* k) { return k ? k->type : "none"; }

const torch::optim::OptimizerParamState* find_state(const torch::optim::Optimizer* opt, const ParamSlot& s) {
  if (!opt) return nullptr;
  auto it = opt->state().find(compat::optimizer_state_key(s.shard_view));
  return it == opt->state().end() ? nullptr : it->second.get();
}

// One state tensor of a parameter shard (undefined when it has none yet).
torch::Tensor state_tensor(const OptimizerKind& k, const torch::optim::OptimizerParamState* st, const std::string& f) {
  return st ? k.tensor(*st, f) : torch::Tensor();
}

// The optimizer's state of one parameter shard, rebuilt by its kind from
// loaded tensors (`get(name)`, each [hi-lo] like the shard view) and its
// step, with the tensors its group keeps.
void install_state(torch::optim::Optimizer& opt, const OptimizerKind& k, const detail::GroupOptions& groups,
                   const ParamSlot& s, int64_t step, const detail::TensorOf& get) {
  opt.state()[compat::optimizer_state_key(s.shard_view)] = k.make(groups.of(s.shard_view), step, get);
}

// State tensor `f` of every parameter of unit u laid out like u's master
// shard ([shard_numel], zeros where no state exists), ready for gather_flat.
torch::Tensor optim_flat(const detail::Unit& u, const torch::optim::Optimizer& opt, const OptimizerKind& k,
                         const std::string& f) {
  auto flat = torch::zeros({u.shard_numel}, torch::kFloat32);
  for (auto& s : u.params()) {
    if (s.hi <= s.lo) continue;
    torch::Tensor t = state_tensor(k, find_state(&opt, s), f);
    if (t.defined()) flat.narrow(0, s.offset + s.lo - u.shard_begin, s.hi - s.lo).copy_(t.detach().reshape(-1));
  }
  return flat;
}

// The hyper-parameters of each group and the names of its parameters, for
// the consolidated optimizer file's metadata (informational: loads keep the
// optimizer's own hyper-parameters, as built).
nlohmann::json describe_groups(const FullyShardedModel& m, const torch::optim::Optimizer& opt,
                               const OptimizerKind& k) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (auto* s : slots(m)) names[s->shard_view.unsafeGetTensorImpl()] = s->name;
  nlohmann::json groups = nlohmann::json::array();
  for (auto& g : opt.param_groups()) {
    nlohmann::json j = k.hyper(g.options());
    nlohmann::json params = nlohmann::json::array();
    for (auto& p : g.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      params.push_back(it == names.end() ? std::string("?") : it->second);
    }
    j["params"] = params;
    groups.push_back(j);
  }
  return groups;
}

// Each parameter's optimizer step as rank 0 will save it: the largest any
// rank holds (a rank whose slice of a tiny parameter is empty may hold no
// state for it). Collective; the result is meaningful on rank 0.
std::vector<int64_t> saved_steps(Communicator& comm, const torch::optim::Optimizer* opt, const OptimizerKind* k,
                                 const std::vector<const ParamSlot*>& all) {
  auto steps = torch::zeros({static_cast<int64_t>(all.size())}, torch::kLong);
  auto acc = steps.accessor<int64_t, 1>();
  for (size_t i = 0; i < all.size(); ++i) {
    const torch::optim::OptimizerParamState* st = k ? find_state(opt, *all[i]) : nullptr;
    acc[i] = st ? k->step(*st) : 0;
  }
  const bool root = comm.rank() == 0;
  torch::Tensor gathered = root ? torch::empty({comm.world_size() * steps.numel()}, torch::kLong) : torch::Tensor();
  comm.gather(steps, gathered, 0, {"optimizer steps"})->wait();
  std::vector<int64_t> out(all.size(), 0);
  if (root && !all.empty()) {
    auto best = std::get<0>(gathered.view({comm.world_size(), -1}).max(0));
    for (size_t i = 0; i < all.size(); ++i) out[i] = best[i].item<int64_t>();
  }
  return out;
}

// Rank 0's writer of a full file; an error opening it is kept in `error`
// for the agreement at the end (the other ranks still take part in the
// gathers, so nobody hangs).
std::unique_ptr<ckpt::SafetensorsWriter> open_writer(int rank, const std::string& path,
                                                     const std::vector<ckpt::TensorSpec>& specs,
                                                     const std::map<std::string, std::string>& md,
                                                     std::string& error) {
  if (rank != 0) return nullptr;
  try {
    return std::make_unique<ckpt::SafetensorsWriter>(path, specs, md);
  } catch (const std::exception& e) {
    error = e.what();
    return nullptr;
  }
}

// Rank 0's progress of a full-file save (bytes; shown when it takes more
// than a few seconds, fsdp/progress.h).
std::unique_ptr<Progress> save_progress(int rank, const std::string& path,
                                        const std::vector<ckpt::TensorSpec>& specs, ProgressOptions po = {}) {
  po.label = "saving " + path;
  po.unit = "bytes";
  po.rank = rank;
  po.total = po.initial = 0;
  po.rate_scale = 1;
  po.rate_unit.clear();
  for (auto& sp : specs) {
    int64_t n = 1;
    for (auto d : sp.shape) n *= d;
    po.total += n * static_cast<int64_t>(c10::elementSize(sp.dtype));
  }
  return std::make_unique<Progress>(po);
}

// Rank 0 writes unit u's parameters from their gathered flat buffer, in
// u.params() order (with_tied_names: once more under each tied name, as the model
// file lists them), and reports the bytes; a write error is kept for the
// agreement.
void write_unit(ckpt::SafetensorsWriter* w, const detail::Unit& u, const torch::Tensor& full, bool with_tied_names,
                int64_t& written, Progress& progress, std::string& error) {
  if (!w || !error.empty()) return;
  try {
    for (auto& s : u.params())
      for (size_t i = 0; i <= (with_tied_names ? s.tied_names.size() : 0); ++i) {
        w->write(full.narrow(0, s.offset, s.numel));
        written += s.numel * 4;
      }
    progress.update(written);
  } catch (const std::exception& e) {
    error = e.what();
  }
}

// Every rank learns whether rank 0's write failed, so a failed save throws
// everywhere and nobody hangs.
void fail_together_saving(Communicator& comm, const std::string& error, const std::string& what) {
  fsdp::comm::fail_together(comm, error.empty() ? std::string() : what + " failed: " + error, {what + " status"},
                    [&](const std::vector<int>&) { return what + " failed on rank 0"; });
}

// The strategy as checkpoints record it (ckpt::SaveOptions::strategy).
std::string strategy_text(const FullyShardedModel& m) {
  std::string s = to_string(m.options().strategy);
  if (m.replica_group())
    s += detail::cat(" (shard groups of ", m.shard_group()->world_size(), " x ", m.replica_group()->world_size(),
                     " replicas; replica group 0 wrote the shards)");
  return s;
}

// ---------------------------------------------------------------- error feedback's residuals

// The communicators the model's collectives run on, each once, by the name
// its residuals are saved under: "world" (comm()), and under HYBRID_SHARD
// "shard" and "replica". Every compressing path keeps its residuals on its
// communicator (Communicator::residuals), so this list is all of them.
std::vector<std::pair<std::string, Communicator*>> feedback_comms(const FullyShardedModel& m) {
  std::vector<std::pair<std::string, Communicator*>> out{{"world", m.comm().get()}};
  for (auto [name, c] : {std::make_pair("shard", m.shard_group().get()), std::make_pair("replica", m.replica_group().get())})
    if (c && c != m.comm().get()) out.emplace_back(name, c);
  return out;
}

// What keys the residuals besides the communicator: each unit's name, its
// padded flat size and the dtype its gradients are reduced in (a
// compressible call's label, numel and dtype), as 16 hex digits of FNV-1a 64.
std::string units_signature(const FullyShardedModel& m) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  for (const detail::Unit* u : EngineAccess(m).units())
    mix(detail::cat(u->display_name(), ":", u->padded_numel, ":", c10::toString(u->reduce_dtype), ";"));
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

// This rank's residuals of every communicator into `per_rank`; returns what
// train_state["error_feedback"] records of them ({"compress": {"world":
// "int8"}, "units": signature}), or null when no communicator compresses.
nlohmann::json snapshot_residuals(const FullyShardedModel& m, std::map<std::string, torch::Tensor>& per_rank) {
  nlohmann::json compress = nlohmann::json::object();
  for (auto& [name, c] : feedback_comms(m)) {
    Residuals r = c->residuals();  // copies, after every collective issued so far
    if (r.compress == Compression::OFF) continue;
    compress[name] = to_string(r.compress);
    for (auto& [key, t] : r.by_buffer) per_rank["residual/" + name + "/" + key] = t;
  }
  if (compress.empty()) return nullptr;
  return {{"compress", compress}, {"units", units_signature(m)}};
}

// What a load does with the residuals: read before anything of the model
// changes (load_per_rank is collective and may fail), given to the
// communicators after.
struct ResidualsPlan {
  bool restore = false;  // false: every compressing communicator starts at zero
  std::map<std::string, std::map<std::string, torch::Tensor>> by_comm;  // name -> key -> residual
  std::string note;      // why they were not restored ("" when they were, or none are kept)
};

// Collective. The decision depends only on the checkpoint's metadata and on
// settings every rank shares, so every rank takes the same branch.
ResidualsPlan plan_residuals(const FullyShardedModel& m, const ckpt::LoadResult& r, const ckpt::LoadOptions& lopts) {
  ResidualsPlan plan;
  nlohmann::json here = nlohmann::json::object();
  for (auto& [name, c] : feedback_comms(m)) {
    const Compression k = c->residuals().compress;
    if (k != Compression::OFF) here[name] = to_string(k);
  }
  const nlohmann::json* saved = r.train_state.contains("error_feedback") && r.train_state["error_feedback"].is_object()
                                    ? &r.train_state["error_feedback"]
                                    : nullptr;
  const int world = m.comm()->world_size();
  std::string why;
  if (!saved && here.empty()) return plan;
  if (!saved)
    why = "the checkpoint holds none (it was saved without compression)";
  else if (here.empty())
    why = "this run compresses nothing (CommOptions::compress / FSDP_COMPRESS off, or its path ignores it)";
  else if (r.saved_world_size != world)
    why = detail::cat("they belong to the ranks of a world of ", r.saved_world_size, ", this one has ", world);
  else if (r.saved_strategy != strategy_text(m))
    why = "it was saved with " + r.saved_strategy + ", this run is " + strategy_text(m);
  else if (const nlohmann::json was = saved->contains("compress") ? saved->at("compress") : nlohmann::json(); was != here)
    why = "it was saved with compression " + was.dump() + ", this run has " + here.dump();
  else if (saved->value("units", std::string()) != units_signature(m))
    why = "this run's units (their names, sizes or reduce dtypes) differ from the saved run's, so its buffers "
          "have other keys";
  if (!why.empty()) {
    plan.note = "error feedback's residuals were not restored: " + why +
                "; every compressed buffer's starts at zero (the run is not bit for bit the one that was saved)";
    return plan;
  }
  plan.restore = true;
  for (auto& [name, t] : ckpt::load_per_rank(*m.comm(), r.path, lopts)) {
    const std::string prefix = "residual/";
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t slash = name.find('/', prefix.size());
    if (slash == std::string::npos) continue;
    plan.by_comm[name.substr(prefix.size(), slash - prefix.size())][name.substr(slash + 1)] = t;
  }
  // Recorded, but none of this rank's came back (e.g. resharded offline at
  // the same size, which drops the per_rank section).
  if (plan.by_comm.empty())
    plan.note = "error feedback's residuals were not restored: the checkpoint holds none of this rank's; every "
                "compressed buffer's starts at zero (the run is not bit for bit the one that was saved)";
  return plan;
}

// Every compressing communicator gets its saved residuals, or none (zero).
void apply_residuals(const FullyShardedModel& m, const ResidualsPlan& plan) {
  static const std::map<std::string, torch::Tensor> kNone;
  for (auto& [name, c] : feedback_comms(m)) {
    if (c->residuals().compress == Compression::OFF) continue;
    auto it = plan.by_comm.find(name);
    c->load_residuals(plan.restore && it != plan.by_comm.end() ? it->second : kNone);
  }
}

}  // namespace

std::vector<ckpt::Slice> model_slices(const FullyShardedModel& m) {
  std::vector<ckpt::Slice> out;
  for (auto* s : slots(m)) {
    auto [lo, hi] = saved_range(m, *s);
    torch::Tensor data = s->shard_view.detach();
    if (m.options().strategy == ShardingStrategy::NO_SHARD) data = data.narrow(0, lo, hi - lo);
    if (!writes_shards(m)) data = data.narrow(0, 0, 0);
    out.push_back({s->name, s->shape, torch::kFloat32, lo, hi, data});
  }
  return out;
}

void prepare_background_saves(FullyShardedModel& model, const torch::optim::Optimizer* opt) {
  EngineAccess(model).checkpoint_comm();
  // A snapshot's blocks, written once and freed: the counting allocator
  // caches them (fsdp/memory.h), so the first snapshot's copies do not
  // fault in fresh pages while training waits.
  const size_t copies = 1 + detail::saved_tensors(detail::checkpoint_kind(opt), opt).size();
  std::vector<torch::Tensor> warm;
  for (const ParamSlot* s : slots(model)) {
    auto [lo, hi] = saved_range(model, *s);
    if (hi <= lo) continue;
    for (size_t c = 0; c < copies; ++c) warm.push_back(torch::zeros({hi - lo}, torch::kFloat32));
  }
}

void wait_for_snapshot(FullyShardedModel& model) { EngineAccess(model).wait_for_snapshot(); }

std::optional<ckpt::SaveResult> wait_for_checkpoint(FullyShardedModel& model) {
  std::unique_ptr<ckpt::BackgroundSave> s = EngineAccess(model).take_background_save();
  if (!s) return std::nullopt;
  trace::Span span("checkpoint_wait", "ckpt", {{"step", s->step()}});
  return s->wait();
}

ckpt::SaveResult save_checkpoint(FullyShardedModel& model, const torch::optim::Optimizer* opt,
                                 const std::string& root, int64_t step, const nlohmann::json& train_state,
                                 const CheckpointOptions& copts) {
  const auto began = std::chrono::steady_clock::now();
  // An optimizer no checkpoint can hold is refused first, before anything
  // waits or is written (the same on every rank).
  const OptimizerKind* k = detail::checkpoint_kind(opt);
  const std::vector<std::string> fields = detail::saved_tensors(k, opt);
  model.wait_pending();
  wait_for_checkpoint(model);  // one save at a time: the previous one first (its error, here)
  trace::Span span("checkpoint_save", "ckpt", {{"step", step}, {"async", copts.async}});
  const bool no_shard = model.options().strategy == ShardingStrategy::NO_SHARD;
  std::vector<ckpt::Slice> optim;
  nlohmann::json steps = nlohmann::json::object();
  const auto all = slots(model);
  const auto step_of = saved_steps(*model.comm(), opt, k, all);
  for (size_t i = 0; i < all.size(); ++i) {
    const ParamSlot* s = all[i];
    const torch::optim::OptimizerParamState* st = find_state(opt, *s);
    steps[s->name] = step_of[i];
    auto [lo, hi] = saved_range(model, *s);
    for (auto& f : fields) {
      torch::Tensor t = state_tensor(*k, st, f);
      // No state yet (before the first step): zeros, which is what the
      // optimizers initialise it to.
      torch::Tensor data = t.defined() ? t.detach().reshape(-1) : torch::zeros({s->hi - s->lo});
      if (no_shard) data = data.narrow(0, lo, hi - lo);
      if (!writes_shards(model)) data = data.narrow(0, 0, 0);
      optim.push_back({s->name + "." + f, s->shape, torch::kFloat32, lo, hi, data});
    }
  }
  nlohmann::json ts = train_state;
  ts["optimizer"] = {{"type", type_of(k)}, {"step", steps}};
  // This rank's residuals: copies already, so a background save's snapshot
  // holds them as they are now.
  std::map<std::string, torch::Tensor> residuals;
  if (nlohmann::json ef = snapshot_residuals(model, residuals); !ef.is_null()) ts["error_feedback"] = ef;
  ckpt::SaveOptions so;
  so.keep_last = copts.keep_last;
  so.fsync = copts.fsync;
  so.max_write_bytes_per_second = copts.max_write_bytes_per_second;
  so.progress = copts.progress;
  so.strategy = strategy_text(model);
  if (!copts.async)
    return ckpt::save_sharded(*model.comm(), root, step, model_slices(model), optim, ts, so, residuals);
  const EngineAccess access(model);
  auto bg = std::make_unique<ckpt::BackgroundSave>(
      access.checkpoint_comm(), root, step, model_slices(model), optim, std::move(ts), so,
      copts.snapshot_on_thread ? ckpt::SnapshotCopy::ON_THREAD : ckpt::SnapshotCopy::IN_CALLER, residuals);
  ckpt::SaveResult r;
  r.path = bg->path();
  r.in_background = true;
  r.snapshot_bytes = bg->snapshot_bytes();
  access.keep_background_save(std::move(bg));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return r;
}

ckpt::LoadResult load_checkpoint(FullyShardedModel& model, torch::optim::Optimizer* opt,
                                 const std::string& path_or_root, const ckpt::LoadOptions& lopts) {
  // Refused first, also when there is no checkpoint yet: a job that resumes
  // learns at its start that its saves would fail.
  const OptimizerKind* k = detail::checkpoint_kind(opt);
  const std::vector<std::string> fields = detail::saved_tensors(k, opt);
  model.wait_pending();
  wait_for_checkpoint(model);  // a background save is committed (or failed, here) before anything is read
  // A checkpoint root that was never created is "no checkpoint yet": a
  // (re)started job with --resume starts fresh instead of failing.
  if (!ckpt::detail::path_exists(path_or_root)) {
    ckpt::LoadResult none;
    none.note = "'" + path_or_root + "' does not exist yet";
    return none;
  }
  trace::Span span("checkpoint_load", "ckpt");
  // Destinations: temporaries for everything, copied into the model and the
  // optimizer only once load_sharded succeeded on every rank.
  std::vector<ckpt::Slice> want_model, want_optim;
  std::vector<std::pair<const ParamSlot*, torch::Tensor>> param_tmp;
  struct OptTmp {
    const ParamSlot* slot;
    std::string field;
    torch::Tensor tmp;
  };
  std::vector<OptTmp> opt_tmp;
  for (auto* s : slots(model)) {
    auto t = torch::empty({s->hi - s->lo}, torch::kFloat32);
    want_model.push_back({s->name, s->shape, torch::kFloat32, s->lo, s->hi, t});
    param_tmp.emplace_back(s, t);
    for (auto& f : fields) {
      auto o = torch::empty({s->hi - s->lo}, torch::kFloat32);
      want_optim.push_back({s->name + "." + f, s->shape, torch::kFloat32, s->lo, s->hi, o});
      opt_tmp.push_back({s, f, o});
    }
  }
  auto r = ckpt::load_sharded(*model.comm(), path_or_root, want_model, want_optim, lopts);
  if (!r.found) return r;
  // The optimizer type must match what was saved (its state has other fields).
  std::string saved_type = r.train_state.contains("optimizer") ? r.train_state["optimizer"].value("type", "none") : "none";
  if (k && saved_type != type_of(k))
    throw Error("checkpoint " + r.path + " holds " + saved_type + " optimizer state, but the optimizer given is " +
                type_of(k) + ". Fix: build the same optimizer type as when saving.");
  // Read before the model changes: a failure here still leaves it as it was.
  const ResidualsPlan residuals = plan_residuals(model, r, lopts);
  if (!residuals.note.empty()) {
    r.note = r.note.empty() ? residuals.note : r.note + "; " + residuals.note;
    if (model.comm()->rank() == 0) {
      std::fprintf(stderr, "fsdp: loading %s: %s.\n", r.path.c_str(), residuals.note.c_str());
      std::fflush(stderr);
    }
  }
  torch::NoGradGuard ng;
  for (auto& [s, t] : param_tmp) s->shard_view.detach().copy_(t);
  if (k) {
    const detail::GroupOptions groups(*opt);
    auto& steps = r.train_state["optimizer"]["step"];
    for (auto* s : slots(model)) {
      const int64_t step = steps.value(s->name, int64_t(0));
      install_state(*opt, *k, groups, *s, step, [&](const std::string& f) {
        for (auto& o : opt_tmp)
          if (o.slot == s && o.field == f) return o.tmp;
        return torch::Tensor();
      });
    }
  }
  apply_residuals(model, residuals);
  // NO_SHARD in low precision refreshes its compute copy at the next forward.
  return r;
}

void save_full(const FullyShardedModel& model, const std::string& path, const ProgressOptions& progress_opts) {
  const EngineAccess engine(model);
  engine.finish_pending_reductions();
  Communicator& comm = *model.comm();
  trace::Span span("checkpoint_save_full", "ckpt");
  std::vector<ckpt::TensorSpec> specs;
  for (auto& u : engine.units())
    for (auto& s : u->params()) {
      specs.push_back({s.name, s.shape, torch::kFloat32});
      for (auto& a : s.tied_names) specs.push_back({a, s.shape, torch::kFloat32});
    }
  auto buffers = model.module().named_buffers(/*recurse=*/true);
  for (auto& b : buffers) specs.push_back({b.key(), b.value().sizes().vec(), b.value().scalar_type()});

  // Rank 0 streams unit by unit; the others only send their shards. A
  // failure to write on rank 0 is agreed on at the end so no rank hangs.
  std::string error;
  auto w = open_writer(comm.rank(), path, specs, {{"format", "pt"}}, error);
  auto progress = save_progress(comm.rank(), path, specs, progress_opts);
  int64_t written = 0;
  torch::NoGradGuard ng;
  for (auto& u : engine.units()) {
    if (u->empty()) continue;
    torch::Tensor full = detail::gather_flat(*u, u->shard, 0, "save_full");
    write_unit(w.get(), *u, full, /*with_tied_names=*/true, written, *progress, error);
  }
  if (w && error.empty()) try {
      for (auto& b : buffers) {
        w->write(b.value());
        written += b.value().numel() * static_cast<int64_t>(b.value().element_size());
      }
      w->finish();
      if (!buffers.is_empty()) progress->update(written);
    } catch (const std::exception& e) {
      error = e.what();
    }
  fail_together_saving(comm, error, "saving the full state dict to '" + path + "'");
}

void save_full_optim(const FullyShardedModel& model, const torch::optim::Optimizer& opt, const std::string& path) {
  const OptimizerKind& k = *detail::checkpoint_kind(&opt);  // before anything waits or is written
  const EngineAccess engine(model);
  engine.finish_pending_reductions();
  Communicator& comm = *model.comm();
  trace::Span span("checkpoint_save_full_optim", "ckpt");
  const auto fields = detail::saved_tensors(&k, &opt);
  const auto all = slots(model);
  const auto steps = saved_steps(comm, &opt, &k, all);

  // Data order: unit by unit, field by field, parameter by parameter, so
  // each gathered [padded] buffer is written out before the next is made;
  // the steps (scalars) come last.
  std::vector<ckpt::TensorSpec> specs;
  for (auto& u : engine.units())
    for (auto& f : fields)
      for (auto& s : u->params()) specs.push_back({s.name + "." + f, s.shape, torch::kFloat32});
  for (auto* s : all) specs.push_back({s->name + ".step", {}, torch::kLong});

  std::string error;
  auto w = open_writer(comm.rank(), path, specs,
                       {{"format", "fsdp-optim"},
                        {"optimizer", k.type},
                        {"param_groups", describe_groups(model, opt, k).dump()}},
                       error);
  auto progress = save_progress(comm.rank(), path, specs);
  int64_t written = 0;
  torch::NoGradGuard ng;
  for (auto& u : engine.units()) {
    if (u->empty()) continue;
    for (auto& f : fields) {
      torch::Tensor full = detail::gather_flat(*u, optim_flat(*u, opt, k, f), 0, "save_full_optim");
      write_unit(w.get(), *u, full, /*with_tied_names=*/false, written, *progress, error);
    }
  }
  if (w && error.empty()) try {
      for (auto step : steps) w->write(torch::tensor({step}, torch::kLong));
      w->finish();
      progress->update(written + static_cast<int64_t>(steps.size()) * 8);
    } catch (const std::exception& e) {
      error = e.what();
    }
  fail_together_saving(comm, error, "saving the full optimizer state to '" + path + "'");
}

void load_full_optim(FullyShardedModel& model, torch::optim::Optimizer& opt, const std::string& path,
                     const ckpt::LoadOptions& lopts) {
  const OptimizerKind& k = *detail::checkpoint_kind(&opt);  // before anything waits or is read
  model.wait_pending();
  wait_for_snapshot(model);  // a background save's snapshot is copied before the state changes
  Communicator& comm = *model.comm();
  trace::Span span("checkpoint_load_full_optim", "ckpt");
  // What the file is: checked on every rank before any tensor is read; the
  // ranks agree, so a wrong file fails everywhere with the same message.
  std::string error;
  try {
    ckpt::SafetensorsReader r(path);
    auto md = r.metadata();
    auto format = md.count("format") ? md.at("format") : std::string("(none)");
    auto saved = md.count("optimizer") ? md.at("optimizer") : std::string("(none)");
    if (format != "fsdp-optim")
      error = "'" + path + "' is not a consolidated optimizer file: expected metadata format 'fsdp-optim', found '" +
              format + "'. Fix: pass the file written by fsdp::save_full_optim (model weights load with load_full).";
    else if (saved != k.type)
      error = "'" + path + "' holds " + saved + " optimizer state, but the optimizer given is " + k.type +
              ". Fix: build the same optimizer type as when saving.";
  } catch (const std::exception& e) {
    error = e.what();
  }
  fsdp::comm::fail_together(comm, error, {"load_full_optim check"}, [&](const std::vector<int>&) {
    return "loading the optimizer state from '" + path + "' failed on another rank";
  });

  const auto fields = detail::saved_tensors(&k, &opt);
  std::vector<ckpt::Slice> want;
  struct Tmp {
    const ParamSlot* slot;
    std::string field;
    torch::Tensor tmp;
  };
  std::vector<Tmp> tmps;
  for (auto* s : slots(model)) {
    for (auto& f : fields) {
      auto t = torch::empty({s->hi - s->lo}, torch::kFloat32);
      want.push_back({s->name + "." + f, s->shape, torch::kFloat32, s->lo, s->hi, t});
      tmps.push_back({s, f, t});
    }
    auto step = torch::zeros({1}, torch::kLong);
    want.push_back({s->name + ".step", {}, torch::kLong, 0, 1, step});
    tmps.push_back({s, "step", step});
  }
  ckpt::load_full_safetensors(comm, path, want, lopts);
  const detail::GroupOptions groups(opt);
  for (auto* s : slots(model)) {
    auto get = [&](const std::string& f) {
      for (auto& t : tmps)
        if (t.slot == s && t.field == f) return t.tmp;
      return torch::Tensor();
    };
    install_state(opt, k, groups, *s, get("step").item<int64_t>(), get);
  }
}

int64_t load_full(FullyShardedModel& model, const std::string& path, const ckpt::LoadOptions& lopts) {
  model.wait_pending();
  wait_for_snapshot(model);  // a background save's snapshot is copied before the shards change
  trace::Span span("checkpoint_load_full", "ckpt");
  std::vector<ckpt::Slice> want;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // dst, tmp
  for (auto* s : slots(model)) {
    auto t = torch::empty({s->hi - s->lo}, torch::kFloat32);
    want.push_back({s->name, s->shape, torch::kFloat32, s->lo, s->hi, t});
    copies.emplace_back(s->shard_view.detach(), t);
    for (auto& a : s->tied_names)  // tied names: present in the file, read and dropped
      want.push_back({a, s->shape, torch::kFloat32, s->lo, s->hi, torch::empty({s->hi - s->lo})});
  }
  for (auto& b : model.module().named_buffers(/*recurse=*/true)) {
    auto t = torch::empty({b.value().numel()}, b.value().scalar_type());
    want.push_back({b.key(), b.value().sizes().vec(), b.value().scalar_type(), 0, b.value().numel(), t});
    copies.emplace_back(b.value(), t);
  }
  const int64_t bytes = ckpt::load_full_safetensors(*model.comm(), path, want, lopts);
  torch::NoGradGuard ng;
  for (auto& [dst, tmp] : copies) dst.view({-1}).copy_(tmp);
  return bytes;
}

}  // namespace fsdp
