// fsdp-cpp: ring collectives on a mesh's links (see ring.h).
//
// Gloo's old algorithm classes (ReduceScatterHalvingDoubling, ...) were seen
// leaving sockets in a state where later 64 MiB all-gathers took 20 s, and
// the CMA path must add in the same order as this one (bitwise equal
// results), so the algorithms are written here on point-to-point sends and
// receives (mesh.h).
#include "comm/ring.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/checks.h"
#include "comm/mesh.h"
#include "comm/slots.h"
#include "comm/local_sum.h"
#include "fsdp/errors.h"
#include "observe/flight_hooks.h"
#include "fsdp/memory.h"

namespace fsdp::comm {
namespace {

// Every message of a collective: its step within the collective's slots
// (slots.h says which algorithm owns which steps).
uint64_t slot(const Wire& w, int step) { return slots::slot(w.seq, step); }

// The transfers posted over one region of memory, waited for in the order
// posted (those to or from one peer complete in that order anyway).
class Posted {
 public:
  Posted(const Wire& w, const void* base) : w_(w), base_(static_cast<char*>(const_cast<void*>(base))) {}
  void send(int peer, uint64_t slot, int64_t offset, int64_t nbytes) {
    q_.emplace_back(peer, post_send(w_, peer, slot, base_ + offset, nbytes));
  }
  void recv(int peer, uint64_t slot, int64_t offset, int64_t nbytes) {
    q_.emplace_back(peer, post_recv(w_, peer, slot, base_ + offset, nbytes));
  }
  // The oldest transfer not yet waited for, and its peer.
  std::pair<int, Transfer> take() {
    auto t = std::move(q_.front());
    q_.pop_front();
    return t;
  }

 private:
  const Wire& w_;
  char* base_;
  std::deque<std::pair<int, Transfer>> q_;
};
using Buffer = std::unique_ptr<Posted>;

// Which neighbour a peer is, for messages.
std::string neighbour(const Wire& w, int peer) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int q = w.name(peer);
  if (n > 1 && peer == (r + n - 1) % n && peer == (r + 1) % n) return detail::cat("rank ", q, " (its ring neighbour)");
  if (peer == (r + n - 1) % n) return detail::cat("rank ", q, " (its left neighbour in the ring)");
  if (peer == (r + 1) % n) return detail::cat("rank ", q, " (its right neighbour in the ring)");
  return detail::cat("rank ", q);
}

int64_t load(const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); }

// Waits for `nbytes` from `peer` (or for `peer` to take what was sent),
// recording it in the step's progress; a failure names the peer and how far
// the transfer got.
void wait_recv(const Wire& w, Posted& b, int peer, int64_t nbytes) {
  if (w.progress) w.progress->wait_on(w.name(peer), flight::Progress::RECEIVE);
  try {
    if (!b.take().second.wait(remaining(w))) throw std::runtime_error("receive aborted");
  } catch (const std::exception& e) {
    std::string far;
    if (w.progress)
      far = detail::cat(": ", memory::format_bytes(load(w.progress->recv_done)), " of ",
                        memory::format_bytes(load(w.progress->recv_total)), " had arrived");
    throw std::runtime_error(detail::cat("waiting to receive from ", neighbour(w, peer), far, " (", e.what(), ")"));
  }
  if (w.progress) w.progress->arrived(nbytes), w.progress->idle();
}
void wait_send(const Wire& w, Posted& b, int peer, int64_t nbytes) {
  if (w.progress) w.progress->wait_on(w.name(peer), flight::Progress::SEND);
  try {
    if (!b.take().second.wait(remaining(w))) throw std::runtime_error("send aborted");
  } catch (const std::exception& e) {
    std::string far;
    if (w.progress)
      far = detail::cat(": ", memory::format_bytes(load(w.progress->sent_done)), " of ",
                        memory::format_bytes(load(w.progress->send_total)), " had been taken");
    throw std::runtime_error(detail::cat("waiting for ", neighbour(w, peer), " to take what this rank sent", far, " (",
                                         e.what(), ")"));
  }
  if (w.progress) w.progress->sent(nbytes), w.progress->idle();
}
// Waits for the next of the `pending` peers (posted in that order; the one
// that completes is removed); a failure names those not heard from.
template <bool Recv>
void wait_any(const Wire& w, Posted& b, std::vector<int>& pending, int64_t nbytes) {
  if (w.progress) w.progress->wait_on(pending.empty() ? -1 : w.name(pending.front()), Recv ? flight::Progress::RECEIVE
                                                                                    : flight::Progress::SEND);
  int from = -1;
  try {
    auto [peer, t] = b.take();
    from = peer;
    if (!t.wait(remaining(w))) throw std::runtime_error(Recv ? "receive aborted" : "send aborted");
  } catch (const std::exception& e) {
    std::string who;
    for (int p : pending) who += detail::cat(who.empty() ? "" : ", ", w.name(p));
    throw std::runtime_error(detail::cat(Recv ? "waiting to receive from rank" : "waiting for rank",
                                         pending.size() > 1 ? "s " : " ", who,
                                         Recv ? " (not heard from yet)" : " to take what this rank sent", " (",
                                         e.what(), ")"));
  }
  pending.erase(std::remove(pending.begin(), pending.end(), from), pending.end());
  if (w.progress) {
    if (Recv) w.progress->arrived(nbytes);
    else w.progress->sent(nbytes);
    w.progress->idle();
  }
}

