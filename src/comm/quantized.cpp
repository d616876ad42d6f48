// fsdp-cpp: quantized all-gather and reduce-scatter on a mesh (see quantized.h).
//
// The bytes travel from host memory: a rank's quantized bytes are made on
// its tensors' device and copied to the CPU once; what arrives is decoded
// on the output's device. Each rank's bytes sit in a staging buffer at an
// offset rounded up to kAlign, so its scales (first) are aligned for a
// view in place; only the exact wire_bytes travel.
#include "comm/quantized.h"

#include <torch/torch.h>

#include <numeric>
#include <stdexcept>
#include <string>

#include "comm/checks.h"
#include "comm/mesh.h"
#include "comm/slots.h"
#include "fsdp/errors.h"
#include "observe/flight_hooks.h"

namespace fsdp::comm {
namespace {

constexpr int64_t kAlign = 16;

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::vector<int64_t> prefix_sums(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size(), 0);
  for (size_t q = 1; q < counts.size(); ++q) off[q] = off[q - 1] + counts[q - 1];
  return off;
}

int64_t total_of(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t(0));
}

// The names of this file's helpers are its own: a unity batch may hold it
// beside ring.cpp, whose helpers live in the same anonymous namespace.
//
// One rank's quantized bytes in the staging buffer: [offset, offset + bytes).
struct Staging {
  std::vector<int64_t> offset, bytes;
  int64_t total = 0;  // the buffer's size
};
Staging staging_of(const std::vector<int64_t>& counts, const QuantFormat& f) {
  Staging l;
  for (int64_t c : counts) {
    l.offset.push_back(l.total);
    l.bytes.push_back(wire_bytes(f, c));
    l.total += align_up(l.bytes.back());
  }
  return l;
}

void check_quantized_args(const char* what, const Wire& w, const std::vector<int64_t>& counts,
                          const at::Tensor& in, int64_t in_numel, const at::Tensor& out, int64_t out_numel,
                          const QuantFormat& f) {
  f.validate();
  const int n = w.mesh->size;
  FSDP_USER_CHECK(static_cast<int>(counts.size()) == n, what, " (", f.describe(), "): ", counts.size(),
                  " counts for a mesh of ", n, " ranks; expected one count per rank");
  for (int q = 0; q < n; ++q)
    FSDP_USER_CHECK(counts[q] >= 0, what, ": count of rank ", w.name(q), " is ", counts[q], "; expected >= 0");
  FSDP_USER_CHECK(at::isFloatingType(in.scalar_type()), what, " (", f.describe(), "): input of ",
                  dtype_name(in.scalar_type()), "; expected a floating tensor (fp32, bf16, fp16)");
  FSDP_USER_CHECK(in.numel() == in_numel, what, " (", f.describe(), "): input of ", in.numel(),
                  " elements; expected ", in_numel, " (from the counts): pass every rank the same counts");
  FSDP_USER_CHECK(out.numel() == out_numel && out.is_contiguous() &&
                      (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16 ||
                       out.scalar_type() == at::kHalf),
                  what, " (", f.describe(), "): output of ", out.numel(), " elements of ",
                  dtype_name(out.scalar_type()), out.is_contiguous() ? "" : " (not contiguous)", "; expected ",
                  out_numel, " contiguous elements of fp32, bf16 or fp16");
}

void expect_bytes(const Wire& w, int64_t recv, int64_t send) {
  if (!w.progress) return;
  w.progress->recv_total.fetch_add(recv, std::memory_order_relaxed);
  w.progress->send_total.fetch_add(send, std::memory_order_relaxed);
}

// Waits for one posted transfer with `peer`, recording it in the
// collective's progress; a failure names the peer.
void wait_transfer(const Wire& w, Transfer& t, int peer, int64_t nbytes, bool recv) {
  if (w.progress) w.progress->wait_on(w.name(peer), recv ? flight::Progress::RECEIVE : flight::Progress::SEND);
  try {
    if (!t.wait(remaining(w))) throw std::runtime_error(recv ? "receive aborted" : "send aborted");
  } catch (const std::exception& e) {
    throw std::runtime_error(recv ? detail::cat("waiting to receive the quantized chunk of rank ", w.name(peer), " (",
                                                e.what(), ")")
                                  : detail::cat("waiting for rank ", w.name(peer),
                                                " to take the quantized chunk this rank sent (", e.what(), ")"));
  }
  if (w.progress) {
    if (recv) w.progress->arrived(nbytes);
    else w.progress->sent(nbytes);
    w.progress->idle();
  }
}

}  // namespace

