// fsdp-cpp tests: the quantized all-gather and reduce-scatter (src/comm/quantized.*) at N = 2, 3
// and 4 ranks, each a process (FSDP_IN_RANKS: the body runs in every rank, on a Gloo mesh of its
// own, the algorithms called directly). Every rank's input is computable on every rank, so each
// result is compared bit for bit with a local reference that quantizes every rank's block (chunk)
// the same way and sums the decoded chunks in fp32 in rank order; the bytes sent are the formula's.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/checks.h"
#include "comm/mesh.h"
#include "comm/quantized.h"
#include "comm/rendezvous.h"
#include "comm/world_env.h"
#include "fsdp/comm.h"
#include "fsdp/config.h"
#include "test_util.h"

namespace FSDP_TEST_ID {

using fsdp::comm::QuantFormat;
using fsdp::comm::QuantKind;
using fsdp::comm::QuantTraffic;
using fsdp::comm::wire_bytes;

// The launcher's ranks on one Gloo mesh, as a communicator's own, without
// a communicator: collectives numbered 1, 2, ... as a communicator would.
class RawMesh {
 public:
  RawMesh() {
    const auto env = fsdp::config::read_env();
    world_ = fsdp::comm::world_of(env);
    opts_ = fsdp::comm::resolve_options({}, env);
    rdv_ = std::make_unique<fsdp::comm::Rendezvous>(world_, opts_);
    mesh_ = rdv_->connect_gloo(opts_.ifname);
  }
  ~RawMesh() {
    mesh_.reset();
    rdv_->leave(std::chrono::seconds(20));
  }
  fsdp::comm::Wire wire() {
    fsdp::comm::Wire w;
    w.mesh = mesh_.get();
    w.seq = ++seq_;
    w.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    return w;
  }
  int rank() const { return mesh_->rank; }
  int size() const { return mesh_->size; }

