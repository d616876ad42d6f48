// fsdp-cpp checkpoints: finding and loading checkpoints (collective), all or
// nothing.
//
// The load path: resolve the directory -> parse and check metadata.json ->
// check keys, shapes, dtypes against what this rank wants -> plan the reads
// (only pieces overlapping this rank's slices: N -> M resharding) -> read them
// into temporaries, checking every chunk's CRC32C -> all ranks agree -> copy
// into the destinations. Until the agreement nothing the caller owns is
// written, so any error on any rank leaves every model and optimizer as it was.
// Memory: the temporaries are one extra copy of this rank's slices.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "checkpoint/collective.h"
#include "checkpoint/file_io.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/safetensors.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;
namespace d = detail;

std::string resolve_checkpoint(const std::string& path, std::string* note) {
  if (!d::path_exists(path))
    throw Error(cat("checkpoint path '", path, "' does not exist. Pass a checkpoint root (a directory with `latest`) "
                    "or a checkpoint directory (with metadata.json)."));
  if (!d::is_directory(path))
    throw Error(cat("checkpoint path '", path, "' is a file; expected a checkpoint root or checkpoint directory "
                    "(a full .safetensors file loads with load_full_safetensors)."));
  if (d::path_exists(d::join_path(path, d::kMetadataFile))) return path;
  std::string latest_target;
  std::string lp = d::join_path(path, d::kLatestFile);
  if (d::path_exists(lp)) {
    std::string t = d::read_small_file(lp, 4096);
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ' || t.back() == '\r')) t.pop_back();
    int64_t step;
    if (d::parse_step_dir_name(t, &step) && d::path_exists(d::join_path(d::join_path(path, t), d::kMetadataFile)))
      return d::join_path(path, t);
    latest_target = t;
  }
  // No usable `latest`: the newest complete step directory (a kill can leave
  // `latest` behind a published directory, never ahead of one).
  int64_t best = -1;
  std::string best_name;
  for (auto& n : d::list_dir(path)) {
    int64_t step;
    if (d::parse_step_dir_name(n, &step) && step > best &&
        d::path_exists(d::join_path(d::join_path(path, n), d::kMetadataFile))) {
      best = step;
      best_name = n;
    }
  }
  if (best_name.empty()) return "";
  if (note && d::path_exists(lp))
    *note = cat("`latest` in '", path, "' names '", latest_target, "', which is not a complete checkpoint; used ",
                best_name, ", the newest complete one");
  return d::join_path(path, best_name);
}

namespace {

struct Available {
  std::vector<int64_t> shape;
  torch::ScalarType dtype;
};

// Staged result for one wanted slice: what will be copied in after agreement.
struct Staged {
  Slice* dst;
  torch::Tensor tmp;
};

template <class... Ts>
[[noreturn]] void fail(const Ts&... xs) {
  throw Error(cat(xs...));
}

std::string list_names(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", '" : "'") + v[i] + "'";
  if (v.size() > 5) s += cat(" and ", v.size() - 5, " more");
  return s;
}

// Missing / unexpected keys, shapes, dtypes: throws the first problem found,
// naming the key, expected vs found and what to do.
void check_keys(const std::string& ctx, const char* section, const std::vector<Slice>& wanted,
                const std::map<std::string, Available>& avail, const LoadOptions& opts, const std::string& other_model) {
  std::set<std::string> wanted_names;
  std::vector<std::string> missing, unexpected;
  for (auto& s : wanted) {
    wanted_names.insert(s.name);
    if (!avail.count(s.name)) missing.push_back(s.name);
  }
  for (auto& [name, a] : avail)
    if (!wanted_names.count(name)) unexpected.push_back(name);
  if (!missing.empty())
    fail(ctx, ": ", other_model, missing.size(), " ", section, " tensor(s) this model expects are missing: ",
         list_names(missing), ". Load a checkpoint saved from this model (same parameter names), or "
         "initialise those tensors yourself and load the rest from a checkpoint that has them.");
  if (!unexpected.empty() && opts.strict)
    fail(ctx, ": ", other_model, unexpected.size(), " unexpected ", section, " tensor(s) in the checkpoint that this ",
         "model does not have: ", list_names(unexpected), ". Load with LoadOptions::strict = false to ignore them.");
  for (auto& s : wanted) {
    const Available& a = avail.at(s.name);
    if (a.shape != s.full_shape)
      fail(ctx, ": ", other_model, section, " tensor '", s.name, "': checkpoint has shape ", shape_str(a.shape),
           ", this model expects ", shape_str(s.full_shape), ". Build the model with the configuration it was saved with.");
    if (a.dtype != s.dtype) {
      bool castable = opts.allow_dtype_cast && c10::isFloatingType(a.dtype) && c10::isFloatingType(s.dtype);
      if (!castable)
        fail(ctx, ": ", section, " tensor '", s.name, "': checkpoint has dtype ", safetensors_dtype_name(a.dtype),
             ", this model expects ", safetensors_dtype_name(s.dtype),
             ". Set LoadOptions::allow_dtype_cast = true to convert floating-point values, or build the model in ",
             safetensors_dtype_name(a.dtype), ".");
    }
  }
}

