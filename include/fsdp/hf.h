// fsdp-cpp: Hugging Face checkpoints in and out of a wrapped model, sharded.
//
// defines: ckpt::HfFile, ckpt::HfTensor, ckpt::HfDirectory, ckpt::read_hf_directory,
//          ckpt::verify_hf_directory, ckpt::convert_to_hf, ckpt::convert_from_hf, HfPart, HfRule, HfNameMap, HfLoadOptions,
//          HfLoadResult, load_hf, zeros_for_loading, HfSaveOptions, HfSaveResult, save_hf
//
// The Hugging Face layout (docs/CHECKPOINT_FORMAT.md, "Hugging Face
// directories"): config.json, model.safetensors.index.json naming the file
// of every tensor, and model-0000K-of-0000M.safetensors (or one
// model.safetensors), whole tensors under the HF names, usually bf16.
//
//   // every rank: a model built without memory, then each rank reads only
//   // the byte ranges of its own slices of each tensor
//   llama::LlamaForCausalLM net{nullptr};
//   { fsdp::DeferredInit d; net = llama::LlamaForCausalLM(cfg); }
//   auto model = fsdp::fully_shard(net, comm, opts);   // opts.param_init = fsdp::zeros_for_loading()
//   fsdp::load_hf(*model, "Llama-3.2-1B");              // bf16 -> fp32 masters
//   ... train ...
//   fsdp::save_hf(*model, "export", {.copy_from = "Llama-3.2-1B"});
//
// Names: the model's parameter names are mapped to HF tensor names by an
// HfNameMap (a function, then a table of rules; identity by default). A
// model parameter is one HF tensor, or a part of one (a fused projection
// such as qkv_proj split into q, k and v), or several stacked along the
// first dimension (q, k and v fused in the model), each optionally
// transposed.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/fully_shard.h"

namespace fsdp::ckpt {

// One safetensors file of an HF directory.
struct HfFile {
  // Its name in the directory ("model-00001-of-00004.safetensors").
  std::string name;
  // Its size in bytes, and the size of its header (8 + N).
  int64_t bytes = 0, header_bytes = 0;
  // CRC32C of its header as read (the 8-byte length and the JSON): load_hf's
  // ranks compare it, so that all read the same file.
  uint32_t header_crc32c = 0;
  // save_hf's checksums of it, from the index (absent in other exports).
  bool has_checksums = false;
  // CRC32C of the whole file.
  uint32_t crc32c = 0;
  // Bytes per checksummed chunk, and the CRC32C of each.
  int64_t chunk_bytes = 0;
  // The CRC32C of each chunk, in order.
  std::vector<uint32_t> chunk_crc32c;
  // The open file, its header validated (shared: copies of the directory
  // read through the same descriptor).
  std::shared_ptr<SafetensorsReader> reader;
};

// One tensor of an HF directory.
struct HfTensor {
  // Its HF name.
  std::string name;
  // Index into HfDirectory::files.
  int file = 0;
  // As its file's header says.
  torch::ScalarType dtype = torch::kFloat32;
  // Its shape.
  std::vector<int64_t> shape;
  // Where its bytes are in the file (absolute offset) and how many.
  int64_t offset = 0, bytes = 0;
};

// A Hugging Face checkpoint directory, checked: the index (or the one
// file), every file's header, config.json.
struct HfDirectory {
  // The directory.
  std::string dir;
  // Whether it has model.safetensors.index.json (else one model.safetensors).
  bool indexed = false;
  // Its files, in the order of their names.
  std::vector<HfFile> files;
  // Every tensor, by HF name.
  std::map<std::string, HfTensor> tensors;
  // config.json (null when absent).
  nlohmann::json config;
  // The index's "metadata" object (null without an index).
  nlohmann::json index_metadata;
  // Header bytes read opening the files.
  int64_t header_bytes_read = 0;
  // CRC32C of the index's bytes and of config.json's as read (0 when
  // absent): load_hf's ranks compare them with the files' header_crc32c.
  uint32_t index_crc32c = 0, config_crc32c = 0;
};

// Reads and checks an HF directory: the index parses and names each tensor
// once; every file it names exists, has a valid header (a truncated file
// fails here) and holds exactly the tensors the index puts in it. One
// fsdp::Error lists every problem found (at most a few of each kind, then a
// count). A value of the wrong JSON type or out of bounds (save_hf's
// checksums) is an fsdp::Error naming the file and the key; anything but a
// regular file is refused at once. Reads the headers only.
HfDirectory read_hf_directory(const std::string& dir);

// `fsdp ckpt verify` of an HF directory: read_hf_directory's checks, then
// every byte of every file against save_hf's checksums when the index has
// them (each file's size, each chunk's and the whole file's CRC32C).
// Returns the faults (empty: sound); never throws for a fault in the files.
std::vector<std::string> verify_hf_directory(const std::string& dir);

// `fsdp ckpt convert DIR --to-hf OUT`: the model section of a sharded
// checkpoint as an HF directory (the model's names; `dtype` on disk; files
// of at most max_shard_size; the index with save_hf's checksums), streamed
// piece by piece in one process; written into a temporary beside OUT and
// renamed into place (OUT must not exist). OUT gets a config.json, in the
// same temporary: `config_file` when given, else the checkpoint's own (a
// config.json in its directory, or the one convert_from_hf recorded); with
// none, an fsdp::Error before anything is written. Returns the tensor bytes.
int64_t convert_to_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                      torch::ScalarType dtype = torch::kBFloat16, int64_t max_shard_size = int64_t(5) << 30,
                      const std::string& config_file = "");

