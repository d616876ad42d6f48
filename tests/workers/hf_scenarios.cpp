// fsdp-cpp tests: rank-side logic of tests/test_hf.cpp — a Hugging Face
// Llama checkpoint (made by transformers) loaded into shards, fine-tuned and
// exported.
//
// hf_load DIR REF [STRATEGY]
//   builds the Llama of DIR/config.json under DeferredInit, wraps it (a unit
//   per decoder layer), load_hf(DIR), and prints on every rank
//   "HFLOAD rank=R bytes_read=.. header_bytes=.. data_bytes=.. direct_reads=.. elements=..
//    peak=.. shared_per_host=.. shared_rss=.. model_bytes=.. dir_header_bytes=.."
//   (peak: the counting allocator's high-water mark; shared_per_host: the
//   ledger's host-shared units, 0 when the units are not host-shared;
//   shared_rss: the shared memory this rank has touched, RssShmem); rank 0
//   computes the logits of REF's ids and prints "LOGITS max_abs_diff=%g max_abs=%g".
// hf_finetune DIR OUT OURS [DTYPE]
//   loads DIR as above, trains 10 AdamW steps on fixed batches, save_hf(OUT)
//   (DTYPE fp32 | bf16, config and tokenizer copied from DIR), writes the
//   logits of the fixed ids to OURS (rank 0) and prints "EXPORT rank=R
//   files=.. bytes_written=.. received=..", then loads OUT into a fresh model
//   and prints "RELOAD max_abs_diff=%g" (its logits against the trained one's).
// hf_mapped DIR OUT BUFFER
//   a model with a transposed proj [H, P] (HF: out [P, H]), a fused qkv
//   [3H, H] (HF: q, k, v [H, H]) and a renamed scale [H] in one unit, so the
//   ranks' slices start and end inside rows; load_hf(DIR) through the name
//   map in reads of BUFFER bytes, save_hf(OUT) under the HF names (fp32).
//   Rank 0 prints "MAPPED loaded_equal=0|1 exported_equal=0|1", each value
//   against DIR's tensors (read whole, as the reference), bit for bit.
// hf_load_dirs DIR_0 ... DIR_{N-1}
//   rank r loads DIR_r (an export of the two-tensor model below; the test
//   makes the ranks' copies differ) and prints "LOADED rank=R" or
//   "LOADFAIL rank=R seconds=S <the message on one line>".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "fsdp/fsdp.h"
#include "fsdp/hf.h"
#include "llama/model.h"
#include "proc_status.h"
#include "scenario.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

using Model = Sharded<std::shared_ptr<llama::LlamaForCausalLMImpl>>;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The Llama of dir/config.json, built without memory and sharded with zeros
// (load_hf gives every value).
Model build(const CommPtr& comm, const llama::Config& cfg, const std::string& strategy) {
  llama::LlamaForCausalLM net{nullptr};
  {
    DeferredInit deferred;
    net = llama::LlamaForCausalLM(cfg);
  }
  FsdpOptions o;
  o.strategy = parse_strategy(strategy);
  o.wrap = WrapPolicy::module_type<llama::DecoderLayerImpl>("DecoderLayer");
  o.param_init = zeros_for_loading();
  return fully_shard(net.ptr(), comm, o);
}

HfLoadResult load(Model& model, const std::string& dir, const llama::Config& cfg) {
  HfLoadOptions lo;
  lo.expect_config = cfg.hf_identity();
  return load_hf(*model, dir, lo);
}

FSDP_SCENARIO(hf_load) {
  const std::string dir = args.at(0), ref = args.at(1);
  auto comm = make_communicator_from_env();
  const auto cfg = llama::Config::from_hf(read_json(dir + "/config.json"));
  Model model = build(comm, cfg, args.size() > 2 ? args[2] : "full");
  const auto r = load(model, dir, cfg);
  const auto st = memory::stats();
  // Host-shared units (one host) keep the masters in memory every local rank
  // maps, outside the counting allocator: what this rank holds of them is
  // the pages it touched.
  const int64_t shared_per_host = model->ledger().shared_per_host;
  const int64_t shared_rss = status_bytes("RssShmem");
  int64_t dir_headers = 0;
  for (auto& f : ckpt::read_hf_directory(dir).files) dir_headers += f.header_bytes;
  std::printf("HFLOAD rank=%d bytes_read=%lld header_bytes=%lld data_bytes=%lld direct_reads=%lld elements=%lld "
              "peak=%lld shared_per_host=%lld shared_rss=%lld model_bytes=%lld dir_header_bytes=%lld files=%d\n",
              comm->rank(), (long long)r.bytes_read, (long long)r.header_bytes,
              (long long)(r.bytes_read - r.header_bytes), (long long)r.direct_reads, (long long)r.elements,
              (long long)st.high_water, (long long)shared_per_host, (long long)shared_rss,
              (long long)(cfg.num_params() * 4), (long long)dir_headers, r.files);
  ckpt::SafetensorsReader refs(ref);
  auto ids = refs.read_all("ids");
  torch::NoGradGuard ng;
  auto logits = model.forward(ids);  // collective
  if (comm->rank() == 0) {
    auto want = refs.read_all("logits");
    std::printf("LOGITS max_abs_diff=%.9g max_abs=%.6g\n", (logits - want).abs().max().item<double>(),
                want.abs().max().item<double>());
  }
  std::fflush(stdout);
  return 0;
}

