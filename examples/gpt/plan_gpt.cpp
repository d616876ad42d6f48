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

int64_t gpt_released(const GptShape& s, const std::string& wrap, int act_bytes) {
  const ActivationEstimate e = gpt_activations(s, act_bytes);
  if (wrap == "none") return e.total;
  if (wrap == "block") return e.per_block + e.head;
  return e.head;  // size-based: the last unit is a Linear of the last block
}

std::vector<Candidate> gpt_candidates(const GptShape& s, int act_bytes) {
  const int64_t d = s.dim;
  std::vector<Candidate> c;
  auto add = [&](const std::string& w) { c.push_back({w, gpt_units(s, w), gpt_released(s, w, act_bytes)}); };
  add("none");
  add("block");
  // Finer: split each block into its large Linear layers. 3d^2 wraps qkv, fc,
  // out (proj and the norms stay in the block's unit); d^2 wraps proj too.
  for (int64_t t : {3 * d * d, d * d}) add("size:" + std::to_string(t));
  return c;
}

ActivationEstimate gpt_activations(const GptShape& s, int a) {
  const int64_t B = s.batch, T = s.seq, d = s.dim, h = s.heads, V = s.vocab;
  const int64_t BTd = B * T * d, BT = B * T;
  ActivationEstimate e;
  // Per block, what autograd saves (elements of [B,T,d] in parentheses):
  // ln1 input x (1), ln1 output = qkv input (1), the contiguous copies bmm
  // keeps of q, k^T and v (3), attention output y = proj input (1), ln2
  // input (1), ln2 output = fc input (1), fc output = gelu input (4), gelu
  // output = out input (4); LayerNorm mean/rstd in fp32; the softmax output
  // [B,h,T,T]; masked_fill's bool mask [T,T].
  e.attention = B * h * T * T * a;
  e.per_block = 16 * BTd * a + e.attention + 2 * 2 * BT * 4 + T * T;
  // Final LayerNorm input (1) and output = head input (1), its stats, the
  // log_softmax output [B*T,V] (fp32: the loss is computed in fp32) and the
  // logits [B,T,V] the caller holds through backward.
  e.head = 2 * BTd * a + 2 * BT * 4 + BT * V * 4 + BT * V * a;
  const int64_t embed = T * 8;  // positions (int64) saved by the position embedding
  // When backward starts: nll_loss's and log_softmax's gradients [B*T,V].
  e.backward_transient = 2 * BT * V * 4;
  e.total = s.layers * e.per_block + e.head + embed + e.backward_transient;
  return e;
}

std::string ActivationEstimate::str() const {
  std::ostringstream os;
  os << "per block " << fsdp::memory::format_bytes(per_block) << " (of which attention [B,h,T,T] "
     << fsdp::memory::format_bytes(attention) << "), head " << fsdp::memory::format_bytes(head)
     << ", backward start " << fsdp::memory::format_bytes(backward_transient);
  return os.str();
}

}  // namespace gpt
