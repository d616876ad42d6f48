// GPT-mini: the reference transformer of the project spec docs/GPT_MINI.md.
//
// defines: gpt::Config, gpt::BlockImpl (Block), gpt::GPTImpl (GPT), gpt::loss
//
// Names, shapes and math follow docs/GPT_MINI.md exactly, so a checkpoint means the
// same thing here and in PyTorch (tests/python/gpt_reference.py):
//   tok.weight [V,d]  pos.weight [T,d]
//   blocks.{i}.ln1 [d]  qkv [3d,d]  proj [d,d]  ln2 [d]  fc [4d,d]  out [d,4d]
//   ln [d]  head.weight [V,d]  head.bias [V]
// Each block is called through fsdp::call(), so under fully_shard() with the
// module-type policy a block is one FSDP unit (all-gathered only while it
// computes); unwrapped, fsdp::call is a plain forward.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct Config {
  int64_t vocab = 256;  // V: byte-level
  int64_t seq = 128;    // T: context length (size of the position table)
  int64_t dim = 256;    // d
  int64_t layers = 6;   // L
  int64_t heads = 4;    // h, head size d/h
  // Attention as one fused kernel (at::scaled_dot_product_attention, causal:
  // flash or memory-efficient attention on a GPU, no [B,h,T,T] scores kept)
  // instead of matmul, mask and softmax. The same parameters and, to
  // rounding, the same function (--attention sdpa).
  bool sdpa = false;

  // Total parameters (4.90 M at the defaults):
  // V*d + T*d + L*(12 d^2 + 13 d) + 2d + V*d + V
  int64_t num_params() const;
  // Throws fsdp::UsageError naming the bad field (e.g. dim not divisible by heads).
  void validate() const;
  std::string str() const;  // "V=256 T=128 d=256 L=6 h=4 (4.90 M parameters)"
};

// One pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t dim, int64_t heads, bool sdpa = false);
  // x [B,T,d] -> [B,T,d]
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln1{nullptr};
  torch::nn::Linear qkv{nullptr};   // [3d, d]
  torch::nn::Linear proj{nullptr};  // [d, d]
  torch::nn::LayerNorm ln2{nullptr};
  torch::nn::Linear fc{nullptr};    // [4d, d]
  torch::nn::Linear out{nullptr};   // [d, 4d]

 private:
  int64_t dim_, heads_;
  bool sdpa_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const Config& cfg);
  // idx [B,t] int64 token ids, t <= cfg.seq -> logits [B,t,V]
  torch::Tensor forward(const torch::Tensor& idx);
  const Config& config() const { return cfg_; }

  torch::nn::Embedding tok{nullptr};  // [V, d]
  torch::nn::Embedding pos{nullptr};  // [T, d]
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};    // [V, d], not tied to tok

 private:
  Config cfg_;
  // The same modules as `blocks`, typed for fsdp::call (a shared_ptr, not the
  // Block holder: a const holder's -> is const and forward() is not).
  std::vector<std::shared_ptr<BlockImpl>> block_list_;
};
TORCH_MODULE(GPT);

// Mean cross-entropy over all B*T positions (computed in fp32 whatever the
// logits' dtype). logits [B,T,V], targets [B,T] int64 -> scalar.
torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace gpt
