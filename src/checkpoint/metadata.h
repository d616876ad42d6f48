// fsdp-cpp checkpoints: metadata.json of a sharded checkpoint and the per-rank
// index each rank leaves for rank 0 (docs/CHECKPOINT_FORMAT.md).
// defines: kFormatName, kFormatVersion, PieceMeta, TensorMeta, FileMeta,
//          RankIndex, Metadata, model_fingerprint, checkpoint dir names, per_rank_prefix
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp::ckpt::detail {

constexpr const char* kFormatName = "fsdp-cpp/sharded-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kLatestFile = "latest";
constexpr int64_t kMaxMetadataBytes = int64_t(1) << 30;  // sanity bound before reading

// Sections of a checkpoint: one name space each.
constexpr const char* kModel = "model";
constexpr const char* kOptim = "optim";
// Each rank's own tensors, named "rank-00003/<name>" and held whole by that
// rank (save_sharded's per_rank; load_per_rank): error feedback's residuals.
constexpr const char* kPerRank = "per_rank";

std::string step_dir_name(int64_t step);                // "step-000010"
bool parse_step_dir_name(const std::string& name, int64_t* step);
std::string rank_file_name(int rank, int world);        // "rank-00001-of-00004.safetensors"
std::string rank_index_name(int rank);                  // "rank-00001.index.json" (temporary)
std::string piece_key(const std::string& section, const std::string& name);  // "model/fc1.weight"
std::string per_rank_prefix(int rank);                  // "rank-00003/": a per_rank tensor's name begins so

// Elements [lo, hi) of a tensor stored under `key` in files[file].
struct PieceMeta {
  int file = 0;
  std::string key;
  int64_t lo = 0, hi = 0;
};

struct TensorMeta {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<PieceMeta> pieces;  // sorted by lo
  int64_t numel() const;
};

struct FileMeta {
  std::string name;  // relative to the checkpoint dir
  int rank = 0;
  int64_t bytes = 0;
  uint32_t crc32c = 0;
  int64_t chunk_bytes = 0;
  std::vector<uint32_t> chunk_crc32c;
};

// What one rank wrote: rank 0 merges these into metadata.json.
struct RankIndex {
  FileMeta file;
  struct Entry {
    std::string section, name, key;
    std::vector<int64_t> shape;
    torch::ScalarType dtype;
    int64_t lo, hi;
  };
  std::vector<Entry> entries;  // every tensor the rank knows, empty ones too
  nlohmann::json to_json() const;
  static RankIndex from_json(const std::string& path, const nlohmann::json& j);
};

struct Metadata {
  int format_version = kFormatVersion;
  int64_t step = 0;
  int world_size = 0;
  std::string strategy;
  std::string fingerprint;
  nlohmann::json train_state;
  std::vector<FileMeta> files;
  std::map<std::string, std::map<std::string, TensorMeta>> sections;  // section -> name -> tensor

  // With a "checksum" field: CRC32C of the dump of everything else.
  std::string dump() const;
  // Validates everything (structure, version, checksum, piece ranges); errors
  // name `path` and say what to do.
  static Metadata parse(const std::string& path, const std::string& text);
  static Metadata load(const std::string& checkpoint_dir);
};

// Hash of the model section's names and shapes (sorted): detects metadata of
// another model at a glance.
std::string model_fingerprint(const std::map<std::string, std::vector<int64_t>>& shapes);

// Merges the ranks' indexes; checks every rank agrees on shapes and dtypes
// and every tensor is fully covered. Throws fsdp::Error.
Metadata merge_rank_indexes(const std::vector<RankIndex>& ranks, int64_t step, const std::string& strategy,
                            const nlohmann::json& train_state);

}  // namespace fsdp::ckpt::detail
