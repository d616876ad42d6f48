// GPT-mini data: token files, the byte-level tokenizer, the batch order.
// (cli/gpt: `fsdp prepare` writes the files, examples/gpt and
// examples/llama train on them.)
//
// defines: gpt::data::Tokens, read_tokens, write_tokens, read_texts, encode,
//          decode, Split, split, Prepared, prepare, Order, row_offset, Batch,
//          batch, eval_batch
//
// A token file is a flat array of little-endian uint16 ids (nanoGPT's .bin).
// Byte-level: token = byte value, so any text converts 1:1 and back.
//
// The order (docs/GPT_MINI.md, "Deterministic order"): for optimizer step s,
// micro-step k (0..K-1), rank r (0..N-1) and row b (0..B-1),
//   j = ((s*K + k)*N + r)*B + b,   row j = tokens[o, o+T), targets [o+1, o+T+1),
//   o = (j*T) mod (len - T - 1).
// Row j depends on nothing else, so N ranks with micro-batch B see exactly
// the rows one process with batch N*B sees. The shuffled order keeps that
// property: o = hash(seed, j) mod (len - T - 1).
//
// Every function throws fsdp::Error with a message that says what was expected,
// what was found and what to do.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpt::data {

using Tokens = std::vector<uint16_t>;

// Reads a .bin token file; checks it exists, is non-empty, has an even byte
// length and that every id is < vocab.
Tokens read_tokens(const std::string& path, int64_t vocab = 65536);
// Writes little-endian uint16 (creates or truncates).
void write_tokens(const std::string& path, const Tokens& tokens);

// Concatenates the bytes of text files in the given order; each must exist
// and be non-empty.
std::string read_texts(const std::vector<std::string>& paths);
Tokens encode(const std::string& text);  // byte -> token
// token -> byte; ids >= 256 (not produced by encode) print as '?'.
std::string decode(const Tokens& tokens);

// nanoGPT's split: the first floor(0.9 * n) tokens train, the rest validate.
struct Split {
  Tokens train, val;
};
Split split(const Tokens& all, double train_fraction = 0.9);

// `fsdp prepare`: texts -> outdir/train.bin, outdir/val.bin (outdir created).
struct Prepared {
  std::string train_path, val_path;
  int64_t train_tokens = 0, val_tokens = 0;
};
Prepared prepare(const std::vector<std::string>& texts, const std::string& outdir);

// Where rows come from.
struct Order {
  int64_t T = 128;  // tokens per row
  int64_t B = 8;    // rows per micro-batch per rank
  int64_t K = 1;    // micro-steps per optimizer step
  int64_t N = 1;    // ranks
  bool shuffle = false;
  uint64_t seed = 0;  // shuffled order only
};

// Start offset of global row j in a stream of `len` tokens. Throws when the
// stream has fewer than T+2 tokens (one row plus its shifted target needs T+1,
// and the formula's modulus len-T-1 must be >= 1).
int64_t row_offset(const Order& order, int64_t len, int64_t j);
// j of (s, k, r, b).
int64_t row_index(const Order& order, int64_t s, int64_t k, int64_t r, int64_t b);

struct Batch {
  torch::Tensor x;  // [B,T] int64 inputs
  torch::Tensor y;  // [B,T] int64 targets (inputs shifted by one)
};
// Micro-batch k of step s for rank r.
Batch batch(const Tokens& tokens, const Order& order, int64_t s, int64_t k, int64_t r);
// Validation batch e (0..E-1) for rank r: the deterministic order with K=1,
// always the same rows, so the validation loss of two evaluations compares.
Batch eval_batch(const Tokens& tokens, const Order& order, int64_t e, int64_t r);

}  // namespace gpt::data
