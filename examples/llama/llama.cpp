// build/bin/llama: fine-tune a Hugging Face Llama checkpoint with FSDP, and
// export the result in the same layout (llama::run: its flags; train.cpp:
// the run; main.cpp calls it).
//
//   fsdp prepare --text a.txt --out data/x       # byte tokens (ids < 256)
//   fsdp run -n 4 -- build/bin/llama --hf Llama-dir --data data/x/train.bin
//       --steps 20 --export llama-finetuned
#include <CLI/CLI.hpp>

#include <optional>

#include "cli_checks.h"
#include "fsdp/errors.h"
#include "fsdp/fully_shard.h"
#include "fsdp/init.h"
#include "llama/train.h"
#include "program.h"
#include "usage.h"

namespace llama {
namespace {

// Returns the exit code to return now (after --help, or a bad flag said on
// stderr), or nullopt to fine-tune. Throws fsdp::UsageError for a bad value.
std::optional<int> parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"Fine-tune a Hugging Face Llama checkpoint with FSDP. Run under `fsdp run -n N --`.", "llama"};
  app.add_option("--hf", a.hf, "the checkpoint: a directory with config.json and model*.safetensors")->required();
  app.add_option("--data", a.data, "training tokens (.bin, uint16 ids below the vocabulary size; fsdp prepare)")
      ->required();
  app.add_option("--export", a.export_dir, "write the fine-tuned model here (Hugging Face layout)");
  app.add_option("--export-dtype", a.export_dtype, "bf16 | fp32: the dtype of the exported tensors")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--export-gathered", a.export_gathered,
                 "also write one .safetensors file from rank 0, every tensor gathered there (the slow way "
                 "save_hf is measured against, bench/hf_load.sh)");
  app.add_option("--max-shard-size", a.max_shard_size, "largest export file, e.g. 2GiB");
  app.add_option("--steps", a.steps, "optimizer steps")->check(fsdp::cli::integer(0, int64_t(1) << 40));
  app.add_option("--batch", a.batch, "rows per rank per step")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--seq", a.seq, "tokens per row")->check(fsdp::cli::integer(1, 1 << 20));
  app.add_option("--lr", a.lr, "AdamW learning rate (constant)")->check(fsdp::cli::real(1e-30, 1e3));
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay")->check(fsdp::cli::real(0, 1e3));
  app.add_option("--clip", a.clip, "global gradient-norm clip (0: off)")->check(fsdp::cli::real(0, 1e12));
  app.add_option("--strategy", a.strategy, "full | grad-op | none | hybrid | hybrid-zero2");
  app.add_option("--dtype", a.dtype, "fp32 | bf16: compute and all-gather dtype (fp32 master shards)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--threads", a.threads, "intra-op threads per rank (0: cores / ranks per host)")
      ->check(fsdp::cli::integer(0, 1024));
  app.add_flag("--buffered-load", a.buffered,
               "load_hf reads through the page cache only (default: what it lacks is read with O_DIRECT)");
  app.add_option("--load-buffer", a.load_buffer,
                 "bytes of one load_hf read (HfLoadOptions::buffer_bytes, e.g. 16MiB; default: the library's)");
  app.add_option("--log-every", a.log_every, "a step line every N steps")->check(fsdp::cli::integer(1, 1 << 30));
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return rc;
  // Values CLI11 cannot check alone, each named in its usage error.
  auto check = [](const char* flag, auto&& parse) {
    try {
      parse();
    } catch (const fsdp::Error& e) {
      throw fsdp::UsageError(std::string(flag) + ": " + e.what());
    }
  };
  check("--strategy", [&] { fsdp::parse_strategy(a.strategy); });
  check("--max-shard-size", [&] { fsdp::cli::parse_bytes(a.max_shard_size); });
  if (!a.load_buffer.empty()) check("--load-buffer", [&] { fsdp::cli::parse_bytes(a.load_buffer); });
  return std::nullopt;
}

}  // namespace

int run(int argc, char** argv) {
  return fsdp::cli::run_program("llama", [&] {
    fsdp::init();  // the counting allocator (DeferredInit needs it), before any tensor
    Args a;
    if (const std::optional<int> rc = parse_args(argc, argv, a)) return *rc;
    return finetune(a);
  });
}

}  // namespace llama