QuantTraffic quantized_all_gather(const Wire& w, const at::Tensor& in_block, const at::Tensor& out,
                                  const std::vector<int64_t>& counts, const QuantFormat& f, const at::Tensor& sent) {
  const int n = w.mesh->size, r = w.mesh->rank;
  check_quantized_args("quantized all_gather", w, counts, in_block, counts.at(r), out, total_of(counts), f);
  FSDP_USER_CHECK(!sent.defined() || (sent.numel() == counts[r] && sent.is_contiguous() &&
                                      sent.scalar_type() == at::kFloat),
                  "quantized all_gather: `sent` of ", sent.defined() ? sent.numel() : 0, " elements; expected ",
                  counts[r], " contiguous fp32 elements (or none)");
  const std::vector<int64_t> elem_off = prefix_sums(counts);
  const Staging l = staging_of(counts, f);
  auto staging = at::empty({l.total}, at::TensorOptions().dtype(at::kByte));
  // Our block is quantized once; its bytes go round the ring and are
  // decoded here like every other rank's.
  staging.slice(0, l.offset[r], l.offset[r] + l.bytes[r]).copy_(quantize(in_block, f));
  QuantTraffic t;
  if (n > 1) t.wire = ring_all_gather(w, staging.data_ptr(), l.offset, l.bytes, slots::kQuantGather);
  t.logical = (total_of(counts) - counts[(r + 1) % n]) * static_cast<int64_t>(in_block.element_size());
  if (n == 1) t.logical = 0;
  at::Tensor flat = out.view({-1});
  for (int q = 0; q < n; ++q)
    dequantize_into(staging.slice(0, l.offset[q], l.offset[q] + l.bytes[q]), f,
                    flat.slice(0, elem_off[q], elem_off[q] + counts[q]));
  // What our block decodes to, in fp32: out may round it.
  if (sent.defined() && counts[r] > 0)
    dequantize_into(staging.slice(0, l.offset[r], l.offset[r] + l.bytes[r]), f, sent.view({-1}));
  return t;
}

QuantTraffic quantized_all_gather(const Wire& w, const at::Tensor& in_block, const at::Tensor& out,
                                  int64_t numel_per_block, const QuantFormat& f) {
  return quantized_all_gather(w, in_block, out, std::vector<int64_t>(w.mesh->size, numel_per_block), f);
}

QuantTraffic quantized_reduce_scatter(const Wire& w, const at::Tensor& in, const at::Tensor& out,
                                      const std::vector<int64_t>& counts, const QuantFormat& f, int divisor,
                                      const at::Tensor& sent) {
  const int n = w.mesh->size, r = w.mesh->rank;
  check_quantized_args("quantized reduce_scatter", w, counts, in, total_of(counts), out, counts.at(r), f);
  FSDP_USER_CHECK(divisor >= 1, "quantized reduce_scatter: divisor ", divisor,
                  "; expected >= 1 (1: a sum, the world size: a mean)");
  FSDP_USER_CHECK(!sent.defined() || (sent.numel() == total_of(counts) && sent.is_contiguous() &&
                                      sent.scalar_type() == at::kFloat),
                  "quantized reduce_scatter: `sent` of ", sent.defined() ? sent.numel() : 0,
                  " elements; expected ", total_of(counts), " contiguous fp32 elements (or none)");
  const std::vector<int64_t> elem_off = prefix_sums(counts);
  at::Tensor flat = in.reshape({-1});
  // What this rank sends: every destination's chunk, quantized with blocks
  // restarting at the chunk (its own kept for its own sum).
  const Staging send_l = staging_of(counts, f);
  auto outgoing = at::empty({send_l.total}, at::TensorOptions().dtype(at::kByte));
  for (int q = 0; q < n; ++q)
    outgoing.slice(0, send_l.offset[q], send_l.offset[q] + send_l.bytes[q])
        .copy_(quantize(flat.slice(0, elem_off[q], elem_off[q] + counts[q]), f));
  // What it receives: chunk r from every rank, each in its own place.
  const Staging recv_l = staging_of(std::vector<int64_t>(n, counts[r]), f);
  auto incoming = at::empty({recv_l.total}, at::TensorOptions().dtype(at::kByte));
  auto from = [&](int p) {
    return p == r ? outgoing.slice(0, send_l.offset[r], send_l.offset[r] + send_l.bytes[r])
                  : incoming.slice(0, recv_l.offset[p], recv_l.offset[p] + recv_l.bytes[p]);
  };

  QuantTraffic t;
  if (n > 1) {
    // Receives first, then sends, all posted before any wait (Gloo moves a
    // send once its peer posted the receive), in ring order from this rank
    // so the N ranks do not all start with rank 0.
    const uint64_t slot = slots::slot(w.seq, slots::kQuantExchange.begin);
    std::vector<std::pair<int, Transfer>> recvs, sends;
    int64_t to_recv = 0, to_send = 0;
    for (int k = 1; k < n; ++k) {
      const int p = (r - k + n) % n, q = (r + k) % n;
      if (recv_l.bytes[p] > 0) to_recv += recv_l.bytes[p];
      if (send_l.bytes[q] > 0) to_send += send_l.bytes[q];
    }
    expect_bytes(w, to_recv, to_send);
    for (int k = 1; k < n; ++k) {
      const int p = (r - k + n) % n;
      if (recv_l.bytes[p] > 0) recvs.emplace_back(p, post_recv(w, p, slot, from(p).data_ptr(), recv_l.bytes[p]));
    }
    for (int k = 1; k < n; ++k) {
      const int q = (r + k) % n;
      if (send_l.bytes[q] == 0) continue;
      auto chunk = outgoing.slice(0, send_l.offset[q], send_l.offset[q] + send_l.bytes[q]);
      sends.emplace_back(q, post_send(w, q, slot, chunk.data_ptr(), send_l.bytes[q]));
      t.wire += send_l.bytes[q];
    }
    for (auto& [p, tr] : recvs) wait_transfer(w, tr, p, recv_l.bytes[p], true);
    for (auto& [q, tr] : sends) wait_transfer(w, tr, q, send_l.bytes[q], false);
    t.logical = (total_of(counts) - counts[r]) * static_cast<int64_t>(in.element_size());
  }

  // What each destination decodes (its chunk's bytes are deterministic).
  if (sent.defined())
    for (int q = 0; q < n; ++q)
      if (counts[q] > 0)
        dequantize_into(outgoing.slice(0, send_l.offset[q], send_l.offset[q] + send_l.bytes[q]), f,
                        sent.view({-1}).slice(0, elem_off[q], elem_off[q] + counts[q]));
  // The sum, in fp32, in rank order, on the output's device; one division,
  // one rounding to the output's dtype.
  if (counts[r] == 0) return t;
  at::Tensor acc = dequantize(from(0).to(out.device()), f, counts[r]);
  for (int p = 1; p < n; ++p) acc.add_(dequantize(from(p).to(out.device()), f, counts[r]));
  if (divisor > 1) acc.div_(divisor);
  out.view({-1}).copy_(acc);
  return t;
}

