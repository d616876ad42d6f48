// fsdp-cpp: the communicator, the one interface every stage talks to.
//
// defines: ReduceOp, CollectiveKind, CollectiveInfo, CommBackend, Compression, CommOptions, CommCounters,
//          Work, SplitOptions, Residuals, Communicator, make_communicator_from_env,
//          make_local_communicator
//
// A Communicator runs the collectives that FSDP needs over a backend
// (CommBackend: Gloo over TCP and cross-memory attach, or NCCL). No backend
// type appears here. Tensors may live on the CPU or a GPU, whatever the
// backend: a communicator's factory stages tensors the backend cannot move
// (src/comm/staged.cpp).
//
// Ordering contract: every rank must issue the same collectives in the same
// order (as with every collective library). Calls are queued in issue order
// and executed by one communication thread per communicator, so several calls
// may be in flight; Work::wait() blocks until that call finished (or throws
// the error that ended it). Tensors passed in must stay alive and must not be
// touched until wait() returned. NCCL: wait() makes the calling thread's
// current CUDA stream wait for the collective and returns at once, as c10d
// does; the GPU, not the host, waits (a collective that hangs is aborted
// by NCCL's watchdog after the timeout).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/errors.h"

namespace fsdp {

// How reduce_scatter and all_reduce combine the ranks' values; AVG divides
// the sum by the world size (gradients: the mean over the ranks' batches).
enum class ReduceOp { SUM, AVG };

// The collectives by kind, as counters, traces and errors name them
// (kCount: their number, for arrays indexed by kind).
enum class CollectiveKind { ALL_GATHER = 0, REDUCE_SCATTER, ALL_REDUCE, BROADCAST, BARRIER, GATHER, kCount };
// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "gather".
const char* to_string(CollectiveKind k);

// What a collective is for; travels with the call into errors and traces.
struct CollectiveInfo {
  std::string label;  // e.g. the unit name "blocks.3" or "clip_grad_norm"
  // The caller accepts a lossy result: with CommOptions::compress on, an
  // all_gather, reduce_scatter or all_reduce of floating tensors may cross
  // hosts quantized (docs/COMM.md, "Quantized formats"). The units set it
  // for their parameters' all-gather and their gradients' reduce-scatter or
  // all-reduce (NO_SHARD, HYBRID's replicas); every other call (state
  // dicts, norms, checks) stays exact. The same on every rank. A
  // reduce_scatter or all_reduce keeps its error feedback under the label,
  // so a compressible label names one gradient buffer.
  bool compressible = false;
};

// The backend that moves a communicator's bytes (docs/COMM.md).
//   GLOO  fsdp-cpp's own collectives over c10d's Gloo links and cross-memory
//         attach: CPU tensors; tensors on a GPU are staged through pinned
//         host memory (so several ranks may share one GPU, which NCCL
//         refuses).
//   NCCL  c10d's ProcessGroupNCCL on cuda:LOCAL_RANK (CommOptions::
//         device_index), through fsdp-cpp's CUDA plugin (fsdp/device.h):
//         GPU tensors; CPU tensors are staged through that GPU.
enum class CommBackend { GLOO, NCCL };
// "gloo", "nccl".
const char* to_string(CommBackend b);

// What crosses hosts quantized when a collective is compressible
// (CollectiveInfo::compressible) and the path composes tiers or is a flat
// ring of one rank per host (docs/COMM.md, "Quantized formats"): parameters'
// all-gather / gradients' reduce-scatter and all-reduce (whose reduced
// chunks then travel int8), blocks of 256 elements with an fp32 scale each.
//   OFF   nothing: every byte exact (the default)
//   INT8  int8 / int8
//   INT4  int8 / int4
//   FP8   float8 e4m3 / int8
enum class Compression { OFF, INT8, INT4, FP8 };
// "off", "int8", "int4", "fp8".
const char* to_string(Compression c);

// How the communicator factories set a communicator up. The environment
// variables named below override the fields.
struct CommOptions {
  // The backend (FSDP_BACKEND=gloo|nccl overrides; FSDP_BACKEND=auto keeps
  // this field).
  CommBackend backend = CommBackend::GLOO;
  // NCCL: the CUDA device of this rank; -1: LOCAL_RANK. Ignored by GLOO.
  int device_index = -1;
  // Every collective fails after this long (FSDP_TIMEOUT seconds overrides).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Network interface for the Gloo device (GLOO_SOCKET_IFNAME overrides);
  // empty: the address that reaches MASTER_ADDR.
  std::string ifname;
  // Target size of one piece of the ring collectives (docs/COMM.md): a
  // block moves as pieces so receiving, reducing and sending overlap. 0:
  // 1 MiB; otherwise in [4 KiB, 1 GiB] (FSDP_RING_PIECE_KIB overrides).
  int64_t ring_piece_bytes = 0;
  // Time between this rank's heartbeats (docs/RELIABILITY.md). 0: a fifth
  // of the timeout, between 50 ms and 1 s; otherwise in [10 ms, 60 s]
  // (FSDP_HEARTBEAT_INTERVAL overrides). The first communicator of the
  // process starts the heartbeat; later ones share it.
  std::chrono::milliseconds heartbeat_interval{0};
  // Ranks of one host that may map each other's memory keep one copy of each
  // unit's parameters per host and reduce gradients where they lie
  // (Communicator::shares_host_memory, docs/COMM.md "Host-shared units").
  // false: every rank keeps its own copies and collectives move bytes
  // (FSDP_SHARE_HOST=on|off overrides).
  bool share_host_memory = true;
  // Quantize what crosses hosts (Compression above; only compressible
  // calls, only on the tiers path and on a flat ring of one rank per host;
  // FSDP_COMPRESS=off|int8|int4|fp8 overrides). Gradients keep error
  // feedback per buffer.
  Compression compress = Compression::OFF;
  // With compress: gradients keep error feedback (a residual per buffer,
  // added to its next send). false sends plain quantized values and keeps
  // no residual, which shows the bias feedback removes
  // (FSDP_COMPRESS_FEEDBACK=on|off overrides).
  bool error_feedback = true;
};

// Per collective kind: how many calls, bytes this rank sent, seconds spent
// inside the backend. Bytes are counted from what the algorithm really sends,
// and split by tier: bytes_inter_host went to ranks on another host (the
// host identity of the same-host transport, docs/COMM.md: FSDP_HOST_ID, or
// the host name, boot id and namespaces), the rest stayed on this host.
struct CommCounters {
  // The totals of one collective kind.
  struct Entry {
    // Collectives issued.
    int64_t calls = 0;
    // Bytes this rank sent, both tiers.
    int64_t bytes_sent = 0;
    int64_t bytes_inter_host = 0;  // part of bytes_sent
    // What bytes_inter_host would have been uncompressed (CommOptions::
    // compress): equal to it when nothing crossed hosts quantized.
    int64_t bytes_inter_host_logical = 0;
    // Seconds spent inside the backend (on the communication thread).
    double seconds = 0;
    // The part of bytes_sent that stayed on this host.
    int64_t bytes_intra_host() const { return bytes_sent - bytes_inter_host; }
  };
  // One entry per CollectiveKind, indexed by its value (operator[] casts).
  Entry by_kind[static_cast<int>(CollectiveKind::kCount)];
  // The entry of one kind.
  const Entry& operator[](CollectiveKind k) const { return by_kind[static_cast<int>(k)]; }
  // The entry of one kind, to add to.
  Entry& operator[](CollectiveKind k) { return by_kind[static_cast<int>(k)]; }
  // Bytes sent over every kind, both tiers.
  int64_t total_bytes_sent() const;
  // Bytes sent over every kind to ranks on other hosts.
  int64_t total_bytes_inter_host() const;
  // What total_bytes_inter_host would have been uncompressed.
  int64_t total_bytes_inter_host_logical() const;
  // Bytes sent over every kind to ranks on this host.
  int64_t total_bytes_intra_host() const { return total_bytes_sent() - total_bytes_inter_host(); }
  // Element-wise sum (the traffic of several communicators, e.g. a model's
  // shard and replica groups).
  CommCounters& operator+=(const CommCounters& o);
};

// Completion handle of one queued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective finished; rethrows its error (every later
  // call on a communicator whose collective failed also fails).
  virtual void wait() = 0;
  // Without blocking: whether wait() would return (or throw) at once.
  virtual bool is_completed() const = 0;
};
// Shared with the communication thread: dropping a handle neither cancels
// nor waits for its collective.
using WorkPtr = std::shared_ptr<Work>;

