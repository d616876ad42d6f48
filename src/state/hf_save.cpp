// fsdp-cpp: exporting the model as a Hugging Face checkpoint (save_hf,
// include/fsdp/hf.h), every rank writing at once.
//
// The write path:
//   1. every rank learns every rank's slices (one all_gather) and builds the
//      same plan: the HF tensors (from the name map), the writer of each
//      (the rank holding most of it, balanced by bytes), each writer's files
//      (at most max_shard_size each), and the pieces each writer lacks.
//   2. rank 0 makes DIR's temporary sibling .DIR.fsdp-tmp-XXXXXX (mkdtemp:
//      nobody can plant a link at a name they cannot predict; leftovers of a
//      killed export removed) and tells the others its name; the ranks agree.
//   3. rounds: in each, every writer gathers (a rooted gather: the owners
//      send, only the writer receives) the next pieces it lacks, at most
//      kRoundElements per writer, converted to the output dtype by their
//      owners; then every rank writes the tensors now complete, in file
//      order, its own slices converted chunk by chunk. Files are written
//      through SafetensorsWriter (temp file, fsync, rename, CRC32C per
//      1 MiB chunk and whole).
//   4. each rank records its files' checksums (.rank-R.json); the ranks agree.
//   5. rank 0 writes model.safetensors.index.json and the config, syncs the
//      directory, and puts it in DIR's place (ckpt::detail::publish_dir: a
//      rename, or an atomic swap with an existing DIR, removed after), then
//      syncs DIR's parent; the ranks agree.
// A kill before 5 leaves DIR as it was (the next export removes the
// temporary); an error, on any rank, leaves it as it was and the temporary
// removed; during 5, DIR is the previous export or absent, never a mix.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include "checkpoint/file_io.h"
#include "comm/fail_together.h"
#include "fsdp/hf.h"
#include "fsdp/state_dict.h"
#include "unit/engine_access.h"
#include "state/hf_names.h"

namespace fsdp {
using detail::cat;
namespace hf = detail::hf;
namespace io = ckpt::detail;

namespace {

using detail::EngineAccess;
using detail::ParamSlot;

// Elements a writer receives per round (its staging for others' pieces).
constexpr int64_t kRoundElements = int64_t(16) << 20;
// Elements converted at once when a rank writes its own slices.
constexpr int64_t kWriteChunk = int64_t(8) << 20;
constexpr const char* kExportFormat = "fsdp-cpp/hf-export";
// The largest index save_hf reads back (an existing export's, to tell it is one).
constexpr int64_t kMaxIndexBytes = int64_t(256) << 20;

// One HF tensor of the export.
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  // Transposed: the whole of slot `slot` (written as its transpose).
  bool transposed = false;
  // Non-transposed: HF elements [hf_begin, hf_begin + n) are slot elements
  // [model_begin, model_begin + n); sorted by hf_begin, tiling [0, numel).
  struct Seg {
    int64_t hf_begin, n;
    size_t slot;
    int64_t model_begin;
  };
  std::vector<Seg> segs;
  int writer = 0, file = 0;
};

// A piece a writer receives: slot elements [a, b) from rank `from`, in round `round`.
struct Need {
  size_t tensor, slot;
  int64_t a, b;
  int from, round;
};

std::string file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, n);
  return buf;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// The HF tensors, in the order of the model's parameters, from the name map.
