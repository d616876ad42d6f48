// fsdp-cpp: all_gather, reduce_scatter and all_reduce by cross-memory
// attach (see cma.h).
#include "comm/cma.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "comm/checks.h"
#include "comm/mesh.h"
#include "comm/post_exchange.h"
#include "comm/slots.h"
#include "comm/local_sum.h"
#include "fsdp/errors.h"
#include "observe/flight_hooks.h"
#include "fsdp/memory.h"

namespace fsdp::comm {
namespace {

// The messages of one exchange, each on its own step of the collective's
// CMA steps (Wire::cma_steps, slots.h).
enum Msg { kPost = 0, kReduced = 1, kDone = 2 };
static_assert(kDone < slots::kCmaMessages, "every CMA message has a step of its own in slots.h");

// What a rank tells each peer: where to read, how much; seq and kind guard
// against a peer that runs a different collective.
struct Post {
  uint64_t seq;
  uint64_t addr;
  int64_t nbytes;
  int64_t msg;
};

uint64_t slot(const Wire& w, Msg m) { return slots::slot(w.seq, w.cma_steps.begin + m); }

// One message of kind `m` to and from every peer (post_exchange.h).
class AllToAll : public PostExchange<Post> {
 public:
  AllToAll(const Wire& w, Msg m) : PostExchange<Post>(w, slot(w, m), m), w_(w) {}

  void send(uint64_t addr, int64_t nbytes) { PostExchange<Post>::send(Post{0, addr, nbytes, 0}); }

  // Every peer's message; a failure says how far the reads had come.
  const std::vector<Post>& wait(const char* what) {
    return PostExchange<Post>::wait(what, [this] {
      if (!w_.progress) return std::string();
      return detail::cat(" (", memory::format_bytes(w_.progress->recv_done.load(std::memory_order_relaxed)), " of ",
                         memory::format_bytes(w_.progress->recv_total.load(std::memory_order_relaxed)),
                         " read from the peers so far)");
    });
  }

