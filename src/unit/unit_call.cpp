// fsdp-cpp: compute — what happens around one unit's forward, and the hook
// that brings its parameters back for backward.
//
// defines: register_unit, unregister_unit, unit_of, Engine::pre_forward,
//          post_forward, forward_failed, pre_backward, UnitCall,
//          run_sequential
//
//   pre_forward:  unshard (waiting for a prefetch), prefetch the next unit
//   forward:      the module's own code, on the unsharded parameters
//   post_forward: FULL_SHARD frees the parameters again; a hook on every
//                 output that requires grad will call pre_backward when the
//                 gradient of that output arrives, i.e. right before autograd
//                 runs this unit's ops backwards
//   pre_backward: unshard again (prefetching the unit before it), keep .grad
//                 pointing into full_grad under no_sync (host-shared units:
//                 point it into a block of peer memory, where the reduce
//                 reads it), make sure the end-of-backward callback is queued
// Each step is the Unit's checked transition (Unit::pre_forward, ...,
// unit.cpp) inside the Engine's entry point here, which adds what spans
// units. Also here: the process's table of units by module (what
// fsdp::call looks a module up in), fsdp::call's frame (UnitCall) and the
// routing of Sequential children.
#include <mutex>
#include <unordered_map>

#include "compat/torch_compat.h"
#include "fsdp/memory.h"
#include "unit/engine.h"

namespace fsdp::detail {
namespace {
std::mutex g_registry_mu;
std::unordered_map<const torch::nn::Module*, Unit*>& registry() {
  static std::unordered_map<const torch::nn::Module*, Unit*> r;
  return r;
}
}  // namespace

void register_unit(const torch::nn::Module* m, Unit* u) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  registry()[m] = u;
}
void unregister_unit(const torch::nn::Module* m) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  registry().erase(m);
}
Unit* unit_of(const torch::nn::Module* m) {
  if (!m) return nullptr;
  std::lock_guard<std::mutex> g(g_registry_mu);
  auto it = registry().find(m);
  return it == registry().end() ? nullptr : it->second;
}

// --- The engine's side: what spans units ---

void Engine::pre_forward(Unit& u) {
  const bool is_root = u.index == 0;
  if (is_root && depth == 0) {
    // A new iteration. Reductions of the previous backward landed at its
    // end; a forward that never got a backward leaves units FORWARD_DONE.
    wait_pending();
    for (auto& x : units) x->forget_forward();
    root_forward_start_bytes = memory_source->read().training();
  }
  if (!forward_order_final && std::find(forward_order.begin(), forward_order.end(), &u) == forward_order.end())
    forward_order.push_back(&u);
  u.pre_forward();
  // A recompute runs in backward: the unit after this one in forward order
  // has already finished its backward.
  if (opts.forward_prefetch && recompute_depth == 0) prefetch_after(u, /*backward=*/false);
  ++depth;
}

void Engine::post_forward(Unit& u, const std::vector<torch::Tensor>& outputs) {
  --depth;
  const bool grad_mode = torch::GradMode::is_enabled();
  bool will_backward = false;
  for (auto& t : outputs) will_backward = will_backward || (t.defined() && t.requires_grad());
  will_backward = will_backward && grad_mode;
  // Inside a recomputed module's forward (grad mode off) the backward
  // still comes, after the recompute: the unit's parameters and state are
  // left as for a forward with grad (FULL_SHARD reshards, SHARD_GRAD_OP
  // keeps them for the recompute and its backward), only no hook is due.
  u.post_forward(will_backward || recompute_forward_depth > 0, recompute_depth > 0);
  if (will_backward) {
    Unit* up = &u;
    for (auto& t : outputs)
      if (t.defined() && t.requires_grad()) t.register_hook([this, up](const torch::Tensor&) { pre_backward(*up); });
  }
  if (u.index == 0 && depth == 0) {
    // A is what a training forward leaves for backward; evaluation and
    // sampling forwards (no grad) keep nothing and do not count.
    if (will_backward) {
      activation_bytes = memory_source->read().training() - root_forward_start_bytes;
      check_recompute_routed();
    }
    forward_order_final = true;
  }
}

