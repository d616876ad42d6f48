// GPT-mini (see model.h). Plain library code: no I/O, no globals.
#include "gpt/model.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "usage.h"

namespace gpt {

int64_t Config::num_params() const {
  const int64_t d = dim;
  const int64_t per_block = 12 * d * d + 13 * d;  // ln1, qkv, proj, ln2, fc, out (weights + biases)
  return vocab * d + seq * d + layers * per_block + 2 * d + vocab * d + vocab;
}

void Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw fsdp::UsageError("gpt config: " + what);
  };
  need(vocab >= 1 && vocab <= 65536,
       "--vocab must be in [1, 65536] (token files hold uint16 ids), found " + std::to_string(vocab));
  need(seq >= 1, "--seq must be >= 1, found " + std::to_string(seq));
  need(dim >= 1, "--dim must be >= 1, found " + std::to_string(dim));
  need(layers >= 0, "--layers must be >= 0, found " + std::to_string(layers));
  need(heads >= 1, "--heads must be >= 1, found " + std::to_string(heads));
  need(dim % heads == 0, "--dim (" + std::to_string(dim) + ") must be divisible by --heads (" +
                             std::to_string(heads) + "); pick e.g. --heads " +
                             std::to_string(dim % 4 == 0 ? 4 : 1));
}

std::string Config::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "V=%lld T=%lld d=%lld L=%lld h=%lld%s (%.2f M parameters)",
                (long long)vocab, (long long)seq, (long long)dim, (long long)layers,
                (long long)heads, sdpa ? " sdpa" : "", num_params() / 1e6);
  return buf;
}

// ---------------------------------------------------------------------------

BlockImpl::BlockImpl(int64_t dim, int64_t heads, bool sdpa) : dim_(dim), heads_(heads), sdpa_(sdpa) {
  // Registration order == the state dict order of docs/GPT_MINI.md.
  auto ln_opts = torch::nn::LayerNormOptions({dim}).eps(1e-5);
  ln1 = register_module("ln1", torch::nn::LayerNorm(ln_opts));
  qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
  proj = register_module("proj", torch::nn::Linear(dim, dim));
  ln2 = register_module("ln2", torch::nn::LayerNorm(ln_opts));
  fc = register_module("fc", torch::nn::Linear(dim, 4 * dim));
  out = register_module("out", torch::nn::Linear(4 * dim, dim));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = dim_, h = heads_, hs = C / h;
  // Attention.
  auto qkv_out = qkv(ln1(x));                          // [B,T,3C]
  auto parts = qkv_out.split(C, /*dim=*/2);            // 3 x [B,T,C]
  auto q = parts[0].view({B, T, h, hs}).transpose(1, 2);  // [B,h,T,hs]
  auto k = parts[1].view({B, T, h, hs}).transpose(1, 2);  // [B,h,T,hs]
  auto v = parts[2].view({B, T, h, hs}).transpose(1, 2);  // [B,h,T,hs]
  torch::Tensor y;                                        // [B,h,T,hs]
  if (sdpa_) {
    // Causal, scale 1/sqrt(hs): the kernel picks flash / memory-efficient
    // attention where the device has them.
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  } else {
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hs)));  // [B,h,T,T]
    // Position t may attend to 0..t only; built per call (not a buffer, so
    // the state dict holds exactly the parameters of docs/GPT_MINI.md).
    auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);  // [T,T]
    att = att.masked_fill(future, -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    y = torch::matmul(att, v);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, C});  // [B,T,C]
  auto r = x + proj(y);
  // MLP with the exact (erf) GELU.
  return r + out(torch::gelu(fc(ln2(r))));             // [B,T,C]
}

// ---------------------------------------------------------------------------

GPTImpl::GPTImpl(const Config& cfg) : cfg_(cfg) {
  cfg_.validate();
  tok = register_module("tok", torch::nn::Embedding(cfg.vocab, cfg.dim));
  pos = register_module("pos", torch::nn::Embedding(cfg.seq, cfg.dim));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.layers; i++) {
    Block b(cfg.dim, cfg.heads, cfg.sdpa);
    blocks->push_back(b);
    block_list_.push_back(b.ptr());
  }
  ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim}).eps(1e-5)));
  head = register_module("head", torch::nn::Linear(cfg.dim, cfg.vocab));
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "gpt: expected token ids [B,T], found ", idx.sizes());
  const int64_t t = idx.size(1);
  TORCH_CHECK(t >= 1 && t <= cfg_.seq, "gpt: sequence of ", t,
              " tokens does not fit the position table (--seq ", cfg_.seq, ")");
  auto positions = torch::arange(t, idx.options().dtype(torch::kLong));  // [t]
  auto x = tok(idx) + pos(positions);                                    // [B,t,d]
  for (auto& block : block_list_) x = fsdp::call(block, x);            // [B,t,d]
  return head(ln(x));                                                    // [B,t,V]
}

torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, V}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

}  // namespace gpt