// How Communicator::split names and times its groups.
struct SplitOptions {
  // For messages, traces and describe(), e.g. "shard" or "replica".
  std::string name = "group";
  // Every collective of the new communicator fails after this long; zero:
  // the parent's timeout.
  std::chrono::milliseconds timeout{0};
};

// Error feedback's state of one communicator (CommOptions::compress,
// docs/COMM.md "Compression on the tiers"): what each compressed buffer's
// last send dropped, added to its next send. Checkpoints save it per rank
// (fsdp::save_checkpoint), so a compressed run resumes bit for bit.
struct Residuals {
  // The compression whose sends left them; OFF: the communicator compresses
  // nothing (the option is off, or its path ignores it) and keeps none.
  Compression compress = Compression::OFF;
  // By the buffer's key (a compressible call's label with the buffer's numel
  // and dtype, e.g. "blocks.3 [1536 fp32]"; an all-reduce's owner residual
  // adds " gather"): fp32, flat, copies of the communicator's own, each of
  // the elements this rank quantizes for that buffer (on the tiers the part
  // it sends across hosts, not the whole buffer). Empty before the first
  // compressed send.
  std::map<std::string, torch::Tensor> by_buffer;
};

class Communicator;
// Shared: the program, a wrapped model and the groups split from it hold
// the same communicator, which lives until the last of them lets go.
using CommPtr = std::shared_ptr<Communicator>;

