// fsdp-cpp tests: rank-side logic of the host-shared tests
// (tests/test_host_shared.cpp).
//
// hs_train DTYPE STEPS OUT FAULT FROZEN: FULL_SHARD training of the core Net
//   (units Block x3 and Gate; uneven sizes, a parameter smaller than N) on
//   fixed data, AdamW, clip_grad_norm; prints
//   "HS shares=<0|1> path=<describe()> loss=<last loss>", "HS ledger
//   shared=<shared_per_host> host_ranks=<k> P=<P> peer=<peer_memory>
//   page=<page size> units=<units>" and "HS grads private=<k>
//   in_peer_memory=<m> dropped=<j>": where each parameter's .grad lay right
//   after autograd accumulated it in the last step (a post-hook on its
//   accumulator after the engine's: in this process's own private memory,
//   in host-shared memory, or already handed to the reduce). OUT ("-": none):
//   rank 0 saves the final parameters (torch::save, in named order); with
//   TiedNet it also prints "HS tied copies=<names of the tied weight>
//   equal=<how many hold the root's values>".
//   FAULT ("-": none): "kill:R:S" or "stop:R:S": rank R raises SIGKILL or
//   SIGSTOP on itself at the start of step S, so the others wait in the
//   first unit's all-gather. FROZEN 1: blocks.0 does not train; FROZEN
//   tied: TiedNet instead of Net (a weight of the root's used by every unit).
// hs_collectives: the two host-shared collectives alone, on memory from
//   shared_tensor / peer_tensor, fp32 and bf16, blocks of 1, 7, 1000 and
//   65536 elements: all_gather in place and from a private input, and
//   reduce_scatter SUM and AVG, each compared bit for bit with the values
//   computed here (sums of small integers in fp32, rounded once).
//   Prints "HSC passed checks=<k> path=<describe()> ag=<bytes> ag_inter=<bytes>
//   rs=<bytes> rs_inter=<bytes>" (the counters). FSDP_TEST_TRACE=DIR: traced
//   there (each collective's span says whether it took the host-shared form).
// hs_ckpt save|load DIR DTYPE: save: 2 steps, a sharded checkpoint, then one
//   more step; load: the checkpoint, then that step. Both print
//   "HSCK loss=<the last step's loss>", equal when the load restored the
//   state exactly.
// hs_fault KIND:R COLLECTIVE: 8 rounds of a host-shared all_gather then a
//   host-shared reduce_scatter; rank R raises KIND (kill: SIGKILL, stop:
//   SIGSTOP) on itself in round 3 right before COLLECTIVE (all_gather or
//   reduce_scatter), so the others wait for it at that collective's first
//   barrier in the host's memory. Prints "HSF rank R raises KIND before
//   COLLECTIVE".
// hs_hardening: what a rank may do to its peers' memory. After one
//   host-shared reduce_scatter, prints "HSH maps read_only=<k>
//   read_write=<m>" (this process's mappings of host-shared memory by
//   permission: peers' gradient blocks, and its own block and the control
//   segment) and "HSH peer_memfds=<k> shrink_refused=<j>" (the host-shared
//   memfds of rank r+1, taken through its pidfd as a rank takes them, and
//   how many refused ftruncate to 0 with EPERM). Then every rank asks for
//   shared memory of another size than rank 0's (the last rank 1 element
//   more) and prints "HSH mismatch: <the error, on one line>".
// hs_desync: under one sequence number rank 0 issues a host-shared
//   all_gather, the others a host-shared reduce_scatter; each prints
//   "HSD failed: <the error, on one line>".
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "../core_model.h"
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include "fsdp/comm.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/state_dict.h"
#include "fsdp/trace.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

// Tied weights: `shared` is the root's and every block's (one tensor, one
// name per owner), so the root unit holds it and each block reads it from
// there; sizes that split unevenly at N = 2, 3, 4.
struct TiedBlockImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, shared{nullptr};
  TiedBlockImpl(int64_t d, torch::nn::Linear tied) {
    fc1 = register_module("fc1", torch::nn::Linear(d, 2 * d + 1));
    fc2 = register_module("fc2", torch::nn::Linear(2 * d + 1, d));
    shared = register_module("shared", tied);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::tanh(fc1(x))) + 0.1 * shared(x); }
};
TORCH_MODULE(TiedBlock);

