// fsdp-cpp: loading a Hugging Face checkpoint into the shards (load_hf,
// include/fsdp/hf.h), and the name map both directions share.
//
// The load path: read and check the directory (index, headers, config) ->
// map every model parameter to its pieces of HF tensors and check names,
// shapes and dtypes, listing every problem -> the ranks agree, and compare
// the CRC32C of the index, config.json and every header each read (all load
// the same export, or all fail naming what differs) -> each rank
// reads the byte ranges of its own slices (a transposed tensor: the columns
// of its rows, one pread per row of the file's tensor), through a bounded
// buffer that converts bf16/fp16/fp64 to the fp32 masters (what the page
// cache lacks read around it, checkpoint/range_reader.h). Nothing is
// written before the agreement; with HfLoadOptions::staged the reads land in
// a copy that is committed only after a second agreement.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <set>

#include "checkpoint/range_reader.h"
#include "comm/fail_together.h"
#include "common/shard_math.h"
#include "fsdp/hf.h"
#include "fsdp/state_dict.h"
#include "unit/engine_access.h"
#include "state/hf_names.h"

namespace fsdp {
using detail::cat;
namespace hf = detail::hf;

std::vector<HfPart> HfNameMap::parts_of(const std::string& model_name) const {
  if (fn) {
    auto p = fn(model_name);
    if (!p.empty()) return p;
  }
  for (auto& r : rules) {
    std::regex re;
    try {
      re = std::regex(r.model_pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(cat("HfNameMap: rule pattern '", r.model_pattern, "' is not a valid regular expression (", e.what(),
                      "). Fix the rule (std::regex, ECMAScript syntax)."));
    }
    std::smatch m;
    if (!std::regex_match(model_name, m, re)) continue;
    std::vector<HfPart> out = r.parts;
    for (auto& p : out) p.name = m.format(p.name);
    if (out.empty())
      throw Error(cat("HfNameMap: rule '", r.model_pattern, "' matches '", model_name,
                      "' but lists no HF tensor. Give the rule at least one part."));
    return out;
  }
  return {HfPart{model_name}};
}

namespace detail::hf {

std::pair<int64_t, int64_t> owned_range(const FullyShardedModel& m, const ParamSlot& s) {
  if (m.replica_group() && m.replica_group()->rank() != 0) return {s.lo, s.lo};
  if (m.options().strategy == ShardingStrategy::NO_SHARD) {
    const auto r = shard::even_range(s.numel, m.comm()->rank(), m.comm()->world_size());
    return {r.lo, r.hi};
  }
  return {s.lo, s.hi};
}

std::string join_names(const std::vector<std::string>& v, size_t most) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < most; ++i) s += (i ? "; " : "") + v[i];
  if (v.size() > most) s += cat("; and ", v.size() - most, " more");
  return s;
}

}  // namespace detail::hf

