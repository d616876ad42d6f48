// GPT-mini for the planner (see plan_gpt.h; the model is docs/GPT_MINI.md).
#include "gpt/plan_gpt.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "fsdp/errors.h"
#include "fsdp/memory.h"
#include "usage.h"

namespace gpt {

int64_t GptShape::num_params() const {
  const int64_t d = dim;
  return vocab * d + seq * d + layers * (12 * d * d + 13 * d) + 2 * d + vocab * d + vocab;
}

void GptShape::validate() const {
  FSDP_USER_CHECK(layers >= 0, "plan: --layers must be >= 0, found ", layers);
  FSDP_USER_CHECK(dim >= 1 && heads >= 1 && dim % heads == 0, "plan: --dim (", dim,
                  ") must be a positive multiple of --heads (", heads, ")");
  FSDP_USER_CHECK(vocab >= 1 && seq >= 1 && batch >= 1, "plan: --vocab, --seq and --batch must be >= 1, found ",
                  vocab, ", ", seq, ", ", batch);
}

namespace {

// GPT-mini's module tree: name, own parameters (numel), children in
// registration order (== state dict order).
struct Node {
  std::string name;
  int64_t own = 0;
  std::vector<Node> children;
};

Node gpt_tree(const GptShape& s) {
  const int64_t d = s.dim;
  Node root{"", 0, {}};
  root.children.push_back({"tok", s.vocab * d, {}});
  root.children.push_back({"pos", s.seq * d, {}});
  Node blocks{"blocks", 0, {}};
  for (int64_t i = 0; i < s.layers; ++i) {
    std::string p = "blocks." + std::to_string(i);
    blocks.children.push_back({p,
                               0,
                               {{p + ".ln1", 2 * d, {}},
                                {p + ".qkv", 3 * d * d + 3 * d, {}},
                                {p + ".proj", d * d + d, {}},
                                {p + ".ln2", 2 * d, {}},
                                {p + ".fc", 4 * d * d + 4 * d, {}},
                                {p + ".out", 4 * d * d + d, {}}}});
  }
  root.children.push_back(std::move(blocks));
  root.children.push_back({"ln", 2 * d, {}});
  root.children.push_back({"head", s.vocab * d + s.vocab, {}});
  return root;
}

// Applies a bottom-up policy; units come out in pre-order (parameter order),
// the root first.
std::vector<UnitSpec> wrap_tree(const Node& root, const std::function<bool(const Node&, int64_t)>& is_unit) {
  struct Found { int order; UnitSpec unit; };
  std::vector<Found> found;
  int counter = 0;
  std::function<int64_t(const Node&, bool)> visit = [&](const Node& n, bool is_root) -> int64_t {
    int order = counter++;
    int64_t unwrapped = n.own;
    for (auto& c : n.children) unwrapped += visit(c, false);
    if (is_root || is_unit(n, unwrapped)) {
      found.push_back({is_root ? -1 : order, {n.name, unwrapped}});
      return 0;
    }
    return unwrapped;
  };
  visit(root, true);
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.order < b.order; });
  std::vector<UnitSpec> out;
  for (auto& f : found) out.push_back(std::move(f.unit));
  return out;
}

bool is_block(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return false;
  return name.find('.', 7) == std::string::npos;
}

}  // namespace

std::vector<UnitSpec> gpt_units(const GptShape& s, const std::string& wrap) {
  s.validate();
  Node root = gpt_tree(s);
  if (wrap == "none") return {{"", s.num_params()}};
  if (wrap == "block") return wrap_tree(root, [](const Node& n, int64_t) { return is_block(n.name); });
  if (wrap.rfind("size:", 0) == 0) {
    int64_t min_params = 0;
    try {
      min_params = static_cast<int64_t>(fsdp::cli::parse_bytes(wrap.substr(5)));
    } catch (const std::exception&) {
      min_params = -1;
    }
    FSDP_USER_CHECK(min_params > 0, "--wrap: expected size:N with N > 0 parameters (e.g. size:100000 or size:1M), found '",
                    wrap, "'");
    return wrap_tree(root, [&](const Node&, int64_t unwrapped) { return unwrapped >= min_params; });
  }
  throw fsdp::UsageError("--wrap: expected block|none|size:N, found '" + wrap + "'");
}

