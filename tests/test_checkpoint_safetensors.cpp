// fsdp-cpp tests: the safetensors writer and the defensive reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "fsdp/checkpoint.h"
#include "test_checkpoint_util.h"
#include "test_util.h"

namespace fsdp::ckpt {
namespace FSDP_TEST_ID {

// Removed when the test ends (fsdp::testing::temp_dir).
std::string safetensors_dir(const std::string& tag) { return fsdp::testing::temp_dir("ckpt-" + tag); }

void write_raw(const std::string& path, const std::string& header_json, const std::string& data,
               int64_t len_override = -1) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header_json.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header_json << data;
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsReader r(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointSafetensors, RoundTripEveryDtype) {
  auto d = safetensors_dir("st_dtypes");
  std::vector<torch::ScalarType> types = {torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kFloat64,
                                          torch::kInt64,   torch::kInt32,    torch::kInt16,   torch::kInt8,
                                          torch::kUInt8,   torch::kBool};
  std::vector<TensorSpec> specs;
  std::vector<torch::Tensor> ts;
  for (size_t i = 0; i < types.size(); ++i) {
    auto t = torch::arange(0, 15, torch::kFloat64).remainder(static_cast<int64_t>(i + 2)).to(types[i]).reshape({3, 5});
    specs.push_back({"t" + std::to_string(i), {3, 5}, types[i]});
    ts.push_back(t);
  }
  specs.push_back({"empty", {0, 4}, torch::kFloat32});
  ts.push_back(torch::zeros({0, 4}));
  specs.push_back({"scalar", {}, torch::kFloat32});
  ts.push_back(torch::tensor(3.5f));
  size_t k = 0;
  int64_t bytes = write_full_safetensors(d + "/a.safetensors", specs, [&](const TensorSpec&) { return ts[k++]; },
                                         {{"note", "hello"}});
  SafetensorsReader r(d + "/a.safetensors");
  EXPECT_EQ(r.file_size(), bytes);
  EXPECT_EQ(r.header_bytes() % 8, 0) << "data section must be 8-byte aligned";
  EXPECT_EQ(r.metadata().at("note"), "hello");
  for (size_t i = 0; i < specs.size(); ++i) {
    auto got = r.read_all(specs[i].name);
    EXPECT_EQ(got.scalar_type(), ts[i].scalar_type()) << specs[i].name;
    EXPECT_TRUE(torch::equal(got, ts[i])) << specs[i].name;
  }
  EXPECT_FALSE(std::ifstream(d + "/a.safetensors.tmp").good()) << "temp file left behind";
}

TEST(CheckpointSafetensors, RangeReadReturnsOnlyThoseElements) {
  auto d = safetensors_dir("st_range");
  auto t = torch::randn({37, 11});
  write_full_safetensors(d + "/r.safetensors", {{"w", {37, 11}, torch::kFloat32}},
                         [&](const TensorSpec&) { return t; });
  SafetensorsReader r(d + "/r.safetensors");
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 407}, {5, 6}, {100, 333}, {406, 407}})
    EXPECT_TRUE(torch::equal(r.read("w", lo, hi), t.reshape(-1).slice(0, lo, hi)));
  EXPECT_THROW(r.read("w", 400, 408), Error);
  EXPECT_THROW(r.read("nope", 0, 1), Error);
}

TEST(CheckpointSafetensors, StreamingWriterTakesPartsAndChecksSizes) {
  auto d = safetensors_dir("st_stream");
  {
    SafetensorsWriter w(d + "/s.safetensors", {{"a", {10}, torch::kFloat32}, {"b", {4}, torch::kInt64}});
    w.write(torch::arange(0, 4, torch::kFloat32));
    w.write(torch::arange(4, 10, torch::kFloat32));
    EXPECT_THROW(w.write(torch::zeros({5}, torch::kInt64)), Error);  // b holds 4
    EXPECT_THROW(w.write(torch::zeros({2}, torch::kFloat32)), Error);  // wrong dtype
    w.write(torch::arange(0, 4, torch::kInt64));
    w.finish();
  }
  SafetensorsReader r(d + "/s.safetensors");
  EXPECT_TRUE(torch::equal(r.read_all("a"), torch::arange(0, 10, torch::kFloat32)));
  {
    SafetensorsWriter w(d + "/incomplete.safetensors", {{"a", {10}, torch::kFloat32}});
    w.write(torch::zeros({3}));
    EXPECT_THROW(w.finish(), Error);
  }
  EXPECT_FALSE(std::ifstream(d + "/incomplete.safetensors").good());
  EXPECT_FALSE(std::ifstream(d + "/incomplete.safetensors.tmp").good()) << "abandoned writer must clean up";
}

