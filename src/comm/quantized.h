// fsdp-cpp: collectives that move quantized bytes (quantize.h) on a mesh's links: for the slow
// tier between hosts.
// defines: QuantTraffic, quantized_all_gather, quantized_reduce_scatter, quantized_all_reduce
//
// all_gather      each rank quantizes its own block once; the quantized
//                 bytes (scales and payload) go round the ring (ring.h's
//                 all-gather, in pieces, steps slots::kQuantGather); every
//                 rank decodes every block into the output, its own block
//                 too, so every rank holds the same bits.
// reduce_scatter  ZeRO++'s qgZ, one hop: each rank quantizes the chunk of
//                 every destination (blocks restart at each chunk) and sends
//                 it straight to that rank (an all-to-all, one message per
//                 pair, steps slots::kQuantExchange); a rank decodes the N
//                 contributions to its chunk, its own too, and adds them in
//                 fp32 in rank order 0, 1, ..., N-1, then divides once by
//                 `divisor` and rounds once to the output's dtype. Quantized
//                 values are never added in their own dtype.
// all_reduce      the two above on the chunks of ring_chunks(numel, N): the
//                 reduce-scatter in the gradients' format leaves rank r the
//                 fp32 mean of chunk r (divided once), which its owner
//                 quantizes in a second format (int8 for every FSDP_COMPRESS
//                 value) and the all-gather sends round the ring; every rank
//                 decodes every chunk, its own too, so all hold the same
//                 bits. With error feedback two residuals: this rank's input
//                 (what each chunk decoded to subtracted, as the
//                 reduce-scatter's callers do) under `key`, and the owner's
//                 reduced chunk (1-bit Adam's "server" residual) under
//                 key + " gather".
// So the results are a pure function of every rank's input and the format:
// bit for bit what a local reference gets by quantizing every rank's block
// (chunk) the same way and (reduce-scatter) summing the decoded chunks in
// fp32 in rank order, `acc = d0; acc += d1; ...; acc /= divisor`.
//
// Bytes sent by rank r (QuantTraffic::wire), c_q the elements of rank q's
// block or chunk and wire_bytes() quantize.h's exact size:
//   all_gather      sum over q != r+1 of wire_bytes(c_q)   (the ring's pattern)
//   reduce_scatter  sum over q != r   of wire_bytes(c_q)   (straight to q)
//   all_reduce      sum over q != r   of wire_bytes_g(c_q)
//                 + sum over q != r+1 of wire_bytes_a(c_q)  (g: the gradients'
//                   format, a: the all-gather's; c_q = ring_chunks(numel, N))
// QuantTraffic::logical is what the unquantized ring would send for the
// same call, in the input's dtype: (sum c_q - c_(r+1)) or (sum c_q - c_r)
// elements; the all-reduce's their sum (ring.h's ring_all_reduce). Zero-byte
// messages are skipped on both sides.
//
// Devices: quantizing and decoding run on the tensors' device (CUDA too);
// the bytes cross the links from host memory (a copy each way off the CPU).
// Staging: the all-gather holds every rank's quantized bytes (about
// wire_bytes of the output), the reduce-scatter every destination's and
// every source's (about 2 x wire_bytes of the input), plus the decoded
// fp32 chunk it sums into; the all-reduce one after the other, plus (with
// error feedback) an fp32 copy of its input and of what it decoded to.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/quantize.h"
#include "comm/ring.h"

namespace fsdp::comm {

struct QuantTraffic {
  int64_t wire = 0;     // bytes this rank sent: scales and payloads
  int64_t logical = 0;  // bytes the unquantized ring would have sent, in the input's dtype
};

// `in_block`: this rank's counts[r] elements (floating, any device);
// `out`: sum(counts) elements, contiguous, fp32, bf16 or fp16, block q at
// the prefix sum of counts before q. Every rank passes the same counts and
// format. `sent`, when defined: counts[r] contiguous fp32 elements that
// receive what this rank's block decodes to (in fp32, before out's
// rounding: error feedback's residual is in_block - sent). Throws fsdp::Error on a size that disagrees with counts or a
// non-finite input (quantize's refusal, before this rank sends anything;
// its peers then fail at the deadline), and, as ring.h's algorithms, a
// failed or late transfer naming the peer (a communicator turns it into a
// CollectiveError).
QuantTraffic quantized_all_gather(const Wire& w, const at::Tensor& in_block, const at::Tensor& out,
                                  const std::vector<int64_t>& counts, const QuantFormat& f,
                                  const at::Tensor& sent = {});
// Equal blocks of `numel_per_block` elements.
QuantTraffic quantized_all_gather(const Wire& w, const at::Tensor& in_block, const at::Tensor& out,
                                  int64_t numel_per_block, const QuantFormat& f);

// `in`: sum(counts) elements (floating, contiguous, any device), rank q's
// chunk at the prefix sum of counts before q; `out`: counts[r] elements,
// contiguous, fp32, bf16 or fp16. divisor >= 1 (N turns the sum into a
// mean). `sent`, when defined: sum(counts) contiguous fp32 elements that
// receive what every chunk of `in` decodes to at its destination (error
// feedback's residual is in - sent; no second quantization). Throws as
// quantized_all_gather.
QuantTraffic quantized_reduce_scatter(const Wire& w, const at::Tensor& in, const at::Tensor& out,
                                      const std::vector<int64_t>& counts, const QuantFormat& f, int divisor,
                                      const at::Tensor& sent = {});
// Equal chunks: `in` has N x count elements, `out` count.
QuantTraffic quantized_reduce_scatter(const Wire& w, const at::Tensor& in, const at::Tensor& out, int64_t count,
                                      const QuantFormat& f, int divisor, const at::Tensor& sent = {});

// In place over `data` (contiguous, fp32, bf16 or fp16, any device), chunks
// as ring_chunks(numel, N): stage 1 quantized_reduce_scatter in `grads`,
// divided once by `divisor`, into an fp32 chunk; stage 2 quantized_all_gather
// of that chunk in `gathered`, decoded into `data` (rounded once to its
// dtype). `feedback`, when not null, keeps the two residuals (above) under
// `key` and key + " gather"; null: plain quantized values, no residual.
// Every rank passes the same numel, formats and divisor. Throws as
// quantized_all_gather.
QuantTraffic quantized_all_reduce(const Wire& w, const at::Tensor& data, const QuantFormat& grads,
                                  const QuantFormat& gathered, int divisor, ErrorFeedback* feedback = nullptr,
                                  const std::string& key = {});

}  // namespace fsdp::comm
