// fsdp-cpp checkpoints: Hugging Face directories (include/fsdp/hf.h) —
// reading and checking the index and every file's header, and verifying
// save_hf's checksums.
//
// Nothing in a directory is trusted: the index is bounded before it is read,
// every value in it must be of the type expected (or an error names the index
// and the key), save_hf's checksums are bounded (no size computed from them
// can overflow), its weight_map is checked for names given twice (JSON
// parsers keep the last silently), every file it names must exist and parse
// (SafetensorsReader bounds the header by the file size, so a truncated file
// fails here, before any tensor is read), and the index and the headers
// must agree tensor by tensor. All problems are collected and reported in
// one error, a few of each kind. The CRC32C of the index, of config.json and
// of each file's header are kept: load_hf's ranks compare them, so that all
// load the same export.
#include <algorithm>
#include <map>
#include <set>

#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "fsdp/hf.h"

namespace fsdp::ckpt {
using fsdp::detail::cat;
namespace d = detail;

namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr int64_t kMaxIndexBytes = int64_t(256) << 20;
constexpr int64_t kMaxChunkBytes = int64_t(1) << 30;  // a checksummed chunk: 1 GiB at most
constexpr int64_t kMaxFileBytes = int64_t(1) << 50;   // a file the index describes: 1 PiB at most

// Problems of one kind, listed a few at a time.
class Problems {
 public:
  void add(const std::string& kind, const std::string& what) { by_kind_[kind].push_back(what); }
  bool empty() const { return by_kind_.empty(); }
  std::string str() const {
    std::string out;
    for (auto& [kind, v] : by_kind_) {
      out += cat("\n  ", kind, " (", v.size(), "): ");
      for (size_t i = 0; i < v.size() && i < 6; ++i) out += (i ? "; " : "") + v[i];
      if (v.size() > 6) out += cat("; and ", v.size() - 6, " more");
    }
    return out;
  }

 private:
  std::map<std::string, std::vector<std::string>> by_kind_;
};

// A JSON object file; *text gets its bytes (for the ranks' digest).
nlohmann::json parse_json_file(const std::string& path, int64_t max_bytes, const char* what, std::string* text) {
  *text = d::read_small_file(path, max_bytes);
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw Error(cat(what, " '", path, "' is not a JSON object. The directory is damaged; copy it again."));
  return j;
}

// The weight_map's names given more than once (the parse below keeps one).
std::vector<std::string> duplicate_weight_map_keys(const std::string& text) {
  std::string top;
  std::map<std::string, int> seen;
  std::vector<std::string> dup;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key) {
      if (depth == 1) top = parsed.get<std::string>();
      else if (depth == 2 && top == "weight_map" && ++seen[parsed.get<std::string>()] == 2)
        dup.push_back(parsed.get<std::string>());
    }
    return true;
  };
  const auto parsed = nlohmann::json::parse(text, cb, /*allow_exceptions=*/false);
  (void)parsed;  // only the callback's findings matter
  return dup;
}

// A value of the index of the wrong type or out of bounds: the file, the
// key, what was expected and what was found.
[[noreturn]] void bad_index_value(const std::string& index_path, const std::string& key, const std::string& expected,
                                  const nlohmann::json* found) {
  throw Error(cat("HF index '", index_path, "': ", key, ": expected ", expected, ", found ",
                  found ? d::json_found(*found) : std::string("nothing (the key is absent)"),
                  ". The index is damaged; copy the directory again (or export it again)."));
}

// An integer of the index in [lo, hi].
int64_t bounded_int(const std::string& index_path, const std::string& key, const nlohmann::json& v, int64_t lo,
                    int64_t hi, const char* what) {
  bool ok = v.is_number_integer();
  if (ok && v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();  // JSON's non-negative integers
    ok = u <= uint64_t(hi) && (lo <= 0 || u >= uint64_t(lo));
  } else if (ok) {
    ok = v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  }
  if (!ok)
    bad_index_value(index_path, key, cat(what, ", an integer in [", lo, ", ", hi, "]"), &v);
  return v.get<int64_t>();
}

