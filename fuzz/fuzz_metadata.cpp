// fsdp-cpp fuzz target: the checkpoint metadata.json parser
// (Metadata::parse) and the per-rank index parser (RankIndex::from_json).
//
// metadata.json carries a CRC32C of its body, checked before any value is
// trusted, so random bytes almost never get past it. The first input byte
// picks the mode: odd -> the rest is JSON whose checksum we fix up before
// parsing (reaching every field check); even -> the bytes as they are
// (the checksum path, and RankIndex::from_json which has no checksum).
#include <cstdint>
#include <string>

#include "checkpoint/crc32c.h"
#include "checkpoint/metadata.h"
#include "fsdp/errors.h"

using fsdp::ckpt::detail::Metadata;
using fsdp::ckpt::detail::RankIndex;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fix_checksum = data[0] & 1;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (fix_checksum) {
      auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) return 0;
      j.erase("checksum");
      std::string body = j.dump();
      j["checksum"] = fsdp::ckpt::detail::crc32c_hex(fsdp::ckpt::detail::crc32c(body.data(), body.size()));
      text = j.dump();
    }
    Metadata m = Metadata::parse("fuzz/metadata.json", text);
    // What the loader does next with a parsed checkpoint: walk every piece.
    for (auto& [sec, tensors] : m.sections)
      for (auto& [name, t] : tensors) {
        int64_t n = t.numel();
        for (auto& p : t.pieces)
          if (p.hi > n || p.file >= static_cast<int>(m.files.size())) __builtin_trap();
      }
    m.dump();
  } catch (const fsdp::InternalError&) {
    throw;  // a bug, not a rejection: the fuzzer must see it
  } catch (const fsdp::Error&) {
  }
  try {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_discarded()) RankIndex::from_json("fuzz/rank.index.json", j);
  } catch (const fsdp::InternalError&) {
    throw;  // a bug, not a rejection: the fuzzer must see it
  } catch (const fsdp::Error&) {
  }
  return 0;
}