std::vector<OutTensor> plan_tensors(const std::vector<const ParamSlot*>& slots, const HfNameMap& names) {
  std::vector<OutTensor> out;
  std::map<std::string, size_t> index;
  struct Tail {
    std::vector<int64_t> dims;
    std::string from;
  };
  std::map<std::string, Tail> tails;
  for (size_t i = 0; i < slots.size(); ++i) {
    const ParamSlot& s = *slots[i];
    const auto parts = names.parts_of(s.name);
    const int64_t inner = hf::inner_of(s.shape);
    int64_t dst = 0;
    for (auto& p : parts) {
      auto [it, fresh] = index.emplace(p.name, out.size());
      if (fresh) {
        OutTensor fresh_tensor;
        fresh_tensor.name = p.name;
        out.push_back(std::move(fresh_tensor));
      }
      OutTensor& t = out[it->second];
      if (p.transpose) {
        FSDP_USER_CHECK(parts.size() == 1 && fresh && s.shape.size() == 2 && p.row_begin == 0 && p.rows == -1,
                        "save_hf: '", s.name, "' maps to HF tensor '", p.name,
                        "' transposed; a transposed part must be a whole 2-D parameter and a whole HF tensor, "
                        "given by one parameter. Fix the name map.");
        t.transposed = true;
        t.shape = {s.shape[1], s.shape[0]};
        t.segs.push_back({0, s.numel, i, 0});
        dst = s.shape[0];
        continue;
      }
      FSDP_USER_CHECK(!t.transposed, "save_hf: HF tensor '", p.name, "' is given by '", s.name,
                      "' and, transposed, by another parameter. Fix the name map.");
      const int64_t rows = p.rows >= 0 ? p.rows : (parts.size() == 1 ? hf::rows_of(s.shape) : -1);
      FSDP_USER_CHECK(rows >= 0, "save_hf: '", s.name, "' is stacked from ", parts.size(),
                      " HF tensors; each part needs its row count (HfPart::rows) to be written. Fix the name map.");
      std::vector<int64_t> tail(s.shape.size() > 1 ? s.shape.begin() + 1 : s.shape.end(), s.shape.end());
      auto [tt, tfresh] = tails.emplace(p.name, Tail{tail, s.name});
      FSDP_USER_CHECK(tfresh || tt->second.dims == tail, "save_hf: HF tensor '", p.name, "' gets rows of ",
                      ckpt::shape_str(tail), " from '", s.name, "' but of ", ckpt::shape_str(tt->second.dims),
                      " from '", tt->second.from, "'. Fix the name map.");
      t.segs.push_back({p.row_begin * inner, rows * inner, i, dst * inner});
      const int64_t end_row = p.row_begin + rows;
      std::vector<int64_t> shape = s.shape.empty() ? std::vector<int64_t>{} : tail;
      if (!s.shape.empty()) shape.insert(shape.begin(), std::max(end_row, t.shape.empty() ? 0 : t.shape[0]));
      t.shape = shape;
      dst += rows;
    }
    FSDP_USER_CHECK(dst == hf::rows_of(s.shape), "save_hf: the name map gives '", s.name, "' ", dst, " rows, it has ",
                    hf::rows_of(s.shape), ". Fix the name map (HfPart::rows).");
  }
  for (auto& t : out) {
    t.numel = ckpt::numel_of(t.shape);
    std::sort(t.segs.begin(), t.segs.end(), [](auto& a, auto& b) { return a.hf_begin < b.hf_begin; });
    int64_t pos = 0;
    for (auto& g : t.segs) {
      FSDP_USER_CHECK(g.hf_begin == pos, "save_hf: HF tensor '", t.name, "' elements [", std::min(pos, g.hf_begin),
                      ", ", std::max(pos, g.hf_begin), ") are ", g.hf_begin > pos ? "given by no" : "given by two",
                      " model parameter(s). Fix the name map (HfPart::row_begin, rows).");
      pos += g.n;
    }
    FSDP_USER_CHECK(pos == t.numel, "save_hf: HF tensor '", t.name, "' elements [", pos, ", ", t.numel,
                    ") are given by no model parameter. Fix the name map.");
  }
  return out;
}