 private:
  fsdp::comm::WorldEnv world_;
  fsdp::comm::ResolvedOptions opts_;
  std::unique_ptr<fsdp::comm::Rendezvous> rdv_;
  std::shared_ptr<fsdp::comm::Mesh> mesh_;
  uint64_t seq_ = 0;
};

// Rank q's input of case `salt`: magnitudes that vary across blocks.
torch::Tensor input_of(int q, int64_t n, int salt, c10::ScalarType dt) {
  torch::manual_seed(7919 * salt + q);
  return (torch::randn({n}) * torch::exp(torch::randn({n}) * 2)).to(dt);
}

// The decoded form of x, as every rank decodes it, in `dt`.
torch::Tensor round_trip(const torch::Tensor& x, const QuantFormat& f, c10::ScalarType dt) {
  return fsdp::comm::dequantize(fsdp::comm::quantize(x, f), f, x.numel()).to(dt);
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Equal blocks {0, 1, 7, 1000, 65539} and uneven ones: the ring's chunks of
// 1, N-1 (tensors smaller than N: some ranks hold nothing), 1001 and 773,
// and a ragged list.
std::vector<std::vector<int64_t>> count_cases(int n) {
  std::vector<std::vector<int64_t>> cases;
  for (int64_t m : {0, 1, 7, 1000, 65539}) cases.push_back(std::vector<int64_t>(n, m));
  for (int64_t numel : {int64_t(1), int64_t(n - 1), int64_t(1001), int64_t(3 * 256 + 5)})
    cases.push_back(fsdp::comm::ring_chunks(numel, n).count);
  std::vector<int64_t> ragged;
  for (int q = 0; q < n; ++q) ragged.push_back((q * 389 + 11) % 600);
  cases.push_back(ragged);
  return cases;
}

std::vector<QuantFormat> formats() {
  return {{QuantKind::INT8, 256, c10::kFloat},
          {QuantKind::INT4, 7, c10::kBFloat16},
          {QuantKind::FP8_E4M3, 64, c10::kFloat},
          {QuantKind::INT8, 1, c10::kBFloat16}};
}

std::string describe(const QuantFormat& f, const std::vector<int64_t>& counts, c10::ScalarType dt) {
  std::string s = f.describe() + " " + c10::toString(dt) + " counts";
  for (int64_t c : counts) s += " " + std::to_string(c);
  return s;
}

void expect_reference_bit_for_bit() {
  RawMesh mesh;
  const int n = mesh.size(), r = mesh.rank();
  int salt = 0;
  for (const QuantFormat& f : formats())
    for (const auto& counts : count_cases(n))
      for (c10::ScalarType dt : {c10::kFloat, c10::kBFloat16}) {
        ++salt;
        const std::string what = describe(f, counts, dt);
        const int64_t total = sum(counts), es = static_cast<int64_t>(c10::elementSize(dt));
        // all_gather: block q is rank q's input, decoded.
        {
          auto out = torch::full({total}, 99.0, dt);
          QuantTraffic t = fsdp::comm::quantized_all_gather(mesh.wire(), input_of(r, counts[r], salt, dt), out,
                                                            counts, f);
          std::vector<torch::Tensor> blocks;
          for (int q = 0; q < n; ++q) blocks.push_back(round_trip(input_of(q, counts[q], salt, dt), f, dt));
          EXPECT_TRUE(torch::equal(out, torch::cat(blocks))) << "all_gather " << what;
          int64_t wire = 0;
          for (int q = 0; q < n; ++q)
            if (q != (r + 1) % n) wire += wire_bytes(f, counts[q]);
          EXPECT_EQ(t.wire, wire) << "all_gather " << what;
          EXPECT_EQ(t.logical, (total - counts[(r + 1) % n]) * es) << "all_gather " << what;
        }
        // reduce_scatter, SUM and a mean: chunk r of every rank's input,
        // decoded, added in fp32 in rank order, divided once.
        for (int divisor : {1, n}) {
          const int64_t lo = sum(std::vector<int64_t>(counts.begin(), counts.begin() + r));
          auto out = torch::full({counts[r]}, 99.0, dt);
          QuantTraffic t = fsdp::comm::quantized_reduce_scatter(mesh.wire(), input_of(r, total, salt + 1000, dt),
                                                                out, counts, f, divisor);
          torch::Tensor acc;
          for (int q = 0; q < n; ++q) {
            auto d = round_trip(input_of(q, total, salt + 1000, dt).slice(0, lo, lo + counts[r]), f, torch::kFloat);
            acc = q == 0 ? d : acc + d;
          }
          if (divisor > 1) acc = acc / divisor;
          EXPECT_TRUE(torch::equal(out, acc.to(dt))) << "reduce_scatter /" << divisor << " " << what;
          int64_t wire = 0;
          for (int q = 0; q < n; ++q)
            if (q != r) wire += wire_bytes(f, counts[q]);
          EXPECT_EQ(t.wire, wire) << "reduce_scatter " << what;
          EXPECT_EQ(t.logical, (total - counts[r]) * es) << "reduce_scatter " << what;
        }
      }
  // One case by its numbers: 1000 fp32 per rank, int8 with an fp32 scale per
  // 256: 1000 + 4 x 4 = 1016 bytes a block against 4000; int4 with bf16
  // scales, 500 + 4 x 2. (127 and 7 are their formats' qmax: scale 1, exact.)
  auto out = torch::empty({n * 1000});
  QuantTraffic t = fsdp::comm::quantized_all_gather(mesh.wire(), torch::full({1000}, 127.0f), out, 1000,
                                                    {QuantKind::INT8, 256, c10::kFloat});
  EXPECT_EQ(t.wire, (n - 1) * 1016);
  EXPECT_EQ(t.logical, (n - 1) * 4000);
  EXPECT_TRUE(torch::equal(out, torch::full({n * 1000}, 127.0f)));
  auto rs = torch::empty({1000});
  t = fsdp::comm::quantized_reduce_scatter(mesh.wire(), torch::full({n * 1000}, 7.0f), rs, 1000,
                                           {QuantKind::INT4, 256, c10::kBFloat16}, n);
  EXPECT_EQ(t.wire, (n - 1) * (500 + 4 * 2));
  EXPECT_EQ(t.logical, (n - 1) * 4000);
  EXPECT_TRUE(torch::equal(rs, torch::full({1000}, 7.0f)));
}

TEST(QuantComm, EqualsTheLocalReferenceBitForBitAt2Ranks) {
  FSDP_IN_RANKS(2);
  expect_reference_bit_for_bit();
}
TEST(QuantComm, EqualsTheLocalReferenceBitForBitAt3Ranks) {
  FSDP_IN_RANKS(3);
  expect_reference_bit_for_bit();
}
TEST(QuantComm, EqualsTheLocalReferenceBitForBitAt4Ranks) {
  FSDP_IN_RANKS(4);
  expect_reference_bit_for_bit();
}

// A non-finite gradient is refused before any byte moves, on the rank
// that holds it, by quantize's message. (One rank: no peer waits on it.)
TEST(QuantComm, NonFiniteInputIsRefusedBeforeSending) {
  FSDP_IN_RANKS(1);
  RawMesh mesh;
  auto in = torch::ones({8});
  in[5] = std::numeric_limits<float>::quiet_NaN();
  auto out = torch::empty({8});
  try {
    fsdp::comm::quantized_reduce_scatter(mesh.wire(), in, out, 8, {QuantKind::INT8, 4, c10::kFloat}, 1);
    FAIL() << "a NaN must be refused";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("element 5 of 8 (block 1, its element 1) is nan"), std::string::npos)
        << e.what();
  }
}

// A peer that never enters: the all-to-all's wait ends at the call's
// deadline with an error naming the rank it waited for, not a hang.
TEST(QuantComm, APeerThatNeverSendsIsNamedAtTheDeadline) {
  FSDP_IN_RANKS(2);
  RawMesh mesh;
  if (mesh.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // past rank 0's deadline
    return;
  }
  auto w = mesh.wire();
  w.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  auto out = torch::empty({4});
  try {
    fsdp::comm::quantized_reduce_scatter(w, torch::ones({8}), out, 4, {QuantKind::INT8, 4, c10::kFloat}, 1);
    FAIL() << "a peer that never sends must fail the call at its deadline";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("waiting to receive the quantized chunk of rank 1"), std::string::npos)
        << e.what();
  }
}

