// fsdp-cpp: argument checks shared by every communicator (see checks.h).
#include "comm/checks.h"

#include "fsdp/errors.h"
#include "fsdp/memory.h"

namespace fsdp::comm {
namespace {

bool reducible(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: case c10::kDouble: case c10::kBFloat16: case c10::kHalf:
    case c10::kInt: case c10::kLong:
      return true;
    default:
      return false;
  }
}

bool movable(c10::ScalarType t) { return reducible(t) || t == c10::kByte || t == c10::kChar || t == c10::kBool; }

[[noreturn]] void misuse(const char* what, const std::string& msg) {
  throw CollectiveError(detail::cat(what, ": ", msg));
}

void check_tensor(const char* what, const char* role, const torch::Tensor& t, c10::DeviceType home) {
  if (!t.defined()) misuse(what, detail::cat("the ", role, " tensor is undefined; pass an allocated tensor"));
  // The communicators' factories stage other devices' tensors (staged.cpp):
  // a tensor elsewhere here is a bug of this library.
  if (t.device().type() != home)
    misuse(what, detail::cat("the ", role, " tensor is on ", t.device().str(), "; this engine moves ",
                             c10::DeviceTypeName(home, /*lower_case=*/true), " tensors only (internal error: ",
                             "its factory stages the others)"));
  if (!t.is_contiguous())
    misuse(what, detail::cat("the ", role, " tensor (shape ", t.sizes(),
                             ") is not contiguous; call .contiguous() first"));
  if (!movable(t.scalar_type()))
    misuse(what, detail::cat("the ", role, " tensor has dtype ", t.scalar_type(),
                             "; supported: fp32, fp64, bf16, fp16, int32, int64, uint8, int8, bool"));
}

void check_reduce(const char* what, c10::ScalarType t, ReduceOp op) {
  if (!reducible(t))
    misuse(what, detail::cat("cannot reduce dtype ", t, "; reduce fp32, fp64, bf16, fp16, int32 or int64"));
  if (op == ReduceOp::AVG && (t == c10::kInt || t == c10::kLong))
    misuse(what, detail::cat("ReduceOp::AVG of integer dtype ", t,
                             " would truncate; use SUM and divide, or reduce a floating tensor"));
}

// The output of a gather: every rank's input, rank-major.
void check_gathered(const char* what, const torch::Tensor& input, const torch::Tensor& output, int world,
                    c10::DeviceType home) {
  check_tensor(what, "output", output, home);
  if (input.scalar_type() != output.scalar_type())
    misuse(what, detail::cat("input is ", input.scalar_type(), " but output is ", output.scalar_type(),
                             "; both must have the same dtype"));
  if (output.numel() != world * input.numel())
    misuse(what, detail::cat("expected output.numel() == world_size * input.numel() = ", world, " * ",
                             input.numel(), " = ", world * input.numel(), ", found ", output.numel()));
}

CallShape shape(CollectiveKind k, const CollectiveInfo& info, const torch::Tensor& t) {
  CallShape s;
  s.kind = k;
  s.label = info.label;
  s.compressible = info.compressible;
  s.dtype = t.scalar_type();
  s.numel = t.numel();
  s.elem_size = static_cast<int64_t>(t.element_size());
  return s;
}

}  // namespace

CallShape check_all_gather(const torch::Tensor& input, const torch::Tensor& output, int world,
                           const CollectiveInfo& info, c10::DeviceType home) {
  const char* what = "all_gather";
  check_tensor(what, "input", input, home);
  check_gathered(what, input, output, world, home);
  return shape(CollectiveKind::ALL_GATHER, info, input);
}

CallShape check_reduce_scatter(const torch::Tensor& input, const torch::Tensor& output,
                               ReduceOp op, int world, const CollectiveInfo& info, c10::DeviceType home) {
  const char* what = "reduce_scatter";
  check_tensor(what, "input", input, home);
  check_tensor(what, "output", output, home);
  if (input.scalar_type() != output.scalar_type())
    misuse(what, detail::cat("input is ", input.scalar_type(), " but output is ", output.scalar_type(),
                             "; both must have the same dtype"));
  check_reduce(what, input.scalar_type(), op);
  if (input.numel() != world * output.numel())
    misuse(what, detail::cat("expected input.numel() == world_size * output.numel() = ", world, " * ",
                             output.numel(), " = ", world * output.numel(), ", found ", input.numel(),
                             "; pad the input to a multiple of the world size"));
  CallShape s = shape(CollectiveKind::REDUCE_SCATTER, info, input);
  s.reduce_op = static_cast<int>(op);
  return s;
}

CallShape check_all_reduce(const torch::Tensor& tensor, ReduceOp op, const CollectiveInfo& info,
                           c10::DeviceType home) {
  check_tensor("all_reduce", "", tensor, home);
  check_reduce("all_reduce", tensor.scalar_type(), op);
  CallShape s = shape(CollectiveKind::ALL_REDUCE, info, tensor);
  s.reduce_op = static_cast<int>(op);
  return s;
}

CallShape check_broadcast(const torch::Tensor& tensor, int root, int world, const CollectiveInfo& info,
                          c10::DeviceType home) {
  check_tensor("broadcast", "", tensor, home);
  if (root < 0 || root >= world)
    misuse("broadcast", detail::cat("root ", root, " is not a rank of this world of ", world,
                                    "; pass a root in [0, ", world, ")"));
  CallShape s = shape(CollectiveKind::BROADCAST, info, tensor);
  s.root = root;
  return s;
}

CallShape check_gather(const torch::Tensor& input, const torch::Tensor& output, int root, int rank,
                       int world, const CollectiveInfo& info, c10::DeviceType home) {
  const char* what = "gather";
  check_tensor(what, "input", input, home);
  if (root < 0 || root >= world)
    misuse(what, detail::cat("root ", root, " is not a rank of this world of ", world,
                             "; pass a root in [0, ", world, ")"));
  if (rank == root) {
    if (!output.defined())
      misuse(what, detail::cat("rank ", rank, " is the root but its output tensor is undefined; pass a tensor of ",
                               world, " * ", input.numel(), " elements"));
    check_gathered(what, input, output, world, home);
  }
  CallShape s = shape(CollectiveKind::GATHER, info, input);
  s.root = root;
  return s;
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "fp32";
    case c10::kDouble: return "fp64";
    case c10::kBFloat16: return "bf16";
    case c10::kHalf: return "fp16";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kByte: return "uint8";
    case c10::kChar: return "int8";
    case c10::kBool: return "bool";
    default: return c10::toString(t);
  }
}

std::string describe_call(const CallShape& s) {
  std::string out = to_string(s.kind);
  if (!s.label.empty()) out += " '" + s.label + "'";
  if (s.kind != CollectiveKind::BARRIER)
    out += detail::cat(" (", dtype_name(s.dtype), ", ", s.numel, " elements, ",
                       memory::format_bytes(s.numel * s.elem_size), ")");
  return out;
}

Chunks ring_chunks(int64_t numel, int world) {
  Chunks c;
  int64_t base = numel / world, extra = numel % world, at = 0;
  for (int j = 0; j < world; ++j) {
    int64_t n = base + (j < extra ? 1 : 0);
    c.offset.push_back(at);
    c.count.push_back(n);
    at += n;
  }
  return c;
}

}  // namespace fsdp::comm
