// Llama (see model.h). Plain library code: no I/O, no globals.
#include "llama/model.h"

#include <cmath>
#include <cstdio>

#include "fsdp/deferred.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"

namespace llama {
namespace {

[[noreturn]] void unsupported(const std::string& what) {
  throw fsdp::Error("llama: config.json " + what +
                    "; this implementation is Llama's (LlamaForCausalLM: no biases, SiLU, default or llama3 rotary "
                    "frequencies). Use a Llama-architecture checkpoint.");
}

int64_t need_int(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw fsdp::Error(std::string("llama: config.json has no integer \"") + key +
                      "\"; expected a LlamaForCausalLM config (as transformers writes it).");
  return j[key].get<int64_t>();
}

// An optional key of config.json (`where`: "" or "rope_parameters."): its
// default when absent or null, else a value of the type expected, or an
// fsdp::Error naming the file and the key (never the JSON library's own).
[[noreturn]] void wrong_type(const std::string& where, const char* key, const char* expected,
                             const nlohmann::json& v) {
  throw fsdp::Error("llama: config.json: \"" + where + key + "\": expected " + expected + ", found " + v.dump() +
                    " (" + v.type_name() + "); expected a LlamaForCausalLM config (as transformers writes it).");
}
bool absent(const nlohmann::json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }
double opt(const nlohmann::json& j, const char* key, double dflt, const std::string& where = "") {
  if (absent(j, key)) return dflt;
  if (!j[key].is_number()) wrong_type(where, key, "a number", j[key]);
  return j[key].get<double>();
}
int64_t opt(const nlohmann::json& j, const char* key, int64_t dflt, const std::string& where = "") {
  if (absent(j, key)) return dflt;
  if (!j[key].is_number_integer()) wrong_type(where, key, "an integer", j[key]);
  return j[key].get<int64_t>();
}
bool opt(const nlohmann::json& j, const char* key, bool dflt, const std::string& where = "") {
  if (absent(j, key)) return dflt;
  if (!j[key].is_boolean()) wrong_type(where, key, "true or false", j[key]);
  return j[key].get<bool>();
}
std::string opt(const nlohmann::json& j, const char* key, const std::string& dflt, const std::string& where = "") {
  if (absent(j, key)) return dflt;
  if (!j[key].is_string()) wrong_type(where, key, "a string", j[key]);
  return j[key].get<std::string>();
}

}  // namespace

Config Config::from_hf(const nlohmann::json& j) {
  if (!j.is_object()) throw fsdp::Error("llama: config.json is not a JSON object");
  Config c;
  c.vocab = need_int(j, "vocab_size");
  c.hidden = need_int(j, "hidden_size");
  c.intermediate = need_int(j, "intermediate_size");
  c.layers = need_int(j, "num_hidden_layers");
  c.heads = need_int(j, "num_attention_heads");
  c.kv_heads = opt(j, "num_key_value_heads", c.heads);
  c.head_dim = opt(j, "head_dim", c.hidden / std::max<int64_t>(1, c.heads));
  c.max_positions = opt(j, "max_position_embeddings", c.max_positions);
  c.rms_eps = opt(j, "rms_norm_eps", c.rms_eps);
  c.tie_embeddings = opt(j, "tie_word_embeddings", false);
  if (opt(j, "attention_bias", false)) unsupported("has attention_bias = true");
  if (opt(j, "mlp_bias", false)) unsupported("has mlp_bias = true");
  if (opt(j, "hidden_act", std::string("silu")) != "silu") unsupported("has hidden_act = " + j["hidden_act"].dump());
  // transformers >= 5: rope_parameters; before: rope_theta and rope_scaling.
  nlohmann::json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
                        : j.contains("rope_scaling") && j["rope_scaling"].is_object()       ? j["rope_scaling"]
                                                                                             : nlohmann::json::object();
  const std::string in = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? "rope_parameters."
                         : j.contains("rope_scaling") && j["rope_scaling"].is_object()    ? "rope_scaling."
                                                                                           : "";
  c.rope_theta = opt(rope, "rope_theta", opt(j, "rope_theta", c.rope_theta), in);
  c.rope_type = opt(rope, "rope_type", opt(rope, "type", std::string("default"), in), in);
  if (c.rope_type == "llama3") {
    c.rope_factor = opt(rope, "factor", c.rope_factor, in);
    c.low_freq_factor = opt(rope, "low_freq_factor", c.low_freq_factor, in);
    c.high_freq_factor = opt(rope, "high_freq_factor", c.high_freq_factor, in);
    c.original_max_positions = opt(rope, "original_max_position_embeddings", c.original_max_positions, in);
  } else if (c.rope_type != "default") {
    unsupported("has rope_type \"" + c.rope_type + "\"");
  }
  c.validate();
  return c;
}

nlohmann::json Config::hf_identity() const {
  return {{"vocab_size", vocab},         {"hidden_size", hidden}, {"intermediate_size", intermediate},
          {"num_hidden_layers", layers}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
          {"tie_word_embeddings", tie_embeddings}};
}

nlohmann::json Config::to_hf() const {
  nlohmann::json rope = {{"rope_theta", rope_theta}, {"rope_type", rope_type}};
  if (rope_type == "llama3")
    rope.update({{"factor", rope_factor}, {"low_freq_factor", low_freq_factor}, {"high_freq_factor", high_freq_factor},
                 {"original_max_position_embeddings", original_max_positions}});
  nlohmann::json j = hf_identity();
  j.update({{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"head_dim", head_dim},
            {"max_position_embeddings", max_positions}, {"rms_norm_eps", rms_eps}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"mlp_bias", false}, {"rope_parameters", rope}});
  return j;
}