// save_hf's checksums (metadata.fsdp_checksums): every field of its type and
// within bounds (a chunk of 1 byte to 1 GiB, a file of at most 2^50 bytes,
// one checksum per chunk), so that nothing computed from them overflows.
void read_checksums(const std::string& index_path, const nlohmann::json& meta, HfDirectory& out) {
  if (!meta.is_object() || !meta.contains("fsdp_checksums")) return;
  const std::string root = "metadata.fsdp_checksums";
  const auto& c = meta["fsdp_checksums"];
  if (!c.is_object()) bad_index_value(index_path, root, "an object", &c);
  if (!c.contains("files") || !c["files"].is_object())
    bad_index_value(index_path, root + ".files", "an object (file name -> checksums)",
                    c.contains("files") ? &c["files"] : nullptr);
  if (!c.contains("chunk_bytes")) bad_index_value(index_path, root + ".chunk_bytes", "bytes per chunk", nullptr);
  const int64_t chunk =
      bounded_int(index_path, root + ".chunk_bytes", c["chunk_bytes"], 1, kMaxChunkBytes, "bytes per chunk");
  for (auto& f : out.files) {
    if (!c["files"].contains(f.name)) continue;
    const std::string key = cat(root, ".files[\"", f.name, "\"]");
    const auto& e = c["files"][f.name];
    if (!e.is_object()) bad_index_value(index_path, key, "an object (bytes, crc32c, chunk_crc32c)", &e);
    uint32_t crc = 0;
    if (!e.contains("crc32c") || !e["crc32c"].is_string() || !d::parse_crc32c_hex(e["crc32c"].get<std::string>(), &crc))
      bad_index_value(index_path, key + ".crc32c", "a CRC32C of 8 hex digits (a string)",
                      e.contains("crc32c") ? &e["crc32c"] : nullptr);
    if (!e.contains("bytes")) bad_index_value(index_path, key + ".bytes", "the file's size", nullptr);
    const int64_t bytes = bounded_int(index_path, key + ".bytes", e["bytes"], 0, kMaxFileBytes, "the file's size");
    if (!e.contains("chunk_crc32c") || !e["chunk_crc32c"].is_array())
      bad_index_value(index_path, key + ".chunk_crc32c", "an array of CRC32Cs (strings of 8 hex digits)",
                      e.contains("chunk_crc32c") ? &e["chunk_crc32c"] : nullptr);
    const auto& chunks = e["chunk_crc32c"];
    const int64_t n_chunks = bytes / chunk + (bytes % chunk != 0);  // no overflow: both bounded
    if (static_cast<int64_t>(chunks.size()) != n_chunks)
      bad_index_value(index_path, key + ".chunk_crc32c",
                      cat(n_chunks, " checksums (", bytes, " bytes in chunks of ", chunk, ")"), &chunks);
    f.has_checksums = true;
    f.crc32c = crc;
    f.chunk_bytes = chunk;
    f.bytes = bytes;
    for (size_t i = 0; i < chunks.size(); ++i) {
      uint32_t v = 0;
      if (!chunks[i].is_string() || !d::parse_crc32c_hex(chunks[i].get<std::string>(), &v))
        bad_index_value(index_path, cat(key, ".chunk_crc32c[", i, "]"), "a CRC32C of 8 hex digits (a string)",
                        &chunks[i]);
      f.chunk_crc32c.push_back(v);
    }
  }
}

}  // namespace

