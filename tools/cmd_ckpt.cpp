// fsdp-cpp: `fsdp ckpt` — inspect, verify and convert checkpoints.
//
//   fsdp ckpt inspect PATH            world size, strategy, step, tensors
//   fsdp ckpt verify PATH             every checksum and the metadata; exit 1 on a fault
//   fsdp ckpt convert DIR --to model.safetensors     sharded -> one full file (streaming)
//   fsdp ckpt convert DIR --world M --to DIR2        reshard offline to M ranks
//   fsdp ckpt convert DIR --to-hf OUT [--dtype bf16] [--max-shard-size 5GiB] [--config FILE]
//                                                    sharded -> Hugging Face layout, with config.json
//                                                    (FILE, or the checkpoint's own)
//   fsdp ckpt convert HF_DIR --from-hf --world M --to ROOT
//                                                    Hugging Face layout -> sharded
//
// PATH is a checkpoint root (follows `latest`), a checkpoint directory, a
// Hugging Face directory (model.safetensors.index.json or model.safetensors),
// or (inspect) a .safetensors file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <filesystem>
#include <string>

#include "cli_checks.h"
#include "command.h"
#include "fsdp/checkpoint.h"
#include "fsdp/hf.h"
#include "usage.h"

namespace {
using namespace fsdp::ckpt;

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  else if (b >= (1 << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / double(1 << 10));
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// A Hugging Face directory (and not one of our checkpoints)?
bool is_hf(const std::string& path) {
  auto has = [&](const char* f) { return std::filesystem::exists(path + "/" + f); };
  return !has("metadata.json") && (has("model.safetensors.index.json") || has("model.safetensors"));
}

int inspect_hf(const std::string& path) {
  HfDirectory h = read_hf_directory(path);
  int64_t total = 0;
  for (auto& [n, t] : h.tensors) total += t.bytes;
  std::printf("Hugging Face checkpoint %s\n  %s, %zu files, %zu tensors, %s of tensors%s\n", path.c_str(),
              h.indexed ? "model.safetensors.index.json" : "model.safetensors", h.files.size(), h.tensors.size(),
              human_bytes(total).c_str(), !h.files.empty() && h.files[0].has_checksums ? ", with checksums" : "");
  if (!h.config.is_null())
    std::printf("  config: %s\n", h.config.value("architectures", nlohmann::json::array()).dump().c_str());
  std::printf("  files:");
  for (auto& f : h.files) std::printf(" %s (%s)", f.name.c_str(), human_bytes(f.bytes).c_str());
  std::printf("\n  %-56s %-6s %-20s %-10s %s\n", "name", "dtype", "shape", "bytes", "file");
  for (auto& [n, t] : h.tensors)
    std::printf("  %-56s %-6s %-20s %-10s %s\n", n.c_str(), safetensors_dtype_name(t.dtype), shape_str(t.shape).c_str(),
                human_bytes(t.bytes).c_str(), h.files[static_cast<size_t>(t.file)].name.c_str());
  return 0;
}

int inspect(const std::string& path) {
  if (is_hf(path)) return inspect_hf(path);
  if (ends_with(path, ".safetensors")) {
    SafetensorsReader r(path);
    std::printf("safetensors file %s: %zu tensors, %s\n", path.c_str(), r.entries().size(),
                human_bytes(r.file_size()).c_str());
    for (auto& [k, v] : r.metadata()) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
    std::printf("  %-48s %-6s %-20s %s\n", "name", "dtype", "shape", "bytes");
    for (auto& e : r.entries())
      std::printf("  %-48s %-6s %-20s %s\n", e.name.c_str(), safetensors_dtype_name(e.dtype),
                  shape_str(e.shape).c_str(), human_bytes(e.end - e.begin).c_str());
    return 0;
  }
  CheckpointInfo info = read_info(path);
  int64_t total = 0;
  for (auto& f : info.files) total += f.bytes;
  std::printf("checkpoint %s\n  format version %d, step %lld, saved at world size %d with %s\n"
              "  model fingerprint %s, %zu files, %s\n  train state %s\n",
              info.path.c_str(), info.format_version, static_cast<long long>(info.step), info.world_size,
              info.strategy.c_str(), info.fingerprint.c_str(), info.files.size(), human_bytes(total).c_str(),
              info.train_state.dump().c_str());
  // The layout: which ranks' files hold bytes (HYBRID: only replica group 0's).
  std::printf("  files:");
  for (auto& f : info.files) std::printf(" %s (%s)", f.name.c_str(), human_bytes(f.bytes).c_str());
  std::printf("\n");
  std::printf("  %-7s %-48s %-6s %-20s %-10s %s\n", "section", "name", "dtype", "shape", "bytes", "pieces");
  for (auto& t : info.tensors) {
    int64_t bytes = numel_of(t.shape) * static_cast<int64_t>(c10::elementSize(t.dtype));
    std::printf("  %-7s %-48s %-6s %-20s %-10s %d\n", t.section.c_str(), t.name.c_str(),
                safetensors_dtype_name(t.dtype), shape_str(t.shape).c_str(), human_bytes(bytes).c_str(), t.pieces);
  }
  return 0;
}

int verify(const std::string& path) {
  if (is_hf(path)) {
    auto faults = verify_hf_directory(path);
    for (auto& f : faults) std::fprintf(stderr, "FAULT: %s\n", f.c_str());
    if (!faults.empty()) return std::fprintf(stderr, "%s: %zu fault(s)\n", path.c_str(), faults.size()), 1;
    std::printf("%s: OK (index, every file's header%s)\n", path.c_str(),
                read_hf_directory(path).files.at(0).has_checksums ? ", size and checksums" : "; no checksums to check");
    return 0;
  }
  auto faults = verify_checkpoint(path);
  if (faults.empty()) {
    std::printf("%s: OK (metadata, every file's size and checksums, every tensor covered)\n",
                resolve_checkpoint(path).c_str());
    return 0;
  }
  for (auto& f : faults) std::fprintf(stderr, "FAULT: %s\n", f.c_str());
  std::fprintf(stderr, "%s: %zu fault(s)\n", path.c_str(), faults.size());
  return 1;
}

int cmd_ckpt(int argc, char** argv) {
  CLI::App app{"inspect, verify and convert fsdp-cpp checkpoints", "fsdp ckpt"};
  app.require_subcommand(1);
  std::string path, to, section = "model", to_hf, dtype = "bf16", max_shard = "5GiB", config;
  int world = 0;
  bool from_hf = false;
  auto* ins = app.add_subcommand("inspect", "world size, strategy, step, tensors (also a .safetensors file)");
  ins->add_option("PATH", path, "checkpoint root, checkpoint directory or .safetensors file")->required();
  auto* ver = app.add_subcommand("verify", "check every checksum and the metadata; exit 1 on any fault");
  ver->add_option("PATH", path, "checkpoint root or directory")->required();
  auto* conv = app.add_subcommand("convert", "to one full safetensors file, or reshard to --world M");
  conv->add_option("DIR", path, "checkpoint root or directory")->required();
  conv->add_option("--to", to, "output .safetensors file, or output root with --world");
  conv->add_option("--to-hf", to_hf, "write the model section as a Hugging Face directory here (new)");
  conv->add_option("--dtype", dtype, "with --to-hf: bf16 | fp16 | fp32 on disk")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  conv->add_option("--max-shard-size", max_shard, "with --to-hf: the largest file, e.g. 2GiB")->capture_default_str();
  conv->add_option("--config", config, "with --to-hf: the model's config.json, written into OUT (default: the "
                                       "checkpoint's own; one is required)");
  conv->add_flag("--from-hf", from_hf, "DIR is a Hugging Face directory: write it as a sharded checkpoint of --world ranks "
                                       "under --to");
  conv->add_option("--world", world, "reshard to this many ranks (writes a sharded checkpoint)")
      ->check(fsdp::cli::integer(1, 1 << 20));
  conv->add_option("--section", section, "model or optim (full-file conversion)")
      ->capture_default_str()
      ->check(CLI::IsMember({"model", "optim"}));
  const std::string first = argc >= 2 ? argv[1] : "";
  if (!first.empty() && first != "-h" && first != "--help" && first != "inspect" && first != "verify" &&
      first != "convert") {
    std::fprintf(stderr, "fsdp ckpt: usage error: unknown %s '%s'; expected a subcommand: inspect, verify or convert\n"
                         "run 'fsdp ckpt --help' for the subcommands\n", first[0] == '-' ? "option" : "subcommand",
                 argv[1]);
    return 2;
  }
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return *rc;  // --help, usage errors
  try {
    if (*ins) return inspect(path);
    if (*ver) return verify(path);
    if (!to_hf.empty()) {
      const auto dt = dtype == "fp32" ? torch::kFloat32 : dtype == "fp16" ? torch::kFloat16 : torch::kBFloat16;
      const int64_t bytes = convert_to_hf(path, to_hf, dt, fsdp::cli::parse_bytes(max_shard), config);
      std::printf("wrote %s (%s of tensors)\n", to_hf.c_str(), human_bytes(bytes).c_str());
      return 0;
    }
    if (to.empty()) {
      std::fprintf(stderr, "fsdp ckpt convert: usage error: --to is required (a .safetensors file, or a root with "
                           "--world), or --to-hf DIR\nrun 'fsdp ckpt convert --help' for the flags\n");
      return 2;
    }
    if (from_hf) {
      if (world <= 0) return std::fprintf(stderr, "fsdp ckpt convert: usage error: --from-hf needs --world M\n"), 2;
      std::printf("wrote %s (world size %d)\n", convert_from_hf(path, world, to).c_str(), world);
      return 0;
    }
  } catch (const fsdp::UsageError& e) {
    std::fprintf(stderr, "fsdp ckpt: usage error: %s\n", e.what());
    return 2;
  }
  if (world > 0) {
    // Per-rank tensors (error feedback's residuals) belong to the old ranks:
    // reshard_offline drops them; say so.
    int per_rank = 0;
    for (auto& t : read_info(path).tensors) per_rank += t.section == "per_rank";
    std::string out = reshard_offline(path, world, to);
    std::printf("wrote %s (world size %d)\n", out.c_str(), world);
    if (per_rank > 0)
      std::printf("dropped %d per-rank tensor(s) (error feedback's residuals of the old ranks): a compressed run "
                  "loading it starts them at zero\n", per_rank);
    return 0;
  }
  int64_t bytes = convert_to_full(path, to, section);
  std::printf("wrote %s (%s)\n", to.c_str(), human_bytes(bytes).c_str());
  return 0;
}

}  // namespace

FSDP_COMMAND(ckpt, "inspect, verify and convert checkpoints", cmd_ckpt);
