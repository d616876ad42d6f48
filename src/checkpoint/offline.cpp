// fsdp-cpp checkpoints: single-process tools over a checkpoint directory —
// inspect, verify, convert to one full file, reshard to another world size.
// Memory is bounded by one piece (convert) or one tensor slice (reshard): the
// bytes stream from the source files straight into the writer.
#include <algorithm>
#include <set>

#include "checkpoint/collective.h"
#include "checkpoint/file_io.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/safetensors.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;
namespace d = detail;

namespace {
std::string must_resolve(const std::string& path) {
  std::string dir = resolve_checkpoint(path);
  if (dir.empty())
    throw Error(cat("'", path, "' holds no checkpoint yet (no `latest`, no complete step-* directory)."));
  return dir;
}

// Streams elements [lo, hi) of a tensor into the writer, one piece at a time.
void stream_range(d::PieceReader& reader, const std::string& what, const std::string& section, const std::string& name,
                  const d::TensorMeta& t, int64_t lo, int64_t hi, SafetensorsWriter& w) {
  for (auto& op : d::plan_reads(what, t, lo, hi)) {
    // Large pieces in bounded parts (64 MiB) so memory does not grow with the model.
    const int64_t step = std::max<int64_t>(1, (int64_t(64) << 20) / d::element_size(t.dtype));
    for (int64_t a = op.src_lo; a < op.src_hi; a += step) {
      int64_t b = std::min(op.src_hi, a + step);
      auto buf = torch::empty({b - a}, torch::TensorOptions().dtype(t.dtype));
      reader.read(section, name, t, t.pieces[op.piece], a, b, buf.data_ptr());
      w.write(buf);
    }
  }
}
}  // namespace

CheckpointInfo read_info(const std::string& path) {
  std::string dir = must_resolve(path);
  d::Metadata m = d::Metadata::load(dir);
  CheckpointInfo info;
  info.path = dir;
  info.format_version = m.format_version;
  info.step = m.step;
  info.world_size = m.world_size;
  info.strategy = m.strategy;
  info.fingerprint = m.fingerprint;
  info.train_state = m.train_state;
  for (auto& [sec, tensors] : m.sections)
    for (auto& [name, t] : tensors)
      info.tensors.push_back({sec, name, t.shape, t.dtype, static_cast<int>(t.pieces.size())});
  for (auto& f : m.files) info.files.push_back({f.name, f.bytes, f.crc32c});
  return info;
}

std::vector<std::string> verify_checkpoint(const std::string& path) {
  std::vector<std::string> faults;
  std::string dir;
  d::Metadata m;
  try {
    dir = must_resolve(path);
    m = d::Metadata::load(dir);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  d::PieceReader reader(dir, m, /*verify=*/true);
  std::vector<bool> file_ok(m.files.size(), false);
  for (size_t i = 0; i < m.files.size(); ++i) {
    try {
      reader.verify_file(static_cast<int>(i));
      file_ok[i] = true;
    } catch (const std::exception& e) {
      faults.push_back(e.what());
    }
  }
  // Every tensor fully covered, every piece present in its (sound) file.
  for (auto& [sec, tensors] : m.sections)
    for (auto& [name, t] : tensors) {
      std::string what = cat("checkpoint '", dir, "': ", sec, " tensor '", name, "'");
      try {
        d::plan_reads(what, t, 0, t.numel());
        for (auto& p : t.pieces) {
          if (!file_ok[p.file]) continue;
          auto buf = torch::empty({std::min<int64_t>(p.hi - p.lo, 1)}, torch::TensorOptions().dtype(t.dtype));
          reader.read(sec, name, t, p, 0, std::min<int64_t>(p.hi - p.lo, 1), buf.data_ptr());  // checks the entry
        }
      } catch (const std::exception& e) {
        faults.push_back(e.what());
      }
    }
  return faults;
}

int64_t convert_to_full(const std::string& path, const std::string& out_file, const std::string& section) {
  std::string dir = must_resolve(path);
  d::Metadata m = d::Metadata::load(dir);
  auto it = m.sections.find(section);
  if (it == m.sections.end())
    throw Error(cat("checkpoint '", dir, "' has no section '", section, "'; it has: model, optim (when saved)."));
  std::vector<TensorSpec> specs;
  for (auto& [name, t] : it->second) specs.push_back({name, t.shape, t.dtype});
  std::map<std::string, std::string> md{
      {"format", "pt"}, {"fsdp.step", std::to_string(m.step)}, {"fsdp.source", d::base_name(dir)}};
  // The optimizer section becomes the file fsdp::save_full_optim writes
  // (docs/CHECKPOINT_FORMAT.md): per-parameter steps as I64 scalars, and the
  // metadata load_full_optim checks.
  std::vector<std::pair<std::string, int64_t>> steps;
  if (section == "optim" && m.train_state.contains("optimizer") && m.train_state["optimizer"].is_object()) {
    auto& o = m.train_state["optimizer"];
    md["format"] = "fsdp-optim";
    md["optimizer"] = o.value("type", std::string("none"));
    if (o.contains("step") && o["step"].is_object())
      for (auto& [name, v] : o["step"].items())
        if (v.is_number_integer()) steps.emplace_back(name, v.get<int64_t>());
    for (auto& [name, v] : steps) specs.push_back({name + ".step", {}, torch::kLong});
  }
  d::PieceReader reader(dir, m, true);
  SafetensorsWriter w(out_file, specs, md);
  for (auto& [name, t] : it->second)
    stream_range(reader, cat("checkpoint '", dir, "': tensor '", name, "'"), section, name, t, 0, t.numel(), w);
  for (auto& [name, v] : steps) w.write(torch::tensor({v}, torch::kLong));
  return w.finish();
}

std::string reshard_offline(const std::string& path, int new_world, const std::string& out_root) {
  if (new_world <= 0) throw Error(cat("--world ", new_world, " expected >= 1."));
  std::string dir = must_resolve(path);
  d::Metadata m = d::Metadata::load(dir);
  d::PieceReader reader(dir, m, true);
  const std::string tmp = d::join_path(out_root, ".tmp-" + d::step_dir_name(m.step));
  d::make_dirs(out_root);
  d::remove_tree(tmp);
  d::make_dirs(tmp);
  // One rank at a time, as FSDP would shard each tensor at the new world size.
  // The per_rank section (error feedback's residuals) belongs to the old
  // ranks and is dropped: a load at the new size starts them afresh.
  for (int r = 0; r < new_world; ++r) {
    std::vector<d::RankIndex::Entry> entries;
    std::vector<const d::TensorMeta*> src;
    for (auto& [sec, tensors] : m.sections)
      for (auto& [name, t] : tensors) {
        if (sec == d::kPerRank) continue;
        auto [lo, hi] = shard_range(t.numel(), r, new_world);
        entries.push_back({sec, name, "", t.shape, t.dtype, lo, hi});
        src.push_back(&t);
      }
    auto copy = entries;
    d::write_rank_shard(tmp, r, new_world, std::move(entries), [&](size_t i, SafetensorsWriter& w) {
      auto& e = copy[i];
      stream_range(reader, cat("checkpoint '", dir, "': tensor '", e.name, "'"), e.section, e.name, *src[i], e.lo,
                   e.hi, w);
    }, true);
  }
  return d::commit_checkpoint(out_root, tmp, new_world, m.step, m.strategy, m.train_state, 0, true);
}

}  // namespace fsdp::ckpt
