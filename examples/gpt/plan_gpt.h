// GPT-mini for the planner: its units and activations from its flags, so
// `fsdp plan --model gpt` and the trainer's --plan need no model built.
//
// defines: gpt::GptShape, gpt::gpt_units, gpt::ActivationEstimate,
//          gpt::gpt_activations, gpt::gpt_candidates, gpt::gpt_released
//
// The model is docs/GPT_MINI.md (examples/gpt/model.h); the formulas it feeds
// are the library's planner (fsdp/plan.h), which knows nothing of GPT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/plan.h"

namespace gpt {

using fsdp::plan::Candidate;
using fsdp::plan::UnitSpec;

struct GptShape {
  int64_t layers = 6, dim = 256, heads = 4, vocab = 256, seq = 128, batch = 8;
  int64_t num_params() const;  // V*d + T*d + L*(12d^2 + 13d) + 2d + V*d + V
  void validate() const;       // throws fsdp::Error
};

// "block": root (tok, pos, ln, head) + one unit per block; "none": one unit;
// "size:N": the size-based policy (a module whose parameters not already in a
// nested unit number at least N becomes a unit, children first), as
// WrapPolicy::size_based does. Units in parameter order, root first.
std::vector<UnitSpec> gpt_units(const GptShape& s, const std::string& wrap);

// What autograd keeps alive for GPT-mini's forward (libtorch 1.13 kernels):
// per block the LayerNorm inputs and stats, the qkv/proj/fc/out inputs, the
// copies matmul makes of q, k^T and v, the softmax output [B,h,T,T], the
// GELU input and the causal mask; at the end the final LayerNorm, the head's
// input, log_softmax's output and the logits [B,T,V] the caller holds; plus
// the two [B,T,V] gradients that exist when backward starts.
struct ActivationEstimate {
  int64_t per_block = 0;      // bytes saved by one block
  int64_t attention = 0;      // of which the softmax output [B,h,T,T]
  int64_t head = 0;           // final LayerNorm, head input, log_softmax, logits
  int64_t backward_transient = 0;
  int64_t total = 0;          // L*per_block + head + embeddings + transient
  std::string str() const;
};
ActivationEstimate gpt_activations(const GptShape& s, int act_bytes = 4);

// Wrappings to try for GPT, coarse to fine: none, block, then size-based
// thresholds that split blocks into their Linear layers.
std::vector<Candidate> gpt_candidates(const GptShape& s, int act_bytes = 4);
// Activations freed before the second unit's backward for a GPT wrapping:
// the last block's and the head's with one unit per block, the head's with a
// size-based wrapping, everything (the whole A) with one unit.
int64_t gpt_released(const GptShape& s, const std::string& wrap, int act_bytes = 4);

}  // namespace gpt