FSDP_SCENARIO(hf_finetune) {
  const std::string dir = args.at(0), out = args.at(1), ours = args.at(2);
  const std::string dtype = args.size() > 3 ? args[3] : "fp32";
  auto comm = make_communicator_from_env();
  const int N = comm->world_size(), rank = comm->rank();
  const auto cfg = llama::Config::from_hf(read_json(dir + "/config.json"));
  Model model = build(comm, cfg, "full");
  load(model, dir, cfg);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
  for (int step = 0; step < 10; ++step) {
    // The global batch of step s, seeded by s, split over the ranks.
    torch::manual_seed(900 + step);
    auto X = torch::randint(cfg.vocab, {6, 17}, torch::kLong);
    const int64_t b = 6 / N;
    auto x = X.narrow(0, rank * b, b);
    opt.zero_grad();
    auto loss = llama::loss(model.forward(x.narrow(1, 0, 16)), x.narrow(1, 1, 16));
    loss.backward();
    opt.step();
  }
  HfSaveOptions so;
  so.dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  so.copy_from = dir;
  so.max_shard_size = 16 << 10;
  const auto w = save_hf(*model, out, so);
  std::printf("EXPORT rank=%d files=%d tensors=%d bytes_written=%lld total_bytes=%lld received=%lld\n", rank, w.files,
              w.tensors, (long long)w.bytes_written, (long long)w.total_bytes, (long long)w.elements_received);
  torch::NoGradGuard ng;
  auto ids = ((torch::arange(2 * 16, torch::kLong) * 7 + 3) % cfg.vocab).reshape({2, 16});
  auto logits = model.forward(ids);
  if (rank == 0)
    ckpt::write_full_safetensors(ours, {{"ids", {2, 16}, torch::kLong}, {"logits", logits.sizes().vec(), torch::kFloat32}},
                                 [&](const ckpt::TensorSpec& s) { return s.name == "ids" ? ids : logits.contiguous(); });
  // The export, loaded back at this world size: the same model (fp32).
  Model again = build(comm, cfg, "full");
  load(again, out, cfg);
  auto logits2 = again.forward(ids);
  if (rank == 0) std::printf("RELOAD max_abs_diff=%.9g\n", (logits2 - logits).abs().max().item<double>());
  std::fflush(stdout);
  return 0;
}

// proj first and largest: at 2 and 3 ranks a slice boundary lies inside one
// of its rows (5976 = 28 x 211 + 68; 3984 = 18 x 211 + 186), and at 3 one
// inside a row of qkv (7968 - 7807 = 4 x 37 + 13).
constexpr int64_t kH = 37, kP = 211;

struct MappedImpl : torch::nn::Module {
  MappedImpl() {
    proj = register_parameter("proj", torch::zeros({kH, kP}));
    qkv = register_parameter("qkv", torch::zeros({3 * kH, kH}));
    scale = register_parameter("scale", torch::zeros({kH}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor qkv, proj, scale;
};

HfNameMap mapped_names() {
  HfNameMap names;
  names.rules = {{"qkv", {{"attn.q.weight", false, 0, kH}, {"attn.k.weight", false, 0, kH},
                          {"attn.v.weight", false, 0, kH}}},
                 {"proj", {{"attn.out.weight", true}}},
                 {"(s)cale", {{"ln.gain"}}}};
  return names;
}

FSDP_SCENARIO(hf_mapped) {
  const std::string dir = args.at(0), out = args.at(1);
  auto comm = make_communicator_from_env();
  auto model = fully_shard(std::make_shared<MappedImpl>(), comm, FsdpOptions{});
  HfLoadOptions lo;
  lo.names = mapped_names();
  lo.buffer_bytes = std::stoll(args.at(2));
  load_hf(*model, dir, lo);
  const auto full = model->full_state(0);  // collective
  HfSaveOptions so;
  so.names = mapped_names();
  so.dtype = torch::kFloat32;
  so.fsync = false;
  save_hf(*model, out, so);  // collective
  if (comm->rank() == 0) {
    // The reference: DIR's tensors read whole, in fp32.
    std::map<std::string, torch::Tensor> hf;
    for (auto& f : ckpt::read_hf_directory(dir).files)
      for (auto& e : f.reader->entries()) hf[e.name] = f.reader->read_all(e.name).reshape(e.shape).to(torch::kFloat32);
    std::map<std::string, torch::Tensor> want = {
        {"qkv", torch::cat({hf.at("attn.q.weight"), hf.at("attn.k.weight"), hf.at("attn.v.weight")})},
        {"proj", hf.at("attn.out.weight").t()},
        {"scale", hf.at("ln.gain")}};
    bool loaded = full.size() == want.size();
    for (auto& [n, t] : full) loaded = loaded && want.count(n) && torch::equal(t, want.at(n));
    bool exported = true;
    size_t found = 0;
    for (auto& f : ckpt::read_hf_directory(out).files)
      for (auto& e : f.reader->entries()) {
        ++found;
        exported = exported && e.dtype == torch::kFloat32 && hf.count(e.name) &&
                   torch::equal(f.reader->read_all(e.name).reshape(e.shape), hf.at(e.name));
      }
    std::printf("MAPPED loaded_equal=%d exported_equal=%d\n", int(loaded), int(exported && found == hf.size()));
    std::fflush(stdout);
  }
  return 0;
}

// The model of hf_load_dirs: tests/test_hf.cpp exports one like it.
struct TwoImpl : torch::nn::Module {
  TwoImpl() {
    w = register_parameter("w", torch::zeros({6, 5}));
    b = register_parameter("b", torch::zeros({7}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor w, b;
};

FSDP_SCENARIO(hf_load_dirs) {
  auto comm = make_communicator_from_env();
  const std::string dir = args.at(static_cast<size_t>(comm->rank()));
  auto model = fully_shard(std::make_shared<TwoImpl>(), comm, FsdpOptions{});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    load_hf(*model, dir);
    std::printf("LOADED rank=%d\n", comm->rank());
  } catch (const Error& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::printf("LOADFAIL rank=%d seconds=%.3f %s\n", comm->rank(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), what.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
