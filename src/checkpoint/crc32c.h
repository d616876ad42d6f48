// fsdp-cpp checkpoints: CRC32C (Castagnoli), the checksum of every file and
// chunk in a checkpoint (docs/CHECKPOINT_FORMAT.md#checksums).
// defines: crc32c_extend, crc32c, crc32c_hex, parse_crc32c_hex
//
// Uses the SSE4.2 instruction when the CPU has it (~10 GB/s), a
// slicing-by-8 table otherwise; both give the same values (the standard
// CRC-32C, check value crc32c("123456789") == 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp::ckpt::detail {

// crc of data appended to bytes whose crc was `crc` (0 for none).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

std::string crc32c_hex(uint32_t crc);  // "e3069283"
// false when `s` is not 8 hex digits.
bool parse_crc32c_hex(const std::string& s, uint32_t* out);

}  // namespace fsdp::ckpt::detail
