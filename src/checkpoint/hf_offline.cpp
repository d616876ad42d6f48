// fsdp-cpp checkpoints: converting between our sharded checkpoints and the
// Hugging Face layout offline, in one process (`fsdp ckpt convert`).
// Memory is bounded by one part of a piece (64 MiB): the bytes stream from
// the source files into the writer. An export gets a config.json (given, in
// the checkpoint, or recorded there by the conversion from HF), so
// transformers can load it as written.
#include <algorithm>
#include <cstdio>

#include "checkpoint/collective.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/safetensors.h"
#include "fsdp/hf.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;
namespace d = detail;

namespace {
constexpr int64_t kPart = int64_t(64) << 20;  // bytes converted at once

std::string hf_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, n);
  return buf;
}

// The key under which convert_from_hf records the source's config.json in
// the checkpoint's train_state, for convert_to_hf to write back.
constexpr const char* kHfConfigKey = "hf_config";

// A config.json's bytes, checked to be a JSON object.
std::string read_config_file(const std::string& path, const char* what) {
  std::string text = d::read_small_file(path, int64_t(64) << 20);
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw Error(cat("convert to HF: ", what, " '", path, "' is not a JSON object (a model's config.json); nothing "
                    "was written. Pass the model's config.json with --config."));
  return text;
}

// The config.json the export gets: `config_file` when given; else one in the
// checkpoint's directory (or the root given); else the one convert_from_hf
// recorded in its train_state. None: an error before anything is written.
std::string export_config(const std::string& config_file, const std::string& path, const std::string& dir,
                          const d::Metadata& m) {
  if (!config_file.empty()) return read_config_file(config_file, "--config");
  for (const std::string& where : {dir, path}) {
    const std::string p = d::join_path(where, "config.json");
    if (d::path_exists(p)) return read_config_file(p, "the checkpoint's config");
  }
  if (m.train_state.is_object() && m.train_state.contains(kHfConfigKey)) {
    const auto& c = m.train_state[kHfConfigKey];
    if (!c.is_object())
      throw Error(cat("convert to HF: checkpoint '", dir, "': train_state.", kHfConfigKey,
                      ": expected an object (the model's config.json), found ", d::json_found(c),
                      "; nothing was written. Pass the model's config.json with --config."));
    return c.dump(2) + "\n";
  }
  throw Error(cat("convert to HF: checkpoint '", dir, "' holds no config.json (none in its directory, none recorded "
                  "by `fsdp ckpt convert --from-hf`), and transformers cannot load an export without one; nothing "
                  "was written. Pass the model's config.json with --config FILE."));
}
}  // namespace

