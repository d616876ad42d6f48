// fsdp-cpp: the books of each collective (see call_log.h).
#include "comm/call_log.h"

#include "comm/rendezvous.h"

namespace fsdp::comm {

Counters::Counters() : own_(std::make_shared<Box>()) {}

Counters Counters::child_of(const Counters& parent) {
  Counters c;
  c.ancestors_ = parent.ancestors_;
  c.ancestors_.push_back(parent.own_);
  return c;
}

CommCounters Counters::snapshot() const {
  std::lock_guard<std::mutex> lock(own_->mu);
  return own_->c;
}

void Counters::reset() {
  std::lock_guard<std::mutex> lock(own_->mu);
  own_->c = {};
}

void Counters::add(CollectiveKind kind, const std::function<void(CommCounters::Entry&)>& f) {
  auto add_to = [&](Box& b) {
    std::lock_guard<std::mutex> lock(b.mu);
    f(b.c[kind]);
  };
  add_to(*own_);
  for (auto& a : ancestors_) add_to(*a);
}

CallLog::CallLog(int comm, Rendezvous* rdv, Counters counters)
    : comm_(comm), rdv_(rdv), counters_(std::move(counters)) {}

uint64_t CallLog::issued(const CallShape& shape) {
  return flight::enqueue(comm_, to_string(shape.kind), shape.label,
                         shape.kind == CollectiveKind::BARRIER ? "" : dtype_name(shape.dtype), shape.numel,
                         shape.numel * shape.elem_size);
}

// The store hears of the entry before the flight recorder: the send is
// complete when record_entered returns, and the kernel delivers it even if
// this rank stops right after.
uint64_t CallLog::enter(const std::string& what) {
  ++seq_;
  if (rdv_) rdv_->record_entered(seq_, what);
  return seq_;
}

CallLog::Entered::Entered(CallLog& log, const CallShape& shape, uint64_t ticket)
    : what(describe_call(shape)),
      seq(log.enter(what)),
      progress(flight::start(ticket, seq)),
      span(to_string(shape.kind), "comm"),
      start(Clock::now()) {
  if (span.active()) span.arg("unit", shape.label).arg("seq", seq);
}

void CallLog::finished(uint64_t ticket, const std::string& error) { flight::finish(ticket, error); }

void CallLog::count(CollectiveKind kind, int64_t bytes, int64_t inter_host_bytes, double seconds,
                    int64_t inter_host_logical) {
  counters_.add(kind, [&](CommCounters::Entry& e) {
    e.calls += 1;
    e.bytes_sent += bytes;
    e.bytes_inter_host += inter_host_bytes;
    e.bytes_inter_host_logical += inter_host_logical >= 0 ? inter_host_logical : inter_host_bytes;
    e.seconds += seconds;
  });
}

void CallLog::add_seconds(CollectiveKind kind, double seconds) {
  counters_.add(kind, [&](CommCounters::Entry& e) { e.seconds += seconds; });
}

}  // namespace fsdp::comm