int64_t Config::num_params() const {
  const int64_t d = hidden, attn = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2;
  return vocab * d * (tie_embeddings ? 1 : 2) + layers * (attn + 3 * d * intermediate + 2 * d) + d;
}

void Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw fsdp::Error("llama config: " + what);
  };
  need(vocab >= 1 && hidden >= 1 && intermediate >= 1 && layers >= 0 && heads >= 1 && kv_heads >= 1,
       "vocab_size, hidden_size, intermediate_size, num_attention_heads and num_key_value_heads must be >= 1");
  need(heads % kv_heads == 0, "num_attention_heads (" + std::to_string(heads) +
                                  ") must be a multiple of num_key_value_heads (" + std::to_string(kv_heads) + ")");
  need(head_dim >= 2 && head_dim % 2 == 0, "head_dim must be even (rotary halves), found " + std::to_string(head_dim));
  need(max_positions >= 1, "max_position_embeddings must be >= 1");
}

std::string Config::str() const {
  char buf[200];
  const double n = double(num_params());
  std::snprintf(buf, sizeof buf, "V=%lld d=%lld f=%lld L=%lld H=%lld K=%lld hd=%lld%s (%.3f %s parameters)",
                (long long)vocab, (long long)hidden, (long long)intermediate, (long long)layers, (long long)heads,
                (long long)kv_heads, (long long)head_dim, tie_embeddings ? " tied" : "", n >= 1e9 ? n / 1e9 : n / 1e6,
                n >= 1e9 ? "B" : "M");
  return buf;
}

// ---------------------------------------------------------------------------

LinearImpl::LinearImpl(int64_t in, int64_t out) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (fsdp::is_deferred(weight)) return;  // its values come later (fully_shard, load_hf)
  torch::NoGradGuard ng;
  const double bound = 1.0 / std::sqrt(double(std::max<int64_t>(1, in)));
  weight.uniform_(-bound, bound);
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim) {
  weight = register_parameter("weight", torch::empty({vocab, dim}));
  if (fsdp::is_deferred(weight)) return;
  torch::NoGradGuard ng;
  weight.normal_();
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * h.to(x.scalar_type());
}

namespace {
Linear linear(int64_t in, int64_t out) { return Linear(in, out); }

// [..., hd] -> [-x2, x1] of its halves.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}
}  // namespace