namespace {

using detail::EngineAccess;
using detail::ParamSlot;

bool loadable_dtype(torch::ScalarType t) {
  return t == torch::kFloat32 || t == torch::kBFloat16 || t == torch::kFloat16 || t == torch::kFloat64;
}

bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

void check_config(const ckpt::HfDirectory& hfd, const nlohmann::json& expect) {
  if (expect.is_null()) return;
  FSDP_USER_CHECK(expect.is_object(), "HfLoadOptions::expect_config must be a JSON object of config.json keys, found ",
                  expect.dump());
  if (hfd.config.is_null())
    throw Error(cat("HF checkpoint '", hfd.dir, "' has no config.json, but this model expects one with ", expect.dump(),
                    ". Copy config.json into the directory, or load without HfLoadOptions::expect_config."));
  std::vector<std::string> diffs;
  for (auto it = expect.begin(); it != expect.end(); ++it) {
    if (!hfd.config.contains(it.key()))
      diffs.push_back(cat(it.key(), ": absent, this model has ", it.value().dump()));
    else if (!same_value(hfd.config[it.key()], it.value()))
      diffs.push_back(cat(it.key(), " = ", hfd.config[it.key()].dump(), ", this model has ", it.value().dump()));
  }
  if (!diffs.empty())
    throw Error(cat("HF checkpoint '", hfd.dir, "': its config.json does not describe this model (", diffs.size(),
                    " difference", diffs.size() == 1 ? "" : "s", "): ", hf::join_names(diffs, 12),
                    ". Nothing was loaded. Build the model from that config.json, or load the checkpoint of this "
                    "model."));
}

bool ignored(const std::vector<std::regex>& ignore, const std::string& name) {
  for (auto& re : ignore)
    if (std::regex_match(name, re)) return true;
  return false;
}

// Every slot's pieces, checked against the directory; every problem listed
// in one error.
std::vector<std::vector<hf::Piece>> resolve(const std::vector<const ParamSlot*>& slots, const ckpt::HfDirectory& hfd,
                                            const HfLoadOptions& opts) {
  std::map<std::string, std::vector<std::string>> problems;
  std::set<std::string> used;
  std::vector<std::vector<hf::Piece>> out(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const ParamSlot& s = *slots[i];
    const auto parts = opts.names.parts_of(s.name);
    // Tied names share the canonical parameter's values: their HF tensors,
    // when the checkpoint has them, are known but not read.
    for (auto& a : s.tied_names)
      for (auto& p : opts.names.parts_of(a)) used.insert(p.name);
    int64_t dst = 0;
    bool ok = true, shape_ok = true;  // every part found and floating; shapes fit
    std::string got;
    for (auto& p : parts) {
      used.insert(p.name);
      auto it = hfd.tensors.find(p.name);
      if (it == hfd.tensors.end()) {
        problems["missing tensors (the model needs them, the checkpoint has none)"].push_back(
            p.name == s.name ? cat("'", s.name, "'") : cat("'", p.name, "' (for '", s.name, "')"));
        ok = false;
        continue;
      }
      const ckpt::HfTensor& t = it->second;
      got += (got.empty() ? "" : " + ") + cat("'", t.name, "' ", ckpt::shape_str(t.shape));
      if (!loadable_dtype(t.dtype)) {
        problems["tensors of a dtype that is not floating point (F32, BF16, F16, F64 load)"].push_back(
            cat("'", t.name, "' is ", ckpt::safetensors_dtype_name(t.dtype)));
        ok = false;
        continue;
      }
      if (p.transpose) {
        if (parts.size() != 1 || p.row_begin != 0 || p.rows != -1 || t.shape.size() != 2 || s.shape.size() != 2 ||
            t.shape[0] != s.shape[1] || t.shape[1] != s.shape[0]) {
          shape_ok = false;
          got += " (transposed)";
        } else {
          out[i].push_back({t.name, true, 0, 0, s.shape[0]});
          dst = s.shape[0];
        }
        continue;
      }
      const std::vector<int64_t> t_tail(t.shape.size() > 1 ? t.shape.begin() + 1 : t.shape.end(), t.shape.end());
      const std::vector<int64_t> s_tail(s.shape.size() > 1 ? s.shape.begin() + 1 : s.shape.end(), s.shape.end());
      const int64_t t_rows = hf::rows_of(t.shape);
      const int64_t rows = p.rows < 0 ? t_rows - p.row_begin : p.rows;
      if (t_tail != s_tail || p.row_begin < 0 || rows < 0 || p.row_begin + rows > t_rows ||
          (t.shape.empty() != s.shape.empty() && hf::inner_of(t.shape) != 1)) {
        shape_ok = false;
        if (p.row_begin || p.rows >= 0) got += cat(" rows [", p.row_begin, ", ", p.row_begin + rows, ")");
        continue;
      }
      out[i].push_back({t.name, false, p.row_begin, dst, rows});
      dst += rows;
    }
    if (ok && shape_ok && dst != hf::rows_of(s.shape)) shape_ok = false;
    if (ok && !shape_ok)
      problems["tensors of another shape"].push_back(
          cat("'", s.name, "': the model has ", ckpt::shape_str(s.shape), ", the checkpoint ", got));
  }
  std::vector<std::regex> ignore;
  for (auto& pat : opts.names.ignore) {
    try {
      ignore.emplace_back(pat, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(cat("HfNameMap::ignore: '", pat, "' is not a valid regular expression (", e.what(), ")."));
    }
  }
  if (opts.strict)
    for (auto& [name, t] : hfd.tensors)
      if (!used.count(name) && !ignored(ignore, name))
        problems["unexpected tensors (in the checkpoint, not in this model)"].push_back(cat("'", name, "'"));
  if (!problems.empty()) {
    std::string text;
    for (auto& [kind, v] : problems) text += cat("\n  ", kind, " (", v.size(), "): ", hf::join_names(v));
    throw Error(cat("HF checkpoint '", hfd.dir, "' does not fit this model:", text,
                    "\nNothing was loaded. Load the checkpoint this model was built for (its config.json), or map "
                    "the names (HfLoadOptions::names: rules, transposes, fused projections); "
                    "HfLoadOptions::strict = false ignores unexpected tensors."));
  }
  return out;
}

// This load's readers of the directory's files (opened on first use), and
// the one buffer every read goes through.
class Files {
 public:
  Files(const ckpt::HfDirectory& hfd, bool direct) : hfd_(hfd), direct_(direct), open_(hfd.files.size()) {}

  ckpt::detail::RangeReader& of(int file) {
    auto& r = open_[static_cast<size_t>(file)];
    if (!r) {
      const auto& f = *hfd_.files[static_cast<size_t>(file)].reader;
      r = std::make_unique<ckpt::detail::RangeReader>(f.fd(), f.path(), f.file_size(), direct_);
    }
    return *r;
  }
  int64_t bytes_read() const {
    int64_t n = 0;
    for (auto& r : open_) n += r ? r->bytes_read() : 0;
    return n;
  }
  int64_t direct_reads() const {
    int64_t n = 0;
    for (auto& r : open_) n += r ? r->direct_reads() : 0;
    return n;
  }
  ckpt::detail::AlignedBuffer buf;

 private:
  const ckpt::HfDirectory& hfd_;
  bool direct_;
  std::vector<std::unique_ptr<ckpt::detail::RangeReader>> open_;
};

// Bytes [offset, offset + n) of a file into dst, in reads of at most
// buffer_bytes.
void read_bytes(Files& files, int file, int64_t offset, int64_t n, void* dst, int64_t buffer_bytes) {
  auto& r = files.of(file);
  for (int64_t done = 0; done < n;) {
    const int64_t k = std::min(buffer_bytes, n - done);
    r.read_to(offset + done, k, static_cast<char*>(dst) + done, files.buf);
    done += k;
  }
}

// The pages wholly inside [p, p + n) made present and writable in one call
// (MADV_POPULATE_WRITE, Linux 5.14) instead of one fault per 4 KiB as they
// are first written: a load's masters are fresh memory, and on 2 cores at
// N = 4 this made load_hf 7 % faster (bench/README.md). Pages only partly
// inside may be another rank's (host-shared shards): never touched. Where
// the kernel lacks the advice nothing happens; the writes fault as before.
void populate(float* p, int64_t n) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t b = reinterpret_cast<uintptr_t>(p + n) / page * page;
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE);
}

