// fsdp-cpp: ring collectives on Gloo unbound buffers (see ring.h).
//
// Gloo's old algorithm classes (ReduceScatterHalvingDoubling, ...) were seen
// leaving sockets in a state where later 64 MiB all-gathers took 20 s, so the
// algorithms are written here directly on send/recv of unbound buffers.
#include "comm/ring.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "comm/reduce.h"
#include "fsdp/errors.h"

namespace fsdp::comm {
namespace {

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// Steps of one collective share the high bits of the slot.
constexpr int kStepBits = 20;

uint64_t slot(const Step& s, int step) { return (s.seq << kStepBits) | static_cast<uint64_t>(step); }

std::chrono::milliseconds remaining(const Step& s) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(s.deadline -
                                                                   std::chrono::steady_clock::now());
  // Gloo treats a non-positive timeout as "use the default"; 1 ms expires now.
  return std::max(left, std::chrono::milliseconds(1));
}

void wait_recv(const Step& s, gloo::transport::UnboundBuffer& b) {
  if (!b.waitRecv(remaining(s))) throw gloo::IoException("receive aborted");
}
void wait_send(const Step& s, gloo::transport::UnboundBuffer& b) {
  if (!b.waitSend(remaining(s))) throw gloo::IoException("send aborted");
}

Buffer wrap(const Step& s, const void* p, int64_t nbytes) {
  // Gloo's API takes a mutable pointer even for sends; sends never write.
  return s.ctx->createUnboundBuffer(const_cast<void*>(p), static_cast<size_t>(std::max<int64_t>(nbytes, 1)));
}

}  // namespace

int64_t ring_all_gather(const Step& s, void* buf, const std::vector<int64_t>& offset_bytes,
                        const std::vector<int64_t>& count_bytes, int step_base) {
  const int n = s.ctx->size, r = s.ctx->rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  int64_t total = offset_bytes.back() + count_bytes.back();
  if (n == 1 || total == 0) return 0;
  // Sends and receives touch disjoint blocks of one buffer; Gloo tracks
  // pending sends and receives of a buffer separately.
  Buffer b = wrap(s, buf, total);
  int64_t sent = 0;
  for (int step = 0; step < n - 1; ++step) {
    int send_block = (r - step + n) % n;
    int recv_block = (r - step - 1 + 2 * n) % n;
    bool do_send = count_bytes[send_block] > 0, do_recv = count_bytes[recv_block] > 0;
    if (do_send)
      b->send(right, slot(s, step_base + step), offset_bytes[send_block], count_bytes[send_block]);
    if (do_recv)
      b->recv(left, slot(s, step_base + step), offset_bytes[recv_block], count_bytes[recv_block]);
    if (do_recv) wait_recv(s, *b);
    if (do_send) wait_send(s, *b);
    if (do_send) sent += count_bytes[send_block];
  }
  return sent;
}

