// PrefetchWaits: WAIT_PREFETCH_STATUS requests parked while their request's prefetch from
// the tiers runs (issue 11, finding 10).
//
// lmcache's WAIT_PREFETCH_STATUS(request_id, timeout) blocks until the lookup's prefetch
// has a result or the timeout passes (then nil). kvd holds no thread for it: the socket
// loop parks the request here with its deadline and answers it when the prefetch ends
// (the service's prefetch-done counter moves), when its session ends, or at the deadline.
// A parked wait costs its envelope frames and a few words, nothing else.
//
// Bounds: a timeout is clamped to [0, kMaxWaitSeconds] (NaN and negatives wait not at all);
// a connection parks at most kMaxPerConnection waits and all connections together at most
// kMaxWaits: beyond that a wait is answered at once (nil while the prefetch runs), as a
// QUERY_PREFETCH_STATUS would be.
//
// Envelope: whatever the caller needs to send the reply later (the request's zmq frames).
// Thread: the socket thread only (not thread-safe).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvd::server {

template <typename Envelope>
class PrefetchWaits {
 public:
  // lmcache's engine adapters wait up to their mq_timeout, 300 s by default.
  static constexpr double kMaxWaitSeconds = 300;
  static constexpr size_t kMaxPerConnection = 1024;
  static constexpr size_t kMaxWaits = 16384;

  // The deadline of a wait of `timeout_seconds` from `now_ns`.
  static int64_t DeadlineNs(int64_t now_ns, double timeout_seconds) {
    if (!(timeout_seconds > 0)) return now_ns;  // NaN, 0, negative: no wait
    const double t = std::min(timeout_seconds, kMaxWaitSeconds);
    return now_ns + static_cast<int64_t>(t * 1e9);
  }

  // False when a bound is reached: nothing is parked and `envelope` is left as it was.
  bool Park(std::string connection, std::string request_id, int64_t deadline_ns,
            Envelope&& envelope) {
    if (waits_.size() >= kMaxWaits) return false;
    auto it = per_connection_.find(connection);
    if (it != per_connection_.end() && it->second >= kMaxPerConnection) return false;
    if (it == per_connection_.end()) it = per_connection_.emplace(connection, 0).first;
    ++it->second;
    next_deadline_ns_ = std::min(next_deadline_ns_, deadline_ns);
    waits_.push_back(Wait{std::move(connection), std::move(request_id), deadline_ns,
                          std::move(envelope)});
    return true;
  }

  // Answers every wait whose request no longer runs a prefetch (`running(request_id)`
  // false) or whose deadline passed: `answer(request_id, envelope)` is called once for it
  // and it is forgotten. Waits are answered in the order they were parked.
  template <typename Running, typename Answer>
  void AnswerReady(int64_t now_ns, Running&& running, Answer&& answer) {
    size_t kept = 0;
    next_deadline_ns_ = INT64_MAX;
    for (size_t i = 0; i < waits_.size(); ++i) {
      Wait& w = waits_[i];
      if (now_ns < w.deadline_ns && running(std::string_view(w.request_id))) {
        next_deadline_ns_ = std::min(next_deadline_ns_, w.deadline_ns);
        if (kept != i) waits_[kept] = std::move(w);
        ++kept;
        continue;
      }
      answer(std::string_view(w.request_id), std::move(w.envelope));
      auto it = per_connection_.find(w.connection);
      if (it != per_connection_.end() && --it->second == 0) per_connection_.erase(it);
    }
    waits_.erase(waits_.begin() + static_cast<std::ptrdiff_t>(kept), waits_.end());
  }

  // The earliest deadline of a parked wait (INT64_MAX when none).
  int64_t NextDeadlineNs() const { return next_deadline_ns_; }
  size_t size() const { return waits_.size(); }
  bool empty() const { return waits_.empty(); }

 private:
  struct Wait {
    std::string connection;
    std::string request_id;
    int64_t deadline_ns = 0;
    Envelope envelope;
  };
  std::vector<Wait> waits_;
  std::unordered_map<std::string, size_t> per_connection_;  // parked waits per connection
  int64_t next_deadline_ns_ = INT64_MAX;                    // min deadline_ns of waits_
};

}  // namespace kvd::server