struct TiedNetImpl : torch::nn::Module {
  torch::nn::Linear inp{nullptr}, shared{nullptr}, out{nullptr};
  torch::nn::ModuleList blocks;
  std::vector<TiedBlock> block_list;
  TiedNetImpl(int64_t in = 7, int64_t d = 9, int64_t outd = 5, int64_t layers = 3) {
    inp = register_module("inp", torch::nn::Linear(in, d));
    shared = register_module("shared", torch::nn::Linear(d, d));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      block_list.push_back(TiedBlock(d, shared));
      blocks->push_back(block_list.back());
    }
    out = register_module("out", torch::nn::Linear(d, outd));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = inp(x);
    for (auto& b : block_list) h = fsdp::call(b, h);
    return out(h + shared(h));
  }
};
TORCH_MODULE(TiedNet);

FsdpOptions hs_options(const std::string& dtype) {
  FsdpOptions o;
  o.strategy = ShardingStrategy::FULL_SHARD;
  o.wrap = WrapPolicy::predicate(
      [](const std::string&, const torch::nn::Module& m, int64_t) {
        return dynamic_cast<const BlockImpl*>(&m) || dynamic_cast<const GateImpl*>(&m) ||
               dynamic_cast<const TiedBlockImpl*>(&m);
      },
      "Block, TiedBlock and Gate");
  o.backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  if (dtype == "bf16") o.mixed_precision.param_dtype = torch::kBFloat16;
  return o;
}

// One step on rank r's rows of batch `step`; returns the mean loss over ranks.
template <class Model>
double hs_step(Model& model, torch::optim::Optimizer& opt, Communicator& comm, int step) {
  const int N = comm.world_size(), r = comm.rank(), B = 3;
  torch::manual_seed(100 + step);
  auto X = torch::randn({N * B, 7}), Y = torch::randn({N * B, 5});
  auto rows = torch::arange(int64_t(r) * B, int64_t(r + 1) * B);
  torch::Tensor out = model.forward(X.index_select(0, rows)).to(torch::kFloat32);
  torch::Tensor loss = (out - Y.index_select(0, rows)).pow(2).mean();
  loss.backward();
  model->clip_grad_norm(0.5);
  opt.step();
  opt.zero_grad();
  return all_reduce_mean(comm, loss.item<double>());
}

void maybe_fault(const std::string& fault, int rank, int step) {
  if (fault == "-") return;
  const auto a = fault.find(':'), b = fault.rfind(':');
  const std::string kind = fault.substr(0, a);
  const int who = std::stoi(fault.substr(a + 1, b - a - 1)), at = std::stoi(fault.substr(b + 1));
  if (who != rank || at != step) return;
  std::printf("HS rank %d raises %s at step %d\n", rank, kind.c_str(), step);
  std::fflush(stdout);
  ::raise(kind == "kill" ? SIGKILL : SIGSTOP);
}

// Whether [p, p + bytes) lies in a mapping of host-shared memory (a memfd of
// HostShared's) of this process.
bool in_host_shared_memory(const void* p, int64_t bytes) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    if (line.find("fsdp-host-shared") == std::string::npos) continue;
    const uintptr_t lo = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    const uintptr_t hi = std::stoull(line.substr(line.find('-') + 1, line.find(' ')), nullptr, 16);
    if (a >= lo && a + bytes <= hi) return true;
  }
  return false;
}

// Where a parameter's .grad lies each time autograd accumulated into it
// (hs_train's "HS grads" line): a post-hook on its AccumulateGrad node,
// which runs after the engine's (hooks run in the order they were added).
struct GradPlaces {
  struct Look final : torch::autograd::FunctionPostHook {
    GradPlaces* places;
    torch::Tensor param;
    Look(GradPlaces* p, torch::Tensor t) : places(p), param(std::move(t)) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      const torch::Tensor g = param.grad();
      if (!g.defined()) ++places->dropped;  // the unit's last: post_backward took the buffer already
      else if (in_host_shared_memory(g.data_ptr(), g.numel() * g.element_size())) ++places->in_peer_memory;
      else ++places->private_;
      return outputs;
    }
  };
  int private_ = 0, in_peer_memory = 0, dropped = 0;
  // The accumulators hooked (the engine holds them too).
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()))> held;
  void watch(torch::nn::Module& net) {
    for (auto& p : net.parameters()) {
      if (!p.requires_grad()) continue;
      held.push_back(torch::autograd::impl::grad_accumulator(p));
      held.back()->add_post_hook(std::make_unique<Look>(this, p));
    }
  }
};

