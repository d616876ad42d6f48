// fsdp-cpp: the three collective paths behind one interface (see
// algorithms.h), and the one place a communicator picks among them.
#include "comm/algorithms.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <optional>

#include "comm/checks.h"
#include "comm/host_shared.h"
#include "comm/quantized.h"
#include "comm/rendezvous.h"
#include "comm/tiers.h"
#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp::comm {
namespace {

// What a compressing path (the tiers, the flat ring of one rank per host)
// keeps: the formats and residuals (TierCompression), and how a
// compressible call becomes a QuantizedCall. Null-like when not
// compressing. Touched by the communicator's thread only.
class PathCompression {
 public:
  // `compress`: OFF, or the compression the path's choice took
  // (path::Choice::compressed). `announce`: FSDP_DEBUG=info on this
  // communicator's rank 0 (a line per new residual).
  PathCompression(Compression compress, bool error_feedback, bool announce) : announce_(announce) {
    if (compress != Compression::OFF)
      with_ = std::make_unique<TierCompression>(tier_compression(compress, error_feedback));
  }

  // A compressible call of `bytes` (the all-gather's block, the
  // reduce-scatter's input, the all-reduce's tensor) when this path
  // compresses; its residuals' key is the label with the buffer's numel and
  // dtype, so two buffers under one label never share a residual.
  // `residual`: the call keeps one (reduce-scatter, all-reduce): named once
  // under FSDP_DEBUG=info when new.
  std::optional<QuantizedCall> call(const Compressible* lossy, int64_t bytes, bool residual) const {
    if (!with_ || !lossy) return std::nullopt;  // lossy: floating only (the communicator's compressible())
    const c10::ScalarType dt = lossy->dtype;
    QuantizedCall q;
    q.with = with_.get();
    q.dtype = dt;
    q.key = detail::cat(lossy->label, " [", bytes / static_cast<int64_t>(c10::elementSize(dt)), " ",
                        dtype_name(dt), "]");
    if (residual && announce_ && with_->error_feedback && !with_->feedback.state().count(q.key))
      std::fprintf(stderr, "fsdp: FSDP_DEBUG: error feedback keeps a residual for '%s' (%s)\n", lossy->label.c_str(),
                   q.key.c_str());
    return q;
  }

  ErrorFeedback* feedback() { return with_ ? &with_->feedback : nullptr; }

 private:
  const bool announce_;
  // Null when not compressing; else the formats and residuals.
  std::unique_ptr<TierCompression> with_;
};

// The flat ring on the communicator's TCP mesh (ring.h). Compressed only
// when no two ranks share a host (path::choose), so every byte of a
// compressible call crosses a host quantized (quantized.h), and counts as
// such (Traffic::inter, inter_logical).
class RingAlgorithms final : public Algorithms {
 public:
  explicit RingAlgorithms(PathCompression compress) : compress_(std::move(compress)) {}

  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block, const Compressible* lossy) override {
    const int n = w.mesh->size, r = w.mesh->rank;
    if (const auto q = compress_.call(lossy, block, false)) {
      // Every rank decodes every block, its own too (`in` is quantized
      // before anything is written, so it may be its place in `out`).
      const int64_t m = block / static_cast<int64_t>(c10::elementSize(q->dtype));
      const auto as = torch::TensorOptions().dtype(q->dtype);
      return across(quantized_all_gather(w, torch::from_blob(const_cast<void*>(in), {m}, as),
                                         torch::from_blob(out, {n * m}, as), m, q->with->weights));
    }
    char* o = static_cast<char*>(out);
    // In-place use (input is block r of output) needs no copy.
    if (block > 0 && in != o + r * block) std::memmove(o + r * block, in, block);
    std::vector<int64_t> offset(n), count(n, block);
    for (int j = 0; j < n; ++j) offset[j] = j * block;
    return ring_all_gather(w, o, offset, count);
  }

  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t m, c10::ScalarType dtype, int divisor,
                         const Compressible* lossy) override {
    const int n = w.mesh->size;
    const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
    if (const auto q = compress_.call(lossy, n * m * es, true)) {
      // As the tiers' inter tier (tiers.cpp, reduce_across): the residual
      // joins the input before it is quantized, what each chunk decoded to
      // is subtracted after. `out` may be chunk r of `in`: written last.
      const auto as = torch::TensorOptions().dtype(dtype);
      ErrorFeedback* feedback = q->with->residuals();
      const torch::Tensor input = torch::from_blob(const_cast<void*>(in), {n * m}, as);
      const torch::Tensor meant = feedback ? feedback->compensate(q->key, input) : input;
      const torch::Tensor decoded = feedback ? torch::empty({n * m}) : torch::Tensor();
      QuantTraffic qt =
          quantized_reduce_scatter(w, meant, torch::from_blob(out, {m}, as), m, q->with->grads, divisor, decoded);
      if (feedback) feedback->remember(q->key, meant, decoded);
      // qt.logical counts `meant`'s fp32 under feedback; the exact ring
      // sends the input's dtype.
      if (n > 1) qt.logical = (n - 1) * m * es;
      return across(qt);
    }
    std::vector<int64_t> offset(n), count(n, m);
    for (int j = 0; j < n; ++j) offset[j] = j * m;
    return ring_reduce_scatter(w, in, out, offset, count, dtype, divisor);
  }

  Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor,
                     const Compressible* lossy) override {
    const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
    if (const auto q = compress_.call(lossy, numel * es, true))
      return across(quantized_all_reduce(w, torch::from_blob(data, {numel}, torch::TensorOptions().dtype(dtype)),
                                         q->with->grads, q->with->reduced, divisor, q->with->residuals(), q->key));
    return ring_all_reduce(w, data, numel, dtype, divisor);
  }

  path::Path path() const override { return path::Path::TCP; }
  const char* name() const override { return "gloo/tcp"; }
  const char* error_source() const override { return "gloo"; }
  ErrorFeedback* feedback() override { return compress_.feedback(); }

 private:
  // A quantized call's bytes: all of them crossed a host (one rank per host).
  static Traffic across(const QuantTraffic& qt) {
    Traffic t(qt.wire, qt.wire);
    t.inter_logical = qt.logical;
    return t;
  }

  PathCompression compress_;
};