// ------------------------------------------------------ quantized all_reduce
// The reference of quantized_all_reduce over `inputs` (every rank's, in
// rank order), as quantized.h specifies it: chunks of ring_chunks; each
// rank's input (plus its residual) quantized per chunk in `gf`; chunk c the
// decoded contributions summed in fp32 in rank order, divided once; the
// owner's sum (plus its "gather" residual) quantized in `af`; every rank
// decodes it into the dtype. `res`, `res_gather`: the residuals of each rank
// (undefined: none yet), updated when `feedback`.
struct AllReduceReference {
  std::vector<torch::Tensor> res, res_gather;
  explicit AllReduceReference(int n) : res(n), res_gather(n) {}

  torch::Tensor run(const std::vector<torch::Tensor>& inputs, const QuantFormat& gf, const QuantFormat& af,
                    int divisor, bool feedback) {
    const int n = static_cast<int>(inputs.size());
    const auto c = fsdp::comm::ring_chunks(inputs[0].numel(), n);
    std::vector<std::vector<torch::Tensor>> decoded(n);  // [q][chunk]
    for (int q = 0; q < n; ++q) {
      torch::Tensor meant = inputs[q].to(torch::kFloat);
      if (feedback && res[q].defined()) meant = meant + res[q];
      for (int k = 0; k < n; ++k)
        decoded[q].push_back(round_trip(meant.slice(0, c.offset[k], c.offset[k] + c.count[k]), gf, torch::kFloat));
      if (feedback) res[q] = meant - torch::cat(decoded[q]);
    }
    std::vector<torch::Tensor> out;
    for (int k = 0; k < n; ++k) {
      torch::Tensor acc = decoded[0][k].clone();
      for (int q = 1; q < n; ++q) acc = acc + decoded[q][k];
      if (divisor > 1) acc = acc / divisor;
      if (feedback && res_gather[k].defined()) acc = acc + res_gather[k];
      const torch::Tensor d = round_trip(acc, af, torch::kFloat);
      if (feedback) res_gather[k] = acc - d;
      out.push_back(d);
    }
    return torch::cat(out).to(inputs[0].scalar_type());
  }
};