void expect(const Wire& w, int64_t recv, int64_t send) {
  if (!w.progress) return;
  w.progress->recv_total.fetch_add(recv, std::memory_order_relaxed);
  w.progress->send_total.fetch_add(send, std::memory_order_relaxed);
}

Buffer wrap(const Wire& w, const void* p, int64_t /*nbytes*/) { return std::make_unique<Posted>(w, p); }

}  // namespace

namespace {

// A post that failed: the peer is the one waited on (the link to it broke).
[[noreturn]] void post_failed(const Wire& w, int peer, flight::Progress::Waiting what, const std::exception& e) {
  if (w.progress) w.progress->wait_on(w.name(peer), what);
  throw std::runtime_error(detail::cat(what == flight::Progress::SEND ? "sending to rank " : "receiving from rank ",
                                       w.name(peer), ": the link to it had already failed (", e.what(), ")"));
}

}  // namespace

Transfer post_send(const Wire& w, int peer, uint64_t slot, const void* p, int64_t nbytes) {
  try {
    return w.mesh->send(peer, slot, p, nbytes);
  } catch (const std::exception& e) {
    post_failed(w, peer, flight::Progress::SEND, e);
  }
}

Transfer post_recv(const Wire& w, int peer, uint64_t slot, void* p, int64_t nbytes) {
  try {
    return w.mesh->recv(peer, slot, p, nbytes);
  } catch (const std::exception& e) {
    post_failed(w, peer, flight::Progress::RECEIVE, e);
  }
}

namespace {

// Both ring algorithms move each block in pieces. Every block (chunk) is cut
// into the same number of pieces, and the messages of a link go piece by
// piece: (piece 0: steps 0..N-2), (piece 1: ...), ... A piece that arrived is
// forwarded (all-gather) or added to and forwarded (reduce-scatter) at once,
// so the transfers of one step overlap the next step's and the local work,
// instead of each step waiting for a whole block. Message (step k, piece j)
// uses step base + j (N-1) + k of its range (slots.h): the all-gather's
// is the caller's, the reduce-scatter's slots::kRingReduce.
constexpr int kGatherWindow = 4;  // all-gather receives posted ahead
constexpr int kRecvSlots = 2;     // reduce-scatter receives posted ahead (staged)
constexpr int kSendSlots = 2;     // reduce-scatter partials on their way right

static_assert(kRecvSlots + kSendSlots == ring::kReduceStagingSlots,
              "the planner counts the reduce-scatter's staging as ring::kReduceStagingSlots pieces");

// Pieces per block for blocks of at most `max_units` units of `unit` bytes
// cut for the step's target (common/ring_math.h), with at most
// `max_messages` (step, piece) slots.
int64_t pieces_for(const Wire& w, int64_t max_units, int64_t unit, int n, int64_t max_messages) {
  return std::max<int64_t>(1, std::min<int64_t>(ring::pieces_for(max_units, unit, w.piece_bytes), max_messages / (n - 1)));
}

// Piece j of `count` units cut into `pieces`: [*lo, *lo + size).
int64_t piece_of(int64_t count, int64_t pieces, int64_t j, int64_t* lo) {
  const shard::Range r = ring::piece(count, pieces, j);
  *lo = r.lo;
  return r.size();
}

}  // namespace