void Engine::forward_failed(Unit& u) {
  --depth;
  u.forward_failed();
}

void Engine::pre_backward(Unit& u) {
  // Inside a recompute the current graph task is the recompute's own (a
  // nested backward): a callback queued there would end the outer backward
  // early. begin_recompute queues it in the outer one first.
  if (!callback_queued && recompute_depth == 0) {
    callback_queued = true;
    compat::queue_backward_callback([this] { end_of_backward(); });
  }
  u.pre_backward([&] {
    if (opts.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch_after(u, /*backward=*/true);
    // Reductions that finished meanwhile are folded in (their outputs join
    // shard_grad now rather than at the end of backward).
    fold_finished_reduces();
  });
}

// ---------------------------------------------------------------------------
// UnitCall: the RAII frame of fsdp::call().

UnitCall::UnitCall(Unit* u) : u_(u) {
  if (trace::enabled()) span_ = std::make_unique<trace::Span>("forward", "forward", nlohmann::json{{"unit", u->name}});
  u_->owner->pre_forward(*u_);
}

UnitCall::~UnitCall() {
  if (!finished_) u_->owner->forward_failed(*u_);
}

void UnitCall::finish(const std::vector<torch::Tensor>& outputs) {
  finished_ = true;
  u_->owner->post_forward(*u_, outputs);
  if (span_) span_->end();
}

torch::Tensor UnitCall::cast_input(const torch::Tensor& t) const {
  if (t.defined() && t.is_floating_point() && t.scalar_type() != u_->param_dtype && u_->index == 0 &&
      u_->owner->opts.mixed_precision.param_dtype)
    return t.to(u_->param_dtype);
  return t;
}

void UnitCall::rethrow(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    std::string what = err.what();
    if (what.find("data is not allocated yet") != std::string::npos ||
        what.find("doesn't have storage") != std::string::npos ||
        what.find("out of bounds for storage of size 0") != std::string::npos) {
      std::string sharded;
      for (auto& x : u_->owner->units)
        if (x->state() == UnitState::SHARDED && !x->empty())
          sharded += (sharded.empty() ? "'" : ", '") + x->display_name() + "'";
      throw Error(
          "a parameter of a sharded FSDP unit was used while its storage is freed (inside the call of '" +
          u_->display_name() + "'). Units sharded right now: " + sharded +
          ". Expected: a module that is its own unit runs through its unit. Fix: call it as "
          "fsdp::call(child, x) instead of child->forward(x) (Sequential containers do this for you).");
    }
    throw;
  }
}

