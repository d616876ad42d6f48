// fsdp-cpp fuzz target: the safetensors header parser (SafetensorsReader).
//
// The input is a whole file: it goes into an anonymous memory file and the
// reader opens it by its /proc path, so the parser runs exactly as on disk
// (length field, bounds against the file size, JSON, entry checks). Every
// tensor the header accepts is then read back, which checks that accepted
// offsets really lie inside the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "fsdp/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int fd = memfd_create("fsdp-fuzz-safetensors", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    fsdp::ckpt::SafetensorsReader reader(path);
    const int64_t data_size = reader.file_size() - reader.header_bytes();
    for (const auto& e : reader.entries()) {
      // An accepted entry must lie inside the data section: anything else
      // is a validation bug even when the read that follows would not crash.
      if (e.begin < 0 || e.begin > e.end || e.end > data_size) __builtin_trap();
      // The header said the bytes exist; reading them must not fail for
      // lack of them (they are at most the file's size).
      if (e.end - e.begin <= static_cast<int64_t>(size)) reader.read_all(e.name);
    }
    reader.metadata();
  } catch (const fsdp::InternalError&) {
    throw;  // a bug, not a rejection: the fuzzer must see it
  } catch (const fsdp::Error&) {
    // Rejected with a message: the expected outcome for hostile input.
  }
  return 0;
}
