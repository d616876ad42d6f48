// fsdp-cpp: collectives over two tiers (see tiers.h).
#include "comm/tiers.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "comm/checks.h"
#include "comm/host_shared.h"
#include "comm/quantized.h"
#include "comm/slots.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

WorldEnv env_of(const WorldEnv& world, const std::vector<int>& members, bool same_host) {
  WorldEnv g = world;
  g.world_size = static_cast<int>(members.size());
  g.rank = static_cast<int>(std::find(members.begin(), members.end(), world.rank) - members.begin());
  g.local_rank = same_host ? g.rank : 0;
  g.local_world_size = same_host ? g.world_size : 1;
  return g;
}

std::vector<int> globals_of(const std::vector<int>& members, const std::vector<int>& global) {
  std::vector<int> out;
  for (int q : members) out.push_back(global.at(q));
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int q : ranks) s += (s.empty() ? "" : ", ") + std::to_string(q);
  return s;
}

}  // namespace

std::optional<TierLayout> tier_layout(const std::vector<int>& host_index, const std::vector<int>& global,
                                      std::string* why) {
  TierLayout L;
  const int n = static_cast<int>(host_index.size());
  for (int h : host_index) L.hosts = std::max(L.hosts, h + 1);
  L.intra.resize(L.hosts);
  L.host = host_index;
  L.local.resize(n);
  for (int q = 0; q < n; ++q) {
    L.local[q] = static_cast<int>(L.intra[host_index[q]].size());
    L.intra[host_index[q]].push_back(q);
  }
  if (L.hosts < 2) {
    *why = "every rank is on one host";
    return std::nullopt;
  }
  L.per_host = static_cast<int>(L.intra[0].size());
  for (int h = 0; h < L.hosts; ++h)
    if (static_cast<int>(L.intra[h].size()) != L.per_host) {
      *why = detail::cat("the hosts have different numbers of ranks (host of rank ", global.at(L.intra[0][0]), ": ",
                         L.intra[0].size(), ", host of rank ", global.at(L.intra[h][0]), ": ", L.intra[h].size(),
                         "); tiers compose only hosts of equal size");
      return std::nullopt;
    }
  if (L.per_host < 2) {
    *why = "every host has one rank: nothing moves inside a host";
    return std::nullopt;
  }
  L.inter.resize(L.per_host);
  for (int q = 0; q < n; ++q) L.inter[L.local[q]].push_back(q);  // rank order
  return L;
}

void Tiers::leave(std::chrono::milliseconds budget) {
  if (intra_rdv) intra_rdv->leave(budget);
  if (inter_rdv) inter_rdv->leave(budget);
}