// After every rank agreed: the only writes to caller-owned tensors.
void commit(std::vector<Staged>& staged) {
  torch::NoGradGuard no_grad;
  for (auto& s : staged) {
    torch::Tensor t = s.tmp.to(s.dst->dtype);
    s.dst->data.copy_(t.reshape(s.dst->data.sizes()));
  }
}

}  // namespace

namespace {

// One section's wanted slices checked against metadata.json and read into
// temporaries (`staged`), every chunk verified by `reader`.
void read_section(const std::string& ctx, d::PieceReader& reader, const d::Metadata& meta, const char* section,
                  std::vector<Slice>& wanted, const LoadOptions& opts, const std::string& other_model,
                  std::vector<Staged>* staged) {
  static const std::map<std::string, d::TensorMeta> kNone;
  auto it = meta.sections.find(section);
  const auto& tensors = it == meta.sections.end() ? kNone : it->second;
  std::map<std::string, Available> avail;
  for (auto& [name, t] : tensors) avail[name] = {t.shape, t.dtype};
  check_keys(ctx, section, wanted, avail, opts, other_model);
  for (auto& s : wanted) {
    if (s.hi == s.lo) continue;
    const d::TensorMeta& t = tensors.at(s.name);
    std::string what = cat(ctx, ": ", section, " tensor '", s.name, "'");
    auto tmp = torch::empty({s.hi - s.lo}, torch::TensorOptions().dtype(t.dtype));
    char* base = static_cast<char*>(tmp.data_ptr());
    int64_t es = d::element_size(t.dtype);
    for (auto& op : d::plan_reads(what, t, s.lo, s.hi))
      reader.read(section, s.name, t, t.pieces[op.piece], op.src_lo, op.src_hi, base + op.dst_offset * es);
    staged->push_back({&s, tmp});
  }
}

// Phase 2 of a load from checkpoint directory res->path: read and check
// everything into `staged`. Returns this rank's error ("" when none).
std::string read_checkpoint(Communicator& comm, LoadResult* res, std::vector<Slice>& model, std::vector<Slice>& optim,
                            const LoadOptions& opts, std::vector<Staged>* staged) {
  const int rank = comm.rank(), world = comm.world_size();
  staged->clear();
  try {
    d::Metadata meta = d::Metadata::load(res->path);
    res->step = meta.step;
    res->saved_world_size = meta.world_size;
    res->saved_strategy = meta.strategy;
    const std::string ctx = cat("checkpoint '", res->path, "' (step ", meta.step, ", saved at world size ",
                                meta.world_size, " with ", meta.strategy, "; loading at world size ", world, ")");
    d::check_slices(d::kModel, model, true);
    d::check_slices(d::kOptim, optim, true);

    std::string other_model;
    if (!model.empty()) {
      std::map<std::string, std::vector<int64_t>> shapes;
      for (auto& s : model) shapes[s.name] = s.full_shape;
      std::string fp = d::model_fingerprint(shapes);
      if (fp != meta.fingerprint)
        other_model = cat("the checkpoint is from another model (fingerprint ", meta.fingerprint,
                          ", this model ", fp, "): ");
    }
    d::PieceReader reader(res->path, meta, opts.verify_checksums);
    // The per_rank section is not read here (load_per_rank reads it).
    for (auto sec : {std::make_pair(d::kModel, &model), std::make_pair(d::kOptim, &optim)}) {
      std::vector<Slice>& wanted = *sec.second;
      if (wanted.empty()) continue;  // e.g. weights only: the optimizer section is skipped
      read_section(ctx, reader, meta, sec.first, wanted, opts, sec.first == std::string(d::kModel) ? other_model : "",
                   staged);
    }
    res->bytes_read = reader.bytes_read();
    res->train_state = meta.train_state;
  } catch (const std::exception& e) {
    staged->clear();
    return cat("rank ", rank, ": ", e.what());
  }
  return "";
}

// The complete checkpoints of `root` older than `step`, newest first.
std::vector<std::string> older_checkpoints(const std::string& root, int64_t step) {
  std::vector<std::pair<int64_t, std::string>> all;
  for (auto& n : d::list_dir(root)) {
    int64_t s;
    if (d::parse_step_dir_name(n, &s) && s < step && d::path_exists(d::join_path(d::join_path(root, n), d::kMetadataFile)))
      all.push_back({s, n});
  }
  std::sort(all.rbegin(), all.rend());
  std::vector<std::string> out;
  for (auto& [s, n] : all) out.push_back(d::join_path(root, n));
  return out;
}

// The step of a checkpoint directory from its name (metadata.json may be
// what is damaged).
int64_t step_of_dir(const std::string& dir) {
  int64_t s = -1;
  d::parse_step_dir_name(d::base_name(dir), &s);
  return s;
}

}  // namespace

