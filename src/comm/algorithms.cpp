// fsdp-cpp: the three collective paths behind one interface (see
// algorithms.h), and the one place a communicator picks among them.
#include "comm/algorithms.h"

#include <cstring>
#include <optional>

#include "comm/checks.h"
#include "comm/host_shared.h"
#include "comm/rendezvous.h"
#include "comm/tiers.h"
#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp::comm {
namespace {

// The flat ring on the communicator's TCP mesh (ring.h).
class RingAlgorithms final : public Algorithms {
 public:
  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block) override {
    const int n = w.mesh->size, r = w.mesh->rank;
    char* o = static_cast<char*>(out);
    // In-place use (input is block r of output) needs no copy.
    if (block > 0 && in != o + r * block) std::memmove(o + r * block, in, block);
    std::vector<int64_t> offset(n), count(n, block);
    for (int j = 0; j < n; ++j) offset[j] = j * block;
    return ring_all_gather(w, o, offset, count);
  }

  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t m, c10::ScalarType dtype,
                         int divisor) override {
    const int n = w.mesh->size;
    std::vector<int64_t> offset(n), count(n, m);
    for (int j = 0; j < n; ++j) offset[j] = j * m;
    return ring_reduce_scatter(w, in, out, offset, count, dtype, divisor);
  }

  Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor) override {
    return ring_all_reduce(w, data, numel, dtype, divisor);
  }

  path::Path path() const override { return path::Path::TCP; }
  const char* name() const override { return "gloo/tcp"; }
  const char* error_source() const override { return "gloo"; }
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
  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block) override {
    if (shared_ && shared_->is_common(out, block * w.mesh->size)) return shared_->all_gather(w, in, out, block);
    return cma_all_gather(w, peers_, in, out, block);
  }
  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t m, c10::ScalarType dtype,
                         int divisor) override {
    if (shared_ && shared_->is_block(in, m * w.mesh->size * static_cast<int64_t>(c10::elementSize(dtype))))
      return shared_->reduce_scatter(w, in, out, m, dtype, divisor);
    return cma_reduce_scatter(w, peers_, in, out, m, dtype, divisor);
  }
  std::shared_ptr<HostShared> host_shared() const override { return shared_; }
  void* map_common(const Wire& w, int64_t bytes) override { return shared_->map_common(w, bytes); }
  Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor) override {
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
  explicit TierAlgorithms(std::unique_ptr<Tiers> t) : t_(std::move(t)) {}

  // As CmaAlgorithms: the host-shared forms for buffers that lie in the
  // host's shared memory, the same on every rank.
  Traffic all_gather(const Wire& w, const void* in, void* out, int64_t block) override {
    if (t_->shared && t_->shared->is_common(out, block * w.mesh->size))
      return tier_shared_all_gather(w, *t_, in, out, block);
    return tier_all_gather(w, *t_, in, out, block);
  }
  Traffic reduce_scatter(const Wire& w, const void* in, void* out, int64_t m, c10::ScalarType dtype,
                         int divisor) override {
    if (t_->shared && t_->shared->is_block(in, m * w.mesh->size * static_cast<int64_t>(c10::elementSize(dtype))))
      return tier_shared_reduce_scatter(w, *t_, in, out, m, dtype, divisor);
    return tier_reduce_scatter(w, *t_, in, out, m, dtype, divisor);
  }
  std::shared_ptr<HostShared> host_shared() const override { return t_->shared; }
  void* map_common(const Wire& w, int64_t bytes) override { return t_->shared->map_common(t_->intra_wire(w), bytes); }
  Traffic all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor) override {
    return tier_all_reduce(w, *t_, data, numel, dtype, divisor);
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

 private:
  const std::unique_ptr<Tiers> t_;
};

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int g : ranks) s += (s.empty() ? "" : ", ") + std::to_string(g);
  return s;
}

}  // namespace

ChosenPath choose_algorithms(const PathInputs& in) {
  const int n = in.world.world_size;
  path::Facts f;
  f.transport = in.opts.transport;
  f.tiers = in.opts.tiers;
  f.share_host = in.opts.share_host;
  f.ranks = n;
  if (in.opts.transport != "tcp") {
    if (in.transport.one_host)
      f.cma_blocked = in.transport.cma ? "" : in.transport.why;
    else
      f.hosts_differ = in.transport.why;
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
      out.algorithms = std::make_unique<TierAlgorithms>(std::move(tiers));
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
      out.algorithms = std::make_unique<RingAlgorithms>();
  }
  trace::set_metadata(in.group.empty() ? "collective_path" : "collective_path/" + in.group,
                      {{"path", path::words(out.choice.path)},
                       {"reason", out.choice.reason},
                       {"host_shared", out.choice.host_shared},
                       {"ranks", in.global}});
  return out;
}

}  // namespace fsdp::comm