std::unique_ptr<Tiers> connect_tiers(const Rendezvous& parent, const WorldEnv& world, Mesh* mesh,
                                     const TierLayout& layout, const std::vector<int>& global,
                                     const ResolvedOptions& opts, std::string* why) {
  auto t = std::make_unique<Tiers>();
  t->layout = layout;
  t->rank = world.rank;
  const int h = layout.host[world.rank], s = layout.local[world.rank];
  const auto& intra = t->intra_ranks();
  const auto& inter = t->inter_ranks();
  const std::vector<int> intra_global = globals_of(intra, global), inter_global = globals_of(inter, global);
  // Same-host mesh first: it waits only for this host's ranks, so the
  // hosts never wait on each other in a cycle.
  t->intra_rdv = std::make_unique<Rendezvous>(parent, detail::cat("tier/h", h, "/"), env_of(world, intra, true),
                                              intra_global);
  t->intra_mesh = t->intra_rdv->connect_gloo(opts.ifname);
  const std::string host_group = detail::cat("host tier of ranks ", ranks_text(intra_global));
  TransportChoice c = choose_transport(t->intra_mesh.get(), "auto", opts.host_id,
                                       Clock::now() + opts.rendezvous_timeout, intra_global, host_group);
  // Whether this host's ranks can also map each other's memory (a
  // collective of the host's ranks alone, as the transport's choice was).
  std::string share_why;
  if (c.cma && opts.share_host)
    share_why = probe_host_sharing(t->intra_mesh.get(), c.peers.pid, Clock::now() + opts.rendezvous_timeout,
                                   &intra_global);
  t->inter_rdv = std::make_unique<Rendezvous>(parent, detail::cat("tier/l", s, "/"), env_of(world, inter, false),
                                              inter_global);
  t->inter_mesh = t->inter_rdv->connect_gloo(opts.ifname);
  // Every rank must take the same path: one host that cannot read its
  // ranks' memory sends everybody the flat way; one whose ranks cannot map
  // each other's keeps every host's copies apart.
  const int n = mesh->size;
  enum : int32_t { kReads = 1, kMaps = 2 };
  std::vector<int32_t> ok(n, 0);
  ok[mesh->rank] = (c.cma ? kReads : 0) | (c.cma && opts.share_host && share_why.empty() ? kMaps : 0);
  std::vector<int64_t> offset(n), count(n, sizeof(int32_t));
  for (int q = 0; q < n; ++q) offset[q] = q * static_cast<int64_t>(sizeof(int32_t));
  try {
    ring_all_gather(Wire{mesh, 0, Clock::now() + opts.rendezvous_timeout}, ok.data(), offset, count,
                    slots::kTiersAgree);
  } catch (const std::exception& e) {
    throw Error(detail::cat("rank ", global.at(world.rank),
                            ": agreeing on the tiers (CMA inside each host, TCP between) failed: a rank stopped or "
                            "the network stalled: ",
                            e.what()));
  }
  for (int q = 0; q < n; ++q)
    if (!(ok[q] & kReads)) {
      *why = c.cma ? detail::cat("the ranks on the host of rank ", global.at(q), " cannot use cross-memory attach")
                   : c.why;
      t->leave(std::chrono::milliseconds(0));
      return nullptr;
    }
  t->peers = c.peers;
  if (opts.share_host) {
    for (int q = 0; q < n && t->share_blocked.empty(); ++q)
      if (!(ok[q] & kMaps))
        t->share_blocked = !share_why.empty() ? share_why
                                              : detail::cat("the ranks on the host of rank ", global.at(q),
                                                            " cannot map each other's memory");
    if (t->share_blocked.empty())
      t->shared = HostShared::connect(t->intra_mesh.get(), c.peers.pid, Clock::now() + opts.rendezvous_timeout,
                                      &t->intra_ranks());
  }
  *why = "";
  return t;
}

namespace {

// The first tier of both all-gathers (b > 0): this rank's block at its
// place in `o` (unless it is there), then the blocks of this rank's local
// index, one per host, straight into their places (rank order is the
// ring's: ascending). Returns the bytes sent across hosts.
int64_t gather_across(const Wire& w, const Tiers& t, const void* in, char* o, int64_t b) {
  const int r = t.rank, H = t.layout.hosts;
  if (in != o + r * b) std::memmove(o + r * b, in, b);
  const auto& inter = t.inter_ranks();
  std::vector<int64_t> offset(H), count(H, b);
  for (int j = 0; j < H; ++j) offset[j] = inter[j] * b;
  return ring_all_gather(t.inter_wire(w), o, offset, count);
}

// gather_across, quantized (tiers.h, "Compressed"): the H decoded shards,
// this rank's own too, staged in inter rank order, then copied to their
// places. `in` may be this rank's place: it is quantized before any copy.
QuantTraffic gather_across_quantized(const Wire& w, const Tiers& t, const void* in, char* o, int64_t b,
                                     const QuantizedCall& q) {
  const int H = t.layout.hosts;
  const int64_t m = b / static_cast<int64_t>(c10::elementSize(q.dtype));
  const auto as = torch::TensorOptions().dtype(q.dtype);
  torch::Tensor mine = torch::from_blob(const_cast<void*>(in), {m}, as);
  torch::Tensor gathered = torch::empty({H * m}, as);
  const QuantTraffic sent = quantized_all_gather(t.inter_wire(w), mine, gathered, m, q.with->weights);
  const auto& inter = t.inter_ranks();
  const char* g = static_cast<const char*>(gathered.data_ptr());
  for (int j = 0; j < H; ++j) std::memcpy(o + inter[j] * b, g + j * b, b);
  return sent;
}

Traffic reduce_across(const Wire& w, const Tiers& t, char* host_sums, void* out, int64_t m, c10::ScalarType dtype,
                      int divisor, const QuantizedCall* q, int64_t inside);

}  // namespace

TierCompression tier_compression(Compression c, bool error_feedback) {
  TierCompression tc;
  tc.weights = {c == Compression::FP8 ? QuantKind::FP8_E4M3 : QuantKind::INT8, 256, c10::kFloat};
  tc.grads = {c == Compression::INT4 ? QuantKind::INT4 : QuantKind::INT8, 256, c10::kFloat};
  // The reduced chunks are what every rank keeps: int8 for every value (fp8's
  // gradients are int8 too), never int4.
  tc.reduced = {QuantKind::INT8, 256, c10::kFloat};
  tc.error_feedback = error_feedback;
  return tc;
}