// quantized_all_reduce equals the reference bit for bit on every rank (so
// every rank holds the same bits), for sizes that cut uneven chunks and
// tensors smaller than N, fp32 and bf16, SUM and a mean; three calls in a
// row under one key with error feedback carry both residuals; the bytes
// sent are the formula's (quantized.h).
void expect_all_reduce_reference() {
  RawMesh mesh;
  const int n = mesh.size(), r = mesh.rank();
  const QuantFormat af{QuantKind::INT8, 256, c10::kFloat};
  int salt = 5000;
  for (const QuantFormat& gf : {QuantFormat{QuantKind::INT8, 256, c10::kFloat}, QuantFormat{QuantKind::INT4, 7,
                                                                                            c10::kBFloat16}})
    for (int64_t numel : {int64_t(0), int64_t(1), int64_t(n - 1), int64_t(1001), int64_t(3 * 256 * n + 5)})
      for (c10::ScalarType dt : {c10::kFloat, c10::kBFloat16})
        for (int divisor : {1, n})
          for (bool feedback : {false, true}) {
            const std::string what = gf.describe() + " " + c10::toString(dt) + " numel " + std::to_string(numel) +
                                     " /" + std::to_string(divisor) + (feedback ? " feedback" : "");
            fsdp::comm::ErrorFeedback ef;
            AllReduceReference ref(n);
            for (int call = 0; call < (feedback ? 3 : 1); ++call) {
              ++salt;
              std::vector<torch::Tensor> inputs;
              for (int q = 0; q < n; ++q) inputs.push_back(input_of(q, numel, salt, dt));
              auto data = inputs[r].clone();
              QuantTraffic t = fsdp::comm::quantized_all_reduce(mesh.wire(), data, gf, af, divisor,
                                                                feedback ? &ef : nullptr, "unit [x]");
              const torch::Tensor want = ref.run(inputs, gf, af, divisor, feedback);
              EXPECT_TRUE(torch::equal(data, want)) << what << " call " << call;
              const auto c = fsdp::comm::ring_chunks(numel, n);
              int64_t wire = 0;
              for (int q = 0; q < n; ++q) {
                if (q != r) wire += wire_bytes(gf, c.count[q]);
                if (q != (r + 1) % n) wire += wire_bytes(af, c.count[q]);
              }
              EXPECT_EQ(t.wire, wire) << what;
              const int64_t es = static_cast<int64_t>(c10::elementSize(dt));
              EXPECT_EQ(t.logical, (2 * numel - c.count[r] - c.count[(r + 1) % n]) * es) << what;
            }
            // The residuals are this rank's: its input's and its chunk's.
            EXPECT_EQ(ef.state().size(), feedback ? 2u : 0u) << what;
            if (feedback) {
              EXPECT_TRUE(torch::equal(ef.state().at("unit [x]"), ref.res[r])) << what;
              EXPECT_TRUE(torch::equal(ef.state().at("unit [x] gather"), ref.res_gather[r])) << what;
              if (numel > 1000) EXPECT_GT(ref.res[r].abs().max().item<float>(), 0.0f) << what;
            }
          }
}

TEST(QuantComm, AllReduceEqualsTheLocalReferenceBitForBitAt2Ranks) {
  FSDP_IN_RANKS(2);
  expect_all_reduce_reference();
}
TEST(QuantComm, AllReduceEqualsTheLocalReferenceBitForBitAt3Ranks) {
  FSDP_IN_RANKS(3);
  expect_all_reduce_reference();
}
TEST(QuantComm, AllReduceEqualsTheLocalReferenceBitForBitAt4Ranks) {
  FSDP_IN_RANKS(4);
  expect_all_reduce_reference();
}

