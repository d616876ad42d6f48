// fsdp-cpp checkpoints: metadata.json (see metadata.h). Parsing trusts nothing:
// every field is type-checked and every range checked before use.
#include "checkpoint/metadata.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "fsdp/checkpoint.h"

namespace fsdp::ckpt::detail {
using fsdp::detail::cat;
using json = nlohmann::json;

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

bool parse_step_dir_name(const std::string& name, int64_t* step) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

std::string rank_file_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, world);
  return buf;
}
std::string rank_index_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d.index.json", rank);
  return buf;
}
std::string piece_key(const std::string& section, const std::string& name) { return section + "/" + name; }

std::string per_rank_prefix(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d/", rank);
  return b;
}

int64_t TensorMeta::numel() const { return checked_numel(shape); }

std::string model_fingerprint(const std::map<std::string, std::vector<int64_t>>& shapes) {
  // FNV-1a 64 over "name:d0,d1,...;" in name order.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  for (auto& [name, shape] : shapes) {
    mix(name);
    mix(":");
    for (int64_t d : shape) mix(std::to_string(d) + ",");
    mix(";");
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ---------------------------------------------------------------------------
// JSON field helpers: every access checks presence and type.
namespace {
// More ranks than any job has; keeps every rank / world_size / file index an
// int without wrapping (a value of 2^32 + 1 must not read as 1).
constexpr int64_t kMaxWorld = int64_t(1) << 20;

struct Ctx {
  const std::string& path;
  [[noreturn]] void bad(const std::string& what) const {
    throw Error(cat("checkpoint metadata '", path, "': ", what,
                    ". The file is damaged or was not written by fsdp-cpp; use another checkpoint "
                    "(`fsdp ckpt verify` checks one)."));
  }
  const json& field(const json& o, const char* k, const std::string& where) const {
    if (!o.is_object() || !o.contains(k)) bad(cat(where, ": missing field \"", k, "\""));
    return o[k];
  }
  int64_t integer(const json& o, const char* k, const std::string& where) const {
    const json& v = field(o, k, where);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
      bad(cat(where, ": field \"", k, "\" expected a 64-bit signed integer, found ", v.dump()));
    return v.get<int64_t>();
  }
  // An integer that must lie in [lo, hi] (an int field: hi <= INT_MAX), so a
  // cast cannot wrap: 2^32 + 1 is not rank 1.
  int64_t ranged(const json& o, const char* k, const std::string& where, int64_t lo, int64_t hi) const {
    const json& v = field(o, k, where);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
      bad(cat(where, ": field \"", k, "\" expected an integer in [", lo, ", ", hi, "], found ", v.dump()));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      bad(cat(where, ": field \"", k, "\" expected an integer in [", lo, ", ", hi, "], found ", v.dump()));
    return x;
  }
  std::string str(const json& o, const char* k, const std::string& where) const {
    const json& v = field(o, k, where);
    if (!v.is_string()) bad(cat(where, ": field \"", k, "\" expected a string, found ", v.dump()));
    return v.get<std::string>();
  }
  std::vector<int64_t> shape(const json& o, const std::string& where) const {
    const json& v = field(o, "shape", where);
    if (!v.is_array()) bad(cat(where, ": \"shape\" expected an array"));
    std::vector<int64_t> s;
    for (auto& d : v) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad(cat(where, ": invalid shape ", v.dump()));
      s.push_back(d.get<int64_t>());
    }
    if (checked_numel(s) < 0) bad(cat(where, ": shape ", v.dump(), " is too large"));
    return s;
  }
  torch::ScalarType dtype(const json& o, const std::string& where) const {
    std::string n = str(o, "dtype", where);
    torch::ScalarType t;
    if (!dtype_from_safetensors(n, &t))
      bad(cat(where, ": dtype \"", n, "\" unknown; expected one of ", known_dtype_names()));
    return t;
  }
  uint32_t crc(const json& v, const std::string& where) const {
    uint32_t c;
    if (!v.is_string() || !parse_crc32c_hex(v.get<std::string>(), &c))
      bad(cat(where, ": expected a CRC32C as 8 hex digits, found ", v.dump()));
    return c;
  }
};

json file_to_json(const FileMeta& f) {
  json chunks = json::array();
  for (uint32_t c : f.chunk_crc32c) chunks.push_back(crc32c_hex(c));
  return {{"name", f.name},   {"rank", f.rank},         {"bytes", f.bytes},
          {"crc32c", crc32c_hex(f.crc32c)}, {"chunk_bytes", f.chunk_bytes}, {"chunk_crc32c", chunks}};
}

FileMeta file_from_json(const Ctx& c, const json& j, const std::string& where) {
  FileMeta f;
  f.name = c.str(j, "name", where);
  if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.')
    c.bad(cat(where, ": file name \"", f.name, "\" must be a plain name inside the checkpoint directory"));
  f.rank = static_cast<int>(c.ranged(j, "rank", where, 0, kMaxWorld - 1));
  f.bytes = c.integer(j, "bytes", where);
  f.crc32c = c.crc(c.field(j, "crc32c", where), where);
  f.chunk_bytes = c.integer(j, "chunk_bytes", where);
  if (f.bytes < 0 || f.bytes > (int64_t(1) << 62) || f.chunk_bytes <= 0 || f.chunk_bytes > (int64_t(1) << 62))
    c.bad(cat(where, ": bytes/chunk_bytes out of range"));
  const json& ch = c.field(j, "chunk_crc32c", where);
  if (!ch.is_array()) c.bad(cat(where, ": \"chunk_crc32c\" expected an array"));
  int64_t want = (f.bytes + f.chunk_bytes - 1) / f.chunk_bytes;
  if (static_cast<int64_t>(ch.size()) != want)
    c.bad(cat(where, ": expected ", want, " chunk checksums for ", f.bytes, " bytes, found ", ch.size()));
  for (auto& v : ch) f.chunk_crc32c.push_back(c.crc(v, where));
  return f;
}
}  // namespace

