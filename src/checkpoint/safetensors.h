// fsdp-cpp checkpoints: safetensors internals shared by the sharded and full
// formats (the public classes are in include/fsdp/checkpoint.h).
// defines: dtype_from_safetensors, element_size, checked_numel, json_found
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::ckpt::detail {

// false when `name` is not one of F32 BF16 F16 F64 I64 I32 I16 I8 U8 BOOL.
bool dtype_from_safetensors(const std::string& name, torch::ScalarType* out);
const char* known_dtype_names();  // for messages
int64_t element_size(torch::ScalarType t);
// Product of dims; -1 when a dim is negative or the product overflows 2^62.
int64_t checked_numel(const std::vector<int64_t>& shape);
// What a JSON value of a file is, for the message of a value of the wrong
// type: `5 (a number)`, `"abc" (a string)` (long values cut short).
std::string json_found(const nlohmann::json& v);

}  // namespace fsdp::ckpt::detail
