// fsdp-cpp bench: checkpoint save/load throughput beside the disk's own
// bandwidth, measured in the same run on the same directory.
//
//   bench_ckpt [DIR] [MiB]     (default: $TMPDIR or /tmp, 64 MiB of fp32 tensors)
//
// Baseline: write+fsync / read of one plain file of the same size. Every
// measurement drops the page cache of the files it reads first
// (posix_fadvise DONTNEED after fsync), so reads hit the disk when the kernel
// honours it. Ranks are threads of this process (4 for the sharded runs), so
// "sharded" is 4 writers in parallel into one directory.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_checkpoint_util.h"
#include "fsdp/checkpoint.h"

using namespace fsdp;
using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = argc > 1 ? argv[1] : std::string(tmp ? tmp : "/tmp") + "/fsdp_bench_ckpt";
  int64_t mib = argc > 2 ? std::atoll(argv[2]) : 64;
  const int64_t bytes = mib << 20;
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());

  // 16 tensors of equal size (uneven numbers of elements per rank at world 3).
  std::vector<testing::Param> params;
  int64_t per = bytes / 4 / 16;
  for (int i = 0; i < 16; ++i)
    params.push_back({"layer" + std::to_string(i) + ".weight", torch::randn({per})});

  // Disk baseline.
  std::vector<char> buf(static_cast<size_t>(bytes), 1);
  std::string plain = dir + "/plain.bin";
  auto t0 = Clock::now();
  {
    int fd = ::open(plain.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (int64_t off = 0; off < bytes;) off += ::write(fd, buf.data() + off, static_cast<size_t>(bytes - off));
    ::fsync(fd);
    ::close(fd);
  }
  double disk_w = since(t0);
  drop_cache(plain);
  t0 = Clock::now();
  {
    int fd = ::open(plain.c_str(), O_RDONLY);
    for (int64_t off = 0; off < bytes;) {
      ssize_t k = ::read(fd, buf.data() + off, static_cast<size_t>(bytes - off));
      if (k <= 0) break;
      off += k;
    }
    ::close(fd);
  }
  double disk_r = since(t0);

  // Full file: one writer, then every rank (1 here) reads its range.
  std::vector<ckpt::TensorSpec> specs;
  for (auto& p : params) specs.push_back({p.name, p.full.sizes().vec(), torch::kFloat32});
  std::string full = dir + "/full.safetensors";
  t0 = Clock::now();
  size_t k = 0;
  ckpt::write_full_safetensors(full, specs, [&](const ckpt::TensorSpec&) { return params[k++].full; });
  double full_w = since(t0);
  drop_cache(full);
  // Destinations exist before a load (they are the model): built outside the timing.
  auto dest = [&](int world) {
    std::vector<std::vector<ckpt::Slice>> d;
    for (int r = 0; r < world; ++r) d.push_back(testing::fsdp_slices(params, r, world, true));
    return d;
  };
  auto d1 = dest(1);
  t0 = Clock::now();
  testing::run_threads(1, [&](Communicator& c) { ckpt::load_full_safetensors(c, full, d1[0]); });
  double full_r = since(t0);

  // Sharded: 4 ranks save in parallel; load at 4 and resharded at 3.
  std::string root = dir + "/sharded";
  t0 = Clock::now();
  auto errs = testing::run_threads(4, [&](Communicator& c) {
    ckpt::save_sharded(c, root, 1, testing::fsdp_slices(params, c.rank(), 4), {}, nlohmann::json::object());
  });
  double sh_w = since(t0);
  auto drop_shards = [&] {
    for (int r = 0; r < 4; ++r) {
      char name[64];
      std::snprintf(name, sizeof name, "/step-000001/rank-%05d-of-00004.safetensors", r);
      drop_cache(root + name);
    }
  };
  drop_shards();
  auto d4 = dest(4);
  t0 = Clock::now();
  testing::run_threads(4, [&](Communicator& c) {
    std::vector<ckpt::Slice> os;
    ckpt::load_sharded(c, root, d4[c.rank()], os);
  });
  double sh_r4 = since(t0);
  drop_shards();
  auto d3 = dest(3);
  t0 = Clock::now();
  testing::run_threads(3, [&](Communicator& c) {
    std::vector<ckpt::Slice> os;
    ckpt::load_sharded(c, root, d3[c.rank()], os);
  });
  double sh_r3 = since(t0);
  for (auto& e : errs)
    if (!e.empty()) std::fprintf(stderr, "error: %s\n", e.c_str());

  auto mbps = [&](double s) { return bytes / double(1 << 20) / s; };
  std::printf("checkpoint throughput, %lld MiB of fp32 tensors in %s\n", static_cast<long long>(mib), dir.c_str());
  std::printf("  %-40s %10s %10s\n", "", "MiB/s", "x disk");
  auto row = [&](const char* what, double s, double base) {
    std::printf("  %-40s %10.0f %10.2f\n", what, mbps(s), base / s);
  };
  row("disk: write + fsync one file", disk_w, disk_w);
  row("disk: read one file", disk_r, disk_r);
  row("full safetensors save (1 writer, fsync)", full_w, disk_w);
  row("full safetensors load (1 rank)", full_r, disk_r);
  row("sharded save (4 ranks, fsync, metadata)", sh_w, disk_w);
  row("sharded load (4 ranks, CRC32C checked)", sh_r4, disk_r);
  row("sharded load resharded 4 -> 3", sh_r3, disk_r);
  // The loads must have produced the saved values.
  bool ok = true;
  for (auto* d : {&d1, &d4, &d3})
    for (auto& rank : *d)
      for (size_t i = 0; i < rank.size(); ++i)
        ok = ok && torch::equal(rank[i].data, params[i].full.reshape(-1).slice(0, rank[i].lo, rank[i].hi));
  std::printf("  loaded values %s\n", ok ? "match" : "DIFFER");
  std::system(("rm -rf " + dir).c_str());
  return ok ? 0 : 1;
}