FSDP_SCENARIO(hs_train) {
  const std::string dtype = args.at(0), out_path = args.at(2), fault = args.at(3);
  const int steps = std::stoi(args.at(1));
  const std::string variant = args.at(4);
  auto comm = make_communicator_from_env();
  torch::manual_seed(1234);
  auto train = [&](auto net) {
    auto model = fully_shard(net, comm, hs_options(dtype));
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.1));
    double loss = 0;
    GradPlaces places;
    for (int s = 0; s < steps; ++s) {
      maybe_fault(fault, comm->rank(), s);
      if (s == steps - 1) places.watch(*net);
      loss = hs_step(model, opt, *comm, s);
    }
    std::printf("HS shares=%d path=%s loss=%.9g\n", comm->shares_host_memory() ? 1 : 0, comm->describe().c_str(),
                loss);
    const Ledger l = model->ledger();
    std::printf("HS ledger shared=%lld host_ranks=%d P=%lld peer=%lld page=%ld units=%zu\n",
                static_cast<long long>(l.shared_per_host), l.host_ranks, static_cast<long long>(l.P),
                static_cast<long long>(l.peer_memory), ::sysconf(_SC_PAGESIZE), model->units().size());
    std::printf("HS grads private=%d in_peer_memory=%d dropped=%d\n", places.private_, places.in_peer_memory,
                places.dropped);
    if (out_path == "-") return;
    auto full = model->full_state(0);
    if (comm->rank() == 0) {
      std::vector<torch::Tensor> values;
      for (auto& [name, t] : full) values.push_back(t.to(torch::kFloat32).contiguous());
      torch::save(values, out_path);
      // TiedNet: every name of the tied weight holds the same values.
      int copies = 0, equal = 0;
      const torch::Tensor* root = nullptr;
      for (auto& [name, t] : full)
        if (name == "shared.weight") root = &t;
      for (auto& [name, t] : full)
        if (root && name.ends_with("shared.weight")) {
          ++copies;
          equal += torch::equal(t, *root) ? 1 : 0;
        }
      if (copies > 0) std::printf("HS tied copies=%d equal=%d\n", copies, equal);
    }
  };
  if (variant == "tied") {
    train(TiedNet());
  } else {
    Net net;
    if (variant == "1")
      for (auto& p : net->block_list[0]->parameters()) p.set_requires_grad(false);
    train(net);
  }
  return 0;
}