HfDirectory read_hf_directory(const std::string& dir) {
  HfDirectory out;
  out.dir = dir;
  if (!d::is_directory(dir))
    throw Error(cat("HF checkpoint '", dir, "' ", d::path_exists(dir) ? "is a file" : "does not exist",
                    "; expected a directory with model.safetensors.index.json (or model.safetensors) and config.json."));
  const std::string index_path = d::join_path(dir, kIndexFile);
  const std::string config_path = d::join_path(dir, kConfigFile);
  if (d::path_exists(config_path)) {
    std::string text;
    out.config = parse_json_file(config_path, 64 << 20, "config", &text);
    out.config_crc32c = d::crc32c(text.data(), text.size());
  }

  // File name -> the tensors the index puts there.
  std::map<std::string, std::vector<std::string>> by_file;
  Problems problems;
  if (d::path_exists(index_path)) {
    out.indexed = true;
    const std::string text = d::read_small_file(index_path, kMaxIndexBytes);
    out.index_crc32c = d::crc32c(text.data(), text.size());
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(cat("HF index '", index_path, "' is not a JSON object with a \"weight_map\" object (tensor name -> "
                      "file name). The directory is damaged or not a Hugging Face checkpoint; copy it again."));
    for (auto& n : duplicate_weight_map_keys(text))
      problems.add("tensors the index names twice", cat("'", n, "'"));
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string() || it.value().get<std::string>().empty() ||
          it.value().get<std::string>().find('/') != std::string::npos) {
        problems.add(cat("weight_map entries of ", kIndexFile,
                         " that are not a file name of this directory (expected a string without '/')"),
                     cat("'", it.key(), "': found ", d::json_found(it.value())));
        continue;
      }
      by_file[it.value().get<std::string>()].push_back(it.key());
    }
    if (j.contains("metadata")) {
      out.index_metadata = j["metadata"];
      if (!out.index_metadata.is_object())
        bad_index_value(index_path, "metadata", "an object (total_size, ...)", &out.index_metadata);
    }
  } else if (d::path_exists(d::join_path(dir, kSingleFile))) {
    by_file[kSingleFile];  // its header lists the tensors
  } else {
    throw Error(cat("HF checkpoint '", dir, "' has neither ", kIndexFile, " nor ", kSingleFile,
                    ". Expected a Hugging Face model directory (as save_pretrained writes it)."));
  }

  // Every file's header; the index and the headers must agree.
  std::map<std::string, std::string> first_file_of;  // tensor -> the first file holding it
  for (auto& [name, listed] : by_file) {
    const std::string path = d::join_path(dir, name);
    if (!d::path_exists(path)) {
      problems.add("files the index names that are missing",
                   cat("'", name, "' (", listed.size(), " tensor", listed.size() == 1 ? "" : "s", ", e.g. '",
                       listed.empty() ? std::string() : listed.front(), "')"));
      continue;
    }
    HfFile f;
    f.name = name;
    try {
      f.reader = std::make_shared<SafetensorsReader>(path);
    } catch (const std::exception& e) {
      problems.add("files that cannot be read (truncated or damaged)", e.what());
      continue;
    }
    f.bytes = f.reader->file_size();
    f.header_bytes = f.reader->header_bytes();
    f.header_crc32c = f.reader->header_crc32c();
    out.header_bytes_read += f.header_bytes;
    const int index = static_cast<int>(out.files.size());
    std::set<std::string> in_header;
    for (auto& e : f.reader->entries()) {
      in_header.insert(e.name);
      auto [it, fresh] = first_file_of.emplace(e.name, name);
      if (!fresh) {
        problems.add("tensors held by two files", cat("'", e.name, "' in '", it->second, "' and '", name, "'"));
        continue;
      }
      if (out.indexed && std::find(listed.begin(), listed.end(), e.name) == listed.end()) {
        problems.add("tensors in a file that the index does not put there", cat("'", e.name, "' in '", name, "'"));
        continue;
      }
      HfTensor t;
      t.name = e.name;
      t.file = index;
      t.dtype = e.dtype;
      t.shape = e.shape;
      t.offset = f.header_bytes + e.begin;
      t.bytes = e.end - e.begin;
      out.tensors[e.name] = t;
    }
    for (auto& n : listed)
      if (!in_header.count(n))
        problems.add("tensors the index names that their file does not hold", cat("'", n, "' (index: '", name, "')"));
    out.files.push_back(std::move(f));
  }
  if (!problems.empty())
    throw Error(cat("HF checkpoint '", dir, "' is not sound:", problems.str(),
                    "\nNothing was loaded. Copy the directory again (or export it again from where it came)."));
  read_checksums(index_path, out.index_metadata, out);
  return out;
}

std::vector<std::string> verify_hf_directory(const std::string& dir) {
  std::vector<std::string> faults;
  HfDirectory h;
  try {
    h = read_hf_directory(dir);
  } catch (const std::exception& e) {
    faults.push_back(e.what());
    return faults;
  }
  std::vector<char> buf(size_t(16) << 20);
  for (auto& f : h.files) {
    if (!f.has_checksums) continue;
    if (f.bytes != f.reader->file_size()) {
      faults.push_back(cat("'", f.name, "': the index records ", f.bytes, " bytes, the file has ",
                           f.reader->file_size()));
      continue;
    }
    const int64_t n_chunks = f.bytes / f.chunk_bytes + (f.bytes % f.chunk_bytes != 0);
    if (static_cast<int64_t>(f.chunk_crc32c.size()) != n_chunks) {
      faults.push_back(cat("'", f.name, "': the index records ", f.chunk_crc32c.size(), " chunk checksums, the file has ",
                           n_chunks, " chunks"));
      continue;
    }
    uint32_t whole = 0;
    int bad = 0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t a = c * f.chunk_bytes, n = std::min(f.chunk_bytes, f.bytes - a);
      if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
      f.reader->pread_exact(a, n, buf.data());
      whole = d::crc32c_extend(whole, buf.data(), static_cast<size_t>(n));
      const uint32_t got = d::crc32c(buf.data(), static_cast<size_t>(n));
      if (got != f.chunk_crc32c[static_cast<size_t>(c)] && ++bad <= 3)
        faults.push_back(cat("'", f.name, "': checksum mismatch in bytes [", a, ", ", a + n, ") (chunk ", c,
                             "): expected CRC32C ", d::crc32c_hex(f.chunk_crc32c[static_cast<size_t>(c)]), ", found ",
                             d::crc32c_hex(got)));
    }
    if (whole != f.crc32c)
      faults.push_back(cat("'", f.name, "': whole-file CRC32C expected ", d::crc32c_hex(f.crc32c), ", found ",
                           d::crc32c_hex(whole)));
  }
  return faults;
}

}  // namespace fsdp::ckpt