int64_t ring_all_gather(const Wire& w, void* buf, const std::vector<int64_t>& offset_bytes,
                        const std::vector<int64_t>& count_bytes, slots::Range steps) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t total = offset_bytes.back() + count_bytes.back();
  if (n == 1 || total == 0) return 0;
  // As many pieces as the range has steps for.
  const int64_t pieces = pieces_for(w, *std::max_element(count_bytes.begin(), count_bytes.end()), 1, n, steps.size());
  auto msg_slot = [&](int step, int64_t j) { return slot(w, steps.begin + static_cast<int>(j * (n - 1) + step)); };
  auto send_block = [&](int step) { return (r - step + n) % n; };
  auto recv_block = [&](int step) { return (r - step - 1 + 2 * n) % n; };

  // Sends read blocks that are complete (ours, or forwarded after arrival);
  // they wait for nothing but the right's receive, so they are waited for
  // only at the end. Zero-byte pieces are skipped on both sides.
  Buffer send_b = wrap(w, buf, total);
  std::vector<int64_t> send_sizes;
  int64_t sent = 0;
  {
    int64_t to_recv = 0, to_send = 0;
    for (int k = 0; k < n - 1; ++k) to_recv += count_bytes[recv_block(k)], to_send += count_bytes[send_block(k)];
    expect(w, to_recv, to_send);
  }
  auto send_piece = [&](int step, int64_t j) {
    const int b = send_block(step);
    int64_t lo, m = piece_of(count_bytes[b], pieces, j, &lo);
    if (m == 0) return;
    send_b->send(right, msg_slot(step, j), offset_bytes[b] + lo, m);
    send_sizes.push_back(m);
    sent += m;
  };
  for (int64_t j = 0; j < pieces; ++j) send_piece(0, j);

  // Receives land in place, in wire order; each outstanding one has its own
  // wrapper of `buf`, so a completion names its piece.
  std::vector<std::pair<int, int64_t>> order;  // (step, piece)
  for (int64_t j = 0; j < pieces; ++j)
    for (int k = 0; k < n - 1; ++k) {
      int64_t lo;
      if (piece_of(count_bytes[recv_block(k)], pieces, j, &lo) > 0) order.emplace_back(k, j);
    }
  std::vector<Buffer> rb;
  for (size_t i = 0; i < order.size() && i < size_t(kGatherWindow); ++i) rb.push_back(wrap(w, buf, total));
  auto post = [&](size_t i) {
    auto [k, j] = order[i];
    const int b = recv_block(k);
    int64_t lo, m = piece_of(count_bytes[b], pieces, j, &lo);
    rb[i % kGatherWindow]->recv(left, msg_slot(k, j), offset_bytes[b] + lo, m);
  };
  for (size_t i = 0; i < rb.size(); ++i) post(i);
  // A rank waits only for its left to have passed on the message before
  // this one in wire order, so the ring cannot deadlock.
  for (size_t i = 0; i < order.size(); ++i) {
    auto [k, j] = order[i];
    {
      int64_t lo;
      wait_recv(w, *rb[i % kGatherWindow], left, piece_of(count_bytes[recv_block(k)], pieces, j, &lo));
    }
    if (k < n - 2) send_piece(k + 1, j);  // what arrived at step k leaves at step k+1
    if (i + kGatherWindow < order.size()) post(i + kGatherWindow);
  }
  for (int64_t m : send_sizes) wait_send(w, *send_b, right, m);
  return sent;
}

