// fsdp-cpp checkpoints: the safetensors writer and reader.
//
// Format (the reference implementation's rules): 8-byte little-endian header
// length N, N bytes of UTF-8 JSON, then the data section; every entry's
// data_offsets are relative to the data section. We pad the header with
// spaces to a multiple of 8 so the data section is 8-byte aligned, as the
// reference writer does. The reader trusts nothing in the file: N is bounded
// by the file size and kMaxHeaderBytes before anything is allocated, every
// entry is validated (dtype known, shape x dtype size == byte span, span
// inside the file, no overlaps) before any read.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "fsdp/checkpoint.h"
#include "common/shard_math.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

namespace fsdp::ckpt {
using fsdp::detail::cat;

namespace detail {
namespace {
struct DtypeName {
  const char* name;
  torch::ScalarType type;
};
const DtypeName kDtypes[] = {
    {"F32", torch::kFloat32}, {"BF16", torch::kBFloat16}, {"F16", torch::kFloat16},
    {"F64", torch::kFloat64}, {"I64", torch::kInt64},     {"I32", torch::kInt32},
    {"I16", torch::kInt16},   {"I8", torch::kInt8},       {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
};
}  // namespace

bool dtype_from_safetensors(const std::string& name, torch::ScalarType* out) {
  for (auto& d : kDtypes)
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  return false;
}
const char* known_dtype_names() { return "F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL"; }
int64_t element_size(torch::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

int64_t checked_numel(const std::vector<int64_t>& shape) {
  // At most 2^59 elements, so numel * element_size (<= 8) cannot overflow.
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > (int64_t(1) << 59) / d) return -1;
    n *= d;
  }
  return n;
}
std::string json_found(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  const std::string type = v.type_name();
  const bool vowel = type == "array" || type == "object";
  return cat(text, " (", v.is_null() ? "null" : cat(vowel ? "an " : "a ", type), ")");
}
}  // namespace detail

const char* safetensors_dtype_name(torch::ScalarType t) {
  for (auto& d : detail::kDtypes)
    if (d.type == t) return d.name;
  throw Error(cat("dtype ", c10::toString(t), " has no safetensors name; expected one of ",
                  detail::known_dtype_names(), ". Convert the tensor before saving."));
}

int64_t numel_of(const std::vector<int64_t>& shape) { return detail::checked_numel(shape); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::pair<int64_t, int64_t> shard_range(int64_t numel, int rank, int world) {
  FSDP_CHECK(world > 0 && rank >= 0 && rank < world, "rank ", rank, " world ", world);
  const auto r = shard::even_range(numel, rank, world);
  return {r.lo, r.hi};
}

// ---------------------------------------------------------------------------
// Writer

struct SafetensorsWriter::Impl {
  // Constant after construction.
  std::string path, tmp_path;
  std::vector<TensorSpec> specs;
  std::vector<int64_t> nbytes;  // per spec
  int64_t header_total = 0;     // 8 + padded JSON
  int64_t file_size = 0;        // when complete
  bool fsync = true;

  // Progress: the tensor being written and how many of its bytes are down.
  size_t cur = 0;
  int64_t cur_done = 0;
  detail::FileHandle file;
  bool finished = false;

  // Checksums of everything written so far.
  uint32_t crc = 0;
  std::vector<uint32_t> chunks;
  uint32_t chunk_crc = 0;
  int64_t chunk_fill = 0;

  void checksum(const char* p, int64_t n) {
    crc = detail::crc32c_extend(crc, p, n);
    while (n > 0) {
      int64_t k = std::min(n, kChunkBytes - chunk_fill);
      chunk_crc = detail::crc32c_extend(chunk_crc, p, k);
      chunk_fill += k;
      p += k;
      n -= k;
      if (chunk_fill == kChunkBytes) {
        chunks.push_back(chunk_crc);
        chunk_crc = 0;
        chunk_fill = 0;
      }
    }
  }
  void emit(const void* p, int64_t n) {
    checksum(static_cast<const char*>(p), n);
    file.write_all(p, static_cast<size_t>(n));
  }
  void skip_empty() {
    while (cur < specs.size() && cur_done == nbytes[cur]) {
      ++cur;
      cur_done = 0;
    }
  }
};

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> specs,
                                     std::map<std::string, std::string> metadata, bool fsync)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = std::move(path);
  m.tmp_path = m.path + ".tmp";
  m.specs = std::move(specs);
  m.fsync = fsync;
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (auto& s : m.specs) {
    if (s.name == "__metadata__" || header.contains(s.name))
      throw Error(cat("writing '", m.path, "': tensor name '", s.name,
                      "' is reserved or declared twice; every name must be unique."));
    int64_t n = detail::checked_numel(s.shape);
    if (n < 0) throw Error(cat("writing '", m.path, "': tensor '", s.name, "' has invalid shape ", shape_str(s.shape)));
    int64_t bytes = n * detail::element_size(s.dtype);
    header[s.name] = {{"dtype", safetensors_dtype_name(s.dtype)},
                      {"shape", s.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    m.nbytes.push_back(bytes);
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  m.header_total = 8 + static_cast<int64_t>(text.size());
  m.file_size = m.header_total + offset;

  detail::remove_file(m.tmp_path);  // a killed write's leftover
  m.file = detail::FileHandle::create(m.tmp_path);
  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  m.emit(len, 8);
  m.emit(text.data(), static_cast<int64_t>(text.size()));
  m.skip_empty();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (impl_ && !impl_->finished) {
    // Abandoned (an exception unwound past us): leave no partial file behind.
    impl_->file = detail::FileHandle();
    try {
      detail::remove_file(impl_->tmp_path);
    } catch (...) {  // a destructor reports nothing; the next write of this file removes it
    }
  }
}

void SafetensorsWriter::write(const torch::Tensor& part_in) {
  Impl& m = *impl_;
  FSDP_CHECK(!m.finished, "write after finish on ", m.path);
  if (part_in.numel() == 0) return;
  if (m.cur >= m.specs.size())
    throw Error(cat("writing '", m.path, "': got ", part_in.numel(),
                    " more elements after every declared tensor was complete."));
  const TensorSpec& s = m.specs[m.cur];
  if (part_in.scalar_type() != s.dtype)
    throw Error(cat("writing '", m.path, "': tensor '", s.name, "' declared ", c10::toString(s.dtype),
                    " but got ", c10::toString(part_in.scalar_type()), "; convert it first."));
  torch::Tensor part = part_in.detach().to(torch::kCPU).contiguous();
  int64_t bytes = part.numel() * detail::element_size(s.dtype);
  if (bytes > m.nbytes[m.cur] - m.cur_done)
    throw Error(cat("writing '", m.path, "': tensor '", s.name, "' declared ", shape_str(s.shape), " (",
                    m.nbytes[m.cur], " bytes) but got ", m.cur_done + bytes,
                    " bytes; parts must not cross tensors."));
  m.emit(part.data_ptr(), bytes);
  m.cur_done += bytes;
  m.skip_empty();
}

int64_t SafetensorsWriter::finish() {
  Impl& m = *impl_;
  if (m.cur < m.specs.size())
    throw Error(cat("writing '", m.path, "': tensor '", m.specs[m.cur].name, "' got ", m.cur_done, " of ",
                    m.nbytes[m.cur], " bytes before finish(); every declared tensor must be written."));
  if (m.chunk_fill > 0) {
    m.chunks.push_back(m.chunk_crc);
    m.chunk_fill = 0;
  }
  if (m.fsync) m.file.sync();
  m.file.close();
  detail::rename_path(m.tmp_path, m.path);
  if (m.fsync) detail::fsync_dir(detail::parent_dir(m.path));
  m.finished = true;
  return m.file_size;
}

uint32_t SafetensorsWriter::file_crc32c() const { return impl_->crc; }
const std::vector<uint32_t>& SafetensorsWriter::chunk_crc32c() const { return impl_->chunks; }

// ---------------------------------------------------------------------------
// Reader

struct SafetensorsReader::Impl {
  // Constant after construction.
  std::string path;
  detail::FileHandle file;
  int64_t size = 0;
  int64_t header_total = 0;
  uint32_t header_crc = 0;                // of the 8 + N bytes read
  std::vector<SafetensorsEntry> entries;  // sorted by begin
  std::map<std::string, size_t> index;
  std::map<std::string, std::string> metadata;

  [[noreturn]] void bad(const std::string& what) const {
    throw Error(cat("safetensors file '", path, "': ", what,
                    ". The file is damaged or not a safetensors file; use another copy "
                    "(`fsdp ckpt verify` checks a checkpoint)."));
  }
};

SafetensorsReader::SafetensorsReader(std::string path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = std::move(path);
  m.file = detail::FileHandle::open(m.path);
  m.size = m.file.size();
  if (m.size < 8) m.bad(cat("the file has ", m.size, " bytes; expected at least 8 (the header length)"));
  unsigned char len[8];
  m.file.pread_all(0, 8, len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > static_cast<uint64_t>(m.size - 8))
    m.bad(cat("the header length field says ", n, " bytes but only ", m.size - 8,
              " bytes follow it (truncated file?)"));
  if (n > static_cast<uint64_t>(kMaxHeaderBytes))
    m.bad(cat("the header length field says ", n, " bytes; expected at most ", kMaxHeaderBytes));
  if (n < 2) m.bad(cat("the header has ", n, " bytes; expected a JSON object"));
  std::string text(n, '\0');
  m.file.pread_all(8, n, text.data());
  m.header_crc = detail::crc32c_extend(detail::crc32c(len, 8), text.data(), text.size());
  m.header_total = 8 + static_cast<int64_t>(n);
  const int64_t data_size = m.size - m.header_total;

  nlohmann::json h = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) m.bad("the header is not a valid JSON object");
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object())
        m.bad(cat("\"__metadata__\": expected an object of strings, found ", detail::json_found(v)));
      for (auto mt = v.begin(); mt != v.end(); ++mt) {
        if (!mt.value().is_string())
          m.bad(cat("\"__metadata__\" entry '", mt.key(), "': expected a string, found ", detail::json_found(mt.value())));
        m.metadata[mt.key()] = mt.value().get<std::string>();
      }
      continue;
    }
    auto tbad = [&](const std::string& what) { m.bad(cat("tensor '", key, "': ", what)); };
    // A field of the wrong type: the key, what was expected, what is there.
    auto field_bad = [&](const char* field, const char* expected) {
      tbad(cat("field \"", field, "\": expected ", expected, ", found ",
               v.contains(field) ? detail::json_found(v[field]) : std::string("nothing (the field is absent)")));
    };
    if (!v.is_object()) tbad(cat("expected an object {\"dtype\", \"shape\", \"data_offsets\"}, found ", detail::json_found(v)));
    if (!v.contains("dtype") || !v["dtype"].is_string()) field_bad("dtype", "a string (a dtype name such as \"F32\")");
    if (!v.contains("shape") || !v["shape"].is_array()) field_bad("shape", "an array of non-negative integers");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      field_bad("data_offsets", "an array of two non-negative integers [begin, end]");
    SafetensorsEntry e;
    e.name = key;
    std::string dt = v["dtype"].get<std::string>();
    if (!detail::dtype_from_safetensors(dt, &e.dtype))
      tbad(cat("dtype \"", dt, "\" is not supported; expected one of ", detail::known_dtype_names()));
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(INT64_MAX) : d.get<int64_t>() < 0))
        field_bad("shape", "an array of non-negative integers");
      e.shape.push_back(d.get<int64_t>());
    }
    for (int i = 0; i < 2; ++i) {
      const auto& o = v["data_offsets"][i];
      if (!o.is_number_integer() || (o.is_number_unsigned() ? o.get<uint64_t>() > uint64_t(INT64_MAX) : o.get<int64_t>() < 0))
        field_bad("data_offsets", "an array of two non-negative integers [begin, end]");
    }
    e.begin = v["data_offsets"][0].get<int64_t>();
    e.end = v["data_offsets"][1].get<int64_t>();
    if (e.begin > e.end || e.end > data_size)
      tbad(cat("data_offsets [", e.begin, ", ", e.end, ") expected within the data section [0, ", data_size,
               ") (truncated file?)"));
    int64_t numel = detail::checked_numel(e.shape);
    if (numel < 0) tbad(cat("shape ", shape_str(e.shape), " is too large"));
    int64_t want = numel * detail::element_size(e.dtype);
    if (want != e.end - e.begin)
      tbad(cat("shape ", shape_str(e.shape), " x ", dt, " needs ", want, " bytes but data_offsets span ",
               e.end - e.begin));
    m.entries.push_back(std::move(e));
  }
  std::sort(m.entries.begin(), m.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  for (size_t i = 0; i < m.entries.size(); ++i) {
    if (i > 0 && m.entries[i].begin < m.entries[i - 1].end && m.entries[i].begin < m.entries[i].end)
      m.bad(cat("tensors '", m.entries[i - 1].name, "' and '", m.entries[i].name, "' overlap (bytes [",
                m.entries[i - 1].begin, ", ", m.entries[i - 1].end, ") and [", m.entries[i].begin, ", ",
                m.entries[i].end, "))"));
    m.index[m.entries[i].name] = i;
  }
}