// ------------------------------------------------ compressed tiers (stage 2)
// The communicator with FSDP_COMPRESS on, at 2 hosts x 2 ranks (FSDP_HOST_ID:
// ranks 0, 1 on host a, 2, 3 on host b; rank q has local index q % 2 and is
// inter rank q / 2 of its local index's ring). A compressible all_gather
// equals every rank's block quantized and decoded; a compressible
// reduce_scatter equals, per host, the fp32 sum of its two ranks' chunks
// (two addends: either order gives the same bits; bf16 rounded once) plus that
// forwarding rank's residual, quantized per destination chunk, decoded and
// added over the hosts in fp32 in host order, divided once; three calls
// under one label carry the residual from call to call. Counters: the
// quantized bytes on the wire across hosts, the uncompressed ones as
// logical, the intra tier's as without compression. A call not marked
// compressible stays exact. fp32 and bf16.
void expect_compressed_tiers(fsdp::Communicator& c4, const char* compress, const QuantFormat& wf,
                             const QuantFormat& gf, c10::ScalarType dt) {
  auto* comm = &c4;
  const int r = comm->rank();
  const int n = 4, H = 2, S = 2;
  const int64_t m = 1003;  // 3 blocks and a short one
  const int64_t es = static_cast<int64_t>(c10::elementSize(dt));
  const std::string what = std::string(compress) + " " + c10::toString(dt);
  using fsdp::CollectiveKind;

  // all_gather, compressible: every block decoded, this rank's too.
  comm->reset_counters();
  auto out = torch::full({n * m}, 99.0, dt);
  comm->all_gather(input_of(r, m, 1, dt), out, {"unit.ag", true})->wait();
  std::vector<torch::Tensor> blocks;
  for (int q = 0; q < n; ++q) blocks.push_back(round_trip(input_of(q, m, 1, dt), wf, dt));
  EXPECT_TRUE(torch::equal(out, torch::cat(blocks))) << what << " all_gather";
  auto c = comm->counters()[CollectiveKind::ALL_GATHER];
  EXPECT_EQ(c.bytes_inter_host, (H - 1) * wire_bytes(wf, m)) << what;
  EXPECT_EQ(c.bytes_inter_host_logical, (H - 1) * m * es) << what;
  EXPECT_EQ(c.bytes_intra_host(), (S - 1) * H * m * es) << what;

  // all_gather, not compressible: exact, counted as without compression.
  comm->reset_counters();
  comm->all_gather(input_of(r, m, 2, dt), out, {"exact"})->wait();
  for (int q = 0; q < n; ++q) blocks[q] = input_of(q, m, 2, dt);
  EXPECT_TRUE(torch::equal(out, torch::cat(blocks))) << what << " exact all_gather";
  c = comm->counters()[CollectiveKind::ALL_GATHER];
  EXPECT_EQ(c.bytes_inter_host, (H - 1) * m * es) << what;
  EXPECT_EQ(c.bytes_inter_host_logical, c.bytes_inter_host) << what;

  // reduce_scatter (AVG), three calls under one label: error feedback.
  const int s = r % S, me = r / S;
  std::vector<torch::Tensor> residual(H, torch::zeros({H * m}));  // of the rank of local index s on host h
  for (int call = 0; call < 3; ++call) {
    const int salt = 100 + call;
    comm->reset_counters();
    auto mine = torch::full({m}, 99.0, dt);
    comm->reduce_scatter(input_of(r, n * m, salt, dt), mine, fsdp::ReduceOp::AVG, {"unit.rs", true})
        ->wait();
    torch::Tensor acc;
    for (int h = 0; h < H; ++h) {
      // Host h's sums of the chunks its rank of local index s forwards:
      // the chunks of ranks j * S + s, j = 0..H-1 (the inter ring's order).
      std::vector<torch::Tensor> sums;
      for (int j = 0; j < H; ++j) {
        const int64_t at = (j * S + s) * m;
        // Added in fp32, rounded once to the dtype (as the CMA sum does).
        sums.push_back((input_of(h * S, n * m, salt, dt).slice(0, at, at + m).to(torch::kFloat) +
                        input_of(h * S + 1, n * m, salt, dt).slice(0, at, at + m).to(torch::kFloat))
                           .to(dt)
                           .to(torch::kFloat));
      }
      const torch::Tensor meant = torch::cat(sums) + residual[h];
      std::vector<torch::Tensor> decoded;
      for (int j = 0; j < H; ++j)
        decoded.push_back(round_trip(meant.slice(0, j * m, (j + 1) * m), gf, torch::kFloat));
      const torch::Tensor sent = torch::cat(decoded);
      residual[h] = meant - sent;
      const torch::Tensor d = decoded[me];
      acc = h == 0 ? d.clone() : acc + d;
    }
    acc = (acc / n).to(dt);
    EXPECT_TRUE(torch::equal(mine, acc)) << what << " reduce_scatter call " << call << ": max diff "
                                         << (mine.to(torch::kFloat) - acc.to(torch::kFloat)).abs().max().item<float>();
    c = comm->counters()[CollectiveKind::REDUCE_SCATTER];
    EXPECT_EQ(c.bytes_inter_host, (H - 1) * wire_bytes(gf, m)) << what;
    EXPECT_EQ(c.bytes_inter_host_logical, (H - 1) * m * es) << what;
    EXPECT_EQ(c.bytes_intra_host(), (S - 1) * H * m * es) << what;
  }
  // The residual is not zero after a call (the last one changed it), so the
  // three calls above did test the feedback.
  EXPECT_GT(residual[me].abs().max().item<float>(), 0.0f);

  // all_reduce (AVG), twice under one label: chunk s of ring_chunks(numel,
  // S) summed inside each host (fp32, rounded once to the dtype), then the
  // quantized all_reduce of the H host sums (AllReduceReference, divided by
  // the world size), every rank the whole result.
  const int64_t numel = 2 * m + 1;
  const auto cs = fsdp::comm::ring_chunks(numel, S);
  std::vector<AllReduceReference> refs(S, AllReduceReference(H));
  for (int call = 0; call < 2; ++call) {
    const int salt = 200 + call;
    auto data = input_of(r, numel, salt, dt);
    comm->reset_counters();
    comm->all_reduce(data, fsdp::ReduceOp::AVG, {"unit.ar", true})->wait();
    std::vector<torch::Tensor> chunks;
    for (int k = 0; k < S; ++k) {
      std::vector<torch::Tensor> host_sums;
      for (int h = 0; h < H; ++h)
        host_sums.push_back((input_of(h * S, numel, salt, dt).to(torch::kFloat) +
                             input_of(h * S + 1, numel, salt, dt).to(torch::kFloat))
                                .slice(0, cs.offset[k], cs.offset[k] + cs.count[k])
                                .to(dt));
      chunks.push_back(refs[k].run(host_sums, gf, {QuantKind::INT8, 256, c10::kFloat}, n, true));
    }
    EXPECT_TRUE(torch::equal(data, torch::cat(chunks))) << what << " all_reduce call " << call;
    const auto e = fsdp::comm::ring_chunks(cs.count[s], H);
    int64_t wire = 0;
    for (int j = 0; j < H; ++j) {
      if (j != me) wire += wire_bytes(gf, e.count[j]);
      if (j != (me + 1) % H) wire += wire_bytes({QuantKind::INT8, 256, c10::kFloat}, e.count[j]);
    }
    c = comm->counters()[CollectiveKind::ALL_REDUCE];
    EXPECT_EQ(c.bytes_inter_host, wire) << what << " all_reduce";
    EXPECT_EQ(c.bytes_inter_host_logical, (2 * cs.count[s] - e.count[me] - e.count[(me + 1) % H]) * es)
        << what << " all_reduce";
  }
}

