// fsdp-cpp checkpoints: saving a sharded checkpoint (collective).
//
// The write path, and what a kill at each point leaves behind:
//   1. rank 0 creates root/.tmp-step-N             -> previous checkpoint intact
//   2. every rank writes + fsyncs its shard file and its index
//   3. rank 0 merges the indexes into metadata.json (fsync), fsyncs the dir
//   4. rank 0 renames .tmp-step-N -> step-N, fsyncs root (a step-N saved
//      before is swapped with the new one atomically, then removed: never
//      deleted first)               -> step-N complete; `latest` still
//                                                     names the previous one
//   5. rank 0 rewrites `latest` (temp, fsync, rename, fsync root)
//   6. rank 0 deletes checkpoints beyond keep_last (rename to .trash-*, then delete)
// Readers only ever follow `latest` or a directory with metadata.json, and
// metadata.json is only ever written into a directory that has every shard.
#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "checkpoint/collective.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "comm/fail_together.h"
#include "fsdp/progress.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;

namespace detail {

void fail_together_at(Communicator& comm, const char* phase, const std::string& local_error, const std::string& consequence) {
  fsdp::comm::fail_together(comm, local_error, CollectiveInfo{cat("checkpoint ", phase)}, [&](const std::vector<int>& failed) {
    std::string list;
    for (size_t i = 0; i < failed.size(); ++i) list += (i ? ", " : "") + std::to_string(failed[i]);
    return cat(phase, " failed on rank(s) ", list, " (see their messages); ", consequence, ".");
  });
}

void check_slices(const char* section, const std::vector<Slice>& slices, bool for_load) {
  std::set<std::string> seen;
  for (auto& s : slices) {
    std::string what = cat(section, " tensor '", s.name, "'");
    if (s.name.empty()) throw Error(cat(section, ": a slice has an empty name; every tensor needs its name."));
    if (!seen.insert(s.name).second)
      throw Error(cat(what, " is listed twice on this rank; give each tensor once (one slice [lo, hi))."));
    int64_t n = checked_numel(s.full_shape);
    if (n < 0) throw Error(cat(what, ": invalid full shape ", shape_str(s.full_shape), "."));
    safetensors_dtype_name(s.dtype);  // throws for dtypes the format cannot hold
    if (s.lo < 0 || s.lo > s.hi || s.hi > n)
      throw Error(cat(what, ": slice [", s.lo, ", ", s.hi, ") expected within [0, ", n, ") of shape ",
                      shape_str(s.full_shape), "."));
    if (s.hi == s.lo && !(s.data.defined() && s.data.numel() > 0)) continue;
    if (!s.data.defined() || s.data.numel() != s.hi - s.lo)
      throw Error(cat(what, ": slice [", s.lo, ", ", s.hi, ") expects ", s.hi - s.lo, " elements of data, found ",
                      s.data.defined() ? std::to_string(s.data.numel()) : std::string("no tensor"), "."));
    if (s.data.scalar_type() != s.dtype)
      throw Error(cat(what, ": slice dtype ", c10::toString(s.dtype), " but its ", for_load ? "destination" : "data",
                      " is ", c10::toString(s.data.scalar_type()), "."));
  }
}

std::vector<Slice> per_rank_slices(int rank, const std::map<std::string, torch::Tensor>& per_rank) {
  std::vector<Slice> out;
  for (const auto& [name, t] : per_rank) {
    if (!t.defined()) throw Error(cat("per_rank tensor '", name, "' is undefined; expected a tensor to save whole."));
    const torch::Tensor flat = t.detach().reshape(-1);
    out.push_back({per_rank_prefix(rank) + name, {flat.numel()}, flat.scalar_type(), 0, flat.numel(), flat});
  }
  return out;
}

RankIndex write_rank_shard(const std::string& dir, int rank, int world, std::vector<RankIndex::Entry> entries,
                           const std::function<void(size_t, SafetensorsWriter&)>& write_entry, bool fsync) {
  RankIndex idx;
  idx.file.name = rank_file_name(rank, world);
  idx.file.rank = rank;
  std::vector<TensorSpec> specs;
  std::vector<size_t> order;
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].key = piece_key(entries[i].section, entries[i].name);
    if (entries[i].hi > entries[i].lo) {
      specs.push_back({entries[i].key, {entries[i].hi - entries[i].lo}, entries[i].dtype});
      order.push_back(i);
    }
  }
  std::map<std::string, std::string> st_meta = {{"format", "pt"}, {"fsdp.rank", std::to_string(rank)},
                                                 {"fsdp.world_size", std::to_string(world)}};
  SafetensorsWriter w(join_path(dir, idx.file.name), specs, st_meta, fsync);
  for (size_t i : order) write_entry(i, w);
  idx.file.bytes = w.finish();
  idx.file.crc32c = w.file_crc32c();
  idx.file.chunk_bytes = SafetensorsWriter::kChunkBytes;
  idx.file.chunk_crc32c = w.chunk_crc32c();
  idx.entries = std::move(entries);
  atomic_write_file(join_path(dir, rank_index_name(rank)), idx.to_json().dump(), fsync);
  return idx;
}