SafetensorsReader::~SafetensorsReader() = default;

const std::string& SafetensorsReader::path() const { return impl_->path; }
int64_t SafetensorsReader::file_size() const { return impl_->size; }
int64_t SafetensorsReader::header_bytes() const { return impl_->header_total; }
uint32_t SafetensorsReader::header_crc32c() const { return impl_->header_crc; }
int SafetensorsReader::fd() const { return impl_->file.fd(); }
const std::vector<SafetensorsEntry>& SafetensorsReader::entries() const { return impl_->entries; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return impl_->metadata; }

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->entries[it->second];
}

torch::Tensor SafetensorsReader::read(const std::string& name, int64_t lo, int64_t hi) {
  const SafetensorsEntry* e = find(name);
  if (!e)
    throw Error(cat("safetensors file '", impl_->path, "' has no tensor '", name,
                    "'. Check the name (`fsdp ckpt inspect` lists them)."));
  int64_t numel = detail::checked_numel(e->shape);
  if (lo < 0 || lo > hi || hi > numel)
    throw Error(cat("safetensors file '", impl_->path, "': tensor '", name, "' has ", numel,
                    " elements; cannot read elements [", lo, ", ", hi, ")."));
  auto out = torch::empty({hi - lo}, torch::TensorOptions().dtype(e->dtype));
  int64_t es = detail::element_size(e->dtype);
  pread_exact(impl_->header_total + e->begin + lo * es, (hi - lo) * es, out.data_ptr());
  return out;
}

torch::Tensor SafetensorsReader::read_all(const std::string& name) {
  const SafetensorsEntry* e = find(name);
  if (!e) return read(name, 0, 0);  // throws the message above
  return read(name, 0, detail::checked_numel(e->shape)).view(e->shape);
}

void SafetensorsReader::pread_exact(int64_t offset, int64_t n, void* dst) const {
  impl_->file.pread_all(offset, static_cast<size_t>(n), dst);
}

}  // namespace fsdp::ckpt
