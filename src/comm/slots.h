// fsdp-cpp: the Gloo message slots, one table.
// defines: slots::Range, slots::kStepBits, slots::slot, the named ranges
//
// A mesh matches a message by (peer, slot) (mesh.h). A slot is
// `seq << kStepBits | step`: the collective's sequence number, then a step
// that names one message of it. Only the low 31 bits travel (c10d's tag), so
// sequence numbers 2^11 apart share slots; a collective's messages are all
// taken before its ranks can be that far apart.
//
// Every algorithm that sends takes its steps from one range below, so the
// messages of two algorithms that can run under one sequence number never
// match each other's. The ranges of each group are checked apart at compile
// time; a new kind of message gets a range here, never a number of its own.
#pragma once

#include <cstdint>

namespace fsdp::comm::slots {

constexpr int kStepBits = 20;
constexpr int kSteps = 1 << kStepBits;

// Steps [begin, end).
struct Range {
  int begin, end;
  constexpr int size() const { return end - begin; }
  // The same range from `offset` steps in (a second phase of one algorithm).
  constexpr Range from(int offset) const { return {begin + offset, end}; }
  constexpr bool apart(Range o) const { return end <= o.begin || o.end <= begin; }
  constexpr bool valid() const { return 0 <= begin && begin < end && end <= kSteps; }
};

// The slot of `step` in collective `seq`.
constexpr uint64_t slot(uint64_t seq, int step) { return (seq << kStepBits) | static_cast<uint64_t>(step); }

// --- Sequence number 0: a communicator being set up, on its own mesh,
// before its first collective (choose_transport, connect_tiers).
constexpr Range kTransportHello{0, 1 << 17};                       // every rank's mode, host and probe address
constexpr Range kTransportProbe{1 << 17, (1 << 17) + (1 << 16)};   // every rank's probe outcome
constexpr Range kTiersAgree{(1 << 17) + (1 << 16), 1 << 18};       // whether every host can use CMA
// Host-shared memory (host_shared.cpp): the probe, its outcome, the
// control segment's descriptor, every rank's "mapped" of it. Its
// collectives send no message: they meet in the control segment.
constexpr Range kShareSetup{1 << 18, (1 << 18) + 4};

// --- Sequence numbers >= 1: the messages of one collective.
// The ring all-gather's pieces (all_reduce's gather phase from step N, after
// its reduce-scatter's), and the direct algorithms' steps (broadcast,
// gather, barrier), which never share a sequence number with a ring.
constexpr Range kRing{0, 1 << 18};
constexpr Range kRingReduce{1 << 18, 1 << 19};                     // the ring reduce-scatter's pieces
constexpr Range kCallCheck{1 << 19, (1 << 19) + (1 << 18)};        // FSDP_DEBUG=detail: the call records
// Cross-memory attach: post, reduced, done (cma.cpp). A composed all_reduce
// (tiers.cpp) runs two CMA exchanges under one sequence number: the second
// takes kCmaSecond.
constexpr int kCmaMessages = 3;
constexpr Range kCma{(1 << 19) + (1 << 18), (1 << 19) + (1 << 18) + kCmaMessages};
constexpr Range kCmaSecond{kCma.end, kCma.end + kCmaMessages};

// A replica link's point-to-point copies (replicas/link.h: a heal), numbered per
// pair of ranks; its all-reduces take the rings' steps.
constexpr Range kPeerCopy{kCmaSecond.end, kCmaSecond.end + 1};

static_assert(kPeerCopy.valid() && kPeerCopy.apart(kRing) && kPeerCopy.apart(kRingReduce),
              "a replica link's copies must not meet its all-reduces");

// Quantized collectives (quantized.h): the ring all-gather of the quantized
// bytes, in pieces (as kRing's), and the quantized reduce-scatter's
// all-to-all, one message per pair of ranks (matched by peer and slot).
constexpr Range kQuantGather{kPeerCopy.end, kPeerCopy.end + (1 << 17)};
constexpr Range kQuantExchange{kQuantGather.end, kQuantGather.end + 1};

static_assert(kQuantGather.valid() && kQuantExchange.valid() && kQuantGather.apart(kQuantExchange),
              "the quantized collectives' two ranges must not meet");
static_assert(kQuantGather.apart(kRing) && kQuantGather.apart(kRingReduce) && kQuantGather.apart(kCallCheck) &&
                  kQuantGather.apart(kCma) && kQuantGather.apart(kCmaSecond) && kQuantGather.apart(kPeerCopy),
              "the quantized all-gather's steps must not meet another algorithm's");
static_assert(kQuantExchange.apart(kRing) && kQuantExchange.apart(kRingReduce) &&
                  kQuantExchange.apart(kCallCheck) && kQuantExchange.apart(kCma) &&
                  kQuantExchange.apart(kCmaSecond) && kQuantExchange.apart(kPeerCopy),
              "the quantized reduce-scatter's steps must not meet another algorithm's");
static_assert(kTransportHello.valid() && kTransportProbe.valid() && kTiersAgree.valid());
static_assert(kShareSetup.valid() && kShareSetup.apart(kTransportHello) && kShareSetup.apart(kTransportProbe) &&
                  kShareSetup.apart(kTiersAgree),
              "the host-shared set-up at sequence number 0 must not share steps");
static_assert(kTransportHello.apart(kTransportProbe) && kTransportHello.apart(kTiersAgree) &&
                  kTransportProbe.apart(kTiersAgree),
              "the set-up exchanges at sequence number 0 must not share steps");
static_assert(kRing.valid() && kRingReduce.valid() && kCallCheck.valid() && kCma.valid() && kCmaSecond.valid());
static_assert(kRing.apart(kRingReduce) && kRing.apart(kCallCheck) && kRing.apart(kCma) && kRing.apart(kCmaSecond),
              "the rings' steps must not meet another algorithm's");
static_assert(kRingReduce.apart(kCallCheck) && kRingReduce.apart(kCma) && kRingReduce.apart(kCmaSecond),
              "the reduce-scatter's steps must not meet another algorithm's");
static_assert(kCallCheck.apart(kCma) && kCallCheck.apart(kCmaSecond) && kCma.apart(kCmaSecond),
              "the call check's and CMA's steps must not meet");

}  // namespace fsdp::comm::slots