namespace {
// Complete checkpoints under root (with metadata.json), by step.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (auto& n : list_dir(root)) {
    int64_t step;
    if (parse_step_dir_name(n, &step) && path_exists(join_path(join_path(root, n), kMetadataFile)))
      out.push_back({step, n});
  }
  std::sort(out.begin(), out.end());
  return out;
}

void delete_checkpoint(const std::string& root, const std::string& name, bool fsync) {
  // Rename first (atomic): a half-deleted directory is never mistaken for a checkpoint.
  std::string trash = join_path(root, ".trash-" + name);
  remove_tree(trash);
  rename_path(join_path(root, name), trash);
  if (fsync) fsync_dir(root);
  remove_tree(trash);
}
}  // namespace

std::string commit_checkpoint(const std::string& root, const std::string& tmp_dir, int world, int64_t step,
                              const std::string& strategy, const nlohmann::json& train_state, int keep_last,
                              bool fsync) {
  std::vector<RankIndex> ranks;
  for (int r = 0; r < world; ++r) {
    std::string p = join_path(tmp_dir, rank_index_name(r));
    auto j = nlohmann::json::parse(read_small_file(p, kMaxMetadataBytes), nullptr, false);
    if (j.is_discarded()) throw Error(cat("saving a checkpoint: index '", p, "' of rank ", r, " is not valid JSON."));
    ranks.push_back(RankIndex::from_json(p, j));
  }
  Metadata meta = merge_rank_indexes(ranks, step, strategy, train_state);
  atomic_write_file(join_path(tmp_dir, kMetadataFile), meta.dump(), fsync);
  for (int r = 0; r < world; ++r) remove_file(join_path(tmp_dir, rank_index_name(r)));
  if (fsync) fsync_dir(tmp_dir);

  const std::string name = step_dir_name(step);
  const std::string final_dir = join_path(root, name);
  // Saving the same step again: the two directories swap in one step, so a
  // crash leaves the previous step-N or the new one, never neither (deleting
  // the previous one first lost it to a crash before the rename).
  publish_dir(tmp_dir, final_dir, fsync);
  atomic_write_file(join_path(root, kLatestFile), name + "\n", fsync);

  if (keep_last > 0) {
    auto all = complete_checkpoints(root);
    for (size_t i = 0; i + keep_last < all.size(); ++i)
      if (all[i].second != name) delete_checkpoint(root, all[i].second, fsync);
  }
  return final_dir;
}

}  // namespace detail

SaveResult save_sharded(Communicator& comm, const std::string& root, int64_t step, const std::vector<Slice>& model,
                        const std::vector<Slice>& optim, const nlohmann::json& train_state, const SaveOptions& opts,
                        const std::map<std::string, torch::Tensor>& per_rank) {
  return detail::save_sharded_checked(comm, root, step, model, optim, detail::per_rank_slices(comm.rank(), per_rank),
                                      train_state, opts, nullptr);
}