Traffic tier_all_gather(const Wire& w, const Tiers& t, const void* in, void* out, int64_t b,
                        const QuantizedCall* q) {
  const TierLayout& L = t.layout;
  const int S = L.per_host, n = L.hosts * S;
  char* o = static_cast<char*>(out);
  if (b == 0) return {0, 0};
  // 1. The shards of this rank's local index, one per host.
  int64_t across = 0, logical = -1;
  if (q) {
    const QuantTraffic qt = gather_across_quantized(w, t, in, o, b, *q);
    across = qt.wire;
    logical = qt.logical;
  } else {
    across = gather_across(w, t, in, o, b);
  }
  // 2. Local rank q now holds the H blocks of local index q: read them
  // where they lie in its output.
  Segments seg(S);
  for (int q = 0; q < S; ++q)
    for (int g : L.inter[q]) seg[q].push_back({g * b, b});
  const int64_t inside = cma_gather_segments(t.intra_wire(w), t.peers, o, n * b, seg);
  Traffic sent(across + inside, across);
  sent.inter_logical = logical;
  return sent;
}

Traffic tier_reduce_scatter(const Wire& w, const Tiers& t, const void* in, void* out, int64_t m,
                            c10::ScalarType dtype, int divisor, const QuantizedCall* q) {
  const TierLayout& L = t.layout;
  const int H = L.hosts, S = L.per_host, n = H * S;
  if (m == 0) return {0, 0};
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  // 1. Local rank q gets the host's sum of the chunks of local index q (in
  // the inter ring's order), the only ones it forwards: staged, through
  // torch so the ledger sees it.
  torch::Tensor staged = torch::empty({H * m * es}, torch::kByte);
  char* host_sums = static_cast<char*>(staged.data_ptr());
  Segments seg(S);
  for (int k = 0; k < S; ++k)
    for (int g : L.inter[k]) seg[k].push_back({g * m, m});
  const int64_t inside = cma_reduce_segments(t.intra_wire(w), t.peers, in, n * m, host_sums, seg, dtype, 1);
  // 2. Across hosts: inter rank j gets the sum of every host's chunk j,
  // which is this rank's chunk.
  return reduce_across(w, t, host_sums, out, m, dtype, divisor, q, inside);
}

namespace {

// The second tier of both reduce-scatters: `host_sums` holds this host's
// sums of the H chunks this rank forwards (inter rank order); the sum over
// the hosts of chunk j lands in `out` of inter rank j. `inside`: the first
// tier's bytes, for the total.
Traffic reduce_across(const Wire& w, const Tiers& t, char* host_sums, void* out, int64_t m, c10::ScalarType dtype,
                      int divisor, const QuantizedCall* q, int64_t inside) {
  const int H = t.layout.hosts;
  if (q) {
    // Compressed: this buffer's residual joins the host sums before they
    // are quantized; what the peers decode (the collective's `sent`, decoded
    // from the very bytes it sent) is subtracted after.
    // Without error feedback the host sums go as they are.
    const auto as = torch::TensorOptions().dtype(dtype);
    ErrorFeedback* feedback = q->with->residuals();
    const QuantFormat& f = q->with->grads;
    const torch::Tensor sums = torch::from_blob(host_sums, {H * m}, as);
    const torch::Tensor meant = feedback ? feedback->compensate(q->key, sums) : sums;
    torch::Tensor decoded = feedback ? torch::empty({H * m}) : torch::Tensor();
    const QuantTraffic qt =
        quantized_reduce_scatter(t.inter_wire(w), meant, torch::from_blob(out, {m}, as), m, f, divisor, decoded);
    if (feedback) feedback->remember(q->key, meant, decoded);
    Traffic sent(inside + qt.wire, qt.wire);
    // qt.logical counts `meant`'s fp32; the uncompressed ring would have
    // sent the host sums in their own dtype.
    sent.inter_logical = qt.logical / static_cast<int64_t>(meant.element_size()) *
                         static_cast<int64_t>(c10::elementSize(dtype));
    return sent;
  }
  std::vector<int64_t> offset(H), count(H, m);
  for (int j = 0; j < H; ++j) offset[j] = j * m;
  const int64_t across = ring_reduce_scatter(t.inter_wire(w), host_sums, out, offset, count, dtype, divisor);
  return {inside + across, across};
}

}  // namespace