// Reads elements [first, first + n) of HF tensor t (flat) into dst (fp32,
// n elements), converting a buffer's worth at a time.
void read_elements(Files& files, const ckpt::HfTensor& t, int64_t first, int64_t n, float* dst,
                   int64_t buffer_bytes) {
  const int64_t es = static_cast<int64_t>(c10::elementSize(t.dtype));
  auto& r = files.of(t.file);
  const int64_t per = std::max<int64_t>(1, buffer_bytes / es);
  for (int64_t done = 0; done < n;) {
    const int64_t k = std::min(per, n - done);
    populate(dst + done, k);
    if (t.dtype == torch::kFloat32) {
      r.read_to(t.offset + (first + done) * es, k * es, dst + done, files.buf);
    } else {
      const char* src = r.read(t.offset + (first + done) * es, k * es, files.buf);
      torch::from_blob(dst + done, {k}, torch::kFloat32)
          .copy_(torch::from_blob(const_cast<char*>(src), {k}, t.dtype));
    }
    done += k;
  }
}

// Elements [lo, hi) of slot s into dst (fp32, hi - lo elements).
void read_slot(const ckpt::HfDirectory& hfd, Files& files, const ParamSlot& s, const std::vector<hf::Piece>& pieces,
               int64_t lo, int64_t hi, float* dst, int64_t buffer_bytes) {
  const int64_t inner = hf::inner_of(s.shape);
  for (auto& p : pieces) {
    const ckpt::HfTensor& t = hfd.tensors.at(p.hf_name);
    if (p.transpose) {
      // P [R, C] = T^T, T [C, R]: P's rows are T's columns. The slice's rows
      // in blocks of about buffer_bytes (at least one row): a block's rows
      // [r, rb) are columns [r, rb) of T, one read per row of T (one for
      // all when the block is every column), then transposed into dst.
      const int64_t R = s.shape[0], C = s.shape[1];
      const int64_t es = static_cast<int64_t>(c10::elementSize(t.dtype));
      const int64_t block = std::max<int64_t>(1, buffer_bytes / (C * es));
      for (int64_t r = lo / C; r * C < hi; r += block) {
        const int64_t rb = std::min((hi - 1) / C + 1, r + block), k = rb - r;
        auto cols = torch::empty({C, k}, t.dtype);
        char* base = static_cast<char*>(cols.data_ptr());
        if (k == R) {
          read_bytes(files, t.file, t.offset, C * R * es, base, buffer_bytes);
        } else {
          for (int64_t c = 0; c < C; ++c)
            read_bytes(files, t.file, t.offset + (c * R + r) * es, k * es, base + c * k * es, buffer_bytes);
        }
        const int64_t a = std::max(lo, r * C), b = std::min(hi, rb * C);
        torch::from_blob(dst + (a - lo), {b - a}, torch::kFloat32)
            .copy_(cols.t().reshape({-1}).narrow(0, a - r * C, b - a));
      }
      continue;
    }
    const int64_t pa = p.dst_row * inner, pb = (p.dst_row + p.rows) * inner;
    const int64_t a = std::max(lo, pa), b = std::min(hi, pb);
    if (a >= b) continue;
    read_elements(files, t, p.src_row * inner + (a - pa), b - a, dst + (a - lo), buffer_bytes);
  }
}