// Sequential containers: route each child through its unit (and its
// recompute, FsdpOptions::recompute).
namespace {

torch::Tensor single_tensor_output(torch::nn::AnyValue v, const RecomputeSite& site) {
  if (auto* t = v.try_get<torch::Tensor>()) return *t;
  recompute_unsupported(site, "as a Sequential (child), its forward must return one tensor");
}

// `call(in)` recomputed when `site` is set and grad mode is on; a
// recomputed call takes and returns one tensor.
template <class Call>
torch::nn::AnyValue maybe_recomputed(RecomputeSite* site, torch::nn::AnyValue in, size_t extra_inputs, Call call) {
  if (!site) return call(std::move(in));
  auto* t = in.try_get<torch::Tensor>();
  if (!t || extra_inputs > 0) recompute_unsupported(*site, "as a Sequential (child), it must take one tensor");
  RegionFn fn = [site, call](const std::vector<torch::Tensor>& x) mutable {
    return std::vector<torch::Tensor>{single_tensor_output(call(torch::nn::AnyValue(x.at(0))), *site)};
  };
  return torch::nn::AnyValue(run_recomputed(*site, std::move(fn), {*t}).at(0));
}

torch::nn::AnyValue run_children(torch::nn::SequentialImpl& seq, std::vector<torch::nn::AnyValue> inputs) {
  FSDP_USER_CHECK(!seq.is_empty(), "fsdp::call on an empty Sequential");
  bool first = true;
  torch::nn::AnyValue v = std::move(inputs[0]);
  for (auto& child : seq) {
    torch::nn::Module* cm = child.ptr().get();
    const size_t extra = first ? inputs.size() - 1 : 0;
    auto call_child = [&](torch::nn::AnyValue in) -> torch::nn::AnyValue {
      if (extra > 0) {
        FSDP_USER_CHECK(inputs.size() <= 3, "fsdp::call on a Sequential takes at most 3 inputs");
        if (inputs.size() == 2) return child.any_forward(std::move(in), std::move(inputs[1]));
        return child.any_forward(std::move(in), std::move(inputs[1]), std::move(inputs[2]));
      }
      return child.any_forward(std::move(in));
    };
    if (auto* nested = dynamic_cast<torch::nn::SequentialImpl*>(cm)) {
      std::vector<torch::nn::AnyValue> in;
      in.push_back(std::move(v));
      v = run_sequential(*nested, std::move(in));
    } else {
      RecomputeSite* site = recompute_site(cm);
      torch::nn::AnyModule module = child;  // shares the module: the recompute calls it again
      auto forward = [&](torch::nn::AnyValue in) {
        return site ? maybe_recomputed(site, std::move(in), extra,
                                         [module](torch::nn::AnyValue x) mutable { return module.any_forward(std::move(x)); })
                    : call_child(std::move(in));
      };
      if (Unit* u = unit_of(cm)) {
        UnitCall c(u);
        try {
          if (auto* t = v.try_get<torch::Tensor>()) v = torch::nn::AnyValue(c.cast_input(*t));
          v = forward(std::move(v));
          std::vector<torch::Tensor> outs;
          if (auto* t = v.try_get<torch::Tensor>()) outs.push_back(*t);
          c.finish(outs);
        } catch (...) {
          c.rethrow(std::current_exception());
        }
      } else {
        v = forward(std::move(v));
      }
    }
    first = false;
  }
  return v;
}

}  // namespace

torch::nn::AnyValue run_sequential(torch::nn::SequentialImpl& seq, std::vector<torch::nn::AnyValue> inputs) {
  Unit* self = unit_of(&seq);
  RecomputeSite* site = recompute_site(&seq);
  std::unique_ptr<UnitCall> frame;
  if (self) frame = std::make_unique<UnitCall>(self);
  try {
    FSDP_USER_CHECK(!inputs.empty(), "fsdp::call on a Sequential needs an input");
    if (frame)
      if (auto* t = inputs[0].try_get<torch::Tensor>()) inputs[0] = torch::nn::AnyValue(frame->cast_input(*t));
    auto run = [&]() -> torch::nn::AnyValue {
      if (!site) return run_children(seq, std::move(inputs));
      std::shared_ptr<torch::nn::Module> keep = seq.shared_from_this();  // the recompute runs it again
      auto* raw = &seq;
      const size_t extra = inputs.size() - 1;
      return maybe_recomputed(site, std::move(inputs[0]), extra, [keep, raw](torch::nn::AnyValue x) {
        std::vector<torch::nn::AnyValue> in;
        in.push_back(std::move(x));
        return run_children(*raw, std::move(in));
      });
    };
    torch::nn::AnyValue v = run();
    if (frame) {
      std::vector<torch::Tensor> outs;
      if (auto* t = v.try_get<torch::Tensor>()) outs.push_back(*t);
      frame->finish(outs);
    }
    return v;
  } catch (...) {
    if (frame) frame->rethrow(std::current_exception());
    throw;
  }
}

}  // namespace fsdp::detail