// Every rank's [lo, hi) of every slot it writes: ranges[r][i].
std::vector<std::vector<std::pair<int64_t, int64_t>>> all_ranges(const FullyShardedModel& m,
                                                                 const std::vector<const ParamSlot*>& slots) {
  Communicator& comm = *m.comm();
  const int N = comm.world_size();
  const int64_t S = static_cast<int64_t>(slots.size());
  auto mine = torch::empty({std::max<int64_t>(1, 2 * S)}, torch::kFloat64);  // exact below 2^53 elements
  for (int64_t i = 0; i < S; ++i) {
    auto [lo, hi] = hf::owned_range(m, *slots[static_cast<size_t>(i)]);
    mine[2 * i] = static_cast<double>(lo);
    mine[2 * i + 1] = static_cast<double>(hi);
  }
  auto all = torch::empty({N * mine.numel()}, torch::kFloat64);
  comm.all_gather(mine, all, {"save_hf slices"})->wait();
  auto acc = all.accessor<double, 1>();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r)
    for (int64_t i = 0; i < S; ++i)
      out[static_cast<size_t>(r)].push_back({static_cast<int64_t>(acc[r * mine.numel() + 2 * i]),
                                             static_cast<int64_t>(acc[r * mine.numel() + 2 * i + 1])});
  return out;
}

int64_t overlap(int64_t a, int64_t b, std::pair<int64_t, int64_t> r) {
  return std::max<int64_t>(0, std::min(b, r.second) - std::max(a, r.first));
}

// Writers: the rank holding most of each tensor, unless that rank is already
// 10% past an even share of the bytes and another is not.
void assign_writers(std::vector<OutTensor>& ts, const std::vector<std::vector<std::pair<int64_t, int64_t>>>& ranges) {
  const int N = static_cast<int>(ranges.size());
  int64_t total = 0;
  for (auto& t : ts) total += t.numel;
  const double cap = 1.1 * static_cast<double>(total) / N;
  std::vector<int64_t> load(static_cast<size_t>(N), 0);
  for (auto& t : ts) {
    int best = -1;
    int64_t best_owned = -1;
    for (int r = 0; r < N; ++r) {
      int64_t owned = 0;
      for (auto& g : t.segs) owned += overlap(g.model_begin, g.model_begin + g.n, ranges[static_cast<size_t>(r)][g.slot]);
      const bool fits = static_cast<double>(load[static_cast<size_t>(r)] + t.numel) <= cap || load[static_cast<size_t>(r)] == 0;
      if (fits && (owned > best_owned || (owned == best_owned && load[static_cast<size_t>(r)] < load[static_cast<size_t>(best)])))
        best = r, best_owned = owned;
    }
    if (best < 0) best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    t.writer = best;
    load[static_cast<size_t>(best)] += t.numel;
  }
}

// Files: each writer's tensors, in order, cut at max_shard_size bytes.
// Returns the file count; sets each tensor's file.
int assign_files(std::vector<OutTensor>& ts, int N, int64_t max_bytes, int64_t es) {
  int files = 0;
  for (int r = 0; r < N; ++r) {
    int64_t in_file = 0;
    bool open = false;
    for (auto& t : ts) {
      if (t.writer != r) continue;
      if (!open || (in_file > 0 && in_file + t.numel * es > max_bytes)) {
        ++files;
        in_file = 0;
        open = true;
      }
      t.file = files - 1;
      in_file += t.numel * es;
    }
  }
  return files;
}

// The pieces each writer lacks, in its write order, cut into rounds.
std::vector<Need> plan_needs(const std::vector<OutTensor>& ts,
                             const std::vector<std::vector<std::pair<int64_t, int64_t>>>& ranges, int* rounds) {
  const int N = static_cast<int>(ranges.size());
  std::vector<Need> needs;
  *rounds = 0;
  for (int w = 0; w < N; ++w) {
    int round = 0;
    int64_t filled = 0;
    // Tensors in file order (files are numbered writer by writer, in order).
    for (size_t k = 0; k < ts.size(); ++k) {
      const OutTensor& t = ts[k];
      if (t.writer != w) continue;
      for (auto& g : t.segs)
        for (int r = 0; r < N; ++r) {
          if (r == w) continue;
          const auto rr = ranges[static_cast<size_t>(r)][g.slot];
          int64_t a = std::max(g.model_begin, rr.first);
          const int64_t b = std::min(g.model_begin + g.n, rr.second);
          while (a < b) {
            if (filled == kRoundElements) ++round, filled = 0;
            const int64_t take = std::min(b - a, kRoundElements - filled);
            needs.push_back({k, g.slot, a, a + take, r, round});
            filled += take;
            a += take;
          }
        }
    }
    if (filled > 0 || round > 0) *rounds = std::max(*rounds, round + 1);
  }
  return needs;
}