LoadResult load_sharded(Communicator& comm, const std::string& path_or_root, std::vector<Slice>& model,
                        std::vector<Slice>& optim, const LoadOptions& opts) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::string consequence = "nothing was loaded: every model and optimizer tensor is unchanged";
  LoadResult res;
  std::string err;

  // Phase 1: where is it? Every rank must find the same answer.
  try {
    res.path = resolve_checkpoint(path_or_root, &res.note);
  } catch (const std::exception& e) {
    err = cat("rank ", rank, ": ", e.what());
  }
  d::fail_together_at(comm, "loading a checkpoint (finding it)", err, consequence);
  {
    auto found = torch::full({1}, res.path.empty() ? 0.0f : 1.0f);
    comm.all_reduce(found, ReduceOp::SUM, CollectiveInfo{"checkpoint load: found"})->wait();
    float n = found.item<float>();
    if (n == 0.0f) return res;  // nothing yet: start fresh
    if (n != static_cast<float>(world))
      throw Error(cat("loading '", path_or_root, "': only ", static_cast<int>(n), " of ", world,
                      " ranks see a checkpoint there. Every rank must see the same file system (shared storage)."));
  }
  res.found = true;
  // Given a root, a damaged newest checkpoint (a flipped byte, a truncated
  // file) is skipped, loudly, for the newest one that verifies, so a restart
  // loop does not die on the same file every time. A named checkpoint
  // directory loads as it is or fails.
  const bool from_root = res.path != path_or_root;
  std::vector<std::string> skipped;  // "step-000010 (fault)"
  std::vector<std::string> candidates;
  bool listed = false;
  std::vector<Staged> staged;

  for (;;) {
    // Phase 2: read and check everything into temporaries.
    err = read_checkpoint(comm, &res, model, optim, opts, &staged);
    if (!from_root) {
      d::fail_together_at(comm, "loading a checkpoint", err, consequence);
      commit(staged);
      return res;
    }
    std::string failure;
    try {
      d::fail_together_at(comm, "loading a checkpoint", err, consequence);
    } catch (const Error& e) {
      failure = e.what();
    }
    if (failure.empty()) break;
    // Damaged, or a genuine mismatch (another model, wrong shapes)? Rank 0
    // verifies every byte of the files and tells the others.
    std::string faults;
    if (rank == 0) {
      auto f = verify_checkpoint(res.path);
      for (size_t i = 0; i < f.size() && i < 3; ++i) {
        std::string one = f[i];
        while (!one.empty() && (one.back() == '.' || one.back() == ' ')) one.pop_back();
        faults += (i ? "; " : "") + one;
      }
      if (f.size() > 3) faults += cat("; and ", f.size() - 3, " more");
    }
    auto damaged = torch::full({1}, rank == 0 && !faults.empty() ? 1.0f : 0.0f);
    comm.all_reduce(damaged, ReduceOp::SUM, CollectiveInfo{"checkpoint load: verified"})->wait();
    if (damaged.item<float>() == 0.0f) throw Error(failure);  // sound files: the mismatch is the error
    if (!listed) candidates = older_checkpoints(path_or_root, step_of_dir(res.path)), listed = true;
    const std::string name = d::base_name(res.path);
    skipped.push_back(rank == 0 ? cat(name, " (", faults, ")") : name);
    if (candidates.empty()) {
      std::string all;
      for (auto& s : skipped) all += (all.empty() ? "" : ", ") + s;
      throw Error(cat("loading '", path_or_root, "': no checkpoint there verifies; every one is damaged: ", all,
                      "; ", consequence, ". Inspect them with `fsdp ckpt verify DIR`; delete the damaged ones to "
                      "start fresh, or restore them from a copy."));
    }
    const std::string next = candidates.front();
    candidates.erase(candidates.begin());
    if (rank == 0) {
      std::fprintf(stderr,
                   "fsdp: WARNING: checkpoint '%s' is damaged and was skipped: %s. Trying '%s', the next older "
                   "checkpoint (the damaged one stays for inspection: fsdp ckpt verify %s; saving that step again "
                   "replaces it).\n",
                   res.path.c_str(), faults.c_str(), next.c_str(), res.path.c_str());
      std::fflush(stderr);
    }
    res.path = next;
  }
  if (!skipped.empty()) {
    std::string all;
    for (auto& s : skipped) all += (all.empty() ? "" : ", ") + s;
    const std::string note = cat("skipped ", skipped.size(), " damaged checkpoint", skipped.size() == 1 ? " that fails" : "s that fail",
                                 " verification: ", all, "; loaded ", d::base_name(res.path),
                                 ", the newest that verifies");
    res.note = res.note.empty() ? note : res.note + "; " + note;
    if (rank == 0) {
      std::fprintf(stderr, "fsdp: WARNING: resuming from '%s' (step %lld), not from the newest checkpoint: %s.\n",
                   res.path.c_str(), static_cast<long long>(res.step), note.c_str());
      std::fflush(stderr);
    }
  }
  // Phase 3: every rank has everything; now, and only now, write destinations.
  commit(staged);
  return res;
}