// One communicator per test (FSDP_COMPRESS is read when it is made).
std::shared_ptr<fsdp::Communicator> compressed_world(const char* compress) {
  const int r = std::atoi(std::getenv("RANK"));
  setenv("FSDP_HOST_ID", r < 2 ? "quant-host-a" : "quant-host-b", 1);
  setenv("FSDP_COMPRESS", compress, 1);
  return fsdp::make_communicator_from_env();
}

TEST(QuantComm, TiersCompressedInt8EqualTheLocalReferenceBitForBit) {
  if (!std::getenv("FSDP_RANK_TEST") && !fsdp::testing::cma_available())
    GTEST_SKIP() << "this host forbids process_vm_readv";
  FSDP_IN_RANKS(4);
  auto comm = compressed_world("int8");
  ASSERT_NE(comm->describe().find("cma+tcp tiers world=4"), std::string::npos) << comm->describe();
  for (c10::ScalarType dt : {c10::kFloat, c10::kBFloat16})
    expect_compressed_tiers(*comm, "int8", {QuantKind::INT8, 256, c10::kFloat}, {QuantKind::INT8, 256, c10::kFloat},
                            dt);
}
TEST(QuantComm, TiersCompressedInt4EqualTheLocalReferenceBitForBit) {
  if (!std::getenv("FSDP_RANK_TEST") && !fsdp::testing::cma_available())
    GTEST_SKIP() << "this host forbids process_vm_readv";
  FSDP_IN_RANKS(4);
  auto comm = compressed_world("int4");
  ASSERT_NE(comm->describe().find("cma+tcp tiers world=4"), std::string::npos) << comm->describe();
  for (c10::ScalarType dt : {c10::kFloat, c10::kBFloat16})
    expect_compressed_tiers(*comm, "int4", {QuantKind::INT8, 256, c10::kFloat}, {QuantKind::INT4, 256, c10::kFloat},
                            dt);
}