// An export directory save_hf may replace: absent, empty, or one it wrote.
std::string refuse_replacing(const std::string& dir, const HfSaveOptions& opts) {
  if (!opts.copy_from.empty() && fsdp::detail::env().same_file(dir, opts.copy_from))
    return cat("save_hf: the export directory '", dir, "' is the directory it copies from (HfSaveOptions::copy_from); "
               "export into a new directory.");
  if (!io::path_exists(dir)) return "";
  if (!io::is_directory(dir)) return cat("save_hf: '", dir, "' is a file; export into a directory (a new one).");
  if (io::list_dir(dir).empty()) return "";
  const std::string index = io::join_path(dir, "model.safetensors.index.json");
  if (io::path_exists(index)) {
    auto j = nlohmann::json::parse(io::read_small_file(index, kMaxIndexBytes), nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("metadata") && j["metadata"].is_object() &&
        j["metadata"].contains("format") && j["metadata"]["format"] == kExportFormat)
      return "";
  }
  return cat("save_hf: '", dir, "' exists and is not an export written by save_hf; it is left as it is. Export into a "
             "new directory, or remove that one first.");
}

// A file copied through (a config, a tokenizer), at most 1 GiB.
std::string slurp(const std::string& path) { return io::read_small_file(path, int64_t(1) << 30); }

void agree(Communicator& comm, const std::string& err, const std::string& dir, const char* phase) {
  comm::fail_together(comm, err, {cat("save_hf ", phase)}, [&](const std::vector<int>& ranks) {
    std::vector<std::string> v;
    for (int r : ranks) v.push_back(std::to_string(r));
    return cat("exporting to '", dir, "' failed on rank(s) ", hf::join_names(v), " (", phase,
               "; see their messages); '", dir, "' is as it was before the export.");
  });
}

}  // namespace

