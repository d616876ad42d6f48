// The Llama fine-tuning run (see train.h): checkpoint in, steps, checkpoint
// out, in the order they happen.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "fsdp/comm.h"
#include "fsdp/deferred.h"
#include "fsdp/hf.h"
#include "fsdp/memory.h"
#include "fsdp/optim.h"
#include "gpt/data.h"
#include "llama/model.h"
#include "llama/train.h"
#include "usage.h"

namespace llama {
namespace {

using Clock = std::chrono::steady_clock;
using Model = fsdp::Sharded<std::shared_ptr<LlamaForCausalLMImpl>>;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Config read_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) throw fsdp::Error("llama: '" + dir + "/config.json' cannot be read; --hf expects a Hugging Face model "
                             "directory (config.json, model.safetensors.index.json, model-*.safetensors).");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) throw fsdp::Error("llama: '" + dir + "/config.json' is not valid JSON");
  return Config::from_hf(j);
}

// The module tree without memory, sharded one decoder layer per unit (the
// root holds the embedding, the final norm and lm_head); every value then
// comes from the checkpoint, each rank reading its shards' bytes.
Model build(const Args& a, const fsdp::CommPtr& comm, const Config& cfg) {
  LlamaForCausalLM net{nullptr};
  {
    fsdp::DeferredInit deferred;
    net = LlamaForCausalLM(cfg);
  }
  fsdp::FsdpOptions o;
  o.strategy = fsdp::parse_strategy(a.strategy);
  o.wrap = fsdp::WrapPolicy::module_type<DecoderLayerImpl>("DecoderLayer");
  if (a.dtype == "bf16") o.mixed_precision.param_dtype = torch::kBFloat16;
  o.param_init = fsdp::zeros_for_loading();  // load_hf writes every value: only the shards are made
  o.backward_prefetch = fsdp::BackwardPrefetch::BACKWARD_PRE;
  o.forward_prefetch = true;
  return fsdp::fully_shard(net.ptr(), comm, o);
}

}  // namespace

int finetune(const Args& a) {
  auto comm = fsdp::make_communicator_from_env();
  const int rank = comm->rank(), N = comm->world_size();
  const bool lead = rank == 0;
  const int threads = a.threads ? a.threads
                                : std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, comm->local_world_size()));
  torch::set_num_threads(threads);
  const Config cfg = read_config(a.hf);
  const auto tokens = gpt::data::read_tokens(a.data, cfg.vocab);
  const gpt::data::Order order{a.seq, a.batch, 1, N, false, 0};
  gpt::data::row_offset(order, int64_t(tokens.size()), 0);  // throws: data shorter than --seq
  if (lead) std::printf("llama: %s, %d rank%s, %s\n", cfg.str().c_str(), N, N == 1 ? "" : "s", a.strategy.c_str());

  auto t0 = Clock::now();
  Model model = build(a, comm, cfg);
  const double build_s = since(t0);
  t0 = Clock::now();
  fsdp::HfLoadOptions lo;
  lo.expect_config = cfg.hf_identity();
  lo.direct_io = !a.buffered;
  if (!a.load_buffer.empty()) lo.buffer_bytes = fsdp::cli::parse_bytes(a.load_buffer);
  const fsdp::HfLoadResult in = fsdp::load_hf(*model, a.hf, lo);
  const double load_s = since(t0);
  const auto mem = fsdp::memory::stats();
  const int64_t rss = fsdp::memory::process_peak_rss();
  const int64_t start_rss = fsdp::memory::process_memory().at_start;  // libtorch and the runtime, before any tensor
  // Host-shared units (one host) keep the masters in the host's one copy,
  // outside the allocator: this rank's share of it.
  const fsdp::Ledger ledger = model->ledger();
  const int64_t shared = ledger.host_ranks > 0 ? ledger.shared_per_host / ledger.host_ranks : 0;
  const std::string tensors = fsdp::memory::format_bytes(mem.high_water) +
                              (shared > 0 ? " + host-shared " + fsdp::memory::format_bytes(shared) : "");
  std::printf("load: rank %d read %s (%s of headers) of %d files in %.2f s (built in %.2f s); peak tensors %s, peak "
              "RSS %s (%s of it resident at start; the model: %s) | build_seconds=%.3f load_seconds=%.3f "
              "bytes_read=%lld direct_reads=%lld peak_rss=%lld start_rss=%lld model_bytes=%lld\n",
              rank, fsdp::memory::format_bytes(in.bytes_read).c_str(), fsdp::memory::format_bytes(in.header_bytes).c_str(),
              in.files, load_s, build_s, tensors.c_str(),
              fsdp::memory::format_bytes(rss).c_str(), fsdp::memory::format_bytes(start_rss).c_str(),
              fsdp::memory::format_bytes(cfg.num_params() * 4).c_str(), build_s, load_s, (long long)in.bytes_read,
              (long long)in.direct_reads, (long long)rss, (long long)start_rss, (long long)(cfg.num_params() * 4));
  std::fflush(stdout);

  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay));
  t0 = Clock::now();
  for (int64_t step = 0; step < a.steps; ++step) {
    const auto b = gpt::data::batch(tokens, order, step, 0, rank);  // x, y [B,T]
    opt.zero_grad();
    auto loss = llama::loss(model.forward(b.x), b.y);
    loss.backward();
    const double norm = a.clip > 0 ? model->clip_grad_norm(a.clip) : 0.0;
    opt.step();
    const double mean = fsdp::all_reduce_mean(*comm, loss.item<double>(), {"train loss"});
    if (lead && (step % a.log_every == 0 || step + 1 == a.steps))
      std::printf("step %4lld | loss %.4f | norm %7.3f | %.2f s\n", (long long)step, mean, norm, since(t0)),
          std::fflush(stdout);
  }
  if (!a.export_dir.empty()) {
    fsdp::HfSaveOptions so;
    so.dtype = a.export_dtype == "fp32" ? torch::kFloat32 : torch::kBFloat16;
    so.max_shard_size = fsdp::cli::parse_bytes(a.max_shard_size);
    so.copy_from = a.hf;
    const auto out = fsdp::save_hf(*model, a.export_dir, so);
    std::printf("export: rank %d wrote %s in %.2f s (%s received from other ranks) | export_seconds=%.3f\n", rank,
                fsdp::memory::format_bytes(out.bytes_written).c_str(), out.seconds,
                fsdp::memory::format_bytes(out.elements_received * int64_t(c10::elementSize(so.dtype))).c_str(),
                out.seconds);
    if (lead)
      std::printf("exported %d tensors in %d files (%s) to %s\n", out.tensors, out.files,
                  fsdp::memory::format_bytes(out.total_bytes).c_str(), a.export_dir.c_str());
    std::fflush(stdout);
  }
  if (!a.export_gathered.empty()) {
    comm->barrier()->wait();
    const auto g0 = Clock::now();
    const auto dt = a.export_dtype == "fp32" ? torch::kFloat32 : torch::kBFloat16;
    auto full = model->full_state(0);  // collective: every tensor on rank 0
    if (lead) {
      std::vector<fsdp::ckpt::TensorSpec> specs;
      for (auto& [n, t] : full) specs.push_back({n, t.sizes().vec(), dt});
      size_t k = 0;
      fsdp::ckpt::write_full_safetensors(a.export_gathered, specs,
                                         [&](const fsdp::ckpt::TensorSpec&) { return full[k++].second.to(dt); });
    }
    comm->barrier()->wait();
    if (lead) std::printf("export gathered to rank 0: %.2f s | gathered_seconds=%.3f\n", since(g0), since(g0));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace llama
