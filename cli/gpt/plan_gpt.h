// GPT-mini for the planner: its units and activations from its flags, so
// `fsdp plan --model gpt` and the trainer's --plan need no model built.
// (cli/gpt: what the command-line programs know of GPT-mini without the
// model: the `fsdp` command and examples/gpt, which links it too.)
//
// defines: gpt::GptShape, gpt::gpt_units, gpt::ActivationEstimate, gpt::recompute_every,
//          gpt::gpt_activations, gpt::gpt_recompute, gpt::gpt_candidates, gpt::gpt_released,
//          gpt::gpt_flops
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
  // Whether the training loop keeps the logits [B,T,V] alive through
  // backward (a `logits` variable still in scope); gpt's own loop drops
  // them once the loss is computed, so its plans say false.
  bool caller_holds_logits = true;
  // Attention by at::scaled_dot_product_attention (gpt --attention sdpa):
  // no [B,h,T,T] scores or mask are kept, a [B,h,T] log-sum-exp instead.
  bool sdpa = false;
  int64_t num_params() const;  // V*d + T*d + L*(12d^2 + 13d) + 2d + V*d + V
  void validate() const;       // throws fsdp::Error
};

// "block": root (tok, pos, ln, head) + one unit per block; "none": one unit;
// "size:N": the size-based policy (a module whose parameters not already in a
// nested unit number at least N becomes a unit, children first), as
// WrapPolicy::size_based does. Units in parameter order, root first.
std::vector<UnitSpec> gpt_units(const GptShape& s, const std::string& wrap);

// What autograd keeps alive for GPT-mini's forward (libtorch's CPU kernels):
// per block the LayerNorm inputs and stats, the qkv/proj/fc/out inputs, the
// copies matmul makes of q, k^T and v, the softmax output [B,h,T,T], the
// GELU input and the causal mask; at the end the final LayerNorm, the head's
// input, log_softmax's output and the logits [B,T,V] the caller holds; plus
// the two [B,T,V] gradients that exist when backward starts.
//
// With activation checkpointing (--ac block | every:K) a checkpointed block
// keeps only its input [B,T,d] and the CPU generator's state; in backward
// its forward runs again, so while the first checkpointed block (the last
// one in forward) recomputes, the activations alive are every block's kept
// bytes up to it, its recomputed activations and the transient gradients
// of its backward, the logits and the gradient coming into the block.
struct ActivationEstimate {
  int64_t per_block = 0;      // bytes saved by one block
  int64_t attention = 0;      // of which the softmax output [B,h,T,T]
  int64_t head = 0;           // final LayerNorm, head input, log_softmax, logits
  int64_t backward_transient = 0;
  int64_t checkpointed = 0;   // blocks that recompute (0 without activation checkpointing)
  int64_t saved_per_checkpointed = 0;  // what one of them keeps: its input and the generator's state
  int64_t recompute_transient = 0;     // a block's backward beyond its activations (gradients in flight)
  int64_t during_recompute = 0;        // alive beside the kept bytes while one block recomputes
  int64_t at_recompute = 0;   // alive during the first recompute (0 without activation checkpointing)
  int64_t total = 0;          // what forward keeps: L*per_block + head + embeddings + transient
                              // (a checkpointed block: saved_per_checkpointed instead of per_block)
  std::string str() const;
};
// --ac: none -> 0, block -> 1, every:K -> K (the 1st, the K+1-th, ... block
// recompute). Throws fsdp::UsageError for anything else.
int recompute_every(const std::string& ac);
ActivationEstimate gpt_activations(const GptShape& s, int act_bytes = 4, const std::string& ac = "none");

// The worst recompute of backward (make_plan's Recompute) for a wrapping:
// with units per block (or finer) the first recompute, the root's gradient
// beside it; with one unit the recompute where activations and the
// gradients computed so far (blocks after it, the head) add up to the most.
// {} without activation checkpointing.
fsdp::plan::Recompute gpt_recompute(const GptShape& s, const std::string& wrap, int act_bytes = 4,
                                    const std::string& ac = "none");

// Wrappings to try for GPT, coarse to fine: none, block, then size-based
// thresholds that split blocks into their Linear layers.
std::vector<Candidate> gpt_candidates(const GptShape& s, int act_bytes = 4, const std::string& ac = "none");
// Activations freed before the second unit's backward for a GPT wrapping:
// the last block's (what it kept) and the head's with one unit per block,
// the head's with a size-based wrapping, everything (the whole A) with one unit.
int64_t gpt_released(const GptShape& s, const std::string& wrap, int act_bytes = 4, const std::string& ac = "none");

// FLOPs of one optimizer step on one rank (what --compute RATE turns into
// the compute time the collectives hide behind): per micro-step forward and
// backward 6 x the non-embedding parameters (every Linear, the head's too)
// x B x T, plus attention's 12 x L x B x T^2 x d (QK^T and AV over the full
// [T,T]: GPT-mini masks, it does not skip), plus with activation
// checkpointing one more forward of each checkpointed block
// (2 x its parameters x B x T + 4 x B x T^2 x d); times micro_steps.
double gpt_flops(const GptShape& s, const std::string& ac = "none", int micro_steps = 1);

}  // namespace gpt
