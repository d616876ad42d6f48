// The Llama fine-tuning run (train.cpp); llama.cpp parses its flags.
// defines: llama::Args, llama::finetune, llama::run
#pragma once

#include <cstdint>
#include <string>

namespace llama {

// Flags, with the defaults of a short fine-tune on a CPU.
struct Args {
  std::string hf;                  // the Hugging Face checkpoint to start from
  std::string data;                // training tokens (.bin, uint16; `fsdp prepare`)
  std::string export_dir;          // where the fine-tuned model goes (HF layout); "": not exported
  std::string export_dtype = "bf16";  // bf16 | fp32
  // The comparison of bench/hf_load.sh: every tensor gathered to rank 0,
  // which writes one safetensors file ("": not done).
  std::string export_gathered;
  std::string max_shard_size = "5GiB";
  int64_t steps = 20, batch = 2, seq = 128, log_every = 1;
  double lr = 2e-5, weight_decay = 0.0, clip = 1.0;
  std::string strategy = "full";   // full | grad-op | none | hybrid | hybrid-zero2
  std::string dtype = "fp32";      // compute: fp32 | bf16 (fp32 masters either way)
  int threads = 0;                 // 0: cores / ranks on this host
  bool buffered = false;           // load_hf through the page cache only (HfLoadOptions::direct_io = false)
  std::string load_buffer;         // HfLoadOptions::buffer_bytes (e.g. "16MiB"; "": its default)
};

// Loads --hf into a model built without memory (every rank reads its
// shards' bytes), fine-tunes it, exports it. Collective; returns the exit code.
int finetune(const Args& a);

// The llama program (llama.cpp): flags, then finetune(). Returns the exit
// code: 0; 1 for an error; 2 for a usage error (said on stderr).
int run(int argc, char** argv);

}  // namespace llama