Traffic tier_all_reduce(const Wire& w, const Tiers& t, void* data, int64_t numel, c10::ScalarType dtype,
                        int divisor, const QuantizedCall* q) {
  const TierLayout& L = t.layout;
  const int H = L.hosts, S = L.per_host, local = L.local[t.rank];
  if (numel == 0) return {0, 0};
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  char* d = static_cast<char*>(data);
  // 1. The host's sum of chunk `local` (the ring's uneven chunks over S),
  // in place: peers read only their own chunks of this tensor.
  const Chunks c = ring_chunks(numel, S);
  Segments seg(S), seg_bytes(S);
  for (int q = 0; q < S; ++q) {
    seg[q] = {{c.offset[q], c.count[q]}};
    seg_bytes[q] = {{c.offset[q] * es, c.count[q] * es}};
  }
  char* mine = d + c.offset[local] * es;
  int64_t inside = cma_reduce_segments(t.intra_wire(w), t.peers, d, numel, mine, seg, dtype, 1);
  // 2. That chunk over the hosts: ring reduce-scatter + all-gather, in
  // place, as the flat all_reduce does on the whole tensor (compressed:
  // quantized.h's all-reduce, its residuals under the call's key).
  int64_t across = 0, logical = q ? 0 : -1;
  if (q && c.count[local] > 0) {
    const QuantTraffic qt = quantized_all_reduce(
        t.inter_wire(w), torch::from_blob(mine, {c.count[local]}, torch::TensorOptions().dtype(dtype)),
        q->with->grads, q->with->reduced, divisor, q->with->residuals(), q->key);
    across = qt.wire;
    logical = qt.logical;
  } else if (c.count[local] > 0) {
    const Wire x = t.inter_wire(w);
    const int j = x.mesh->rank;
    Chunks e = ring_chunks(c.count[local], H);
    across = ring_reduce_scatter(x, mine, mine + e.offset[j] * es, e.offset, e.count, dtype, divisor);
    for (int k = 0; k < H; ++k) {
      e.offset[k] *= es;
      e.count[k] *= es;
    }
    across += ring_all_gather(x, mine, e.offset, e.count, slots::kRing.from(H));
  }
  // 3. Every chunk from the local rank that holds it: a second CMA exchange
  // under the same sequence number, on steps of its own.
  Wire second = t.intra_wire(w);
  second.cma_steps = slots::kCmaSecond;
  inside += cma_gather_segments(second, t.peers, d, numel * es, seg_bytes);
  Traffic sent(inside + across, across);
  sent.inter_logical = logical;
  return sent;
}

Traffic tier_shared_all_gather(const Wire& w, const Tiers& t, const void* in, void* out, int64_t b) {
  const TierLayout& L = t.layout;
  const int H = L.hosts, S = L.per_host;
  if (b == 0) return {0, 0};
  // 1. As tier_all_gather, into the host's copy: in fp32 the shard is its
  // slice already, a low-precision copy is written there; each local rank
  // writes its own places, so the host's ranks never write the same byte.
  const int64_t across = gather_across(w, t, in, static_cast<char*>(out), b);
  // 2. Every block of the unit is in place once every rank of the host got
  // its H: a barrier in the host's memory (host_shared.h).
  t.shared->gathered(t.intra_wire(w));
  Traffic sent(across + static_cast<int64_t>(S - 1) * H * b, across);
  sent.host_shared = true;
  return sent;
}

Traffic tier_shared_reduce_scatter(const Wire& w, const Tiers& t, const void* in, void* out, int64_t m,
                                   c10::ScalarType dtype, int divisor, const QuantizedCall* q) {
  const TierLayout& L = t.layout;
  const int H = L.hosts, n = H * L.per_host;
  if (m == 0) return {0, 0};
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  // 1. The host's sums of the H chunks this rank forwards, read where every
  // local rank's gradients lie: staged, through torch so the ledger sees it.
  torch::Tensor staged = torch::empty({H * m * es}, torch::kByte);
  char* host_sums = static_cast<char*>(staged.data_ptr());
  std::vector<int64_t> chunks;
  for (int g : t.inter_ranks()) chunks.push_back(g * m);
  const int64_t inside = t.shared->sum_chunks(t.intra_wire(w), in, n * m * es, chunks, m, host_sums, dtype, 1).bytes;
  // 2. Across hosts, as tier_reduce_scatter (compressed too: `out` is this
  // rank's own shard of the gradients, never the host's memory).
  Traffic sent = reduce_across(w, t, host_sums, out, m, dtype, divisor, q, inside);
  sent.host_shared = true;
  return sent;
}

}  // namespace fsdp::comm