SaveResult detail::save_sharded_checked(Communicator& comm, const std::string& root, int64_t step,
                                        const std::vector<Slice>& model, const std::vector<Slice>& optim,
                                        const std::vector<Slice>& per_rank, const nlohmann::json& train_state,
                                        const SaveOptions& opts, const std::function<std::string()>& check) {
  // The caller's check: this rank's error unless one came first.
  auto checked = [&](std::string& err) {
    if (!check || !err.empty()) return;
    try {
      if (std::string e = check(); !e.empty()) err = cat("rank ", comm.rank(), ": ", e);
    } catch (const std::exception& e) {
      err = cat("rank ", comm.rank(), ": ", e.what());
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  const int rank = comm.rank(), world = comm.world_size();
  const std::string tmp_dir = detail::join_path(root, ".tmp-" + detail::step_dir_name(step));
  const std::string consequence = "nothing was saved and the previous checkpoint is intact";
  SaveResult res;

  // Phase 1: check the inputs everywhere, rank 0 prepares the temp dir.
  std::string err;
  try {
    if (step < 0) throw Error(cat("save_sharded: step ", step, " expected >= 0."));
    if (opts.keep_last < 0) throw Error(cat("SaveOptions::keep_last ", opts.keep_last, " expected >= 0 (0: keep all)."));
    if (opts.max_write_bytes_per_second < 0)
      throw Error(cat("SaveOptions::max_write_bytes_per_second ", opts.max_write_bytes_per_second,
                      " expected >= 0 (0: no limit)."));
    detail::check_slices(detail::kModel, model, false);
    detail::check_slices(detail::kOptim, optim, false);
    detail::check_slices(detail::kPerRank, per_rank, false);
    if (rank == 0) {
      detail::make_dirs(root, opts.fsync);
      for (auto& n : detail::list_dir(root))  // leftovers of saves killed part-way
        if (n.rfind(".tmp-step-", 0) == 0 || n.rfind(".trash-", 0) == 0 ||
            (n.rfind(".step-", 0) == 0 && n.find(".fsdp-tmp-") != std::string::npos))
          detail::remove_tree(detail::join_path(root, n));
      detail::make_dirs(tmp_dir, opts.fsync);
    }
  } catch (const std::exception& e) {
    err = cat("rank ", rank, ": ", e.what());
  }
  checked(err);
  detail::fail_together_at(comm, "saving a checkpoint (preparing)", err, consequence);

  // Phase 2: every rank writes its shard in parallel.
  try {
    std::vector<detail::RankIndex::Entry> entries;
    std::vector<const Slice*> src;
    for (auto* list : {&model, &optim, &per_rank})
      for (auto& s : *list) {
        const char* section = list == &model ? detail::kModel : list == &optim ? detail::kOptim : detail::kPerRank;
        entries.push_back({section, s.name, "", s.full_shape, s.dtype, s.lo, s.hi});
        src.push_back(&s);
      }
    // Progress of rank 0's shard (the ranks write in parallel), shown when
    // the save takes more than a few seconds (fsdp/progress.h).
    ProgressOptions po = opts.progress;  // how the caller wants progress shown; what is shown is ours
    po.label = cat("saving ", detail::step_dir_name(step), " (rank 0 of ", world, ")");
    po.unit = "bytes";
    po.rank = rank;
    po.total = 0;
    po.initial = 0;
    po.rate_scale = 1;
    po.rate_unit.clear();
    for (auto* s : src) po.total += (s->hi - s->lo) * int64_t(c10::elementSize(s->dtype));
    Progress prog(po);
    int64_t written = 0;
    const auto began = std::chrono::steady_clock::now();
    // SaveOptions::max_write_bytes_per_second: parts of at most a chunk,
    // each written no earlier than the rate allows.
    auto pace = [&] {
      if (opts.max_write_bytes_per_second <= 0) return;
      std::this_thread::sleep_until(began + std::chrono::duration<double>(double(written) /
                                                                          double(opts.max_write_bytes_per_second)));
    };
    auto idx = detail::write_rank_shard(
        tmp_dir, rank, world, std::move(entries),
        [&](size_t i, SafetensorsWriter& w) {
          const int64_t es = int64_t(c10::elementSize(src[i]->dtype)), n = src[i]->hi - src[i]->lo;
          const int64_t part = opts.max_write_bytes_per_second > 0
                                   ? std::max<int64_t>(1, SafetensorsWriter::kChunkBytes / es)
                                   : n;
          const torch::Tensor flat = src[i]->data.reshape(-1);
          for (int64_t lo = 0; lo < n; lo += part) {
            pace();
            const int64_t len = std::min(part, n - lo);
            w.write(len == n ? src[i]->data : flat.narrow(0, lo, len));
            written += len * es;
            prog.update(written);
          }
        },
        opts.fsync);
    prog.finish();
    res.bytes_written = idx.file.bytes;
  } catch (const std::exception& e) {
    err = cat("rank ", rank, ": ", e.what());
  }
  checked(err);
  detail::fail_together_at(comm, "saving a checkpoint (writing shards)", err, consequence);

  // Phase 3: rank 0 publishes it.
  try {
    if (rank == 0)
      res.path = detail::commit_checkpoint(root, tmp_dir, world, step, opts.strategy, train_state, opts.keep_last,
                                           opts.fsync);
  } catch (const std::exception& e) {
    err = cat("rank 0: ", e.what());
  }
  detail::fail_together_at(comm, "saving a checkpoint (publishing)", err, consequence);
  if (rank != 0) res.path = detail::join_path(root, detail::step_dir_name(step));
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace fsdp::ckpt