 private:
  Wire w_;
};

// The peers' buffers, checked against what this rank expects (a peer that
// posts another size runs another collective: fail, do not read past it).
const std::vector<Post>& posted(const Wire& w, AllToAll& x, int64_t expect, int self) {
  const auto& t = x.wait("the buffer address");
  for (size_t q = 0; q < t.size(); ++q)
    if (static_cast<int>(q) != self && t[q].nbytes != expect)
      throw std::runtime_error(detail::cat("rank ", w.name(static_cast<int>(q)), " posted a buffer of ", t[q].nbytes,
                                           " bytes where this rank expected ", expect,
                                           ": the ranks issued different collectives"));
  return t;
}

// Elements of one reduce piece: the ring's cut (common/ring_math.h, the
// step's target), so the staging is never more than the ring's and the
// planner's prediction (src/plan/plan.cpp) holds.
int64_t piece_elems(const Wire& w, int64_t count, int64_t es) { return ring::piece_numel(count, es, w.piece_bytes); }

// Writes to `out` the reduction of elements [off, off + count) of every
// rank's posted buffer, in the ring's order (cma.h); this rank's own
// elements are at `own`. out may be `own` (every piece of own is read
// before it is written); otherwise no peer may read `out`. Staging: one
// piece when out is own, one more when N > 2 (the ring stages 2 at N = 2
// in place, 4 at N > 2); torch allocates it, so the ledger sees it.
void reduce_chunk(const Wire& w, const CmaPeers& p, const std::vector<Post>& t, int64_t off, int64_t count,
                  const char* own, char* out, c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  if (count == 0) return;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  const bool in_place = out == own;
  const int64_t pe = piece_elems(w, count, es);
  const int slots = (in_place ? 1 : 0) + (n > 2 ? 1 : 0);
  torch::Tensor staging;
  if (slots > 0) staging = torch::empty({slots * pe * es}, torch::kByte);
  char* mem = staging.defined() ? static_cast<char*>(staging.data_ptr()) : nullptr;
  char* tmp = mem + (in_place ? pe * es : 0);
  for (int64_t lo = 0; lo < count; lo += pe) {
    const int64_t m = std::min(pe, count - lo);
    const uint64_t at = static_cast<uint64_t>((off + lo) * es);
    // The partial sum starts as rank r+1's piece, straight in the output
    // when that is not our own input.
    char* acc = in_place ? mem : out + lo * es;
    int q = (r + 1) % n;
    read_peer(w, q, p.pid[q], acc, t[q].addr + at, m * es);
    for (int i = 2; i < n; ++i) {
      q = (r + i) % n;
      read_peer(w, q, p.pid[q], tmp, t[q].addr + at, m * es);
      add_into(acc, acc, tmp, m, dtype, 1);
    }
    add_into(out + lo * es, acc, own + lo * es, m, dtype, divisor);
  }
}

// "Nobody reads my buffers any more": sent by every rank, awaited from every
// peer, before a collective returns its buffers to the caller.
void finish(AllToAll& done) {
  done.send(0, 0);
  done.wait("the end of reading");
}

uint64_t address(const void* p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace

int64_t cma_all_gather(const Wire& w, const CmaPeers& p, const void* in, void* out, int64_t block) {
  const int n = w.mesh->size, r = w.mesh->rank;
  char* o = static_cast<char*>(out);
  if (block > 0 && in != o + r * block) std::memmove(o + r * block, in, block);
  if (n == 1 || block == 0) return 0;
  if (w.progress) w.progress->recv_total.fetch_add((n - 1) * block, std::memory_order_relaxed);
  AllToAll post(w, kPost), done(w, kDone);
  // Peers read our block where it now lies in the output: this rank never
  // writes there, whatever `in` aliases.
  post.send(address(o + r * block), block);
  const auto& t = posted(w, post, block, r);
  // Rank r starts at r+1, so the N readers spread over the N sources.
  for (int i = 1; i < n; ++i) {
    const int q = (r + i) % n;
    read_peer(w, q, p.pid[q], o + q * block, t[q].addr, block);
  }
  finish(done);
  post.wait_sent();
  done.wait_sent();
  return (n - 1) * block;
}

int64_t cma_reduce_scatter(const Wire& w, const CmaPeers& p, const void* in, void* out, int64_t count,
                           c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype)), chunk = count * es, total = n * chunk;
  const char* input = static_cast<const char*>(in);
  char* output = static_cast<char*>(out);
  const char* own = input + r * chunk;
  if (n == 1) {
    if (out != in) std::memcpy(out, in, chunk);
    return 0;
  }
  if (count == 0) return 0;
  // An output inside the input anywhere but chunk r would be read by a peer
  // while we write it: reduce into a spare, copy once nobody reads.
  const bool overlaps = output < input + total && output + chunk > input;
  torch::Tensor spare;
  char* dst = output;
  if (overlaps && output != own) {
    spare = torch::empty({chunk}, torch::kByte);
    dst = static_cast<char*>(spare.data_ptr());
  }
  if (w.progress) w.progress->recv_total.fetch_add((n - 1) * chunk, std::memory_order_relaxed);
  AllToAll post(w, kPost), done(w, kDone);
  post.send(address(input), total);
  const auto& t = posted(w, post, total, r);
  reduce_chunk(w, p, t, r * count, count, own, dst, dtype, divisor);
  finish(done);
  if (spare.defined()) std::memcpy(output, dst, chunk);
  post.wait_sent();
  done.wait_sent();
  return (n - 1) * chunk;
}

int64_t cma_all_reduce(const Wire& w, const CmaPeers& p, void* data, int64_t numel, c10::ScalarType dtype,
                       int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  if (n == 1 || numel == 0) return 0;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  const Chunks c = ring_chunks(numel, n);
  char* d = static_cast<char*>(data);
  if (w.progress)
    w.progress->recv_total.fetch_add((n - 1) * c.count[r] * es + (numel - c.count[r]) * es, std::memory_order_relaxed);
  AllToAll post(w, kPost), reduced(w, kReduced), done(w, kDone);
  post.send(address(d), numel * es);
  const auto& t = posted(w, post, numel * es, r);
  // Phase 1: chunk r, in place. Peers read only their own chunks of our
  // tensor, never chunk r, so writing it is safe while they read.
  char* mine = d + c.offset[r] * es;
  reduce_chunk(w, p, t, c.offset[r], c.count[r], mine, mine, dtype, divisor);
  // Phase 2 overwrites chunk q, which rank q may still be reading in phase
  // 1, with rank q's result, which must be final: both wait for this.
  reduced.send(0, 0);
  reduced.wait("the end of the reduce phase");
  for (int i = 1; i < n; ++i) {
    const int q = (r + i) % n;
    read_peer(w, q, p.pid[q], d + c.offset[q] * es, t[q].addr + static_cast<uint64_t>(c.offset[q] * es),
              c.count[q] * es);
  }
  finish(done);
  post.wait_sent();
  reduced.wait_sent();
  done.wait_sent();
  // The ring's bytes: every chunk but ours in the reduce-scatter, every
  // chunk but our right neighbour's in the all-gather.
  return (2 * numel - c.count[r] - c.count[(r + 1) % n]) * es;
}

int64_t cma_gather_segments(const Wire& w, const CmaPeers& p, void* buf, int64_t total_bytes, const Segments& seg) {
  const int n = w.mesh->size, r = w.mesh->rank;
  char* b = static_cast<char*>(buf);
  auto bytes_of = [&](int q) {
    int64_t t = 0;
    for (const Segment& g : seg[q]) t += g.count;
    return t;
  };
  int64_t theirs = 0;
  for (int q = 0; q < n; ++q) theirs += q == r ? 0 : bytes_of(q);
  // Every rank sees the same segments: all skip the exchange or none.
  if (n == 1 || theirs + bytes_of(r) == 0) return 0;
  if (w.progress) w.progress->recv_total.fetch_add(theirs, std::memory_order_relaxed);
  AllToAll post(w, kPost), done(w, kDone);
  // Peers read only our own ranges, which this rank never writes.
  post.send(address(b), total_bytes);
  const auto& t = posted(w, post, total_bytes, r);
  for (int i = 1; i < n; ++i) {
    const int q = (r + i) % n;
    for (const Segment& g : seg[q])
      if (g.count > 0) read_peer(w, q, p.pid[q], b + g.offset, t[q].addr + static_cast<uint64_t>(g.offset), g.count);
  }
  finish(done);
  post.wait_sent();
  done.wait_sent();
  return theirs + bytes_of(r) - bytes_of((r + 1) % n);
}

int64_t cma_reduce_segments(const Wire& w, const CmaPeers& p, const void* in, int64_t numel, void* out,
                            const Segments& seg, c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  const char* input = static_cast<const char*>(in);
  char* output = static_cast<char*>(out);
  int64_t mine = 0, all = 0;
  for (int q = 0; q < n; ++q)
    for (const Segment& g : seg[q]) (q == r ? mine : all) += g.count;
  if (n == 1) {
    for (const Segment& g : seg[r]) {
      if (output != input + g.offset * es) std::memmove(output, input + g.offset * es, g.count * es);
      output += g.count * es;
    }
    return 0;
  }
  if (mine + all == 0) return 0;
  if (w.progress) w.progress->recv_total.fetch_add((n - 1) * mine * es, std::memory_order_relaxed);
  AllToAll post(w, kPost), done(w, kDone);
  post.send(address(input), numel * es);
  const auto& t = posted(w, post, numel * es, r);
  for (const Segment& g : seg[r]) {
    reduce_chunk(w, p, t, g.offset, g.count, input + g.offset * es, output, dtype, divisor);
    output += g.count * es;
  }
  finish(done);
  post.wait_sent();
  done.wait_sent();
  return all * es;
}

}  // namespace fsdp::comm