// ------------------------------------------------ compressed flat ring
// The communicator with FSDP_COMPRESS on and every rank on a host of its own
// (FSDP_HOST_ID): the flat TCP ring, compressed (path::choose), every byte
// across a host. A compressible all_gather equals every rank's block
// quantized and decoded; a compressible reduce_scatter (AVG) equals every
// rank's input plus its residual quantized per chunk, decoded, summed in
// fp32 in rank order, divided once; a compressible all_reduce equals
// AllReduceReference. Three calls under one label carry the residuals
// (FSDP_COMPRESS_FEEDBACK on), or keep none (off: the same inputs give the
// same outputs every call). Counters: bytes_inter_host is all of
// bytes_sent, the quantized bytes (quantized.h's formulas), below
// bytes_inter_host_logical, the exact ring's. A call not marked
// compressible stays exact.
void expect_compressed_flat_ring(fsdp::Communicator& comm, const QuantFormat& wf, const QuantFormat& gf,
                                 c10::ScalarType dt, bool feedback) {
  using fsdp::CollectiveKind;
  const int n = comm.world_size(), r = comm.rank();
  const int64_t m = 1003, es = static_cast<int64_t>(c10::elementSize(dt));
  const std::string what = gf.describe() + " " + c10::toString(dt) + (feedback ? " feedback" : " no feedback");
  auto expect_counted = [&](CollectiveKind k, int64_t wire, int64_t logical, const std::string& call) {
    const auto c = comm.counters()[k];
    EXPECT_EQ(c.bytes_sent, wire) << what << " " << call;
    EXPECT_EQ(c.bytes_inter_host, wire) << what << " " << call;
    EXPECT_EQ(c.bytes_inter_host_logical, logical) << what << " " << call;
    EXPECT_LT(c.bytes_inter_host, c.bytes_inter_host_logical) << what << " " << call;
  };

  // all_gather, compressible: every block decoded, this rank's too.
  comm.reset_counters();
  auto out = torch::full({n * m}, 99.0, dt);
  comm.all_gather(input_of(r, m, 1, dt), out, {"unit.ag", true})->wait();
  std::vector<torch::Tensor> blocks;
  for (int q = 0; q < n; ++q) blocks.push_back(round_trip(input_of(q, m, 1, dt), wf, dt));
  EXPECT_TRUE(torch::equal(out, torch::cat(blocks))) << what << " all_gather";
  expect_counted(CollectiveKind::ALL_GATHER, (n - 1) * wire_bytes(wf, m), (n - 1) * m * es, "all_gather");

  // all_gather, not compressible: exact, counted as without compression.
  comm.reset_counters();
  comm.all_gather(input_of(r, m, 2, dt), out, {"exact"})->wait();
  for (int q = 0; q < n; ++q) blocks[q] = input_of(q, m, 2, dt);
  EXPECT_TRUE(torch::equal(out, torch::cat(blocks))) << what << " exact all_gather";
  auto c = comm.counters()[CollectiveKind::ALL_GATHER];
  EXPECT_EQ(c.bytes_inter_host, (n - 1) * m * es) << what;
  EXPECT_EQ(c.bytes_inter_host_logical, c.bytes_inter_host) << what;

  // reduce_scatter (AVG) and all_reduce (AVG), three calls each under one
  // label; without feedback the same inputs every call.
  std::vector<torch::Tensor> residual(n);
  AllReduceReference ref(n);
  std::vector<torch::Tensor> first_rs, first_ar;
  for (int call = 0; call < 3; ++call) {
    const int salt = feedback ? 100 + call : 100;
    comm.reset_counters();
    auto mine = torch::full({m}, 99.0, dt);
    comm.reduce_scatter(input_of(r, n * m, salt, dt), mine, fsdp::ReduceOp::AVG, {"unit.rs", true})->wait();
    torch::Tensor acc;
    for (int q = 0; q < n; ++q) {
      torch::Tensor meant = input_of(q, n * m, salt, dt).to(torch::kFloat);
      if (feedback && residual[q].defined()) meant = meant + residual[q];
      std::vector<torch::Tensor> decoded;
      for (int j = 0; j < n; ++j) decoded.push_back(round_trip(meant.slice(0, j * m, (j + 1) * m), gf, torch::kFloat));
      if (feedback) residual[q] = meant - torch::cat(decoded);
      acc = q == 0 ? decoded[r].clone() : acc + decoded[r];
    }
    acc = (acc / n).to(dt);
    EXPECT_TRUE(torch::equal(mine, acc)) << what << " reduce_scatter call " << call;
    expect_counted(CollectiveKind::REDUCE_SCATTER, (n - 1) * wire_bytes(gf, m), (n - 1) * m * es, "reduce_scatter");

    const int64_t numel = n * m + 1;  // uneven chunks
    std::vector<torch::Tensor> inputs;
    for (int q = 0; q < n; ++q) inputs.push_back(input_of(q, numel, salt + 50, dt));
    auto data = inputs[r].clone();
    comm.reset_counters();
    comm.all_reduce(data, fsdp::ReduceOp::AVG, {"unit.ar", true})->wait();
    EXPECT_TRUE(torch::equal(data, ref.run(inputs, gf, {QuantKind::INT8, 256, c10::kFloat}, n, feedback)))
        << what << " all_reduce call " << call;
    const auto ch = fsdp::comm::ring_chunks(numel, n);
    int64_t wire = 0;
    for (int q = 0; q < n; ++q) {
      if (q != r) wire += wire_bytes(gf, ch.count[q]);
      if (q != (r + 1) % n) wire += wire_bytes({QuantKind::INT8, 256, c10::kFloat}, ch.count[q]);
    }
    expect_counted(CollectiveKind::ALL_REDUCE, wire, (2 * numel - ch.count[r] - ch.count[(r + 1) % n]) * es,
                   "all_reduce");
    // Without feedback nothing carries over: every call the first's bits.
    if (call == 0) {
      first_rs.push_back(mine);
      first_ar.push_back(data);
    } else if (!feedback) {
      EXPECT_TRUE(torch::equal(mine, first_rs[0])) << what;
      EXPECT_TRUE(torch::equal(data, first_ar[0])) << what;
    }
  }
  if (feedback) EXPECT_GT(residual[r].abs().max().item<float>(), 0.0f) << what;
}