// ---------------------------------------------------------------------------
// RankIndex

json RankIndex::to_json() const {
  json es = json::array();
  for (auto& e : entries)
    es.push_back({{"section", e.section}, {"name", e.name}, {"key", e.key}, {"shape", e.shape},
                  {"dtype", safetensors_dtype_name(e.dtype)}, {"lo", e.lo}, {"hi", e.hi}});
  return {{"file", file_to_json(file)}, {"entries", es}};
}

RankIndex RankIndex::from_json(const std::string& path, const json& j) {
  Ctx c{path};
  RankIndex r;
  r.file = file_from_json(c, c.field(j, "file", "index"), "index file");
  const json& es = c.field(j, "entries", "index");
  if (!es.is_array()) c.bad("\"entries\" expected an array");
  for (auto& e : es) {
    Entry x;
    x.section = c.str(e, "section", "entry");
    x.name = c.str(e, "name", "entry");
    x.key = c.str(e, "key", "entry " + x.name);
    x.shape = c.shape(e, "entry " + x.name);
    x.dtype = c.dtype(e, "entry " + x.name);
    x.lo = c.integer(e, "lo", "entry " + x.name);
    x.hi = c.integer(e, "hi", "entry " + x.name);
    r.entries.push_back(std::move(x));
  }
  return r;
}

// ---------------------------------------------------------------------------
// Metadata

