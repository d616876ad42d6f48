// GPT-mini data (see data.h). Plain library code: throws, never exits.
#include "gpt/data.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/errors.h"

namespace gpt::data {

namespace {

std::string read_file_bytes(const std::string& path, const char* what, const char* hint) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw fsdp::Error(std::string(what) + " '" + path + "' does not exist; " + hint);
  if (std::filesystem::is_directory(path, ec))
    throw fsdp::Error(std::string(what) + " '" + path + "' is a directory, expected a file; " + hint);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw fsdp::Error(std::string("cannot open ") + what + " '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw fsdp::Error(std::string("error reading ") + what + " '" + path + "'");
  return ss.str();
}

// splitmix64: a fixed, portable hash for the shuffled order (std:: engines'
// distributions differ between standard libraries).
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Tokens read_tokens(const std::string& path, int64_t vocab) {
  const char* hint = "write one with `fsdp prepare --text FILE... --out DIR` (uint16 little-endian tokens)";
  std::string bytes = read_file_bytes(path, "token file", hint);
  if (bytes.empty()) throw fsdp::Error("token file '" + path + "' is empty; " + hint);
  if (bytes.size() % 2 != 0)
    throw fsdp::Error("token file '" + path + "' has " + std::to_string(bytes.size()) +
                      " bytes, expected an even count (uint16 tokens); is it a text file? "
                      "pass text with --text instead, or " + hint);
  Tokens t(bytes.size() / 2);
  for (size_t i = 0; i < t.size(); i++) {
    t[i] = uint16_t(uint8_t(bytes[2 * i])) | uint16_t(uint16_t(uint8_t(bytes[2 * i + 1])) << 8);
    if (t[i] >= vocab)
      throw fsdp::Error("token file '" + path + "': token " + std::to_string(i) + " is " +
                        std::to_string(t[i]) + ", expected ids < --vocab " + std::to_string(vocab) +
                        "; raise --vocab or re-prepare the data with this tokenizer");
  }
  return t;
}

void write_tokens(const std::string& path, const Tokens& tokens) {
  std::string bytes(tokens.size() * 2, '\0');
  for (size_t i = 0; i < tokens.size(); i++) {
    bytes[2 * i] = char(tokens[i] & 0xff);
    bytes[2 * i + 1] = char(tokens[i] >> 8);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw fsdp::Error("cannot write token file '" + path + "': " + std::strerror(errno));
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.close();
  if (!out) throw fsdp::Error("error writing token file '" + path + "' (disk full?)");
}

std::string read_texts(const std::vector<std::string>& paths) {
  if (paths.empty()) throw fsdp::Error("no text files given; pass one or more with --text FILE...");
  std::string all;
  for (auto& p : paths) {
    std::string s = read_file_bytes(p, "text file", "check the path given to --text");
    if (s.empty()) throw fsdp::Error("text file '" + p + "' is empty; expected some text to train on");
    all += s;
  }
  return all;
}

Tokens encode(const std::string& text) {
  Tokens t(text.size());
  for (size_t i = 0; i < text.size(); i++) t[i] = uint8_t(text[i]);
  return t;
}

std::string decode(const Tokens& tokens) {
  std::string s(tokens.size(), '?');
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] < 256) s[i] = char(uint8_t(tokens[i]));
  return s;
}

Split split(const Tokens& all, double train_fraction) {
  const size_t n_train = size_t(double(all.size()) * train_fraction);
  Split s;
  s.train.assign(all.begin(), all.begin() + n_train);
  s.val.assign(all.begin() + n_train, all.end());
  return s;
}

Prepared prepare(const std::vector<std::string>& texts, const std::string& outdir) {
  Split s = split(encode(read_texts(texts)));
  std::error_code ec;
  std::filesystem::create_directories(outdir, ec);
  if (ec) throw fsdp::Error("cannot create output folder '" + outdir + "': " + ec.message());
  Prepared p;
  p.train_path = (std::filesystem::path(outdir) / "train.bin").string();
  p.val_path = (std::filesystem::path(outdir) / "val.bin").string();
  write_tokens(p.train_path, s.train);
  write_tokens(p.val_path, s.val);
  p.train_tokens = int64_t(s.train.size());
  p.val_tokens = int64_t(s.val.size());
  return p;
}

int64_t row_index(const Order& o, int64_t s, int64_t k, int64_t r, int64_t b) {
  return ((s * o.K + k) * o.N + r) * o.B + b;
}

int64_t row_offset(const Order& o, int64_t len, int64_t j) {
  if (len < o.T + 2)
    throw fsdp::Error("the token stream has " + std::to_string(len) + " tokens, too few for --seq " +
                      std::to_string(o.T) + " (a row needs T+1 tokens and the order needs len >= T+2 = " +
                      std::to_string(o.T + 2) + "); lower --seq or give more data");
  const uint64_t modulus = uint64_t(len - o.T - 1);
  if (o.shuffle) return int64_t(mix(o.seed ^ mix(uint64_t(j))) % modulus);
  // (j*T) mod m without overflow for any j we can reach: reduce both factors first.
  return int64_t(((uint64_t(j) % modulus) * (uint64_t(o.T) % modulus)) % modulus);
}

namespace {
Batch rows(const Tokens& tokens, const Order& o, int64_t first_j) {
  const int64_t len = int64_t(tokens.size());
  auto x = torch::empty({o.B, o.T}, torch::kLong);  // [B,T]
  auto y = torch::empty({o.B, o.T}, torch::kLong);  // [B,T]
  auto xa = x.accessor<int64_t, 2>();
  auto ya = y.accessor<int64_t, 2>();
  for (int64_t b = 0; b < o.B; b++) {
    const int64_t off = row_offset(o, len, first_j + b);
    for (int64_t t = 0; t < o.T; t++) {
      xa[b][t] = tokens[off + t];
      ya[b][t] = tokens[off + t + 1];
    }
  }
  return {x, y};
}
}  // namespace

Batch batch(const Tokens& tokens, const Order& o, int64_t s, int64_t k, int64_t r) {
  return rows(tokens, o, row_index(o, s, k, r, 0));
}

Batch eval_batch(const Tokens& tokens, const Order& o, int64_t e, int64_t r) {
  Order v = o;
  v.K = 1;
  v.shuffle = false;
  return rows(tokens, v, row_index(v, e, 0, r, 0));
}

}  // namespace gpt::data