int recompute_every(const std::string& ac) {
  if (ac == "none") return 0;
  if (ac == "block") return 1;
  if (ac.rfind("every:", 0) == 0) {
    const std::string k = ac.substr(6);
    if (!k.empty() && k.size() <= 7 && k.find_first_not_of("0123456789") == std::string::npos && std::stoi(k) >= 1)
      return std::stoi(k);
  }
  throw fsdp::UsageError("--ac '" + ac +
                         "': expected none, block (every transformer block recomputes) or every:K with K >= 1 "
                         "(every K-th block), e.g. every:2");
}

namespace {
bool is_recomputed(int64_t block, int every) { return every > 0 && block % every == 0; }
}  // namespace

int64_t gpt_released(const GptShape& s, const std::string& wrap, int act_bytes, const std::string& ac) {
  const ActivationEstimate e = gpt_activations(s, act_bytes, ac);
  if (wrap == "none") return e.total;
  if (wrap == "block") {
    const bool last_ckpt = s.layers > 0 && is_recomputed(s.layers - 1, recompute_every(ac));
    return (last_ckpt ? e.saved_per_checkpointed : e.per_block) + e.head;
  }
  return e.head;  // size-based: the last unit is a Linear of the last block
}

std::vector<Candidate> gpt_candidates(const GptShape& s, int act_bytes, const std::string& ac) {
  const int64_t d = s.dim;
  std::vector<Candidate> c;
  auto add = [&](const std::string& w) {
    c.push_back({w, gpt_units(s, w), gpt_released(s, w, act_bytes, ac), gpt_recompute(s, w, act_bytes, ac)});
  };
  add("none");
  add("block");
  // Finer: split each block into its large Linear layers. 3d^2 wraps qkv, fc,
  // out (proj and the norms stay in the block's unit); d^2 wraps proj too.
  for (int64_t t : {3 * d * d, d * d}) add("size:" + std::to_string(t));
  return c;
}

ActivationEstimate gpt_activations(const GptShape& s, int a, const std::string& ac) {
  const int64_t B = s.batch, T = s.seq, d = s.dim, h = s.heads, V = s.vocab;
  const int64_t BTd = B * T * d, BT = B * T;
  ActivationEstimate e;
  // Per block, what autograd saves (elements of [B,T,d] in parentheses):
  // ln1 input x (1), ln1 output = qkv input (1), the contiguous copies bmm
  // keeps of q, k^T and v (3), attention output y = proj input (1), ln2
  // input (1), ln2 output = fc input (1), fc output = gelu input (4), gelu
  // output = out input (4); LayerNorm mean/rstd in fp32; the softmax output
  // [B,h,T,T]; masked_fill's bool mask [T,T].
  // With sdpa: q, k and v stay views of the qkv output (kept), the kernel
  // keeps its output and a [B,h,T] fp32 log-sum-exp, then y's contiguous
  // copy: one [B,T,d] more, no scores, no mask.
  e.attention = s.sdpa ? B * h * T * 4 : B * h * T * T * a;
  e.per_block = s.sdpa ? 17 * BTd * a + e.attention + 2 * 2 * BT * 4 : 16 * BTd * a + e.attention + 2 * 2 * BT * 4 + T * T;
  // Final LayerNorm input (1) and output = head input (1), its stats, the
  // log_softmax output [B*T,V] (fp32: the loss is computed in fp32) and,
  // when the caller holds them through backward, the logits [B,T,V].
  const int64_t logits = s.caller_holds_logits ? BT * V * a : 0;
  e.head = 2 * BTd * a + 2 * BT * 4 + BT * V * 4 + logits;
  const int64_t embed = T * 8;  // positions (int64) saved by the position embedding
  // When backward starts: nll_loss's and log_softmax's gradients [B*T,V].
  e.backward_transient = 2 * BT * V * 4;
  e.total = s.layers * e.per_block + e.head + embed + e.backward_transient;
  const int every = recompute_every(ac);
  if (every == 0 || s.layers == 0) return e;
  // Activation checkpointing (src/unit/recompute.cpp): a checkpointed block
  // keeps its input and the CPU generator's state (mt19937: 5056 bytes).
  constexpr int64_t kRngState = 5056;
  e.saved_per_checkpointed = BTd * a + kRngState;
  int64_t kept = 0, kept_to_first = 0;  // every block's; the blocks up to the first to recompute
  const int64_t first = (s.layers - 1) / every * every;  // the last checkpointed block in forward
  for (int64_t i = 0; i < s.layers; ++i) {
    const bool c = is_recomputed(i, every);
    e.checkpointed += c;
    kept += c ? e.saved_per_checkpointed : e.per_block;
    if (i <= first) kept_to_first += c ? e.saved_per_checkpointed : e.per_block;
  }
  e.total = kept + e.head + embed + e.backward_transient;
  // The block's backward beyond its own activations: the gradient of the
  // attention scores [B,h,T,T] and a few [B,T,d] gradients in flight.
  e.recompute_transient = e.attention + 3 * BTd * a;
  e.during_recompute = e.per_block + e.recompute_transient + logits + embed + BTd * a;
  // While it recomputes: the kept bytes up to it, its activations, its
  // backward's transients, the logits if the caller holds them and the
  // gradient [B,T,d] coming into it.
  e.at_recompute = kept_to_first + e.during_recompute;
  return e;
}