// One communicator per test (the variables are read when it is made).
std::shared_ptr<fsdp::Communicator> one_rank_per_host(const char* compress, const char* feedback) {
  setenv("FSDP_HOST_ID", (std::string("quant-flat-host-") + std::getenv("RANK")).c_str(), 1);
  setenv("FSDP_COMPRESS", compress, 1);
  setenv("FSDP_COMPRESS_FEEDBACK", feedback, 1);
  return fsdp::make_communicator_from_env();
}

TEST(QuantComm, FlatRingOfOneRankPerHostCompressedInt8EqualsTheReferenceBitForBit) {
  FSDP_IN_RANKS(2);
  auto comm = one_rank_per_host("int8", "on");
  ASSERT_NE(comm->describe().find("gloo/tcp world=2"), std::string::npos) << comm->describe();
  for (c10::ScalarType dt : {c10::kFloat, c10::kBFloat16})
    expect_compressed_flat_ring(*comm, {QuantKind::INT8, 256, c10::kFloat}, {QuantKind::INT8, 256, c10::kFloat}, dt,
                                true);
}
TEST(QuantComm, FlatRingOfOneRankPerHostCompressedInt4At3RanksEqualsTheReferenceBitForBit) {
  FSDP_IN_RANKS(3);
  auto comm = one_rank_per_host("int4", "on");
  ASSERT_NE(comm->describe().find("gloo/tcp world=3"), std::string::npos) << comm->describe();
  expect_compressed_flat_ring(*comm, {QuantKind::INT8, 256, c10::kFloat}, {QuantKind::INT4, 256, c10::kFloat},
                              c10::kFloat, true);
}
TEST(QuantComm, FlatRingWithoutErrorFeedbackKeepsNoResidual) {
  FSDP_IN_RANKS(2);
  auto comm = one_rank_per_host("fp8", "off");
  for (c10::ScalarType dt : {c10::kFloat, c10::kBFloat16})
    expect_compressed_flat_ring(*comm, {QuantKind::FP8_E4M3, 256, c10::kFloat}, {QuantKind::INT8, 256, c10::kFloat},
                                dt, false);
}

}  // namespace FSDP_TEST_ID