FSDP_SCENARIO(hs_collectives) {
  auto comm = make_communicator_from_env();
  const int n = comm->world_size(), r = comm->rank();
  const char* trace_dir = std::getenv("FSDP_TEST_TRACE");
  if (trace_dir) trace::start(trace_dir, r, n);
  FSDP_USER_CHECK(comm->shares_host_memory(), "hs_collectives: expected a communicator that shares its hosts' memory, "
                  "found ", comm->describe());
  comm->reset_counters();
  int checks = 0;
  auto expect_equal = [&](const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
    FSDP_USER_CHECK(torch::equal(got, want), "rank ", r, ": ", what, " differs: got ",
                    got.narrow(0, 0, 1).item<float>(), "..., want ", want.narrow(0, 0, 1).item<float>(), "...");
    ++checks;
  };
  // Block q of a gathered unit: q * 1000 + (i % 997), in fp32, then the dtype.
  auto block_of = [](int q, int64_t m, torch::ScalarType dtype) {
    return (torch::arange(m, torch::kFloat32).remainder(997) + q * 1000.0f).to(dtype);
  };
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 16}) {
      const std::string tag = detail::cat(c10::toString(dtype), " m=", m);
      for (bool in_place : {true, false}) {
        torch::Tensor full = comm->shared_tensor(n * m, dtype, {"hs.full"});
        torch::Tensor input = in_place ? full.narrow(0, r * m, m) : torch::empty({m}, dtype);
        input.copy_(block_of(r, m, dtype));
        comm->all_gather(input, full, {"hs.ag"})->wait();
        for (int q = 0; q < n; ++q)
          expect_equal(full.narrow(0, q * m, m), block_of(q, m, dtype),
                       detail::cat("all_gather ", tag, in_place ? " in place" : "", " block ", q));
      }
      // Rank q's element i: (q + 1) * (i % 13); every rank's chunk r summed.
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        torch::Tensor grads = comm->peer_tensor(n * m, dtype);
        grads.copy_((torch::arange(n * m, torch::kFloat32).remainder(13) * (r + 1)).to(dtype));
        torch::Tensor out = torch::empty({m}, dtype);
        comm->reduce_scatter(grads, out, op, {"hs.rs"})->wait();
        torch::Tensor want = torch::arange(r * m, (r + 1) * m, torch::kFloat32).remainder(13) * (n * (n + 1) / 2);
        if (op == ReduceOp::AVG) want = want / n;
        expect_equal(out, want.to(dtype), detail::cat("reduce_scatter ", tag, op == ReduceOp::AVG ? " AVG" : " SUM"));
      }
    }
  }
  const CommCounters k = comm->counters();
  const auto &ag = k[CollectiveKind::ALL_GATHER], &rs = k[CollectiveKind::REDUCE_SCATTER];
  std::printf("HSC passed checks=%d path=%s ag=%lld ag_inter=%lld rs=%lld rs_inter=%lld\n", checks,
              comm->describe().c_str(), static_cast<long long>(ag.bytes_sent),
              static_cast<long long>(ag.bytes_inter_host), static_cast<long long>(rs.bytes_sent),
              static_cast<long long>(rs.bytes_inter_host));
  if (trace_dir) trace::stop();
  return 0;
}

FSDP_SCENARIO(hs_ckpt) {
  const std::string mode = args.at(0), dir = args.at(1), dtype = args.at(2);
  auto comm = make_communicator_from_env();
  torch::manual_seed(1234);
  Net net;
  auto model = fully_shard(net, comm, hs_options(dtype));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.1));
  if (mode == "save") {
    for (int s = 0; s < 2; ++s) hs_step(model, opt, *comm, s);
    save_checkpoint(*model, &opt, dir, 2, nlohmann::json{{"step", 2}});
  } else {
    auto r = load_checkpoint(*model, &opt, dir);
    FSDP_USER_CHECK(r.found, "no checkpoint in ", dir);
  }
  const double loss = hs_step(model, opt, *comm, 2);
  std::printf("HSCK shares=%d loss=%.9g\n", comm->shares_host_memory() ? 1 : 0, loss);
  return 0;
}

FSDP_SCENARIO(hs_fault) {
  const std::string fault = args.at(0), where = args.at(1);
  const std::string kind = fault.substr(0, fault.find(':'));
  const int who = std::stoi(fault.substr(fault.find(':') + 1));
  FSDP_USER_CHECK(where == "all_gather" || where == "reduce_scatter",
                  "hs_fault: the collective is all_gather or reduce_scatter, found '", where, "'");
  auto comm = make_communicator_from_env();
  const int n = comm->world_size(), r = comm->rank();
  FSDP_USER_CHECK(comm->shares_host_memory(), "hs_fault: expected a communicator that shares its hosts' memory, "
                  "found ", comm->describe());
  const int64_t m = 1000;
  torch::Tensor full = comm->shared_tensor(n * m, torch::kFloat32, {"hsf.full"});
  torch::Tensor grads = comm->peer_tensor(n * m, torch::kFloat32);
  torch::Tensor out = torch::empty({m}, torch::kFloat32);
  auto fault_here = [&](int round, const std::string& collective) {
    if (round != 3 || r != who || collective != where) return;
    std::printf("HSF rank %d raises %s before %s\n", r, kind.c_str(), where.c_str());
    std::fflush(stdout);
    ::raise(kind == "kill" ? SIGKILL : SIGSTOP);
  };
  for (int round = 0; round < 8; ++round) {
    full.narrow(0, r * m, m).fill_(static_cast<float>(round));
    fault_here(round, "all_gather");
    comm->all_gather(full.narrow(0, r * m, m), full, {"hsf.ag"})->wait();
    grads.fill_(1.0f);
    fault_here(round, "reduce_scatter");
    comm->reduce_scatter(grads, out, ReduceOp::SUM, {"hsf.rs"})->wait();
  }
  return 0;
}

