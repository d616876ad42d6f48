// fsdp-cpp: the names c10d's ProcessGroupGloo.hpp needs from Gloo, declared
// so that header compiles (see mesh_gloo.cpp).
//
// The torch wheel ships c10d's headers but not Gloo's: its Gloo is built
// into libtorch_cpu.so. ProcessGroupGloo.hpp names Gloo's types only through
// pointers (shared_ptr<gloo::Context>, unique_ptr<UnboundBuffer>, ...)
// except its GlooStore adapter, which derives from gloo::rendezvous::Store
// and which only libtorch constructs. So incomplete types are enough for
// every object fsdp-cpp makes, and the Store below only has to declare the
// virtual functions GlooStore overrides (read off GlooStore itself) for the
// header to compile. One inline virtual of ProcessGroupGloo (setTimeout)
// calls gloo::Context::setTimeout, so Context declares that member; the
// virtual's code is libtorch's own (its vtable lives in libtorch), and
// fsdp-cpp never calls it, never takes the size of Context, never makes one.
// Nothing here is defined or instantiated by fsdp-cpp, so no layout of ours
// can disagree with the Gloo inside libtorch.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous
}  // namespace gloo
