// fsdp-cpp: writes the valid half of the fuzz seed corpus with our own writers.
//   make_seed_corpus OUT_DIR   -> OUT_DIR/safetensors/*, OUT_DIR/metadata/*
// The broken seeds next to them in fuzz/corpus/ are made by hand (see README).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/metadata.h"
#include "fsdp/checkpoint.h"

namespace ck = fsdp::ckpt;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seed_corpus OUT_DIR\n");
    return 2;
  }
  std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out / "safetensors");
  std::filesystem::create_directories(out / "metadata");

  // Two small files: several dtypes, an empty tensor, metadata strings.
  {
    std::vector<ck::TensorSpec> specs = {{"w", {2, 3}, torch::kFloat32},
                                         {"b", {3}, torch::kBFloat16},
                                         {"empty", {0, 4}, torch::kFloat16},
                                         {"step", {}, torch::kInt64}};
    ck::SafetensorsWriter w((out / "safetensors" / "valid_mixed.safetensors").string(), specs,
                            {{"format", "pt"}, {"note", "seed"}}, /*fsync=*/false);
    w.write(torch::arange(6, torch::kFloat32));
    w.write(torch::ones({3}, torch::kBFloat16));
    w.write(torch::tensor({int64_t(7)}));
    w.finish();
  }
  {
    ck::SafetensorsWriter w((out / "safetensors" / "valid_one.safetensors").string(),
                            {{"layer.0.weight", {4}, torch::kUInt8}}, {}, false);
    w.write(torch::arange(4, torch::kUInt8));
    w.finish();
  }

  // metadata.json of a 2-rank checkpoint, as merge_rank_indexes builds it.
  std::vector<ck::detail::RankIndex> ranks(2);
  for (int r = 0; r < 2; ++r) {
    auto& ri = ranks[r];
    ri.file.name = ck::detail::rank_file_name(r, 2);
    ri.file.rank = r;
    ri.file.bytes = 100;
    ri.file.crc32c = 0x1234 + r;
    ri.file.chunk_bytes = 1 << 20;
    ri.file.chunk_crc32c = {0x1234u + r};
    auto [lo, hi] = ck::shard_range(10, r, 2);
    ri.entries.push_back({"model", "fc.weight", "model/fc.weight", {2, 5}, torch::kFloat32, lo, hi});
    ri.entries.push_back({"optim", "fc.weight.exp_avg", "optim/fc.weight.exp_avg", {2, 5}, torch::kFloat32, lo, hi});
  }
  auto m = ck::detail::merge_rank_indexes(ranks, 10, "FULL_SHARD", {{"step", 10}, {"data_pos", 640}});
  std::string text = m.dump();
  // Mode byte of fuzz_metadata: '1' fixes the checksum up, '0' keeps it.
  std::ofstream((out / "metadata" / "valid_fixsum.json").string()) << '1' << text;
  std::ofstream((out / "metadata" / "valid_keepsum.json").string()) << '0' << text;
  std::ofstream((out / "metadata" / "valid_rank_index.json").string()) << '0' << ranks[1].to_json().dump();
  std::printf("seed corpus written to %s\n", out.string().c_str());
  return 0;
}