int64_t convert_to_hf(const std::string& path, const std::string& out_dir, torch::ScalarType dtype,
                      int64_t max_shard_size, const std::string& config_file) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16)
    throw Error(cat("convert to HF: dtype ", c10::toString(dtype), " expected F32, BF16 or F16."));
  if (max_shard_size <= 0) throw Error(cat("convert to HF: max shard size ", max_shard_size, " expected > 0."));
  if (d::path_exists(out_dir))
    throw Error(cat("convert to HF: '", out_dir, "' exists; give a new directory (nothing was written)."));
  const std::string dir = resolve_checkpoint(path);
  if (dir.empty()) throw Error(cat("'", path, "' holds no checkpoint yet."));
  d::Metadata m = d::Metadata::load(dir);
  auto sec = m.sections.find(d::kModel);
  if (sec == m.sections.end()) throw Error(cat("checkpoint '", dir, "' has no model section."));
  const std::string config = export_config(config_file, path, dir, m);
  const int64_t es = d::element_size(dtype);
  // Files: the tensors in name order, cut at max_shard_size.
  std::vector<std::vector<std::string>> files(1);
  int64_t in_file = 0, total = 0, params = 0;
  for (auto& [name, t] : sec->second) {
    if (!files.back().empty() && in_file + t.numel() * es > max_shard_size) files.emplace_back(), in_file = 0;
    files.back().push_back(name);
    in_file += t.numel() * es;
    total += t.numel() * es;
    params += t.numel();
  }
  // The files go into a temporary directory beside out_dir (mkdtemp: a name
  // nobody could plant a link at), renamed into place when complete: a kill
  // at any point leaves out_dir absent or complete. Leftovers of killed
  // conversions to the same out_dir go first.
  const std::string parent = d::parent_dir(out_dir);
  if (d::is_directory(parent))
    for (auto& n : d::list_dir(parent))
      if (d::is_temp_dir_of(n, d::base_name(out_dir))) d::remove_tree(d::join_path(parent, n));
  const std::string tmp = d::make_temp_dir(out_dir);
  try {
    d::PieceReader reader(dir, m, true);
    nlohmann::json weight_map = nlohmann::json::object(), sums = nlohmann::json::object();
    const int n = static_cast<int>(files.size());
    for (int k = 0; k < n; ++k) {
      std::vector<TensorSpec> specs;
      for (auto& name : files[static_cast<size_t>(k)]) specs.push_back({name, sec->second.at(name).shape, dtype});
      SafetensorsWriter w(d::join_path(tmp, hf_file_name(k, n)), specs, {{"format", "pt"}});
      for (auto& name : files[static_cast<size_t>(k)]) {
        const d::TensorMeta& t = sec->second.at(name);
        weight_map[name] = hf_file_name(k, n);
        const std::string what = cat("checkpoint '", dir, "': tensor '", name, "'");
        for (auto& op : d::plan_reads(what, t, 0, t.numel())) {
          const int64_t step = std::max<int64_t>(1, kPart / d::element_size(t.dtype));
          for (int64_t a = op.src_lo; a < op.src_hi; a += step) {
            const int64_t b = std::min(op.src_hi, a + step);
            auto buf = torch::empty({b - a}, torch::TensorOptions().dtype(t.dtype));
            reader.read(d::kModel, name, t, t.pieces[op.piece], a, b, buf.data_ptr());
            w.write(buf.to(dtype));
          }
        }
      }
      const int64_t bytes = w.finish();
      nlohmann::json chunks = nlohmann::json::array();
      for (uint32_t c : w.chunk_crc32c()) chunks.push_back(d::crc32c_hex(c));
      sums[hf_file_name(k, n)] = {{"bytes", bytes}, {"crc32c", d::crc32c_hex(w.file_crc32c())}, {"chunk_crc32c", chunks}};
    }
    nlohmann::json index = {
        {"metadata",
         {{"total_size", total},
          {"total_parameters", params},
          {"format", "fsdp-cpp/hf-export"},
          {"fsdp_checksums", {{"algorithm", "crc32c"}, {"chunk_bytes", SafetensorsWriter::kChunkBytes}, {"files", sums}}}}},
        {"weight_map", weight_map}};
    d::atomic_write_file(d::join_path(tmp, "model.safetensors.index.json"), index.dump(2) + "\n");
    d::atomic_write_file(d::join_path(tmp, "config.json"), config);
    d::fsync_dir(tmp);
    // rename(2), not a swap: fails, rather than replace it, when out_dir
    // appeared meanwhile.
    d::rename_path(tmp, out_dir);
    d::fsync_dir(parent);
  } catch (const std::exception&) {
    try {
      d::remove_tree(tmp);
    } catch (const std::exception&) {  // the first error is the one to report
    }
    throw;
  }
  return total;
}

std::string convert_from_hf(const std::string& hf_dir, int world, const std::string& out_root) {
  if (world <= 0) throw Error(cat("--world ", world, " expected >= 1."));
  HfDirectory h = read_hf_directory(hf_dir);
  const std::string tmp = d::join_path(out_root, ".tmp-" + d::step_dir_name(0));
  d::make_dirs(out_root);
  d::remove_tree(tmp);
  d::make_dirs(tmp);
  for (int r = 0; r < world; ++r) {
    std::vector<d::RankIndex::Entry> entries;
    std::vector<const HfTensor*> src;
    for (auto& [name, t] : h.tensors) {
      if (!c10::isFloatingType(t.dtype))
        throw Error(cat("HF checkpoint '", hf_dir, "': tensor '", name, "' is ", safetensors_dtype_name(t.dtype),
                        "; a model checkpoint holds floating-point tensors."));
      auto [lo, hi] = shard_range(numel_of(t.shape), r, world);
      entries.push_back({d::kModel, name, "", t.shape, torch::kFloat32, lo, hi});
      src.push_back(&t);
    }
    auto copy = entries;
    d::write_rank_shard(tmp, r, world, std::move(entries), [&](size_t i, SafetensorsWriter& w) {
      const HfTensor& t = *src[i];
      const int64_t es = d::element_size(t.dtype), step = std::max<int64_t>(1, kPart / es);
      for (int64_t a = copy[i].lo; a < copy[i].hi; a += step) {
        const int64_t b = std::min(copy[i].hi, a + step);
        auto buf = torch::empty({b - a}, torch::TensorOptions().dtype(t.dtype));
        h.files[static_cast<size_t>(t.file)].reader->pread_exact(t.offset + a * es, (b - a) * es, buf.data_ptr());
        w.write(buf.to(torch::kFloat32));
      }
    }, true);
  }
  // The source's config.json is kept in the train_state: convert_to_hf
  // writes it back.
  nlohmann::json train_state = {{"source", hf_dir}};
  if (!h.config.is_null()) train_state[kHfConfigKey] = h.config;
  return d::commit_checkpoint(out_root, tmp, world, 0, "converted from a Hugging Face checkpoint", train_state, 0,
                              true);
}

}  // namespace fsdp::ckpt