int64_t ring_reduce_scatter(const Wire& w, const void* in, void* out_chunk,
                            const std::vector<int64_t>& offset, const std::vector<int64_t>& count,
                            c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  const char* input = static_cast<const char*>(in);
  char* out = static_cast<char*>(out_chunk);
  if (n == 1) {
    if (out_chunk != in) std::memcpy(out_chunk, in, count[0] * es);
    // AVG over one rank is the identity; divisor is 1 here by construction.
    return 0;
  }
  const int64_t max_count = *std::max_element(count.begin(), count.end());
  if (max_count == 0) return 0;
  const int64_t pieces = pieces_for(w, max_count, es, n, slots::kRingReduce.size());
  // Piece j of chunk c: elements [*lo, *lo + size) of the chunk.
  auto piece = [&](int c, int64_t j, int64_t* lo) { return piece_of(count[c], pieces, j, lo); };
  auto msg_slot = [&](int step, int64_t j) { return slot(w, slots::kRingReduce.begin + static_cast<int>(j * (n - 1) + step)); };
  auto send_chunk = [&](int step) { return (r - step - 1 + 2 * n) % n; };
  auto recv_chunk = [&](int step) { return (r - step - 2 + 2 * n) % n; };
  const int64_t in_bytes = (offset.back() + count.back()) * es;

  // The last step's partials are received straight into out_chunk and our
  // contribution is added in place, unless out_chunk lies inside `in`
  // (all_reduce runs in place: the partial would overwrite our own chunk).
  // Earlier steps' partials land in staging: kRecvSlots pieces posted ahead
  // and kSendSlots partial sums on their way right. So at N=2 (every step is
  // the last) a reduce-scatter allocates nothing. Staging goes through
  // torch, so the memory ledger sees it.
  const bool direct = out + count[r] * es <= input || out >= input + in_bytes;
  const bool staged_recv = !direct || n > 2;
  const int send_slots = n > 2 ? kSendSlots : 0;
  const int recv_slots = staged_recv ? kRecvSlots : 0;
  const int64_t slot_bytes = (max_count + pieces - 1) / pieces * es;
  torch::Tensor staging;
  if (recv_slots + send_slots > 0)
    staging = torch::empty({(recv_slots + send_slots) * slot_bytes}, torch::kByte);
  char* recv_mem = staging.defined() ? static_cast<char*>(staging.data_ptr()) : nullptr;
  char* send_mem = recv_mem + recv_slots * slot_bytes;
  // One wrapper per receive window position (staging slot, or out_chunk),
  // so a completion names its piece.
  std::vector<Buffer> rb, ob, sb;
  for (int i = 0; i < kRecvSlots; ++i) {
    if (staged_recv) rb.push_back(wrap(w, recv_mem + i * slot_bytes, slot_bytes));
    if (direct) ob.push_back(wrap(w, out, count[r] * es));
  }
  for (int i = 0; i < send_slots; ++i) sb.push_back(wrap(w, send_mem + i * slot_bytes, slot_bytes));
  Buffer in_b = wrap(w, in, in_bytes);

  // Step 0: our own input of chunk r-1, straight from `in`, every piece now
  // (a send moves only once the right has posted the receive).
  int64_t sent = 0;
  {
    int64_t to_recv = 0, to_send = 0;
    for (int k = 0; k < n - 1; ++k) to_recv += count[recv_chunk(k)] * es, to_send += count[send_chunk(k)] * es;
    expect(w, to_recv, to_send);
  }
  std::vector<int64_t> in_sizes;
  for (int64_t j = 0; j < pieces; ++j) {
    int64_t lo, m = piece(send_chunk(0), j, &lo);
    if (m == 0) continue;
    in_b->send(right, msg_slot(0, j), (offset[send_chunk(0)] + lo) * es, m * es);
    in_sizes.push_back(m * es);
    sent += m * es;
  }

  // What arrives from the left, in wire order. Zero-element pieces are
  // skipped on both sides (a chunk has as many empty pieces on every rank).
  std::vector<std::pair<int, int64_t>> order;  // (step, piece)
  for (int64_t j = 0; j < pieces; ++j)
    for (int k = 0; k < n - 1; ++k) {
      int64_t lo;
      if (piece(recv_chunk(k), j, &lo) > 0) order.emplace_back(k, j);
    }
  auto into_out = [&](int k) { return direct && k == n - 2; };
  auto post = [&](size_t i) {
    auto [k, j] = order[i];
    int64_t lo, m = piece(recv_chunk(k), j, &lo);
    if (into_out(k))
      ob[i % kRecvSlots]->recv(left, msg_slot(k, j), lo * es, m * es);
    else
      rb[i % kRecvSlots]->recv(left, msg_slot(k, j), 0, m * es);
  };
  for (size_t i = 0; i < order.size() && i < size_t(kRecvSlots); ++i) post(i);

  // Each arriving partial gets our contribution added: at the last step into
  // out_chunk (chunk r has every rank's then), before that into a send slot
  // that goes right as step k+1. No wait here can close a cycle: a rank
  // waits only for its left to have passed the message before this one, or
  // for its right to have taken a partial sent kSendSlots partials ago.
  std::vector<bool> send_busy(send_slots, false);
  std::vector<int64_t> send_bytes(send_slots, 0);
  int next = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    auto [k, j] = order[i];
    const int c = recv_chunk(k);
    int64_t lo, m = piece(c, j, &lo);
    wait_recv(w, into_out(k) ? *ob[i % kRecvSlots] : *rb[i % kRecvSlots], left, m * es);
    const char* partial = into_out(k) ? out + lo * es : recv_mem + (i % kRecvSlots) * slot_bytes;
    const char* own = input + (offset[c] + lo) * es;
    if (k == n - 2) {
      add_into(out + lo * es, partial, own, m, dtype, divisor);
    } else {
      const int t = next;
      next = (next + 1) % send_slots;
      if (send_busy[t]) wait_send(w, *sb[t], right, send_bytes[t]);
      add_into(send_mem + t * slot_bytes, partial, own, m, dtype, 1);
      sb[t]->send(right, msg_slot(k + 1, j), 0, m * es);
      send_busy[t] = true;
      send_bytes[t] = m * es;
      sent += m * es;
    }
    if (i + kRecvSlots < order.size()) post(i + kRecvSlots);
  }
  for (int t = 0; t < send_slots; ++t)
    if (send_busy[t]) wait_send(w, *sb[t], right, send_bytes[t]);
  for (int64_t m : in_sizes) wait_send(w, *in_b, right, m);
  return sent;
}

