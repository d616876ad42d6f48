// A Llama (Hugging Face's LlamaForCausalLM) in libtorch, with HF's parameter
// names, so a checkpoint from the hub loads by name (fsdp::load_hf).
//
// defines: llama::Config, Linear, Embedding, RMSNorm, Attention, MLP, DecoderLayer,
//          LlamaModel, LlamaForCausalLM, rope_tables, loss
//
// The math is transformers' (modeling_llama.py), in the same order, so the
// logits agree to fp32 rounding (tests/test_hf.cpp):
//   h = embed_tokens(ids)
//   per layer: h += o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))  n = input_layernorm(h)
//              h += down_proj(silu(gate_proj(n)) * up_proj(n))            n = post_attention_layernorm(h)
//   logits = lm_head(norm(h))        (lm_head = embed_tokens when tied)
// RMSNorm: w * x / sqrt(mean(x^2) + eps) in fp32; rotary embeddings on
// halves (rotate_half), default or "llama3" frequencies; grouped-query
// attention (kv heads repeated), causal; SwiGLU MLP; no biases.
// Names and shapes (hd = head_dim, H heads, K kv heads, d hidden, f intermediate):
//   model.embed_tokens.weight [V, d]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight [H*hd, d] [K*hd, d] [K*hd, d] [d, H*hd]
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight [f, d] [f, d] [d, f]
//   model.layers.{i}.{input,post_attention}_layernorm.weight [d]
//   model.norm.weight [d]     lm_head.weight [V, d] (absent when tied)
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace llama {

struct Config {
  int64_t vocab = 32000;         // vocab_size
  int64_t hidden = 2048;         // hidden_size
  int64_t intermediate = 5632;   // intermediate_size
  int64_t layers = 22;           // num_hidden_layers
  int64_t heads = 32;            // num_attention_heads
  int64_t kv_heads = 4;          // num_key_value_heads
  int64_t head_dim = 64;         // head_dim (hidden / heads unless config.json says)
  int64_t max_positions = 2048;  // max_position_embeddings
  double rms_eps = 1e-5;         // rms_norm_eps
  double rope_theta = 10000.0;   // rope_parameters.rope_theta (or rope_theta)
  bool tie_embeddings = false;   // tie_word_embeddings
  // rope_parameters.rope_type: "default" or "llama3" (Llama 3.1/3.2), with
  // its factor, low/high frequency factors and original context length.
  std::string rope_type = "default";
  double rope_factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;

  // From a config.json of LlamaForCausalLM; throws fsdp::Error naming what
  // this implementation does not do (biases, another activation, another
  // rope type).
  static Config from_hf(const nlohmann::json& config);
  // The keys of config.json that fix the parameters' shapes, as this
  // config has them (HfLoadOptions::expect_config).
  nlohmann::json hf_identity() const;
  // config.json for an export of a model built from this config.
  nlohmann::json to_hf() const;
  int64_t num_params() const;
  // Throws fsdp::Error naming the bad field.
  void validate() const;
  std::string str() const;  // "V=32000 d=2048 f=5632 L=22 H=32 K=4 hd=64 (1.100 B parameters)"
};

// A linear map without bias (torch::nn::Linear's math and "weight" name).
// Built under fsdp::DeferredInit it writes nothing: libtorch's modules draw
// their initial values in the constructor, which would touch the pages of
// the largest tensor (the embedding) on every rank of a model that is
// about to be loaded anyway. Built eagerly: kaiming-uniform, as Linear.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight); }
  torch::Tensor weight;  // [out, in]
};
TORCH_MODULE(Linear);

// A lookup table (torch::nn::Embedding's math and name), initialised N(0, 1)
// only when built eagerly (see LinearImpl).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab, int64_t dim);
  torch::Tensor forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }
  torch::Tensor weight;  // [V, d]
};
TORCH_MODULE(Embedding);

// Root-mean-square norm with a learned scale (no bias, no mean).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);  // [..., d] -> [..., d]
  torch::Tensor weight;                           // [d], ones
 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const Config& c);
  // x [B,T,d], cos/sin [T,hd] -> [B,T,d]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const Config& c);
  torch::Tensor forward(const torch::Tensor& x);  // SwiGLU: down(silu(gate(x)) * up(x))
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

// One pre-norm decoder layer: one FSDP unit under the "layer" wrap policy.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// HF's "model": the embedding, the layers and the final norm (a container:
// LlamaForCausalLM's forward runs them, so they belong to its root unit).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const Config& c);
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  // The same modules as `layers`, typed for fsdp::call.
  std::vector<std::shared_ptr<DecoderLayerImpl>> layer_list;
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const Config& c);
  // ids [B,T] int64, T <= max_positions -> logits [B,T,V]
  torch::Tensor forward(const torch::Tensor& ids);
  const Config& config() const { return cfg_; }
  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // null when tie_embeddings
 private:
  Config cfg_;
};
TORCH_MODULE(LlamaForCausalLM);

// The rotary tables of positions 0..T-1: cos, sin [T, hd] (fp32).
std::pair<torch::Tensor, torch::Tensor> rope_tables(const Config& c, int64_t T, torch::Device device);

// Mean next-token cross-entropy in fp32. logits [B,T,V], targets [B,T] -> scalar.
torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace llama
