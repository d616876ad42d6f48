// fsdp-cpp: checkpoints — safetensors files, sharded checkpoint directories,
// resharding N -> M, full state dicts. Independent of the FSDP engine.
//
// defines: ckpt::Slice, ckpt::TensorSpec, ckpt::shard_range,
//          ckpt::SafetensorsWriter, ckpt::SafetensorsReader (range reads),
//          ckpt::SaveOptions, ckpt::SaveResult, ckpt::save_sharded,
//          ckpt::BackgroundSave,
//          ckpt::LoadOptions, ckpt::LoadResult, ckpt::load_sharded, ckpt::load_per_rank,
//          ckpt::resolve_checkpoint, ckpt::write_full_safetensors,
//          ckpt::load_full_safetensors, ckpt::CheckpointInfo, ckpt::read_info
//
// Vocabulary (docs/CHECKPOINT_FORMAT.md): a *slice* is the elements [lo, hi)
// of the row-major flattened full tensor that one rank holds. Every sharding
// strategy maps onto slices: FULL_SHARD's flat shards give each parameter a
// contiguous range per rank; NO_SHARD gives lo = 0, hi = numel. A *piece* is a
// slice as stored in one shard file of a checkpoint.
//
//   // save (collective: every rank calls it with its own slices)
//   ckpt::save_sharded(*comm, "ckpts", step, model_slices, optim_slices,
//                      {{"step", step}, {"data_pos", pos}}, {/*keep_last=*/3});
//   // load at any world size (collective); destinations are the slices' data
//   auto r = ckpt::load_sharded(*comm, "ckpts", model_slices, optim_slices);
//   if (!r.found) { /* start fresh */ }
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/progress.h"

// Checkpoint files on their own: safetensors, sharded checkpoint directories,
// resharding. Works on slices, without the FSDP engine (fsdp/state_dict.h
// saves and loads a wrapped model).
namespace fsdp::ckpt {

// Elements [lo, hi) of the flattened full tensor `name` held by this rank.
// For saving, `data` holds them (1-D or any contiguous-able shape with
// hi - lo elements, CPU, dtype == `dtype`); for loading, `data` is the
// destination and is written only after every rank validated everything.
// hi == lo (an empty slice) is allowed and means "this rank holds none of it
// but knows the tensor exists" — list every tensor on every rank.
struct Slice {
  // The full tensor's name.
  std::string name;
  // The full tensor's shape.
  std::vector<int64_t> full_shape;
  // The element type saved, and of `data`.
  torch::ScalarType dtype = torch::kFloat32;
  // The elements held: [lo, hi) of the flattened full tensor.
  int64_t lo = 0, hi = 0;
  // The elements, or where they go; the caller keeps it alive through the call.
  torch::Tensor data;