fsdp::plan::Recompute gpt_recompute(const GptShape& s, const std::string& wrap, int a, const std::string& ac) {
  const ActivationEstimate e = gpt_activations(s, a, ac);
  const int every = recompute_every(ac);
  if (e.checkpointed == 0) return {};
  if (wrap != "none") {
    // The first recompute is the last checkpointed block; what the next
    // one finds freed: the kept bytes of the blocks from it up to the first.
    const int64_t first = (s.layers - 1) / every * every;
    if (first < every) return {e.at_recompute, -1, -1};
    int64_t released = 0;
    for (int64_t i = first - every + 1; i <= first; ++i)
      released += is_recomputed(i, every) ? e.saved_per_checkpointed : e.per_block;
    return {e.at_recompute, -1, released};
  }
  // One unit: every gradient stays until its reduce at the end, so the
  // moment to find is where the gradients of what follows block j (the
  // blocks after it, the final LayerNorm, the head) and the activations
  // while j recomputes add up to the most.
  const int64_t d = s.dim, block_numel = 12 * d * d + 13 * d, head_numel = 2 * d + s.vocab * d + s.vocab;
  fsdp::plan::Recompute best;
  int64_t kept_below = 0;  // blocks before j: what they kept
  for (int64_t j = 0; j < s.layers; ++j) {
    if (is_recomputed(j, every)) {
      const int64_t act = kept_below + e.saved_per_checkpointed + e.during_recompute;
      const int64_t grads = (head_numel + (s.layers - 1 - j) * block_numel) * a;
      if (act + grads > best.activation_bytes + best.grad_bytes) best = {act, grads, -1};
    }
    kept_below += is_recomputed(j, every) ? e.saved_per_checkpointed : e.per_block;
  }
  return best;
}

double gpt_flops(const GptShape& s, const std::string& ac, int micro_steps) {
  s.validate();
  const double B = s.batch, T = s.seq, d = s.dim, L = s.layers;
  const double non_embedding = double(s.num_params()) - double(s.vocab) * d - T * d;  // tok and pos only look up
  const double block = 12 * d * d + 13 * d;
  double f = 6 * non_embedding * B * T + 12 * L * B * T * T * d;
  const ActivationEstimate e = gpt_activations(s, 4, ac);
  f += e.checkpointed * (2 * block * B * T + 4 * B * T * T * d);  // each checkpointed block's forward again
  return f * micro_steps;
}

std::string ActivationEstimate::str() const {
  std::ostringstream os;
  os << "per block " << fsdp::memory::format_bytes(per_block) << " (of which attention [B,h,T,T] "
     << fsdp::memory::format_bytes(attention) << "), head " << fsdp::memory::format_bytes(head)
     << ", backward start " << fsdp::memory::format_bytes(backward_transient);
  if (checkpointed > 0)
    os << "; activation checkpointing: " << checkpointed << " block(s) keep "
       << fsdp::memory::format_bytes(saved_per_checkpointed) << " each (their input), "
       << fsdp::memory::format_bytes(at_recompute) << " alive during the first recompute";
  return os.str();
}

}  // namespace gpt
