// fsdp-cpp bench: all_gather and reduce_scatter bus bandwidth, beside the
// loopback TCP and memcpy bandwidth of the same machine in the same run.
//
//   build/bin/fsdp run -n 4 -- build/bin/bench_comm [--json FILE] [--max-mib 64]
//
// Sizes are the full (unsharded) buffer: the all_gather output and the
// reduce_scatter input, fp32, 1 KiB .. 64 MiB. Bus bandwidth follows
// nccl-tests: size / time x (N-1)/N, the rate each rank's link really carries,
// so it is comparable with the TCP figures. Rank 0 prints a table and
// appends one JSON line to --json.
//
// Transports (FSDP_TRANSPORT) at the largest size: a communicator of each
// (tcp: Gloo's ring over loopback; cma: cross-memory attach; at an even
// N >= 4 also tiers: the ranks split into two simulated hosts by
// FSDP_HOST_ID, so the collectives compose CMA inside each half with TCP
// between them, docs/COMM.md "Across hosts"), in paired
// rounds beside a plain memcpy of the same bytes each rank moves, done by
// every rank at once (the memory bus is shared alike). The target
// for ranks on one host is >= 0.5 x that memcpy.
//
// Two TCP references, measured in the same run:
//   loopback 1 stream   one connection over 127.0.0.1 inside rank 0 (a writer
//                       thread, a reader), the others idle at a barrier: the
//                       rate of one stream with every core free
//   TCP ring            the collectives' own shape with plain sockets: every
//                       rank sends to rank r+1 and receives from rank r-1 at
//                       once (a writer thread and a reader per rank), all N
//                       ranks together; per-rank rate. This is the ceiling a
//                       ring collective over loopback TCP can reach on this
//                       machine, and what the ratios /ring compare with.
#include <CLI/CLI.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/init.h"

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

// The collectives' shape with plain sockets: a connection from every rank to
// its right neighbour (ports travel through the communicator), a writer
// thread and a reader per rank. transfer() moves `bytes` each way between
// buffers of that size (cold in cache, like a large collective's), all
// ranks at once, and returns the per-rank rate in GB/s (mean over ranks).
class TcpRing {
 public:
  explicit TcpRing(fsdp::Communicator& c) : c_(c) {
    const int n = c.world_size(), r = c.rank();
    if (n == 1) return;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bool ok = lfd >= 0 && !bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) && !listen(lfd, 1) &&
              !getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    auto mine = torch::full({1}, ok ? int64_t(ntohs(a.sin_port)) : int64_t(0), torch::kLong);
    auto ports = torch::empty({n}, torch::kLong);
    c.all_gather(mine, ports)->wait();
    const int64_t right_port = ports[(r + 1) % n].item<int64_t>();
    if (ok && right_port != 0) {
      out_ = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in ra = a;
      ra.sin_port = htons(static_cast<uint16_t>(right_port));
      std::thread connector([&] {
        if (connect(out_, reinterpret_cast<const sockaddr*>(&ra), sizeof ra)) {
          close(out_);
          out_ = -1;
        }
      });
      in_ = accept(lfd, nullptr, nullptr);
      connector.join();
    }
    if (lfd >= 0) close(lfd);
  }
  ~TcpRing() {
    for (int fd : {in_, out_})
      if (fd >= 0) close(fd);
  }
  double transfer(size_t bytes) {
    if (c_.world_size() == 1) return 0;
    if (send_.size() != bytes) {
      send_.assign(bytes, 1);
      recv_.assign(bytes, 0);
    }
    bool ok = in_ >= 0 && out_ >= 0;
    c_.barrier()->wait();
    auto t0 = Clock::now();
    std::thread writer([this, bytes, ok] {
      for (size_t sent = 0; ok && sent < bytes;) {
        ssize_t k = write(out_, send_.data() + sent, std::min<size_t>(4 << 20, bytes - sent));
        if (k <= 0) break;
        sent += k;
      }
    });
    size_t got = 0;
    for (ssize_t k; ok && got < bytes &&
                    (k = read(in_, recv_.data() + got, std::min<size_t>(4 << 20, bytes - got))) > 0;)
      got += k;
    writer.join();
    double rate = got / since(t0) / 1e9;
    auto t = torch::full({1}, rate, torch::kDouble);
    c_.all_reduce(t, fsdp::ReduceOp::AVG)->wait();
    return t.item<double>();
  }

 private:
  fsdp::Communicator& c_;
  int in_ = -1, out_ = -1;
  std::vector<char> send_, recv_;
};

double memcpy_gbps(size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in first
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) std::memcpy(dst.data(), src.data(), bytes);
  return double(bytes) * reps / since(t0) / 1e9;
}