TEST(CheckpointSafetensors, ReaderRejectsDamagedHeaders) {
  auto d = safetensors_dir("st_bad");
  auto p = d + "/x.safetensors";
  std::string eight(8, '\0');

  { std::ofstream(p, std::ios::binary) << "abc"; }
  EXPECT_NE(open_error(p).find("expected at least 8"), std::string::npos) << open_error(p);

  write_raw(p, "{}", "", 1000);  // header length beyond the file
  EXPECT_NE(open_error(p).find("only 2 bytes follow"), std::string::npos) << open_error(p);

  write_raw(p, "{\"a\": [1,2", "");
  EXPECT_NE(open_error(p).find("not a valid JSON object"), std::string::npos) << open_error(p);

  write_raw(p, R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", "xx");
  EXPECT_NE(open_error(p).find("dtype \"F8_E4M3\" is not supported"), std::string::npos) << open_error(p);

  write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight);
  EXPECT_NE(open_error(p).find("needs 12 bytes but data_offsets span 8"), std::string::npos) << open_error(p);

  write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight);  // truncated data
  EXPECT_NE(open_error(p).find("within the data section [0, 8)"), std::string::npos) << open_error(p);

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight);
  EXPECT_NE(open_error(p).find("overlap"), std::string::npos) << open_error(p);

  write_raw(p, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight);
  EXPECT_NE(open_error(p).find("field \"shape\": expected an array of non-negative integers, found [-2] (an array)"),
            std::string::npos)
      << open_error(p);

  write_raw(p, R"({"__metadata__":{"k":1}})", "");
  EXPECT_NE(open_error(p).find("\"__metadata__\" entry 'k': expected a string, found 1 (a number)"), std::string::npos)
      << open_error(p);

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2]}})", eight);
  EXPECT_NE(open_error(p).find("data_offsets"), std::string::npos) << open_error(p);

  // Every message names the file.
  EXPECT_NE(open_error(p).find(p), std::string::npos);
}

// A value of the wrong JSON type is one clear error naming the file, the
// tensor, the key, the type expected and what is there (never a raw JSON
// library exception).
TEST(CheckpointSafetensors, AValueOfTheWrongTypeNamesTheFileTheKeyAndTheTypeExpected) {
  auto d = safetensors_dir("st_types");
  auto p = d + "/x.safetensors";
  const std::string eight(8, '\0');
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})",
       "tensor 'a': field \"dtype\": expected a string (a dtype name such as \"F32\"), found 7 (a number)"},
      {R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})",
       "tensor 'a': field \"shape\": expected an array of non-negative integers, found \"2\" (a string)"},
      {R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
       "tensor 'a': field \"shape\": expected an array of non-negative integers, found [2.5] (an array)"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})",
       "tensor 'a': field \"data_offsets\": expected an array of two non-negative integers [begin, end], found [8] "
       "(an array)"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})",
       "tensor 'a': field \"data_offsets\": expected an array of two non-negative integers [begin, end], found "
       "[\"0\",\"8\"] (an array)"},
      {R"({"a":{"dtype":"F32","shape":[2]}})",
       "tensor 'a': field \"data_offsets\": expected an array of two non-negative integers [begin, end], found "
       "nothing (the field is absent)"},
      {R"({"a":[1,2]})", "tensor 'a': expected an object {\"dtype\", \"shape\", \"data_offsets\"}, found [1,2] (an array)"},
      {R"({"__metadata__":"pt"})", "\"__metadata__\": expected an object of strings, found \"pt\" (a string)"},
  };
  for (auto& [header, want] : cases) {
    write_raw(p, header, eight);
    const std::string e = open_error(p);
    EXPECT_NE(e.find("safetensors file '" + p + "': " + want), std::string::npos) << header << "\n" << e;
    EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  }
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::ckpt