// Every rank on this host: the bytes move by cross-memory attach (cma.h),
// the few messages that coordinate it over the TCP mesh. Every byte stays
// on this host.
class CmaAlgorithms final : public Algorithms {
 public:
  // `shared`: the host-shared memory, when the path's choice says so.
  CmaAlgorithms(CmaPeers peers, int rank, std::shared_ptr<HostShared> shared)
      : peers_(std::move(peers)), rank_(rank), shared_(std::move(shared)) {}

  // Every rank passes the same kind of buffer (the engine decides the same
  // on every rank), so every rank takes the same algorithm.
  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block, const Compressible*) override {
    if (shared_ && shared_->is_common(out, block * w.mesh->size)) return shared_->all_gather(w, in, out, block);
    return cma_all_gather(w, peers_, in, out, block);
  }
  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t m, c10::ScalarType dtype, int divisor,
                         const Compressible*) override {
    if (shared_ && shared_->is_block(in, m * w.mesh->size * static_cast<int64_t>(c10::elementSize(dtype))))
      return shared_->reduce_scatter(w, in, out, m, dtype, divisor);
    return cma_reduce_scatter(w, peers_, in, out, m, dtype, divisor);
  }
  std::shared_ptr<HostShared> host_shared() const override { return shared_; }
  void* map_common(const Wire& w, int64_t bytes) override { return shared_->map_common(w, bytes); }
  Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor,
                     const Compressible*) override {
    return cma_all_reduce(w, peers_, data, numel, dtype, divisor);
  }

  path::Path path() const override { return path::Path::CMA; }
  const char* name() const override { return "cma+gloo"; }
  std::string gone_peers() const override { return cma_gone_peers(peers_, rank_); }
  pid_t pid_of(int q) const override {
    return q >= 0 && q < static_cast<int>(peers_.pid.size()) ? peers_.pid[q] : -1;
  }

 private:
  // Constant after construction.
  const CmaPeers peers_;  // every rank's process, in rank order
  const int rank_;        // this rank (its own process is never gone)
  const std::shared_ptr<HostShared> shared_;  // null: each rank keeps its own copies
};

// Across hosts: CMA inside each host, TCP between the ranks of one local
// index (tiers.h). Owns the two tiers' meshes.
class TierAlgorithms final : public Algorithms {
 public:
  TierAlgorithms(std::unique_ptr<Tiers> t, PathCompression compress)
      : t_(std::move(t)), compress_(std::move(compress)) {}

  // As CmaAlgorithms: the host-shared forms for buffers that lie in the
  // host's shared memory, the same on every rank (the all-gather never
  // compressed, the reduce-scatter's inter tier as the plain one, tiers.h).
  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block, const Compressible* lossy) override {
    if (t_->shared && t_->shared->is_common(out, block * w.mesh->size))
      return tier_shared_all_gather(w, *t_, in, out, block);
    const auto q = compress_.call(lossy, block, false);
    return tier_all_gather(w, *t_, in, out, block, q ? &*q : nullptr);
  }
  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t m, c10::ScalarType dtype, int divisor,
                         const Compressible* lossy) override {
    const int64_t bytes = m * w.mesh->size * static_cast<int64_t>(c10::elementSize(dtype));
    const auto q = compress_.call(lossy, bytes, true);
    if (t_->shared && t_->shared->is_block(in, bytes))
      return tier_shared_reduce_scatter(w, *t_, in, out, m, dtype, divisor, q ? &*q : nullptr);
    return tier_reduce_scatter(w, *t_, in, out, m, dtype, divisor, q ? &*q : nullptr);
  }
  std::shared_ptr<HostShared> host_shared() const override { return t_->shared; }
  void* map_common(const Wire& w, int64_t bytes) override { return t_->shared->map_common(t_->intra_wire(w), bytes); }
  Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor,
                     const Compressible* lossy) override {
    const auto q = compress_.call(lossy, numel * static_cast<int64_t>(c10::elementSize(dtype)), true);
    return tier_all_reduce(w, *t_, data, numel, dtype, divisor, q ? &*q : nullptr);
  }

  path::Path path() const override { return path::Path::TIERS; }
  const char* name() const override { return "cma+tcp tiers"; }
  std::string gone_peers() const override {
    return cma_gone_peers(t_->peers, t_->intra_mesh->rank, &t_->intra_ranks());
  }
  pid_t pid_of(int q) const override {
    const TierLayout& L = t_->layout;
    if (L.host[q] != L.host[t_->rank]) return -1;
    return t_->peers.pid[L.local[q]];
  }
  void leave(std::chrono::milliseconds budget) override { t_->leave(budget); }
  ErrorFeedback* feedback() override { return compress_.feedback(); }

 private:
  const std::unique_ptr<Tiers> t_;
  PathCompression compress_;
};

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int g : ranks) s += (s.empty() ? "" : ", ") + std::to_string(g);
  return s;
}

