// `fsdp prepare --text FILE... --out DIR`: text -> train.bin / val.bin.
//
// Byte-level tokens (token = byte), uint16 little-endian, the first 90% of the
// concatenated text to train.bin and the rest to val.bin, as nanoGPT's
// prepare scripts do. build/bin/gpt --data DIR/train.bin --val DIR/val.bin
// then trains on them.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "command.h"
#include "gpt/data.h"

namespace {

int cmd_prepare(int argc, char** argv) {
  std::vector<std::string> texts;
  std::string out;
  CLI::App app{"Tokenize text files (byte-level) into train.bin / val.bin (90/10 split)", "fsdp prepare"};
  app.add_option("--text", texts, "text files, concatenated in the order given")->required()->expected(1, -1);
  app.add_option("--out", out, "output folder (created)")->required();
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return *rc;
  gpt::data::Prepared p = gpt::data::prepare(texts, out);
  std::printf("fsdp prepare: %zu file(s) -> %s (%lld tokens), %s (%lld tokens), vocab 256 (bytes)\n",
              texts.size(), p.train_path.c_str(), (long long)p.train_tokens, p.val_path.c_str(),
              (long long)p.val_tokens);
  if (p.val_tokens == 0)
    std::printf("fsdp prepare: warning: val.bin is empty (the text is too short for a 10%% split)\n");
  return 0;
}

}  // namespace

FSDP_COMMAND(prepare, "tokenize text files into train.bin / val.bin (byte-level, 90/10)", cmd_prepare);
