// fsdp-cpp bench: all_gather and reduce_scatter bus bandwidth, beside the
// loopback TCP and memcpy bandwidth of the same machine in the same run.
//
//   build/bin/fsdp run -n 4 -- build/bin/bench_comm [--json FILE] [--max-mib 64]
//
// Sizes are the full (unsharded) buffer: the all_gather output and the
// reduce_scatter input, fp32, 1 KiB .. 64 MiB. Bus bandwidth follows
// nccl-tests: size / time x (N-1)/N, the rate each rank's link really carries,
// so it is comparable with the loopback TCP figure. Rank 0 prints a table and
// appends one JSON line to --json.
#include <CLI/CLI.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "fsdp/comm.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One TCP connection over 127.0.0.1, one thread writing, this one reading:
// the ceiling for any TCP-based collective between two local processes.
double loopback_tcp_gbps(size_t total_bytes) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(lfd, 1) ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len))
    return 0;
  std::thread writer([a, total_bytes] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a)) return;
    std::vector<char> buf(4 << 20, 1);
    for (size_t sent = 0; sent < total_bytes;) {
      ssize_t n = write(fd, buf.data(), std::min(buf.size(), total_bytes - sent));
      if (n <= 0) break;
      sent += n;
    }
    close(fd);
  });
  int fd = accept(lfd, nullptr, nullptr);
  std::vector<char> buf(4 << 20);
  auto t0 = Clock::now();
  size_t got = 0;
  for (ssize_t n; (n = read(fd, buf.data(), buf.size())) > 0;) got += n;
  double s = since(t0);
  writer.join();
  close(fd);
  close(lfd);
  return got / s / 1e9;
}

double memcpy_gbps(size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in first
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) std::memcpy(dst.data(), src.data(), bytes);
  return double(bytes) * reps / since(t0) / 1e9;
}

struct Row {
  int64_t bytes;
  double ag_busbw, rs_busbw;  // GB/s
  double ag_us, rs_us;        // per call
};

// Seconds per call, timed on every rank between barriers; rank 0's figure.
template <class Fn>
double time_calls(fsdp::Communicator& c, int64_t bytes, Fn fn) {
  fn();  // warm-up: connections, page faults
  int iters = static_cast<int>(std::clamp<int64_t>((256 << 20) / std::max<int64_t>(bytes, 1), 3, 200));
  c.barrier()->wait();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double s = since(t0) / iters;
  // Agree on one number: the mean over ranks.
  auto t = torch::full({1}, s, torch::kDouble);
  c.all_reduce(t, fsdp::ReduceOp::AVG)->wait();
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("all_gather / reduce_scatter bus bandwidth vs loopback TCP and memcpy", "bench_comm");
  std::string json_path;
  int max_mib = 64;
  app.add_option("--json", json_path, "append one JSON line with the results to this file");
  app.add_option("--max-mib", max_mib, "largest buffer in MiB (default 64)")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);

  auto c = fsdp::make_communicator_from_env();
  const int n = c->world_size();
  const bool lead = c->rank() == 0;
  // Reference rates, measured by rank 0 while the others wait at a barrier.
  double tcp = 0, mem = 0;
  if (lead) {
    tcp = loopback_tcp_gbps(size_t(1) << 30);
    mem = memcpy_gbps(size_t(64) << 20, 8);
  }
  c->barrier()->wait();

  std::vector<Row> rows;
  for (int64_t bytes = 1024; bytes <= (int64_t(max_mib) << 20); bytes *= 4) {
    const int64_t full = bytes / 4, shard = full / n;  // fp32 elements
    auto shard_t = torch::ones({shard}, torch::kFloat), full_t = torch::ones({shard * n}, torch::kFloat);
    double ag = time_calls(*c, bytes, [&] { c->all_gather(shard_t, full_t)->wait(); });
    double rs = time_calls(*c, bytes, [&] { c->reduce_scatter(full_t, shard_t, fsdp::ReduceOp::SUM)->wait(); });
    double moved = double(shard * n * 4) * (n - 1) / n;
    rows.push_back({bytes, n > 1 ? moved / ag / 1e9 : 0, n > 1 ? moved / rs / 1e9 : 0, ag * 1e6, rs * 1e6});
  }
  if (!lead) return 0;

  std::printf("bench_comm: %s, loopback TCP %.2f GB/s, memcpy %.2f GB/s (1 thread)\n",
              c->describe().c_str(), tcp, mem);
  std::printf("%8s | %9s %8s %7s %7s | %9s %8s %7s %7s\n", "size", "AG us", "AG GB/s", "/tcp", "/memcpy",
              "RS us", "RS GB/s", "/tcp", "/memcpy");
  nlohmann::json j = {{"bench", "comm"}, {"world", n}, {"engine", c->describe()},
                      {"tcp_GBps", tcp}, {"memcpy_GBps", mem}, {"rows", nlohmann::json::array()}};
  for (auto& r : rows) {
    char size[32];
    if (r.bytes >= (1 << 20))
      std::snprintf(size, sizeof size, "%lld MiB", static_cast<long long>(r.bytes >> 20));
    else
      std::snprintf(size, sizeof size, "%lld KiB", static_cast<long long>(r.bytes >> 10));
    std::printf("%8s | %9.0f %8.3f %7.3f %7.3f | %9.0f %8.3f %7.3f %7.3f\n", size, r.ag_us, r.ag_busbw,
                r.ag_busbw / tcp, r.ag_busbw / mem, r.rs_us, r.rs_busbw, r.rs_busbw / tcp, r.rs_busbw / mem);
    j["rows"].push_back({{"bytes", r.bytes},
                         {"all_gather_us", r.ag_us},
                         {"reduce_scatter_us", r.rs_us},
                         {"all_gather_busbw_GBps", r.ag_busbw},
                         {"reduce_scatter_busbw_GBps", r.rs_busbw},
                         {"all_gather_vs_tcp", r.ag_busbw / tcp},
                         {"reduce_scatter_vs_tcp", r.rs_busbw / tcp},
                         {"all_gather_vs_memcpy", r.ag_busbw / mem},
                         {"reduce_scatter_vs_memcpy", r.rs_busbw / mem}});
  }
  std::fflush(stdout);
  if (!json_path.empty()) std::ofstream(json_path, std::ios::app) << j.dump() << "\n";
  return 0;
}
