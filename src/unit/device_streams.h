// fsdp-cpp: the streams of a GPU job, as FSDP2 orders them.
// defines: DeviceStreams
//
// On a GPU the all-gathers run on a stream of their own and the
// reduce-scatters on another, so that the next unit's all-gather and the
// last unit's reduce-scatter overlap this unit's compute on the current
// (compute) stream. They are ordered with events, never by blocking the host:
//   all-gather   waits for what compute has queued (the optimizer may have
//                just written the shard); compute waits for the gather
//                before it reads the parameters (Unit::wait_for_unshard).
//   reduce       waits for the gradients compute produced; compute waits
//                for the reduced shard before the optimizer reads it.
// The caching allocator's cross-stream hazard: a block allocated on one
// stream and freed while another still uses it could be handed out again
// too early; each tensor used on a stream it was not allocated on is
// recorded on that stream (keep_until_done), so its free waits for that
// stream's work queued so far.
//
// On the CPU there is one stream: every call here is a no-op, and the CPU
// path runs exactly as it does without this class. Written against c10's
// device-generic interfaces (c10::Stream, c10::Event, the device guard of
// the device type): the engine links no CUDA library; CUDA's implementations
// are registered by libtorch_cuda when the CUDA plugin loads it.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>

#include <torch/torch.h>

namespace fsdp::detail {

class DeviceStreams {
 public:
  explicit DeviceStreams(c10::Device device) : device_(device) {
    if (device_.is_cpu()) return;
    c10::impl::VirtualGuardImpl impl(device_.type());
    // Both high-priority, as FSDP2's: a collective's short kernels (the
    // bf16 cast, the copy-out) are scheduled ahead of queued compute, so the
    // transfer the next unit waits for starts as soon as it can.
    all_gather_.emplace(impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/true));
    reduce_.emplace(impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/true));
  }

  bool active() const { return all_gather_.has_value(); }
  const c10::Device& device() const { return device_; }

  // The stream compute runs on: the calling thread's current one.
  c10::Stream current() const { return c10::impl::VirtualGuardImpl(device_.type()).getStream(device_); }

  // Makes `side` wait for what `before` has queued so far.
  static void order(const c10::Stream& before, const c10::Stream& side) {
    c10::Event e(before.device_type());
    e.record(before);
    e.block(side);
  }

  // Runs `fn` with the all-gather (reduce) stream current, after it waited
  // for the compute stream; on the CPU just runs it.
  template <class F>
  auto on_all_gather(F&& fn) {
    return on(all_gather_, std::forward<F>(fn));
  }
  template <class F>
  auto on_reduce(F&& fn) {
    return on(reduce_, std::forward<F>(fn));
  }

  // The compute stream waits for the all-gather (reduce) stream's work.
  void compute_waits_for_all_gather() const {
    if (active()) order(*all_gather_, current());
  }
  void compute_waits_for_reduce() const {
    if (active()) order(*reduce_, current());
  }

  // `t`'s memory is used on the current stream too: its free waits for
  // what that stream has queued when it is freed.
  void keep_until_done(const torch::Tensor& t) const {
    if (!active() || !t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return;
    c10::impl::VirtualGuardImpl(device_.type()).recordDataPtrOnStream(t.storage().data_ptr(), current());
  }

 private:
  template <class F>
  auto on(const std::optional<c10::Stream>& side, F&& fn) {
    if (!side) return fn();
    order(current(), *side);
    c10::StreamGuard guard(*side);
    return fn();
  }

  const c10::Device device_;
  std::optional<c10::Stream> all_gather_;  // set on a GPU
  std::optional<c10::Stream> reduce_;      // set on a GPU
};

}  // namespace fsdp::detail