// Every rank copies `bytes` between two cold buffers at once; the mean
// per-rank rate.
double memcpy_all_ranks_gbps(fsdp::Communicator& c, size_t bytes, std::vector<char>& src, std::vector<char>& dst) {
  if (src.size() != bytes) {
    src.assign(bytes, 1);
    dst.assign(bytes, 0);
  }
  c.barrier()->wait();
  auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), bytes);
  auto t = torch::full({1}, bytes / since(t0) / 1e9, torch::kDouble);
  c.all_reduce(t, fsdp::ReduceOp::AVG)->wait();
  return t.item<double>();
}

// A communicator with FSDP_TRANSPORT=`transport` (every rank asks for the
// same one, so every rank gets it or every rank fails); null when this
// host cannot.
// `host_id`: this rank's FSDP_HOST_ID while it is made (null: unchanged).
fsdp::CommPtr communicator_over(const char* transport, const char* host_id = nullptr) {
  auto swap_env = [](const char* name, const char* value) {
    const char* old = std::getenv(name);
    std::optional<std::string> saved;
    if (old) saved = old;
    if (value) setenv(name, value, 1);
    return saved;
  };
  auto restore = [](const char* name, const std::optional<std::string>& saved) {
    if (saved)
      setenv(name, saved->c_str(), 1);
    else
      unsetenv(name);
  };
  const auto transport_was = swap_env("FSDP_TRANSPORT", transport);
  const auto host_was = swap_env("FSDP_HOST_ID", host_id);
  fsdp::CommPtr c;
  try {
    c = fsdp::make_communicator_from_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: no %s communicator: %s\n", transport, e.what());
  }
  restore("FSDP_TRANSPORT", transport_was);
  if (host_id) restore("FSDP_HOST_ID", host_was);
  return c;
}

struct Row {
  int64_t bytes;
  double ag_busbw, rs_busbw;  // GB/s
  double ag_us, rs_us;        // per call
};