// What each rank read, as words the ranks compare: the index's CRC32C,
// config.json's, the number of files and the CRC32C of their headers
// together.
std::vector<uint32_t> digest_words(const ckpt::HfDirectory& hfd) {
  uint32_t headers = 0;
  for (auto& f : hfd.files) headers = headers * 0x9E3779B1u + f.header_crc32c + 1;
  return {hfd.index_crc32c, hfd.config_crc32c, static_cast<uint32_t>(hfd.files.size()), headers};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += cat(s.empty() ? "" : ", ", r);
  return s;
}

// "rank(s) 0, 2 read CRC32C 1a2b3c4d; rank(s) 1 read 5e6f7a8b": the ranks by
// the value of word `w` they read.
std::string who_read_what(const std::vector<std::vector<uint32_t>>& by_rank, size_t w) {
  std::map<uint32_t, std::vector<int>> groups;
  for (size_t r = 0; r < by_rank.size(); ++r) groups[by_rank[r][w]].push_back(static_cast<int>(r));
  std::vector<std::pair<int, uint32_t>> order;  // by the first rank of each
  for (auto& [v, ranks] : groups) order.push_back({ranks.front(), v});
  std::sort(order.begin(), order.end());
  std::string s;
  for (auto& [first, v] : order) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", v);
    s += cat(s.empty() ? "" : "; ", "rank(s) ", rank_list(groups[v]), " read CRC32C ", hex);
  }
  return s;
}

bool all_equal(const std::vector<std::vector<uint32_t>>& by_rank, size_t w) {
  for (auto& row : by_rank)
    if (row[w] != by_rank.front()[w]) return false;
  return true;
}

// Every rank read the same index, config.json and headers, or every rank
// throws the same message naming what differs. Collective only where the
// index is the same and the headers are not (the same files on every rank
// then): a second exchange of each file's digest names the file.
void agree_on_files(Communicator& comm, const ckpt::HfDirectory& hfd,
                    const std::vector<std::vector<uint32_t>>& by_rank) {
  std::vector<std::string> differ;
  if (!all_equal(by_rank, 0))
    differ.push_back(cat("the index model.safetensors.index.json (", who_read_what(by_rank, 0), ")"));
  if (!all_equal(by_rank, 1)) differ.push_back(cat("config.json (", who_read_what(by_rank, 1), ")"));
  if (all_equal(by_rank, 0) && all_equal(by_rank, 2) && !all_equal(by_rank, 3)) {
    std::vector<uint32_t> mine;
    for (auto& f : hfd.files) mine.push_back(f.header_crc32c);
    const auto files = comm::fail_together_sharing(comm, "", mine, {"load_hf file digests"},
                                                   [](const std::vector<int>&) { return std::string(); });
    for (size_t i = 0; i < hfd.files.size(); ++i)
      if (!all_equal(files, i))
        differ.push_back(cat("the header of '", hfd.files[i].name, "' (", who_read_what(files, i), ")"));
  } else if (!all_equal(by_rank, 3)) {
    differ.push_back("the headers of the files");
  }
  if (differ.empty()) return;
  throw Error(cat("loading the HF checkpoint '", hfd.dir, "': the ranks did not read the same files: ",
                  hf::join_names(differ), ". The export changed while the ranks were reading it (it was written or "
                  "replaced meanwhile), or the ranks see different files at this path (a copy per node that "
                  "differs). Nothing was loaded. Load again once the export is complete, with every rank seeing "
                  "the same files."));
}

}  // namespace