int64_t ring_reduce_scatter(const Step& s, const void* in, void* out_chunk,
                            const std::vector<int64_t>& offset, const std::vector<int64_t>& count,
                            c10::ScalarType dtype, int divisor) {
  const int n = s.ctx->size, r = s.ctx->rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  auto at = [&](const void* base, int chunk) {
    return static_cast<const char*>(base) + offset[chunk] * es;
  };
  if (n == 1) {
    if (out_chunk != in) std::memcpy(out_chunk, in, count[0] * es);
    // AVG over one rank is the identity; divisor is 1 here by construction.
    return 0;
  }
  int64_t max_count = *std::max_element(count.begin(), count.end());
  // Partial sums travel in the tensor's dtype (bytes as counted); two staging
  // chunks live for the duration of this call, allocated through torch so the
  // memory ledger sees them.
  torch::Tensor staging = torch::empty({2 * std::max<int64_t>(max_count, 1) * es}, torch::kByte);
  char* send_buf = static_cast<char*>(staging.data_ptr());
  char* recv_buf = send_buf + std::max<int64_t>(max_count, 1) * es;
  Buffer in_b = wrap(s, in, (offset.back() + count.back()) * es);
  Buffer send_b = wrap(s, send_buf, max_count * es);
  Buffer recv_b = wrap(s, recv_buf, max_count * es);

  int64_t sent = 0;
  // Step k: send the partial sum of chunk r-k-1 right, receive chunk r-k-2's
  // partial from the left and add our contribution. The partial of chunk c
  // started at rank c+1, so after N-1 steps chunk r has every contribution.
  for (int step = 0; step < n - 1; ++step) {
    int send_chunk = (r - step - 1 + 2 * n) % n;
    int recv_chunk = (r - step - 2 + 2 * n) % n;
    int64_t send_bytes = count[send_chunk] * es, recv_bytes = count[recv_chunk] * es;
    // Step 0 sends our own input as is; later steps send the staged partial.
    auto& src = step == 0 ? in_b : send_b;
    size_t src_off = step == 0 ? static_cast<size_t>(offset[send_chunk] * es) : 0;
    if (send_bytes > 0) src->send(right, slot(s, step), src_off, send_bytes);
    if (recv_bytes > 0) recv_b->recv(left, slot(s, step), 0, recv_bytes);
    if (recv_bytes > 0) wait_recv(s, *recv_b);
    if (send_bytes > 0) wait_send(s, *src);
    sent += send_bytes;
    // The send of send_buf has completed, so it can be overwritten now.
    bool last = step == n - 2;
    add_into(last ? out_chunk : send_buf, recv_buf, at(in, recv_chunk), count[recv_chunk], dtype,
             last ? divisor : 1);
  }
  return sent;
}

int64_t direct_broadcast(const Step& s, void* buf, int64_t nbytes, int root) {
  const int n = s.ctx->size, r = s.ctx->rank;
  if (n == 1 || nbytes == 0) return 0;
  Buffer b = wrap(s, buf, nbytes);
  if (r != root) {
    b->recv(root, slot(s, 0), 0, nbytes);
    wait_recv(s, *b);
    return 0;
  }
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) b->send(peer, slot(s, 0), 0, nbytes);
  for (int peer = 0; peer < n - 1; ++peer) wait_send(s, *b);
  return (n - 1) * nbytes;
}

int64_t direct_gather(const Step& s, const void* in, void* out, int64_t nbytes, int root) {
  const int n = s.ctx->size, r = s.ctx->rank;
  if (r == root && nbytes > 0 && in != static_cast<char*>(out) + r * nbytes)
    std::memmove(static_cast<char*>(out) + r * nbytes, in, nbytes);
  if (n == 1 || nbytes == 0) return 0;
  if (r != root) {
    Buffer b = wrap(s, in, nbytes);
    b->send(root, slot(s, 0), 0, nbytes);
    wait_send(s, *b);
    return nbytes;
  }
  Buffer b = wrap(s, out, n * nbytes);
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) b->recv(peer, slot(s, 0), peer * nbytes, nbytes);
  for (int peer = 0; peer < n - 1; ++peer) wait_recv(s, *b);
  return 0;
}

int64_t dissemination_barrier(const Step& s) {
  const int n = s.ctx->size, r = s.ctx->rank;
  if (n == 1) return 0;
  char out = 1, in = 0;
  Buffer out_b = wrap(s, &out, 1), in_b = wrap(s, &in, 1);
  int64_t sent = 0;
  // After round k every rank has (transitively) heard from 2^(k+1) ranks.
  for (int k = 0, dist = 1; dist < n; ++k, dist *= 2) {
    out_b->send((r + dist) % n, slot(s, k));
    in_b->recv((r - dist + n) % n, slot(s, k));
    wait_recv(s, *in_b);
    wait_send(s, *out_b);
    sent += 1;
  }
  return sent;
}

}  // namespace fsdp::comm