// `fsdp ckpt convert HF_DIR --from-hf --world M --to ROOT`: an HF
// directory as a sharded checkpoint of `world` ranks (FSDP's even split of
// each tensor, fp32, step 0) under out_root, which load_checkpoint reads at
// any world size; the directory's config.json is kept in its train_state
// ("hf_config") for convert_to_hf. Returns the checkpoint directory.
std::string convert_from_hf(const std::string& hf_dir, int world, const std::string& out_root);

}  // namespace fsdp::ckpt

namespace fsdp {

// Where the rows of a model parameter come from in an HF checkpoint: rows
// [row_begin, row_begin + rows) of HF tensor `name` (its first dimension),
// or the whole tensor transposed (a 2-D tensor the model holds as [in, out]
// where the checkpoint holds [out, in], or the other way round).
struct HfPart {
  // The HF tensor's name; in an HfRule, $1, $2... stand for the rule's
  // capture groups.
  std::string name;
  // The model holds this tensor transposed (2-D only; the whole tensor, so
  // row_begin must be 0 and rows -1).
  bool transpose = false;
  // First row of the HF tensor taken.
  int64_t row_begin = 0;
  // Rows taken; -1: every row from row_begin on (at load, from the file; a
  // save needs every row count of a tensor stacked from several parts).
  int64_t rows = -1;
};

// One rename: a model parameter whose whole name matches `model_pattern`
// (std::regex, ECMAScript) is made of `parts`, stacked along the first
// dimension in order.
struct HfRule {
  // Matched against the whole model parameter name.
  std::string model_pattern;
  // The HF tensors it is made of; their names may use $1, $2...
  std::vector<HfPart> parts;
};

// From model parameter names to HF tensor names (both directions use it:
// load_hf reads, save_hf writes the same tensors).
struct HfNameMap {
  // Asked first for each model parameter; an empty answer falls through to
  // the rules. May be empty.
  std::function<std::vector<HfPart>(const std::string& model_name)> fn;
  // Tried in order; the first that matches decides. None: the HF tensor has
  // the model parameter's name, whole.
  std::vector<HfRule> rules;
  // HF tensors the model does not have and loading ignores (whole-name
  // std::regex patterns, e.g. "model\\.layers\\.\\d+\\.self_attn\\.rotary_emb\\.inv_freq").
  std::vector<std::string> ignore;