HfSaveResult save_hf(const FullyShardedModel& model, const std::string& dir_in, const HfSaveOptions& opts) {
  const auto began = std::chrono::steady_clock::now();
  const EngineAccess engine(model);
  engine.finish_pending_reductions();
  trace::Span span("checkpoint_save_hf", "ckpt");
  Communicator& comm = *model.comm();
  const int N = comm.world_size(), me = comm.rank();
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const auto slots = engine.slots();
  HfSaveResult res;
  res.dir = dir;

  // 1. The plan, the same on every rank.
  std::vector<OutTensor> ts;
  std::string err;
  const auto ranges = all_ranges(model, slots);
  const int64_t es = static_cast<int64_t>(c10::elementSize(opts.dtype));
  int n_files = 0, rounds = 0;
  std::vector<Need> needs;
  try {
    FSDP_USER_CHECK(opts.dtype == torch::kFloat32 || opts.dtype == torch::kBFloat16 || opts.dtype == torch::kFloat16,
                    "HfSaveOptions::dtype must be kFloat32, kBFloat16 or kFloat16, found ", c10::toString(opts.dtype));
    FSDP_USER_CHECK(opts.max_shard_size > 0, "HfSaveOptions::max_shard_size must be positive, found ",
                    opts.max_shard_size);
    ts = plan_tensors(slots, opts.names);
    assign_writers(ts, ranges);
    n_files = assign_files(ts, N, opts.max_shard_size, es);
    needs = plan_needs(ts, ranges, &rounds);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(comm, err, dir, "planning");
  res.files = n_files;
  res.tensors = static_cast<int>(ts.size());
  for (auto& t : ts) res.total_bytes += t.numel * es;

  // 2. The temporary directory.
  std::string tmp;
  // An export that fails leaves nothing behind: when a later phase throws,
  // rank 0 removes its temporary (a kill leaves it to the next export). The
  // first error is the one reported; after a simulated crash every call
  // throws again, so nothing is removed then either.
  struct RemoveTemporary {
    std::string* tmp;  // rank 0's; null elsewhere
    ~RemoveTemporary() {
      if (tmp == nullptr || tmp->empty()) return;
      try {
        io::remove_tree(*tmp);
      } catch (...) {
      }
    }
  } remove_tmp{me == 0 ? &tmp : nullptr};
  if (me == 0) {
    try {
      err = refuse_replacing(dir, opts);
      if (err.empty()) {
        const std::string parent = io::parent_dir(dir);
        if (io::is_directory(parent))
          for (auto& n : io::list_dir(parent))
            if (io::is_temp_dir_of(n, io::base_name(dir))) io::remove_tree(io::join_path(parent, n));
        tmp = io::make_temp_dir(dir, opts.fsync);
      }
    } catch (const std::exception& e) {
      err = cat("save_hf: preparing a temporary directory beside '", dir, "': ", e.what());
    }
  }
  agree(comm, err, dir, "preparing");
  if (N > 1) {  // rank 0's temporary directory, by name, to every rank
    constexpr int64_t kMaxName = 4096;
    auto name = torch::zeros({kMaxName}, torch::kFloat32);  // one byte per element
    if (me == 0) {
      FSDP_CHECK(static_cast<int64_t>(tmp.size()) < kMaxName, "save_hf: temporary path of ", tmp.size(), " bytes");
      auto a = name.accessor<float, 1>();
      for (size_t i = 0; i < tmp.size(); ++i) a[static_cast<int64_t>(i)] = static_cast<unsigned char>(tmp[i]);
    }
    comm.broadcast(name, 0, {"save_hf: the temporary directory's name"})->wait();
    if (me != 0) {
      const auto a = name.accessor<float, 1>();
      for (int64_t i = 0; i < kMaxName && a[i] != 0; ++i) tmp.push_back(static_cast<char>(static_cast<int>(a[i])));
    }
  }

  // 3. Rounds of gathers, writing what is complete after each.
  std::vector<size_t> my_tensors;
  for (size_t k = 0; k < ts.size(); ++k)
    if (ts[k].writer == me) my_tensors.push_back(k);
  std::vector<int> missing(ts.size(), 0);  // pieces still to come, per tensor
  for (auto& n : needs)
    if (ts[n.tensor].writer == me) ++missing[n.tensor];
  std::map<std::pair<size_t, int64_t>, torch::Tensor> received;  // (slot, a) -> elements [a, b) in dtype
  size_t next = 0;
  std::unique_ptr<ckpt::SafetensorsWriter> writer;
  struct Written {
    std::string name;
    int64_t bytes;
    uint32_t crc;
    std::vector<uint32_t> chunks;
  };
  std::vector<Written> written;
  // This rank's own elements [a, b) of slot i, in the output dtype, in parts.
  auto own = [&](size_t i, int64_t a, int64_t b, const std::function<void(const torch::Tensor&)>& put) {
    const ParamSlot& s = *slots[i];
    const torch::Tensor view = s.shard_view.detach();
    for (int64_t x = a; x < b; x += kWriteChunk) {
      const int64_t k = std::min(kWriteChunk, b - x);
      put(view.narrow(0, x - s.lo, k).to(torch::kCPU).to(opts.dtype));
    }
  };
  auto write_tensor = [&](const OutTensor& t) {
    const auto mine = ranges[static_cast<size_t>(me)];
    // Elements [a, b) of slot i, whoever held them, to `put`, in order.
    auto elements = [&](size_t i, int64_t a, int64_t b, const std::function<void(const torch::Tensor&)>& put) {
      for (int64_t pos = a; pos < b;) {
        const auto r = mine[i];
        if (pos >= r.first && pos < r.second) {
          const int64_t end = std::min(b, r.second);
          own(i, pos, end, put);
          pos = end;
          continue;
        }
        auto it = received.find({i, pos});
        FSDP_CHECK(it != received.end(), "save_hf: no piece of slot ", i, " at ", pos);
        put(it->second);
        pos += it->second.numel();
        received.erase(it);
      }
    };
    if (t.transposed) {
      const ParamSlot& s = *slots[t.segs[0].slot];
      auto whole = torch::empty({s.numel}, opts.dtype);
      int64_t at = 0;
      elements(t.segs[0].slot, 0, s.numel, [&](const torch::Tensor& part) {
        whole.narrow(0, at, part.numel()).copy_(part);
        at += part.numel();
      });
      writer->write(whole.view(s.shape).t().contiguous());
      return;
    }
    for (auto& g : t.segs)
      elements(g.slot, g.model_begin, g.model_begin + g.n, [&](const torch::Tensor& part) { writer->write(part); });
  };
  auto write_ready = [&] {
    while (next < my_tensors.size() && missing[my_tensors[next]] == 0) {
      const OutTensor& t = ts[my_tensors[next]];
      if (!writer) {
        std::vector<ckpt::TensorSpec> specs;
        for (size_t k : my_tensors)
          if (ts[k].file == t.file) specs.push_back({ts[k].name, ts[k].shape, opts.dtype});
        writer = std::make_unique<ckpt::SafetensorsWriter>(io::join_path(tmp, file_name(t.file, n_files)),
                                                           specs, std::map<std::string, std::string>{{"format", "pt"}},
                                                           opts.fsync);
      }
      write_tensor(t);
      ++next;
      if (next == my_tensors.size() || ts[my_tensors[next]].file != t.file) {
        Written w{file_name(t.file, n_files), writer->finish(), writer->file_crc32c(), writer->chunk_crc32c()};
        res.bytes_written += w.bytes;
        written.push_back(std::move(w));
        writer.reset();
      }
    }
  };
  err.clear();
  // A write error is kept and the rank goes on taking part in the gathers,
  // so that no rank waits forever; the agreement below fails every rank.
  auto try_write = [&] {
    if (!err.empty()) return;
    try {
      write_ready();
    } catch (const std::exception& e) {
      err = cat("rank ", me, ": ", e.what());
    }
  };
  try {
    torch::NoGradGuard ng;
    for (int round = 0; round < rounds; ++round) {
      try_write();
      for (int w = 0; w < N; ++w) {
        // What each rank sends writer w this round; the largest sets the size.
        std::vector<int64_t> count(static_cast<size_t>(N), 0);
        std::vector<const Need*> from_me, to_w;
        for (auto& n : needs) {
          if (n.round != round || ts[n.tensor].writer != w) continue;
          count[static_cast<size_t>(n.from)] += n.b - n.a;
          if (n.from == me) from_me.push_back(&n);
          if (w == me) to_w.push_back(&n);
        }
        const int64_t M = *std::max_element(count.begin(), count.end());
        if (M == 0) continue;
        auto input = torch::zeros({M}, opts.dtype);
        int64_t at = 0;
        for (const Need* n : from_me)
          own(n->slot, n->a, n->b, [&](const torch::Tensor& part) {
            input.narrow(0, at, part.numel()).copy_(part);
            at += part.numel();
          });
        torch::Tensor output = w == me ? torch::empty({N * M}, opts.dtype) : torch::Tensor();
        comm.gather(input, output, w, {cat("save_hf round ", round, " to rank ", w)})->wait();
        if (w != me) continue;
        std::vector<int64_t> offset(static_cast<size_t>(N), 0);
        for (const Need* n : to_w) {
          int64_t& o = offset[static_cast<size_t>(n->from)];
          received[{n->slot, n->a}] = output.narrow(0, n->from * M + o, n->b - n->a);
          o += n->b - n->a;
          res.elements_received += n->b - n->a;
          --missing[n->tensor];
        }
      }
    }
    try_write();
    if (err.empty())
      FSDP_CHECK(next == my_tensors.size(), "save_hf: ", my_tensors.size() - next, " tensors left unwritten");
  } catch (const std::exception& e) {
    if (err.empty()) err = cat("rank ", me, ": ", e.what());
  }
  writer.reset();  // an abandoned file removes its temporary

  // 4. Each rank's files, durable; their checksums for rank 0.
  if (err.empty()) try {
      nlohmann::json j = nlohmann::json::array();
      for (auto& w : written) {
        nlohmann::json chunks = nlohmann::json::array();
        for (uint32_t c : w.chunks) chunks.push_back(hex(c));
        j.push_back({{"name", w.name}, {"bytes", w.bytes}, {"crc32c", hex(w.crc)}, {"chunk_crc32c", chunks}});
      }
      io::atomic_write_file(io::join_path(tmp, cat(".rank-", me, ".json")), j.dump(), opts.fsync);
    } catch (const std::exception& e) {
      err = cat("rank ", me, ": ", e.what());
    }
  agree(comm, err, dir, "writing the files");

  // 5. Rank 0: the index, the config, and the swap into place.
  if (me == 0) try {
      nlohmann::json files = nlohmann::json::object();
      for (int r = 0; r < N; ++r) {
        const std::string p = io::join_path(tmp, cat(".rank-", r, ".json"));
        auto j = nlohmann::json::parse(slurp(p), nullptr, false);
        FSDP_USER_CHECK(j.is_array(), "save_hf: '", p, "' is damaged (not the JSON rank ", r, " wrote).");
        for (auto& f : j) files[f["name"].get<std::string>()] = {
                              {"bytes", f["bytes"]}, {"crc32c", f["crc32c"]}, {"chunk_crc32c", f["chunk_crc32c"]}};
        io::remove_file(p);
      }
      nlohmann::json weight_map = nlohmann::json::object();
      int64_t params = 0;
      for (auto& t : ts) weight_map[t.name] = file_name(t.file, n_files), params += t.numel;
      nlohmann::json index = {
          {"metadata",
           {{"total_size", res.total_bytes},
            {"total_parameters", params},
            {"format", kExportFormat},
            {"fsdp_checksums", {{"algorithm", "crc32c"}, {"chunk_bytes", ckpt::SafetensorsWriter::kChunkBytes},
                                {"files", files}}}}},
          {"weight_map", weight_map}};
      io::atomic_write_file(io::join_path(tmp, "model.safetensors.index.json"), index.dump(2) + "\n", opts.fsync);
      // The config and the tokenizer, copied through.
      nlohmann::json config = opts.config;
      std::string config_from = "HfSaveOptions::config";
      if (!opts.copy_from.empty()) {
        for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                              "special_tokens_map.json", "tokenizer.model"}) {
          const std::string src = io::join_path(opts.copy_from, f);
          if (io::path_exists(src)) io::atomic_write_file(io::join_path(tmp, f), slurp(src), opts.fsync);
        }
        const std::string cfg = io::join_path(opts.copy_from, "config.json");
        if (config.is_null() && io::path_exists(cfg)) {
          config = nlohmann::json::parse(slurp(cfg), nullptr, false);
          FSDP_USER_CHECK(!config.is_discarded(), "save_hf: '", cfg, "' is not valid JSON.");
          config_from = cat("'", cfg, "'");
        }
      }
      if (!config.is_null()) {
        FSDP_USER_CHECK(config.is_object(), "save_hf: the config (", config_from,
                        ") must be a JSON object of config.json's keys, found ", config.dump().substr(0, 60),
                        " (", config.type_name(), "); nothing was exported. Give the model's config.json.");
        const char* dt = opts.dtype == torch::kFloat32 ? "float32" : opts.dtype == torch::kBFloat16 ? "bfloat16" : "float16";
        config["dtype"] = dt;
        if (config.contains("torch_dtype")) config["torch_dtype"] = dt;
        io::atomic_write_file(io::join_path(tmp, "config.json"), config.dump(2) + "\n", opts.fsync);
      }
      if (opts.fsync) io::fsync_dir(tmp);
      io::publish_dir(tmp, dir, opts.fsync);
      tmp.clear();  // published: nothing of ours to remove
    } catch (const std::exception& e) {
      err = cat("rank 0: ", e.what());
    }
  agree(comm, err, dir, "committing");
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return res;
}

}  // namespace fsdp