QuantTraffic quantized_reduce_scatter(const Wire& w, const at::Tensor& in, const at::Tensor& out, int64_t count,
                                      const QuantFormat& f, int divisor, const at::Tensor& sent) {
  return quantized_reduce_scatter(w, in, out, std::vector<int64_t>(w.mesh->size, count), f, divisor, sent);
}

QuantTraffic quantized_all_reduce(const Wire& w, const at::Tensor& data, const QuantFormat& grads,
                                  const QuantFormat& gathered, int divisor, ErrorFeedback* feedback,
                                  const std::string& key) {
  const int n = w.mesh->size, r = w.mesh->rank;
  FSDP_USER_CHECK(data.is_contiguous(), "quantized all_reduce (", grads.describe(),
                  "): a tensor that is not contiguous; expected a contiguous one (it is reduced in place)");
  const int64_t numel = data.numel();
  const std::vector<int64_t> counts = ring_chunks(numel, n).count;
  const auto fp32 = data.options().dtype(at::kFloat);
  // 1. Chunk r's mean, in fp32, from every rank's input plus its residual;
  // the residual becomes what was meant minus what each chunk decoded to.
  const at::Tensor flat = data.view({-1});
  const at::Tensor meant = feedback ? feedback->compensate(key, flat) : flat;
  const at::Tensor decoded = feedback ? at::empty({numel}, fp32) : at::Tensor();
  at::Tensor reduced = at::empty({counts[r]}, fp32);
  const QuantTraffic scattered = quantized_reduce_scatter(w, meant, reduced, counts, grads, divisor, decoded);
  if (feedback) feedback->remember(key, meant, decoded);
  // 2. The owner's chunk, plus its own residual, quantized once and sent
  // round the ring; every rank decodes every chunk into `data`, its own too.
  const std::string server = key + " gather";
  if (feedback) reduced = feedback->compensate(server, reduced);
  const at::Tensor owned = feedback ? at::empty({counts[r]}, fp32) : at::Tensor();
  const QuantTraffic spread = quantized_all_gather(w, reduced, flat, counts, gathered, owned);
  if (feedback) feedback->remember(server, reduced, owned);
  QuantTraffic t;
  t.wire = scattered.wire + spread.wire;
  // As the ring's all_reduce sends, in the data's dtype (stage 1's input was
  // fp32 under feedback, stage 2's always).
  if (n > 1)
    t.logical = (2 * numel - counts[r] - counts[(r + 1) % n]) * static_cast<int64_t>(data.element_size());
  return t;
}

}  // namespace fsdp::comm