std::map<std::string, torch::Tensor> load_per_rank(Communicator& comm, const std::string& checkpoint_dir,
                                                   const LoadOptions& opts) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::string prefix = d::per_rank_prefix(rank);
  std::vector<Slice> wanted;  // every rank's names (so none is unexpected); this rank's whole, the others empty
  std::vector<Staged> staged;
  std::string err;
  try {
    d::Metadata meta = d::Metadata::load(checkpoint_dir);
    const std::string ctx = cat("checkpoint '", checkpoint_dir, "' (step ", meta.step, ", saved at world size ",
                                meta.world_size, " with ", meta.strategy, "; loading at world size ", world, ")");
    if (meta.world_size != world)
      throw Error(cat(ctx, ": its per-rank tensors belong to the ranks of a world of ", meta.world_size,
                      ", not to this world of ", world, ". Expected the same world size; at another, start them "
                      "afresh instead of loading them"));
    auto it = meta.sections.find(d::kPerRank);
    if (it != meta.sections.end()) {
      wanted.reserve(it->second.size());  // staged keeps pointers into it
      for (auto& [name, t] : it->second) {
        const bool mine = name.rfind(prefix, 0) == 0;
        wanted.push_back({name, t.shape, t.dtype, 0, mine ? t.numel() : 0,
                          mine ? torch::empty({t.numel()}, torch::TensorOptions().dtype(t.dtype)) : torch::Tensor()});
      }
      d::PieceReader reader(checkpoint_dir, meta, opts.verify_checksums);
      read_section(ctx, reader, meta, d::kPerRank, wanted, opts, "", &staged);
    }
  } catch (const std::exception& e) {
    staged.clear();
    err = cat("rank ", rank, ": ", e.what());
  }
  d::fail_together_at(comm, "loading per-rank tensors", err, "none was loaded");
  commit(staged);
  std::map<std::string, torch::Tensor> out;
  for (auto& s : wanted)
    if (s.hi > s.lo) out[s.name.substr(prefix.size())] = s.data;
  return out;
}

int64_t load_full_safetensors(Communicator& comm, const std::string& path, std::vector<Slice>& wanted,
                              const LoadOptions& opts) {
  const int rank = comm.rank();
  std::vector<Staged> staged;
  std::string err;
  int64_t bytes = 0;
  try {
    d::check_slices("model", wanted, true);
    SafetensorsReader r(path);
    std::map<std::string, Available> avail;
    for (auto& e : r.entries()) avail[e.name] = {e.shape, e.dtype};
    check_keys(cat("safetensors file '", path, "'"), "model", wanted, avail, opts, "");
    for (auto& s : wanted) {
      if (s.hi == s.lo) continue;
      staged.push_back({&s, r.read(s.name, s.lo, s.hi)});
      bytes += (s.hi - s.lo) * static_cast<int64_t>(c10::elementSize(avail.at(s.name).dtype));
    }
  } catch (const std::exception& e) {
    err = cat("rank ", rank, ": ", e.what());
  }
  d::fail_together_at(comm, "loading a safetensors file", err, "nothing was loaded: every tensor is unchanged");
  commit(staged);
  return bytes;
}

int64_t write_full_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                               const std::function<torch::Tensor(const TensorSpec&)>& produce,
                               const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> md = metadata;
  md.emplace("format", "pt");  // what Hugging Face loaders look for
  SafetensorsWriter w(path, specs, md);
  for (auto& s : specs) {
    torch::Tensor t = produce(s);
    if (!t.defined() || t.numel() != numel_of(s.shape))
      throw Error(cat("writing '", path, "': tensor '", s.name, "' declared ", shape_str(s.shape), " but produced ",
                      t.defined() ? shape_str(t.sizes().vec()) : std::string("nothing"), "."));
    w.write(t);
  }
  return w.finish();
}

}  // namespace fsdp::ckpt