std::string Metadata::dump() const {
  json files_j = json::array();
  for (auto& f : files) files_j.push_back(file_to_json(f));
  json secs = json::object();
  for (auto& [sec, tensors] : sections) {
    json ts = json::object();
    for (auto& [name, t] : tensors) {
      json ps = json::array();
      for (auto& p : t.pieces) ps.push_back({{"file", p.file}, {"key", p.key}, {"lo", p.lo}, {"hi", p.hi}});
      ts[name] = {{"shape", t.shape}, {"dtype", safetensors_dtype_name(t.dtype)}, {"pieces", ps}};
    }
    secs[sec] = ts;
  }
  json j = {{"format", kFormatName},    {"format_version", format_version}, {"step", step},
            {"world_size", world_size}, {"strategy", strategy},             {"fingerprint", fingerprint},
            {"train_state", train_state}, {"files", files_j},               {"tensors", secs}};
  std::string body = j.dump();
  j["checksum"] = crc32c_hex(crc32c(body.data(), body.size()));
  return j.dump(1) + "\n";
}

Metadata Metadata::parse(const std::string& path, const std::string& text) {
  Ctx c{path};
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) c.bad("not a valid JSON object (damaged or truncated)");
  if (!j.contains("format") || j["format"] != kFormatName)
    c.bad(cat("expected \"format\": \"", kFormatName, "\", found ", j.contains("format") ? j["format"].dump() : "none"));
  Metadata m;
  m.format_version = static_cast<int>(c.ranged(j, "format_version", "top level", 0, INT32_MAX));
  if (m.format_version != kFormatVersion)
    throw Error(cat("checkpoint metadata '", path, "': format version ", m.format_version,
                    " is not supported; this fsdp-cpp reads version ", kFormatVersion,
                    ". Load it with the fsdp-cpp that wrote it and convert it to a full safetensors file "
                    "(`fsdp ckpt convert DIR --to model.safetensors`)."));
  // Checksum before trusting any value: a flipped digit in a shape still parses.
  uint32_t want = c.crc(c.field(j, "checksum", "top level"), "checksum");
  json body = j;
  body.erase("checksum");
  std::string b = body.dump();
  uint32_t got = crc32c(b.data(), b.size());
  if (got != want)
    throw Error(cat("checkpoint metadata '", path, "': checksum mismatch (expected ", crc32c_hex(want), ", found ",
                    crc32c_hex(got), "): the file was modified or damaged. Use another checkpoint."));
  m.step = c.ranged(j, "step", "top level", 0, INT64_MAX);
  m.world_size = static_cast<int>(c.ranged(j, "world_size", "top level", 1, kMaxWorld));
  m.strategy = c.str(j, "strategy", "top level");
  m.fingerprint = c.str(j, "fingerprint", "top level");
  m.train_state = c.field(j, "train_state", "top level");
  const json& fs = c.field(j, "files", "top level");
  if (!fs.is_array()) c.bad("\"files\" expected an array");
  for (size_t i = 0; i < fs.size(); ++i) m.files.push_back(file_from_json(c, fs[i], cat("files[", i, "]")));
  if (static_cast<int64_t>(m.files.size()) != m.world_size)
    c.bad(cat("world_size ", m.world_size, " expected to equal the number of files, found ", m.files.size()));
  for (size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].rank >= m.world_size)
      c.bad(cat("files[", i, "]: field \"rank\" expected an integer in [0, ", m.world_size - 1, "], found ",
                m.files[i].rank));
  const json& secs = c.field(j, "tensors", "top level");
  if (!secs.is_object()) c.bad("\"tensors\" expected an object");
  for (auto it = secs.begin(); it != secs.end(); ++it) {
    if (!it.value().is_object()) c.bad(cat("section \"", it.key(), "\" expected an object"));
    auto& out = m.sections[it.key()];
    for (auto t = it.value().begin(); t != it.value().end(); ++t) {
      std::string where = cat("tensor '", t.key(), "'");
      TensorMeta tm;
      tm.shape = c.shape(t.value(), where);
      tm.dtype = c.dtype(t.value(), where);
      const json& ps = c.field(t.value(), "pieces", where);
      if (!ps.is_array()) c.bad(cat(where, ": \"pieces\" expected an array"));
      for (auto& p : ps) {
        PieceMeta pm;
        pm.file = static_cast<int>(c.ranged(p, "file", where, 0, static_cast<int64_t>(m.files.size()) - 1));
        pm.key = c.str(p, "key", where);
        pm.lo = c.integer(p, "lo", where);
        pm.hi = c.integer(p, "hi", where);
        if (pm.file < 0 || pm.file >= static_cast<int>(m.files.size()) || pm.lo < 0 || pm.lo > pm.hi ||
            pm.hi > tm.numel())
          c.bad(cat(where, ": piece (file ", pm.file, ", [", pm.lo, ", ", pm.hi, ")) out of range for ",
                    tm.numel(), " elements and ", m.files.size(), " files"));
        tm.pieces.push_back(std::move(pm));
      }
      std::sort(tm.pieces.begin(), tm.pieces.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
      out[t.key()] = std::move(tm);
    }
  }
  return m;
}