AttentionImpl::AttentionImpl(const Config& c) : heads_(c.heads), kv_heads_(c.kv_heads), head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", linear(c.hidden, c.heads * c.head_dim));
  k_proj = register_module("k_proj", linear(c.hidden, c.kv_heads * c.head_dim));
  v_proj = register_module("v_proj", linear(c.hidden, c.kv_heads * c.head_dim));
  o_proj = register_module("o_proj", linear(c.heads * c.head_dim, c.hidden));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), hd = head_dim_;
  auto q = q_proj(x).view({B, T, heads_, hd}).transpose(1, 2);     // [B,H,T,hd]
  auto k = k_proj(x).view({B, T, kv_heads_, hd}).transpose(1, 2);  // [B,K,T,hd]
  auto v = v_proj(x).view({B, T, kv_heads_, hd}).transpose(1, 2);  // [B,K,T,hd]
  const auto c = cos.to(q.scalar_type()), s = sin.to(q.scalar_type());  // [T,hd]
  q = q * c + rotate_half(q) * s;
  k = k * c + rotate_half(k) * s;
  if (heads_ != kv_heads_) {  // head h reads kv head h / (H/K)
    k = k.repeat_interleave(heads_ / kv_heads_, 1);
    v = v.repeat_interleave(heads_ / kv_heads_, 1);
  }
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                            /*scale=*/1.0 / std::sqrt(double(hd)));  // [B,H,T,hd]
  return o_proj(y.transpose(1, 2).reshape({B, T, heads_ * hd}));
}

MLPImpl::MLPImpl(const Config& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden, c.intermediate));
  up_proj = register_module("up_proj", linear(c.hidden, c.intermediate));
  down_proj = register_module("down_proj", linear(c.intermediate, c.hidden));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }

DecoderLayerImpl::DecoderLayerImpl(const Config& c) {
  // Registration order == HF's named_parameters() order.
  self_attn = register_module("self_attn", Attention(c));
  mlp = register_module("mlp", MLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden, c.rms_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden, c.rms_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const Config& c) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab, c.hidden));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    DecoderLayer l(c);
    layers->push_back(l);
    layer_list.push_back(l.ptr());
  }
  norm = register_module("norm", RMSNorm(c.hidden, c.rms_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c) : cfg_(c) {
  cfg_.validate();
  model = register_module("model", LlamaModel(c));
  if (!c.tie_embeddings) lm_head = register_module("lm_head", linear(c.hidden, c.vocab));
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& ids) {
  TORCH_CHECK(ids.dim() == 2, "llama: expected token ids [B,T], found ", ids.sizes());
  const int64_t T = ids.size(1);
  TORCH_CHECK(T >= 1 && T <= cfg_.max_positions, "llama: ", T, " tokens exceed max_position_embeddings ",
              cfg_.max_positions);
  auto [cos, sin] = rope_tables(cfg_, T, ids.device());
  auto h = model->embed_tokens(ids);  // [B,T,d]
  for (auto& layer : model->layer_list) h = fsdp::call(layer, h, cos, sin);
  h = model->norm(h);
  return lm_head ? lm_head(h) : torch::linear(h, model->embed_tokens->weight);  // [B,T,V]
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(const Config& c, int64_t T, torch::Device device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto inv = 1.0 / torch::pow(c.rope_theta, torch::arange(0, c.head_dim, 2, torch::kLong).to(torch::kFloat32) /
                                                double(c.head_dim));  // [hd/2]
  if (c.rope_type == "llama3") {
    // Long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    const double low_wl = c.original_max_positions / c.low_freq_factor;
    const double high_wl = c.original_max_positions / c.high_freq_factor;
    auto wl = 2 * M_PI / inv;
    auto scaled = torch::where(wl > low_wl, inv / c.rope_factor, inv);
    auto smooth = (c.original_max_positions / wl - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
    auto medium = torch::logical_not(wl < high_wl).logical_and(torch::logical_not(wl > low_wl));
    inv = torch::where(medium, smoothed, scaled);
  }
  auto freqs = torch::arange(T, f32).unsqueeze(1) * inv.unsqueeze(0);  // [T,hd/2]
  auto emb = torch::cat({freqs, freqs}, -1);                            // [T,hd]
  return {emb.cos().to(device), emb.sin().to(device)};
}

torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, V}).to(torch::kFloat), targets.reshape({-1}));
}

}  // namespace llama