int64_t direct_broadcast(const Wire& w, void* buf, int64_t nbytes, int root) {
  const int n = w.mesh->size, r = w.mesh->rank;
  if (n == 1 || nbytes == 0) return 0;
  Buffer b = wrap(w, buf, nbytes);
  if (r != root) {
    expect(w, nbytes, 0);
    b->recv(root, slot(w, 0), 0, nbytes);
    wait_recv(w, *b, root, nbytes);
    return 0;
  }
  expect(w, 0, (n - 1) * nbytes);
  std::vector<int> pending;
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) b->send(peer, slot(w, 0), 0, nbytes), pending.push_back(peer);
  for (int peer = 0; peer < n - 1; ++peer) wait_any<false>(w, *b, pending, nbytes);
  return (n - 1) * nbytes;
}

int64_t direct_gather(const Wire& w, const void* in, void* out, int64_t nbytes, int root) {
  const int n = w.mesh->size, r = w.mesh->rank;
  if (r == root && nbytes > 0 && in != static_cast<char*>(out) + r * nbytes)
    std::memmove(static_cast<char*>(out) + r * nbytes, in, nbytes);
  if (n == 1 || nbytes == 0) return 0;
  if (r != root) {
    expect(w, 0, nbytes);
    Buffer b = wrap(w, in, nbytes);
    b->send(root, slot(w, 0), 0, nbytes);
    wait_send(w, *b, root, nbytes);
    return nbytes;
  }
  expect(w, (n - 1) * nbytes, 0);
  Buffer b = wrap(w, out, n * nbytes);
  std::vector<int> pending;
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) b->recv(peer, slot(w, 0), peer * nbytes, nbytes), pending.push_back(peer);
  for (int peer = 0; peer < n - 1; ++peer) wait_any<true>(w, *b, pending, nbytes);
  return 0;
}

int64_t dissemination_barrier(const Wire& w) {
  const int n = w.mesh->size, r = w.mesh->rank;
  if (n == 1) return 0;
  char out = 1, in = 0;
  Buffer out_b = wrap(w, &out, 1), in_b = wrap(w, &in, 1);
  int64_t sent = 0;
  // After round k every rank has (transitively) heard from 2^(k+1) ranks.
  for (int k = 0, dist = 1; dist < n; ++k, dist *= 2) {
    out_b->send((r + dist) % n, slot(w, k), 0, 1);
    in_b->recv((r - dist + n) % n, slot(w, k), 0, 1);
    expect(w, 1, 1);
    wait_recv(w, *in_b, (r - dist + n) % n, 1);
    wait_send(w, *out_b, (r + dist) % n, 1);
    sent += 1;
  }
  return sent;
}

int64_t ring_all_reduce(const Wire& w, void* data, int64_t numel, c10::ScalarType dtype, int divisor) {
  const int n = w.mesh->size, r = w.mesh->rank;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  Chunks c = ring_chunks(numel, n);
  char* d = static_cast<char*>(data);
  const int64_t sent = ring_reduce_scatter(w, d, d + c.offset[r] * es, c.offset, c.count, dtype, divisor);
  for (int j = 0; j < n; ++j) {
    c.offset[j] *= es;
    c.count[j] *= es;
  }
  return sent + ring_all_gather(w, d, c.offset, c.count, slots::kRing.from(n));
}

}  // namespace fsdp::comm