// The compression the choice took (OFF when it says not compressed).
PathCompression compression_of(const PathInputs& in, const path::Choice& c) {
  return PathCompression(c.compressed ? in.opts.compress : Compression::OFF, in.opts.error_feedback,
                         in.opts.debug_info && in.world.rank == 0);
}

}  // namespace

ChosenPath choose_algorithms(const PathInputs& in) {
  const int n = in.world.world_size;
  path::Facts f;
  f.transport = in.opts.transport;
  f.tiers = in.opts.tiers;
  f.share_host = in.opts.share_host;
  f.compress = to_string(in.opts.compress);
  f.ranks = n;
  if (in.opts.transport != "tcp") {
    if (in.transport.one_host)
      f.cma_blocked = in.transport.cma ? "" : in.transport.why;
    else
      f.hosts_differ = in.transport.why;
  } else {
    // FSDP_TRANSPORT=tcp: the hosts still decide whether the flat ring's
    // bytes all cross one (compression, path::choose).
    for (int q = 1; q < n && f.hosts_differ.empty(); ++q)
      if (in.transport.host.at(q) != in.transport.host.at(0))
        f.hosts_differ = detail::cat("the ranks are not all on one host (rank ", in.global.at(0), " on '",
                                     in.transport.host[0], "', rank ", in.global.at(q), " on '",
                                     in.transport.host[q], "')");
  }
  // Whether the ranks can also map each other's memory: asked only where
  // it would be used (one host, memory readable, sharing on).
  if (n > 1 && in.opts.transport != "tcp" && in.transport.one_host && in.transport.cma && f.share_host)
    f.share_blocked = probe_host_sharing(in.mesh, in.transport.peers.pid, Clock::now() + in.opts.rendezvous_timeout);
  std::optional<TierLayout> layout;
  if (!f.hosts_differ.empty()) {
    for (int q = 0; q < n; ++q)
      for (int p = 0; p < n; ++p)
        if (p != q && in.host_index[p] == in.host_index[q]) {
          ++f.ranks_sharing_a_host;
          break;
        }
    layout = tier_layout(in.host_index, in.global, &f.layout_blocked);
  }
  ChosenPath out;
  out.choice = path::choose(f);
  if (out.choice.path == path::Path::TIERS) {
    std::string why;
    if (auto tiers = connect_tiers(in.rdv, in.world, in.mesh, *layout, in.global, in.opts, &why)) {
      // What connecting found: the hosts' shape, and whether their ranks
      // share memory inside each.
      f.tiers_shape = detail::cat(layout->hosts, " hosts of ", layout->per_host, " ranks");
      f.share_blocked = tiers->share_blocked;
      out.choice = path::choose(f);
      out.algorithms = std::make_unique<TierAlgorithms>(std::move(tiers), compression_of(in, out.choice));
    } else {
      f.tiers_blocked = why;
      out.choice = path::choose(f);
    }
  }
  if (!out.choice.refused.empty())
    throw Error(detail::cat("FSDP_TRANSPORT=cma",
                            in.group.empty() ? "" : " in group '" + in.group + "' (global ranks " + ranks_text(in.global) + ")",
                            ", but ", out.choice.refused,
                            ". Use FSDP_TRANSPORT=auto (falls back to TCP) or FSDP_TRANSPORT=tcp."));
  if (!out.algorithms) {
    if (out.choice.path == path::Path::CMA)
      out.algorithms = std::make_unique<CmaAlgorithms>(
          in.transport.peers, in.world.rank,
          out.choice.host_shared ? HostShared::connect(in.mesh, in.transport.peers.pid,
                                                       Clock::now() + in.opts.rendezvous_timeout)
                                 : nullptr);
    else
      out.algorithms = std::make_unique<RingAlgorithms>(compression_of(in, out.choice));
  }
  trace::set_metadata(in.group.empty() ? "collective_path" : "collective_path/" + in.group,
                      {{"path", path::words(out.choice.path)},
                       {"reason", out.choice.reason},
                       {"host_shared", out.choice.host_shared},
                       {"compress", out.choice.compressed ? to_string(in.opts.compress) : "off"},
                       {"ranks", in.global}});
  return out;
}

}  // namespace fsdp::comm