// Seconds per call, timed on every rank between barriers; rank 0's figure.
template <class Fn>
double time_calls(fsdp::Communicator& c, int64_t bytes, Fn fn, int iters = 0) {
  fn();  // warm-up: connections, page faults
  if (iters <= 0) iters = static_cast<int>(std::clamp<int64_t>((256 << 20) / std::max<int64_t>(bytes, 1), 3, 200));
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv) {
  fsdp::init();
  CLI::App app("all_gather / reduce_scatter bus bandwidth vs loopback TCP and memcpy", "bench_comm");
  std::string json_path, piece_list;
  int max_mib = 64, rounds = 5;
  app.add_option("--json", json_path, "append one JSON line with the results to this file");
  app.add_option("--max-mib", max_mib, "largest buffer in MiB (default 64)")->check(CLI::Range(1, 1024));
  app.add_option("--rounds", rounds, "paired rounds at the largest size (default 5)")->check(CLI::Range(1, 1000));
  app.add_option("--piece-kib", piece_list,
                 "comma-separated ring piece sizes (KiB) to compare in the paired rounds (CommOptions::ring_piece_bytes)");
  app.add_flag("--paired-only", [&](int64_t) { max_mib = -max_mib; }, "skip the size sweep");
  CLI11_PARSE(app, argc, argv);
  const bool sweep = max_mib > 0;
  max_mib = std::abs(max_mib);

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
  TcpRing ring(*c);

  std::vector<Row> rows;
  for (int64_t bytes = 1024; sweep && bytes <= (int64_t(max_mib) << 20); bytes *= 4) {
    const int64_t full = bytes / 4, shard = full / n;  // fp32 elements
    auto shard_t = torch::ones({shard}, torch::kFloat), full_t = torch::ones({shard * n}, torch::kFloat);
    double ag = time_calls(*c, bytes, [&] { c->all_gather(shard_t, full_t)->wait(); });
    double rs = time_calls(*c, bytes, [&] { c->reduce_scatter(full_t, shard_t, fsdp::ReduceOp::SUM)->wait(); });
    double moved = double(shard * n * 4) * (n - 1) / n;
    rows.push_back({bytes, n > 1 ? moved / ag / 1e9 : 0, n > 1 ? moved / rs / 1e9 : 0, ag * 1e6, rs * 1e6});
  }

  // Paired rounds at the largest size: the TCP ring moving the same bytes per
  // rank between buffers of that size, then the all-gather, then the
  // reduce-scatter, back to back; the ratios are taken within each round,
  // so a machine whose speed drifts (other jobs) affects both sides alike.
  const int64_t big = int64_t(max_mib) << 20;
  const int64_t shard = big / 4 / n;
  const double moved = double(shard * n * 4) * (n - 1) / n;
  auto shard_t = torch::ones({shard}, torch::kFloat), full_t = torch::ones({shard * n}, torch::kFloat);
  std::vector<std::string> pieces = {""};  // "": the built-in piece size
  {
    std::stringstream ss(piece_list);
    for (std::string x; std::getline(ss, x, ',');)
      if (!x.empty()) pieces.push_back(x);
  }
  struct Paired {
    std::vector<double> ring, ag, rs, ag_ratio, rs_ratio;
  };
  std::vector<Paired> paired(pieces.size());
  // One communicator per piece size (CommOptions::ring_piece_bytes), made
  // before the rounds; "" is the one above, at the built-in size.
  std::vector<fsdp::CommPtr> by_piece(pieces.size(), c);
  for (size_t v = 1; n > 1 && v < pieces.size(); ++v) {
    fsdp::CommOptions o;
    o.ring_piece_bytes = std::stoll(pieces[v]) << 10;
    by_piece[v] = fsdp::make_communicator_from_env(o);
  }
  for (int round = 0; n > 1 && round < rounds; ++round) {
    for (size_t v = 0; v < pieces.size(); ++v) {
      fsdp::Communicator& pc = *by_piece[v];
      double tr = ring.transfer(static_cast<size_t>(moved));
      double ag = moved / time_calls(pc, big, [&] { pc.all_gather(shard_t, full_t)->wait(); }, 2) / 1e9;
      double rs = moved / time_calls(pc, big, [&] { pc.reduce_scatter(full_t, shard_t, fsdp::ReduceOp::SUM)->wait(); }, 2) / 1e9;
      auto& p = paired[v];
      p.ring.push_back(tr);
      p.ag.push_back(ag);
      p.rs.push_back(rs);
      p.ag_ratio.push_back(tr > 0 ? ag / tr : 0);
      p.rs_ratio.push_back(tr > 0 ? rs / tr : 0);
    }
  }
  by_piece.clear();
  const double ring_gbps = median(paired[0].ring);

  // Transports at the largest size, in paired rounds with a memcpy of the
  // same bytes (see the top of the file).
  struct Over {
    std::string name;
    fsdp::CommPtr comm;
    std::vector<double> ag, rs, ag_ratio, rs_ratio;
  };
  std::vector<Over> over_t;
  std::vector<double> memcpy_rounds;
  if (n > 1) {
    for (const char* t : {"tcp", "cma"}) {
      auto comm = communicator_over(t);
      if (comm) over_t.push_back({t, comm, {}, {}, {}, {}});
    }
    if (n >= 4 && n % 2 == 0) {
      // Every rank makes it (collective); kept only when it composed.
      const std::string half = "bench-half-" + std::to_string(c->rank() < n / 2 ? 0 : 1);
      auto comm = communicator_over("auto", half.c_str());
      if (comm && comm->describe().find("tiers") != std::string::npos) over_t.push_back({"tiers", comm, {}, {}, {}, {}});
    }
    std::vector<char> src, dst;
    for (int round = 0; round < rounds; ++round) {
      const double mc = memcpy_all_ranks_gbps(*c, static_cast<size_t>(moved), src, dst);
      memcpy_rounds.push_back(mc);
      for (auto& o : over_t) {
        auto& x = *o.comm;
        const double ag = moved / time_calls(x, big, [&] { x.all_gather(shard_t, full_t)->wait(); }, 2) / 1e9;
        const double rs =
            moved / time_calls(x, big, [&] { x.reduce_scatter(full_t, shard_t, fsdp::ReduceOp::SUM)->wait(); }, 2) /
            1e9;
        o.ag.push_back(ag);
        o.rs.push_back(rs);
        o.ag_ratio.push_back(mc > 0 ? ag / mc : 0);
        o.rs_ratio.push_back(mc > 0 ? rs / mc : 0);
      }
    }
  }
  if (!lead) return 0;

  std::printf("bench_comm: %s, loopback TCP 1 stream %.2f GB/s, TCP ring %.2f GB/s per rank (%lld MiB), memcpy "
              "%.2f GB/s (1 thread)\n",
              c->describe().c_str(), tcp, ring_gbps, (long long)max_mib, mem);
  nlohmann::json j = {{"bench", "comm"},         {"world", n},           {"engine", c->describe()},
                      {"tcp_GBps", tcp},          {"tcp_ring_GBps", ring_gbps}, {"memcpy_GBps", mem},
                      {"rows", nlohmann::json::array()}};
  auto over = [](double x, double ref) { return ref > 0 ? x / ref : 0.0; };
  if (sweep)
    std::printf("%8s | %9s %8s %7s %7s | %9s %8s %7s %7s\n", "size", "AG us", "AG GB/s", "/tcp", "/ring", "RS us",
                "RS GB/s", "/tcp", "/ring");
  for (auto& r : rows) {
    char size[32];
    if (r.bytes >= (1 << 20))
      std::snprintf(size, sizeof size, "%lld MiB", static_cast<long long>(r.bytes >> 20));
    else
      std::snprintf(size, sizeof size, "%lld KiB", static_cast<long long>(r.bytes >> 10));
    std::printf("%8s | %9.0f %8.3f %7.3f %7.3f | %9.0f %8.3f %7.3f %7.3f\n", size, r.ag_us, r.ag_busbw,
                over(r.ag_busbw, tcp), over(r.ag_busbw, ring_gbps), r.rs_us, r.rs_busbw, over(r.rs_busbw, tcp),
                over(r.rs_busbw, ring_gbps));
    j["rows"].push_back({{"bytes", r.bytes},
                         {"all_gather_us", r.ag_us},
                         {"reduce_scatter_us", r.rs_us},
                         {"all_gather_busbw_GBps", r.ag_busbw},
                         {"reduce_scatter_busbw_GBps", r.rs_busbw},
                         {"all_gather_vs_tcp", over(r.ag_busbw, tcp)},
                         {"reduce_scatter_vs_tcp", over(r.rs_busbw, tcp)},
                         {"all_gather_vs_tcp_ring", over(r.ag_busbw, ring_gbps)},
                         {"reduce_scatter_vs_tcp_ring", over(r.rs_busbw, ring_gbps)},
                         {"all_gather_vs_memcpy", over(r.ag_busbw, mem)},
                         {"reduce_scatter_vs_memcpy", over(r.rs_busbw, mem)}});
  }
  if (n > 1) {
    std::printf("paired at %lld MiB, %d rounds (median, min-max of the per-round ratio):\n", (long long)max_mib,
                rounds);
    j["paired"] = nlohmann::json::array();
    for (size_t v = 0; v < pieces.size(); ++v) {
      const auto& p = paired[v];
      auto mm = [](const std::vector<double>& x) { return std::minmax_element(x.begin(), x.end()); };
      auto ag_mm = mm(p.ag_ratio), rs_mm = mm(p.rs_ratio);
      std::printf("  piece %-8s TCP ring %.3f GB/s | AG %.3f GB/s = %.3f x ring (%.3f-%.3f) | RS %.3f GB/s = %.3f x "
                  "ring (%.3f-%.3f)\n",
                  pieces[v].empty() ? "default" : (pieces[v] + "K").c_str(), median(p.ring), median(p.ag),
                  median(p.ag_ratio), *ag_mm.first, *ag_mm.second, median(p.rs), median(p.rs_ratio), *rs_mm.first,
                  *rs_mm.second);
      j["paired"].push_back({{"bytes", big},
                             {"piece_kib", pieces[v].empty() ? nlohmann::json(nullptr) : nlohmann::json(pieces[v])},
                             {"rounds", rounds},
                             {"tcp_ring_GBps", median(p.ring)},
                             {"all_gather_busbw_GBps", median(p.ag)},
                             {"reduce_scatter_busbw_GBps", median(p.rs)},
                             {"all_gather_vs_tcp_ring", median(p.ag_ratio)},
                             {"reduce_scatter_vs_tcp_ring", median(p.rs_ratio)},
                             {"all_gather_vs_tcp_ring_each", p.ag_ratio},
                             {"reduce_scatter_vs_tcp_ring_each", p.rs_ratio}});
    }
  }
  if (!over_t.empty()) {
    std::printf("transports at %lld MiB, %d rounds (median; x a memcpy of the same %.1f MiB per rank, all ranks at "
                "once, in the same round): memcpy %.3f GB/s\n",
                (long long)max_mib, rounds, moved / (1 << 20), median(memcpy_rounds));
    j["transports"] = nlohmann::json::array();
    for (auto& o : over_t) {
      std::printf("  %-5s AG %.3f GB/s = %.3f x memcpy | RS %.3f GB/s = %.3f x memcpy\n", o.name.c_str(),
                  median(o.ag), median(o.ag_ratio), median(o.rs), median(o.rs_ratio));
      j["transports"].push_back({{"transport", o.name},
                                 {"engine", o.comm->describe()},
                                 {"bytes", big},
                                 {"rounds", rounds},
                                 {"memcpy_all_ranks_GBps", median(memcpy_rounds)},
                                 {"all_gather_busbw_GBps", median(o.ag)},
                                 {"reduce_scatter_busbw_GBps", median(o.rs)},
                                 {"all_gather_vs_memcpy", median(o.ag_ratio)},
                                 {"reduce_scatter_vs_memcpy", median(o.rs_ratio)},
                                 {"all_gather_vs_memcpy_each", o.ag_ratio},
                                 {"reduce_scatter_vs_memcpy_each", o.rs_ratio}});
    }
  }
  std::fflush(stdout);
  if (!json_path.empty()) std::ofstream(json_path, std::ios::app) << j.dump() << "\n";
  return 0;
}
