// One fixed-size message to and from every peer of a mesh, on one slot: the
// handshake of the collectives that touch a peer's memory. The CMA
// collectives (cma.cpp) post where a peer reads and say when they are done
// reading; the host-shared set-up (host_shared.cpp) posts the descriptors a
// peer maps (its collectives meet in shared memory instead). Internal: not
// installed.
// defines: PostExchange
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/mesh.h"
#include "comm/ring.h"
#include "fsdp/detail/errors.h"
#include "observe/flight_hooks.h"

namespace fsdp::comm {

// One message `msg` of collective w.seq, to and from every peer, on `slot`.
// T is trivially copyable and has `seq` and `msg` fields: a peer whose
// message carries others runs another collective, and the wait says so.
// Receives are posted at construction, so a peer's early message always has
// a home. Waiting peer by peer from rank + 1 names the one that failed. The
// table outlives every outstanding operation (waited for, or destroyed only
// after the mesh failed for good).
template <class T>
class PostExchange {
  static_assert(std::is_trivially_copyable_v<T>, "a posted message is sent as its bytes");

 public:
  PostExchange(const Wire& w, uint64_t slot, int64_t msg)
      : w_(w), slot_(slot), msg_(msg), n_(w.mesh->size), r_(w.mesh->rank), table_(n_), recv_(n_) {
    for (int q = 0; q < n_; ++q)
      if (q != r_) recv_[q] = post_recv(w, q, slot_, &table_[q], sizeof(T));
  }

  // Sends `mine` (its seq and msg set to this exchange's) to every peer;
  // it is the table's entry for this rank.
  void send(T mine) {
    mine.seq = w_.seq;
    mine.msg = msg_;
    table_[r_] = mine;
    for (int q = 0; q < n_; ++q)
      if (q != r_) send_.push_back(post_send(w_, q, slot_, &table_[r_], sizeof(T)));
  }

  // Every peer's message, `what` in the words of a failure's message;
  // `context` (optional) adds where this rank stood, e.g. " (host-shared
  // memory)".
  const std::vector<T>& wait(const char* what, const std::function<std::string()>& context = {}) {
    for (int i = 1; i < n_; ++i) {
      const int q = (r_ + i) % n_;
      if (w_.progress) w_.progress->wait_on(w_.name(q), flight::Progress::RECEIVE);
      try {
        if (!recv_[q].wait(remaining(w_))) throw std::runtime_error("receive aborted");
      } catch (const std::exception& e) {
        throw std::runtime_error(
            detail::cat("waiting for ", what, " of rank ", w_.name(q), context ? context() : std::string(), ": ",
                        e.what()));
      }
      if (w_.progress) w_.progress->idle();
      const T& p = table_[q];
      if (p.seq != w_.seq || p.msg != msg_)
        throw std::runtime_error(detail::cat("rank ", w_.name(q), " sent message ", p.msg, " of collective #", p.seq,
                                             " where this rank expected ", what, " of #", w_.seq,
                                             ": the ranks issued different collectives"));
    }
    return table_;
  }

  // The sends, once they left (before `mine`'s memory may change).
  void wait_sent() {
    for (auto& t : send_)
      if (!t.wait(remaining(w_))) throw std::runtime_error("send aborted");
    send_.clear();
  }

 private:
  Wire w_;
  uint64_t slot_;
  int64_t msg_;
  int n_, r_;
  std::vector<T> table_;
  std::vector<Transfer> recv_;
  std::vector<Transfer> send_;
};

}  // namespace fsdp::comm