namespace {
// This process's mappings of host-shared memory, by their permissions
// ("r--s", "rw-s", ...).
std::map<std::string, int> host_shared_maps() {
  std::map<std::string, int> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("memfd:fsdp-host-shared") != std::string::npos) {
      const auto a = line.find(' ');
      out[line.substr(a + 1, 4)] += 1;
    }
  return out;
}
}  // namespace

FSDP_SCENARIO(hs_hardening) {
  auto comm = make_communicator_from_env();
  const int n = comm->world_size(), r = comm->rank();
  FSDP_USER_CHECK(comm->shares_host_memory(), "hs_hardening: expected a communicator that shares its hosts' memory, "
                  "found ", comm->describe());
  auto pid = torch::empty({n}, torch::kInt64);
  comm->all_gather(torch::full({1}, static_cast<int64_t>(::getpid()), torch::kInt64), pid, {"hsh.pids"})->wait();
  const int64_t m = 1000;
  torch::Tensor grads = comm->peer_tensor(n * m, torch::kFloat32);
  grads.fill_(1.0f);
  torch::Tensor out = torch::empty({m}, torch::kFloat32);
  comm->reduce_scatter(grads, out, ReduceOp::SUM, {"hsh.rs"})->wait();
  FSDP_USER_CHECK(out.eq(static_cast<float>(n)).all().item<bool>(), "hs_hardening: the reduce_scatter's sum is wrong");
  auto maps = host_shared_maps();
  std::printf("HSH maps read_only=%d read_write=%d\n", maps["r--s"], maps["rw-s"]);
  // Rank r+1's memfds, taken as a rank takes a peer's block: a shrink fails.
  const pid_t peer = static_cast<pid_t>(pid[(r + 1) % n].item<int64_t>());
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, peer, 0));
  FSDP_USER_CHECK(pidfd >= 0, "hs_hardening: pidfd_open(", peer, "): ", std::strerror(errno));
  int memfds = 0, refused = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(peer) + "/fd", ec)) {
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (ec || target.string().find("memfd:fsdp-host-shared") == std::string::npos) continue;
    const int taken = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, std::stoi(e.path().filename().string()), 0));
    if (taken < 0) continue;  // closed since the listing
    ++memfds;
    if (::ftruncate(taken, 0) != 0 && errno == EPERM) ++refused;
    ::close(taken);
  }
  ::close(pidfd);
  std::printf("HSH peer_memfds=%d shrink_refused=%d\n", memfds, refused);
  std::fflush(stdout);
  // Every rank checks every rank's request, so every rank says what differs.
  try {
    comm->shared_tensor(r == n - 1 ? 1001 : 1000, torch::kFloat32, {"hsh.mismatch"});
    std::printf("HSH mismatch: none\n");
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (auto& c : what)
      if (c == '\n') c = ' ';
    std::printf("HSH mismatch: %s\n", what.c_str());
  }
  return 0;
}

FSDP_SCENARIO(hs_desync) {
  auto comm = make_communicator_from_env();
  const int n = comm->world_size(), r = comm->rank();
  const int64_t m = 1000;
  torch::Tensor full = comm->shared_tensor(n * m, torch::kFloat32, {"hsd.full"});
  torch::Tensor grads = comm->peer_tensor(n * m, torch::kFloat32);
  torch::Tensor out = torch::empty({m}, torch::kFloat32);
  try {
    if (r == 0)
      comm->all_gather(full.narrow(0, r * m, m), full, {"hsd.ag"})->wait();
    else
      comm->reduce_scatter(grads, out, ReduceOp::SUM, {"hsd.rs"})->wait();
    std::printf("HSD failed: no\n");
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (auto& c : what)
      if (c == '\n') c = ' ';
    std::printf("HSD failed: %s\n", what.c_str());
  }
  return 0;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