Metadata Metadata::load(const std::string& dir) {
  std::string p = join_path(dir, kMetadataFile);
  if (!path_exists(p))
    throw Error(cat("'", dir, "' has no ", kMetadataFile, ": it is not a complete fsdp-cpp checkpoint "
                    "(a save interrupted before its end leaves only a .tmp-* directory). Use the checkpoint "
                    "root (its `latest` pointer) or another step directory."));
  return parse(p, read_small_file(p, kMaxMetadataBytes));
}

Metadata merge_rank_indexes(const std::vector<RankIndex>& ranks, int64_t step, const std::string& strategy,
                            const json& train_state) {
  Metadata m;
  m.step = step;
  m.world_size = static_cast<int>(ranks.size());
  m.strategy = strategy;
  m.train_state = train_state;
  std::map<std::string, std::vector<int64_t>> model_shapes;
  std::map<std::string, std::map<std::string, int>> first_rank;  // who declared a tensor first
  for (size_t r = 0; r < ranks.size(); ++r) {
    m.files.push_back(ranks[r].file);
    for (auto& e : ranks[r].entries) {
      auto& sec = m.sections[e.section];
      auto it = sec.find(e.name);
      if (it == sec.end()) {
        TensorMeta t;
        t.shape = e.shape;
        t.dtype = e.dtype;
        it = sec.emplace(e.name, std::move(t)).first;
        first_rank[e.section][e.name] = static_cast<int>(r);
      } else if (it->second.shape != e.shape || it->second.dtype != e.dtype) {
        throw Error(cat("saving a checkpoint: ranks disagree on ", e.section, " tensor '", e.name, "': rank ",
                        first_rank[e.section][e.name], " has ", shape_str(it->second.shape), " ",
                        c10::toString(it->second.dtype), ", rank ", r, " has ", shape_str(e.shape), " ",
                        c10::toString(e.dtype), ". Every rank must describe the same model."));
      }
      if (e.hi > e.lo) it->second.pieces.push_back({static_cast<int>(r), e.key, e.lo, e.hi});
    }
  }
  // Every element must be held by some rank, or the checkpoint cannot be loaded.
  for (auto& [sec, tensors] : m.sections)
    for (auto& [name, t] : tensors) {
      std::sort(t.pieces.begin(), t.pieces.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
      int64_t covered = 0;
      for (auto& p : t.pieces) {
        if (p.lo > covered) break;
        covered = std::max(covered, p.hi);
      }
      if (covered < t.numel())
        throw Error(cat("saving a checkpoint: ", sec, " tensor '", name, "' ", shape_str(t.shape), " has ",
                        t.numel(), " elements but elements from ", covered,
                        " on are held by no rank. The slices given to save_sharded must cover every tensor."));
      if (sec == kModel) model_shapes[name] = t.shape;
    }
  m.fingerprint = model_fingerprint(model_shapes);
  return m;
}

}  // namespace fsdp::ckpt::detail