// The collectives FSDP needs, over one group of ranks. A world, or a group
// split from one; the ordering contract of comm.h applies to every call.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index here, 0..world_size()-1.
  virtual int rank() const = 0;
  // Ranks in this communicator.
  virtual int world_size() const = 0;
  // This rank's index among this communicator's ranks on its host.
  virtual int local_rank() const = 0;
  // This communicator's ranks on this host (HYBRID_SHARD's default shard group).
  virtual int local_world_size() const = 0;

  // output.numel() == world_size * input.numel(); rank-major: rank r's input
  // lands at output[r*n, (r+1)*n). Both contiguous, same dtype.
  virtual WorkPtr all_gather(const torch::Tensor& input, torch::Tensor output,
                             const CollectiveInfo& info = {}) = 0;
  // input.numel() == world_size * output.numel(); rank r receives the
  // reduction of every rank's input[r*n, (r+1)*n). bf16/fp16 are summed in fp32.
  virtual WorkPtr reduce_scatter(const torch::Tensor& input, torch::Tensor output, ReduceOp op,
                                 const CollectiveInfo& info = {}) = 0;
  // In place.
  virtual WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op, const CollectiveInfo& info = {}) = 0;
  // In place; root's values land on every rank.
  virtual WorkPtr broadcast(torch::Tensor tensor, int root, const CollectiveInfo& info = {}) = 0;
  // Completes once every rank has entered it.
  virtual WorkPtr barrier(const CollectiveInfo& info = {}) = 0;
  // Gather to one rank: on `root`, output.numel() == world_size *
  // input.numel() and rank r's input lands at output[r*n, (r+1)*n) (same
  // dtype, contiguous); on the other ranks `output` is ignored (pass an
  // undefined tensor) and nothing but the input is touched, so only root
  // ever holds the whole (full state dicts, consolidated optimizer state).
  virtual WorkPtr gather(const torch::Tensor& input, torch::Tensor output, int root,
                         const CollectiveInfo& info = {}) = 0;

  // Snapshot of the counters (thread-safe).
  virtual CommCounters counters() const = 0;
  // Zeroes the counters, to measure from here on (a step, a benchmark).
  virtual void reset_counters() = 0;

  // How long one collective may take before it fails with CollectiveError.
  virtual std::chrono::milliseconds timeout() const = 0;
  // e.g. "gloo/tcp world=4" for messages.
  virtual std::string describe() const = 0;

  // --- Groups (HYBRID_SHARD's shard and replica groups) ---

  // The global rank (in the world this communicator was split from, at any
  // depth) of each of this communicator's ranks, in rank order. A world:
  // 0..N-1. Errors of a group name these.
  virtual std::vector<int> global_ranks() const;
  // The host of each rank, as indices 0..H-1 numbered in rank order of first
  // appearance; ranks with the same index count as one host for the traffic
  // tiers. A world of one: {0}.
  virtual std::vector<int> hosts() const;
  // Collective over this communicator: every rank passes a color >= 0 and
  // gets a new communicator over the ranks that passed the same color,
  // ranked in their order here, on the same backend (its own connections,
  // communication thread, sequence numbers, counters and timeout; what it
  // sends is also added to this communicator's counters). A group
  // whose ranks share one host keeps the same-host transport. A group of one
  // rank is a world of one. Throws fsdp::Error for a negative color, and for
  // communicators that cannot be split (the default: anything with more
  // than one rank).
  virtual CommPtr split(int color, const SplitOptions& opts = {});

  // --- Memory shared by the ranks of a host (docs/COMM.md, "Host-shared units") ---

  // Whether shared_tensor and peer_tensor are offered: the ranks of this
  // communicator on each host may map each other's memory (every rank on
  // this host, or hosts of equal size composed in tiers, docs/COMM.md), and
  // CommOptions::share_host_memory (FSDP_SHARE_HOST) is on. The collective
  // path decides it once, the same on every rank (FSDP_DEBUG=info says why).
  // The default: false.
  virtual bool shares_host_memory() const { return false; }
  // Collective: `numel` zeroed elements of `dtype` over one piece of memory
  // that every rank of this communicator on this host maps, so what one rank
  // writes the others of its host read. all_gather into it, each rank's input
  // being its own block of it (or copied there), moves no bytes inside a
  // host: it is a barrier there (across hosts, the blocks of the other hosts'
  // ranks arrive in it). The memory is freed when the host's last tensor is;
  // no crash leaves it behind. Throws fsdp::Error when !shares_host_memory().
  virtual torch::Tensor shared_tensor(int64_t numel, torch::ScalarType dtype, const CollectiveInfo& info = {});
  // Not collective: `numel` uninitialised elements of `dtype` in memory that
  // this communicator's ranks of this host can map. reduce_scatter from it
  // reads every rank's chunk where it lies and sums it in rank order (0, 1,
  // ..., N-1; bf16 and fp16 in fp32, rounded once; across hosts, each host's
  // ranks in rank order, then the hosts' sums), copying nothing inside a
  // host. Throws fsdp::Error when !shares_host_memory().
  virtual torch::Tensor peer_tensor(int64_t numel, torch::ScalarType dtype);
  // The bytes of this rank's memory that peer_tensor holds now: the tensors
  // in use and the pages kept to serve the next ones (a tensor's memory goes
  // back to a pool of this rank's, reused, never returned before the
  // communicator ends). Resident, but not the allocator's: the memory
  // ledger counts it apart (Ledger::peer_memory). 0 when !shares_host_memory().
  virtual int64_t peer_memory_bytes() const { return 0; }

  // --- Error feedback (CommOptions::compress) ---

  // A copy of this communicator's residuals, taken after every collective
  // issued before the call has finished (the Gloo communicator reads them on
  // its communication thread, in issue order, and waits; it sends nothing).
  // Throws that collective's error when one failed. The default: none, OFF.
  virtual Residuals residuals();
  // Replaces every residual with `by_buffer` (copied; floating tensors, each
  // flat and of the size residuals() gave for its key, which may be a part
  // of the buffer: what this rank sends across hosts; empty: every buffer
  // starts at zero again),
  // in issue order like residuals(), and waits. Throws fsdp::Error for a
  // non-floating tensor, and for a non-empty map when this communicator
  // keeps no residuals (residuals().compress is OFF).
  virtual void load_residuals(const std::map<std::string, torch::Tensor>& by_buffer);
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT (torchrun's conventions, as set by `fsdp run`). With no RANK /
// WORLD_SIZE in the environment, or WORLD_SIZE=1, returns a single-process
// communicator without any rendezvous.
// It has no process-wide side effects: the counting allocator and the
// SIGPIPE disposition are fsdp::init's (init.h); call that first.
CommPtr make_communicator_from_env(const CommOptions& opts = {});

// A world of one; every collective is a local copy.
CommPtr make_local_communicator(const CommOptions& opts = {});

// The error every failed collective raises (timeouts, dead peers, misuse).
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// The mean over all ranks of one number, e.g. the loss for logging:
//   double loss = fsdp::all_reduce_mean(*comm, local_loss.item<double>());
// Collective (every rank calls it, blocks until done); computed in fp64, so
// every rank gets the same value. A world of one returns `value`.
double all_reduce_mean(Communicator& comm, double value, const CollectiveInfo& info = {"all_reduce_mean"});

}  // namespace fsdp