HfLoadResult load_hf(FullyShardedModel& model, const std::string& dir, const HfLoadOptions& opts) {
  model.wait_pending();
  wait_for_snapshot(model);  // a background save's snapshot is copied before the shards change
  trace::Span span("checkpoint_load_hf", "ckpt");
  Communicator& comm = *model.comm();
  const auto slots = EngineAccess(model).slots();
  HfLoadResult res;
  res.dir = dir;

  // Phase 1: everything that can be checked, on every rank, then agreed.
  ckpt::HfDirectory hfd;
  std::vector<std::vector<hf::Piece>> plan;
  std::string err;
  try {
    FSDP_USER_CHECK(opts.buffer_bytes >= 1024, "HfLoadOptions::buffer_bytes must be at least 1024, found ",
                    opts.buffer_bytes);
    hfd = ckpt::read_hf_directory(dir);
    check_config(hfd, opts.expect_config);
    plan = resolve(slots, hfd, opts);
  } catch (const std::exception& e) {
    err = e.what();
  }
  // The same all_reduce carries each rank's digests of what it read: every
  // rank loads the same export, or all fail naming what differs.
  const auto digests = comm::fail_together_sharing(
      comm, err, digest_words(hfd), {"load_hf check"}, [&](const std::vector<int>& ranks) {
        return cat("loading the HF checkpoint '", dir, "' failed on rank(s) ", rank_list(ranks),
                   " (see their messages); nothing was loaded.");
      });
  agree_on_files(comm, hfd, digests);
  res.files = static_cast<int>(hfd.files.size());
  res.tensors = static_cast<int>(hfd.tensors.size());
  res.header_bytes = hfd.header_bytes_read;
  res.config = hfd.config;

  // Phase 2: this rank's slices, straight into the shards (or a copy).
  std::vector<torch::Tensor> staged(slots.size());
  Files files(hfd, opts.direct_io);
  try {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < slots.size(); ++i) {
      const ParamSlot& s = *slots[i];
      if (s.hi <= s.lo) continue;
      // A device's shard (or a staged load) reads into host memory first.
      const torch::Tensor shard = s.shard_view.detach();
      const bool direct = !opts.staged && shard.is_cpu();
      torch::Tensor dst = direct ? shard : torch::empty({s.hi - s.lo}, torch::kFloat32);
      FSDP_CHECK(dst.is_contiguous() && dst.scalar_type() == torch::kFloat32, "shard of ", s.name);
      read_slot(hfd, files, s, plan[i], s.lo, s.hi, dst.data_ptr<float>(), opts.buffer_bytes);
      res.elements += s.hi - s.lo;
      if (opts.staged) staged[i] = dst;
      else if (!direct) shard.copy_(dst);
    }
  } catch (const std::exception& e) {
    err = cat("rank ", comm.rank(), ": ", e.what());
  }
  const std::string consequence =
      opts.staged ? "nothing was loaded"
                  : "the shards of this model are partly loaded: load the checkpoint again before using the model";
  comm::fail_together(comm, err.empty() ? err : err + "; " + consequence, {"load_hf read"},
                      [&](const std::vector<int>&) {
                        return cat("reading the HF checkpoint '", dir, "' failed on another rank; ", consequence, ".");
                      });
  if (opts.staged) {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < slots.size(); ++i)
      if (staged[i].defined()) slots[i]->shard_view.detach().copy_(staged[i]);
  }
  res.bytes_read = files.bytes_read() + hfd.header_bytes_read;
  res.direct_reads = files.direct_reads();
  return res;
}

}  // namespace fsdp