  // Elements held: hi - lo.
  int64_t numel() const { return hi - lo; }
};

// A tensor declared before its bytes are written (streaming writers).
struct TensorSpec {
  // Its name in the file.
  std::string name;
  // Its full shape.
  std::vector<int64_t> shape;
  // The element type its parts must have.
  torch::ScalarType dtype = torch::kFloat32;
};

// FSDP's even split of `numel` elements over `world` ranks with padding:
// rank r owns [r*S, (r+1)*S) ∩ [0, numel), S = ceil(numel / world).
std::pair<int64_t, int64_t> shard_range(int64_t numel, int rank, int world);

// Names as safetensors spells them: "F32", "BF16", ... (throws fsdp::Error for
// a dtype the format has no name for).
const char* safetensors_dtype_name(torch::ScalarType t);
// The product of the dimensions; -1 when one is negative or the product
// overflows (a header's shape is not trusted).
int64_t numel_of(const std::vector<int64_t>& shape);
// "[2, 3]", for messages.
std::string shape_str(const std::vector<int64_t>& shape);

// ---------------------------------------------------------------------------
// safetensors: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {str: str}}, then the raw little-endian data (offsets relative to it).

// Writes a safetensors file tensor by tensor, in bounded memory.
//
// Streaming writer: declare every tensor first (the header needs every
// offset), then write them in declaration order, each in one or more parts,
// so a whole state dict can be written unit by unit with bounded memory.
// Writes `path`.tmp and renames it into place in finish() after fsync (a crash
// never leaves a half-written `path`). Without finish() the temp file is
// removed by the destructor.
class SafetensorsWriter {
 public:
  // Opens `path`.tmp and writes the header for `specs` and `metadata`.
  // fsync = false only in tests of speed.
  SafetensorsWriter(std::string path, std::vector<TensorSpec> specs,
                    std::map<std::string, std::string> metadata = {}, bool fsync = true);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends elements of the next tensor (the current one until its numel is
  // reached). `part` must have the declared dtype; any shape, any device.
  void write(const torch::Tensor& part);
  // Checks every declared tensor was fully written, fsyncs, renames into
  // place, fsyncs the directory. Returns the file size.
  int64_t finish();

  // CRC32C of every byte written so far (the whole file after finish()), and
  // of each chunk of `chunk_bytes` bytes (last one may be shorter).
  uint32_t file_crc32c() const;
  // The CRC32C of each chunk of kChunkBytes (what a load of part of the
  // file verifies).
  const std::vector<uint32_t>& chunk_crc32c() const;
  // Bytes per checksummed chunk (1 MiB).
  static constexpr int64_t kChunkBytes = 1 << 20;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One tensor entry of a parsed, validated header.
struct SafetensorsEntry {
  // The tensor's name.
  std::string name;
  // Its element type.
  torch::ScalarType dtype;
  // Its shape.
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

// Reads a safetensors file, a byte range of one tensor at a time.
//
// Reader: parses and validates the header at open (bounded, checked against
// the file size: never allocates from an unchecked length), then reads byte
// ranges of single tensors on demand. Not thread-safe (one file position).
class SafetensorsReader {
 public:
  // Opens `path` and validates its header; throws fsdp::Error naming what is wrong.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // The file read.
  const std::string& path() const;
  // Its size in bytes.
  int64_t file_size() const;
  // The descriptor of the open file (the reader's own, valid while it
  // lives): reads of it by offset see the file the header was checked on,
  // even if the path is replaced meanwhile.
  int fd() const;
  int64_t header_bytes() const;  // 8 + N: where the data section starts
  // CRC32C of the header as read (the 8-byte length and the N bytes of
  // JSON): two readers saw the same header when theirs are equal.
  uint32_t header_crc32c() const;
  const std::vector<SafetensorsEntry>& entries() const;  // in data order
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr: absent
  // The header's "__metadata__" (empty when there is none).
  const std::map<std::string, std::string>& metadata() const;

  // Elements [lo, hi) of the flattened tensor `name`, as a 1-D tensor.
  torch::Tensor read(const std::string& name, int64_t lo, int64_t hi);
  // Every element of `name`, as a 1-D tensor.
  torch::Tensor read_all(const std::string& name);
  // Raw bytes [offset, offset+n) of the file into `dst`.
  void pread_exact(int64_t offset, int64_t n, void* dst) const;

  static constexpr int64_t kMaxHeaderBytes = 100 << 20;  // as the reference implementation

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Sharded checkpoints: root/step-000010/{metadata.json, rank-*-of-*.safetensors},
// root/latest names the newest complete one.

// How save_sharded keeps and syncs checkpoints.
struct SaveOptions {
  // Delete the oldest complete checkpoints so that at most this many remain
  // under root (0: keep all).
  int keep_last = 0;
  // Caller's sharding strategy, recorded for messages ("FULL_SHARD").
  std::string strategy = "unknown";
  // fsync files and directories (off only for tests of speed; never in training).
  bool fsync = true;
  // Each rank writes at most this many bytes per second (0: as fast as the
  // disk allows), so that a background save shares the disk and the memory
  // bandwidth with training.
  int64_t max_write_bytes_per_second = 0;
  // Progress lines of rank 0's writes (fsdp/progress.h; a save shows them
  // only when it takes more than a few seconds): the label, unit, totals,
  // rank and rate are the save's own, the rest (enabled, interval_s, tty,
  // out, clock...) is taken from here. A program's progress flags
  // (--no-progress, --progress-every) go here, so its saves follow them.
  ProgressOptions progress;
};

// Where save_sharded wrote, and how much.
struct SaveResult {
  std::string path;       // root/step-000010
  int64_t bytes_written = 0;  // by this rank
  // Wall time of the save on this rank. A background save: the time the
  // caller was blocked (the snapshot); BackgroundSave::wait returns the
  // write's own.
  double seconds = 0;
  // Written by a BackgroundSave (CheckpointOptions::async): when the call
  // returned, `path` was not committed yet.
  bool in_background = false;
  // A background save: the bytes of this rank's in-memory snapshot.
  int64_t snapshot_bytes = 0;
  // A background save whose thread copied the snapshot (BackgroundSave::wait
  // only): how long the caller waited in wait_for_snapshot for the copy,
  // training time lost beyond `seconds` of the call.
  double snapshot_wait_seconds = 0;
};

// Collective: every rank calls it with the slices it holds. Each rank writes
// one shard file into root/.tmp-step-N, fsyncs it; rank 0 writes
// metadata.json, renames the directory into place, fsyncs root, updates
// `latest` atomically and deletes checkpoints beyond keep_last. A process
// killed at any point leaves the previous checkpoint and `latest` intact.
// Replicated tensors (NO_SHARD): pass each replica's part from one rank only
// (e.g. shard_range(numel, rank, world)) so the bytes are written once; the
// loader accepts overlapping pieces too.
// `per_rank`: this rank's own tensors (error feedback's residuals), each
// saved whole as "rank-RRRRR/<name>" in the section "per_rank" and given
// back only to the same rank of a world of the same size (load_per_rank);
// ranks may pass different names, or none.
SaveResult save_sharded(Communicator& comm, const std::string& root, int64_t step,
                        const std::vector<Slice>& model, const std::vector<Slice>& optim,
                        const nlohmann::json& train_state, const SaveOptions& opts = {},
                        const std::map<std::string, torch::Tensor>& per_rank = {});

// Who copies a BackgroundSave's snapshot.
enum class SnapshotCopy {
  // The constructor, before it returns: the caller may change the originals
  // at once.
  IN_CALLER,
  // The save's thread, first: the constructor returns at once, and the
  // caller leaves the originals alone until wait_for_snapshot() returns. The
  // CPU's tensors only (a device's are copied in the caller, where it is
  // quick).
  ON_THREAD,
};

// One save_sharded running on a thread of its own, from a snapshot.
//
// The snapshot is a copy of every slice's data in memory, taken as `copy`
// says; the thread then writes, checksums and commits the copies exactly as
// save_sharded does, over `comm`, and frees them. The thread runs at the
// lowest priority (its own nice 19): where training fills the cores, it
// takes the cycles training leaves. A kill at any point leaves the previous
// checkpoint and `latest` intact (save_sharded's promise). `comm` must carry
// nothing else while the save runs: its collectives are not ordered against
// the caller's (split one from the training communicator;
// fsdp::save_checkpoint does). With SnapshotCopy::ON_THREAD, an original
// whose version counter moved before the caller's wait_for_snapshot (an
// in-place change: the copy may mix old and new values) fails the save on
// every rank, naming the tensor; the previous checkpoint stays.
class BackgroundSave {
 public:
  // Collective over `comm` (on the thread): every rank starts one with its
  // own slices, in the same order as its other saves. `per_rank`: as
  // save_sharded's, part of the snapshot like the slices.
  BackgroundSave(CommPtr comm, std::string root, int64_t step, const std::vector<Slice>& model,
                 const std::vector<Slice>& optim, nlohmann::json train_state, SaveOptions opts = {},
                 SnapshotCopy copy = SnapshotCopy::IN_CALLER,
                 const std::map<std::string, torch::Tensor>& per_rank = {});
  // Waits for the thread; an error that wait() never returned is printed
  // to stderr (the checkpoint was not written; the previous one is intact).
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  // The step being saved.
  int64_t step() const;
  // Where it is committed: root/step-<step>.
  const std::string& path() const;
  // Bytes the snapshot holds now: all of it until the write finished, 0 after.
  int64_t held_bytes() const;
  // Bytes the snapshot took (what the caller's call copied).
  int64_t snapshot_bytes() const;
  // Whether the thread is done (wait() returns at once).
  bool finished() const;
  // Blocks until the snapshot is copied (at once with IN_CALLER); from then
  // on the caller may change the originals. Checks, the first time, that
  // none changed before (otherwise the save fails; wait() says why).
  void wait_for_snapshot();
  // Whether the snapshot is copied.
  bool snapshot_taken() const;
  // Blocks until the checkpoint is committed and returns save_sharded's
  // result; rethrows its error (fsdp::Error naming the step). Once: a second
  // call throws.
  SaveResult wait();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// How strict a load is.
struct LoadOptions {
  // Unexpected keys (in the checkpoint, wanted by nobody) are errors. An empty
  // wanted list for a section (e.g. optimizer) skips that section entirely.
  bool strict = true;
  // Allow loading a tensor saved in another floating dtype (converted).
  bool allow_dtype_cast = false;
  // Verify the CRC32C of every chunk this rank reads (always on in training).
  bool verify_checksums = true;
};

// What a load found.
struct LoadResult {
  bool found = false;       // false: path is a root with no checkpoint yet
  std::string path;         // the checkpoint directory loaded
  // The step it was saved at (-1: none found).
  int64_t step = -1;
  // The world size it was saved at.
  int saved_world_size = 0;
  // The strategy it was saved under (SaveOptions::strategy).
  std::string saved_strategy;
  // The caller's JSON, as saved.
  nlohmann::json train_state;
  std::string note;         // e.g. "latest pointed to a missing dir; used step-000008"
  int64_t bytes_read = 0;   // by this rank
};

// Collective. Reads only the byte ranges of the saved files that overlap this
// rank's wanted slices (any world size). All or nothing: everything is read
// and validated into temporaries, the ranks agree (all_reduce), and only then
// the destinations are written; on any error on any rank every rank throws
// fsdp::Error and no destination was touched.
LoadResult load_sharded(Communicator& comm, const std::string& path_or_root,
                        std::vector<Slice>& model, std::vector<Slice>& optim,
                        const LoadOptions& opts = {});

// Collective: this rank's per_rank tensors (save_sharded's), by the names
// it saved them under, read from checkpoint directory `checkpoint_dir`
// (LoadResult::path: no `latest` is followed) with every chunk checked;
// empty when it saved none. All or nothing like load_sharded. Throws
// fsdp::Error on every rank when the checkpoint was saved at another world
// size (its rank r is not this rank r) or any rank fails to read.
std::map<std::string, torch::Tensor> load_per_rank(Communicator& comm, const std::string& checkpoint_dir,
                                                   const LoadOptions& opts = {});

// "root" (has `latest` or step-* dirs) or a checkpoint dir (has metadata.json)
// -> the checkpoint dir; "" when root has no checkpoint. Throws when `path`
// does not exist at all or is neither. `note` receives fallbacks taken.
std::string resolve_checkpoint(const std::string& path, std::string* note = nullptr);

// What `fsdp ckpt inspect` prints.
struct CheckpointInfo {
  // The checkpoint directory.
  std::string path;
  // metadata.json's format version (docs/CHECKPOINT_FORMAT.md).
  int format_version = 0;
  // The step it was saved at.
  int64_t step = -1;
  // The ranks that saved it.
  int world_size = 0;
  // The saving strategy, and a hash of the model's names and shapes (two
  // checkpoints of one model have the same).
  std::string strategy, fingerprint;
  // The caller's JSON, as saved.
  nlohmann::json train_state;
  // One saved tensor.
  struct Tensor {
    std::string section;  // "model" or "optim"
    // Its name.
    std::string name;
    // Its full shape.
    std::vector<int64_t> shape;
    // Its element type.
    torch::ScalarType dtype;
    // The slices stored of it, over every shard file.
    int pieces = 0;
  };
  // Every saved tensor, by section and name.
  std::vector<Tensor> tensors;
  // One file of the checkpoint.
  struct File {
    // Its name in the directory.
    std::string name;
    // Its size.
    int64_t bytes = 0;
    // The CRC32C of the whole file.
    uint32_t crc32c = 0;
  };
  // Every shard file.
  std::vector<File> files;
};
// Reads a checkpoint directory's metadata.json (no tensor data); throws
// fsdp::Error when it is missing or invalid.
CheckpointInfo read_info(const std::string& checkpoint_dir);

// Reads every byte of every file and checks sizes, checksums, headers against
// metadata and that every tensor is fully covered. Returns the faults found
// (empty: sound). Never throws for a fault in the files.
std::vector<std::string> verify_checkpoint(const std::string& checkpoint_dir);

// ---------------------------------------------------------------------------
// Full state dicts (one safetensors file, the unwrapped model's names).

// Streams tensors from `produce` (called once per spec, in order, e.g. the
// engine gathering unit by unit on rank 0) into `path` atomically. Only the
// calling process writes; call it on rank 0. Returns bytes written.
int64_t write_full_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                               const std::function<torch::Tensor(const TensorSpec&)>& produce,
                               const std::map<std::string, std::string>& metadata = {});

// Collective: each rank reads only its slices' byte ranges of a full
// safetensors file (ours or from PyTorch); same all-or-nothing contract and
// key/shape/dtype checks as load_sharded (safetensors has no checksums).
// Returns the tensor bytes this rank read from the file.
int64_t load_full_safetensors(Communicator& comm, const std::string& path, std::vector<Slice>& wanted,
                           const LoadOptions& opts = {});

// Offline tools (`fsdp ckpt convert`): single process, bounded memory (one
// tensor piece at a time).
int64_t convert_to_full(const std::string& checkpoint_dir, const std::string& out_file,
                        const std::string& section = "model");
// Writes the checkpoint again for `new_world` ranks, as a checkpoint under
// `out_root`; returns its directory. The per_rank section (save_sharded's
// per_rank: the old ranks' own tensors) is not written.
std::string reshard_offline(const std::string& checkpoint_dir, int new_world,
                            const std::string& out_root);

}  // namespace fsdp::ckpt