  // The parts of model parameter `model_name` (fn, then the rules, then
  // the identity). Throws fsdp::Error for a bad rule pattern.
  std::vector<HfPart> parts_of(const std::string& model_name) const;
};

// How load_hf reads and checks a directory.
struct HfLoadOptions {
  // Model names -> HF names (default: the same names).
  HfNameMap names;
  // Keys config.json must hold with these values (e.g. {"hidden_size":
  // 2048, "num_hidden_layers": 16}); every difference is listed in one
  // error before any tensor is read. Null: config.json is not checked (nor
  // needed).
  nlohmann::json expect_config;
  // HF tensors the model does not use are errors (listed); false: ignored.
  bool strict = true;
  // Bytes of one read staged for conversion (bf16/fp16 -> fp32): a read of
  // a tensor's range goes through a buffer of at most this size. 1 MiB stays
  // in the CPU's cache between the read and the conversion: 1.1 B
  // parameters at 4 ranks on 2 cores loaded faster than with 16 MiB in the
  // medians of every mode (cold, around the cache: 1.84 s against 2.57 s),
  // with 15 MiB less resident (bench/README.md).
  int64_t buffer_bytes = int64_t(1) << 20;
  // Read what the page cache does not hold with O_DIRECT, around the cache
  // (what it holds is copied from it): a cold load then spends no CPU
  // filling the cache, CPU it needs for converting and filling the shards.
  // Files on a file system that refuses O_DIRECT are read through the cache.
  // false: every read goes through the page cache.
  bool direct_io = true;
  // Read everything into a copy first and write the shards only once every
  // rank has read all of it: an I/O error in the middle (a disk failing, a
  // file replaced under the load) leaves the model as it was, at the cost of
  // one extra copy of this rank's shards. false (default): every check
  // (files, headers, names, shapes, dtypes, sizes) runs on every rank and
  // the ranks agree before the first shard byte is written; only an I/O
  // error past that point would leave the shards partly loaded, and every
  // rank then throws saying so.
  bool staged = false;
};

// What load_hf read.
struct HfLoadResult {
  // The directory loaded.
  std::string dir;
  // Its safetensors files, and the HF tensors in them.
  int files = 0, tensors = 0;
  // Bytes this rank read from the files: the headers of the files it
  // opened, and the byte ranges of its slices (plus, for a transposed
  // tensor, at most a row at each end; for a read around the page cache,
  // its rounding out to 4 KiB: under 8 KiB each).
  int64_t bytes_read = 0;
  // Of which, the safetensors headers.
  int64_t header_bytes = 0;
  // Reads that went around the page cache (HfLoadOptions::direct_io): at
  // most one per HfLoadOptions::buffer_bytes of a range.
  int64_t direct_reads = 0;
  // The elements of the model parameters this rank loaded (its slices).
  int64_t elements = 0;
  // config.json, parsed (null when the directory has none).
  nlohmann::json config;
};

// Collective: loads the HF checkpoint in `dir` (model.safetensors.index.json
// with its files, or one model.safetensors) into the model's shards. Every
// rank reads only the byte ranges of its own slices of each tensor (pread,
// or O_DIRECT for what the page cache lacks, through a buffer of
// HfLoadOptions::buffer_bytes), converting BF16, F16,
// F32 or F64 to the fp32 masters, so it works on a model built under
// fsdp::DeferredInit without any rank holding the whole model. Before
// anything is written every rank checks the directory (a file the index
// names missing, a truncated file, a tensor named twice), the config
// (HfLoadOptions::expect_config) and every tensor (missing, unexpected,
// wrong shape, a dtype that is not floating point): one fsdp::Error lists
// every problem of a kind, and every rank throws with nothing loaded. The
// ranks also compare the CRC32C of the index, config.json and every file's
// header each read: where they differ (the export changed while loading, or
// the ranks see different copies), every rank throws one message naming
// what differs, with nothing loaded. The model's buffers are left as they
// are (HF checkpoints hold parameters).
HfLoadResult load_hf(FullyShardedModel& model, const std::string& dir, const HfLoadOptions& opts = {});

// A FsdpOptions::param_init for a model every value of which comes from a
// checkpoint loaded right after wrapping (load_hf, load_full): zeros, and
// fully_shard recognises it and makes only this rank's shard of each unit,
// never a parameter at full size, so wrapping a model built under
// fsdp::DeferredInit holds no more than the shards (nothing to compute, no
// agreement of values between ranks). Buffers are made in full, as zeros.
ParamInit zeros_for_loading();

// How save_hf writes.
struct HfSaveOptions {
  // Model names -> HF names (default: the same names).
  HfNameMap names;
  // The dtype of the tensors written (bf16 as the hub ships most models;
  // kFloat32 keeps the fp32 masters exactly).
  torch::ScalarType dtype = torch::kBFloat16;
  // No file holds more tensor bytes than this (a larger tensor gets a file
  // of its own), as transformers' max_shard_size. Files are cut smaller
  // still so that every rank has files to write (when there are tensors
  // enough): the ranks write in parallel.
  int64_t max_shard_size = int64_t(5) << 30;
  // A directory whose config.json, generation_config.json and tokenizer
  // files are copied into the export ("" : none).
  std::string copy_from;
  // config.json to write (overrides copy_from's); null: copy_from's, if any.
  // Its "dtype" (and "torch_dtype" when present) is set to `dtype`.
  nlohmann::json config;
  // fsync files and directories (off only in tests of speed).
  bool fsync = true;
};

// What save_hf wrote.
struct HfSaveResult {
  // The export directory.
  std::string dir;
  // Files and tensors in it (every rank knows them).
  int files = 0, tensors = 0;
  // Tensor bytes in all the files.
  int64_t total_bytes = 0;
  // Bytes of the files this rank wrote.
  int64_t bytes_written = 0;
  // Elements this rank received from other ranks (pieces of tensors it
  // writes that it does not hold).
  int64_t elements_received = 0;
  // Wall time on this rank.
  double seconds = 0;
};

// Collective: writes the model as an HF checkpoint into `dir`: whole tensors
// under the HF names in model-0000K-of-0000M.safetensors files of at most
// max_shard_size, model.safetensors.index.json (weight_map, total_size, and
// each file's CRC32C per 1 MiB chunk and whole, as our checkpoints have),
// and the config. Each tensor is written by the rank that holds most of it
// (the files balanced by bytes); the pieces it lacks come from their owners
// through rooted gathers, in rounds of bounded size. All ranks write at
// once into a temporary directory beside `dir` that replaces `dir` only
// once every file is durable: a crash leaves the previous export or
// nothing, never a mix. A tied parameter's further names are not written,
// as transformers does for tied embeddings.
HfSaveResult save_hf(const FullyShardedModel& model, const std::string& dir, const HfSaveOptions& opts = {});

}  // namespace fsdp
