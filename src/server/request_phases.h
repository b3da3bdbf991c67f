// Request phases: where a request's server time goes, for the per-phase series in /metrics
// (kvd_request_phase_seconds) and the per-request debug log line that explain a slow one.
//
//   queue   received on the socket loop -> a lane/pool thread starts it (0: run inline)
//   decode  the wire decoders            hash  chunk keys of the tokens
//   index   L1 lookups, reservations, pins (and the locks they take)
//   copy    the copy engine's Submit (its lock, the copy, an inline commit)
//   reply   reply ready -> handed to the socket (the loop's batching of replies)
// queue..copy fall inside kvd_request_duration_seconds; reply comes after it.
//
// The thread handling a request accumulates phase time in a thread-local PhaseTotals
// (ScopedPhase marks a region; AddPhase adds a time measured elsewhere); the socket loop
// takes the totals when the request is done and hands them to RequestMetrics::RecordPhases.
// A region nested in another of the same request counts in both (keep phases disjoint where
// they are marked). Costs two steady_clock reads per region; no lock, no allocation.
//
// Threads: each thread has its own totals; Take/Reset act on the calling thread's only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace kvd::server {

enum class Phase : uint8_t { kDecode, kHash, kIndex, kCopy, kQueue, kReply };
inline constexpr size_t kNumPhases = 6;
inline constexpr std::array<const char*, kNumPhases> kPhaseNames = {"decode", "hash",  "index",
                                                                    "copy",   "queue", "reply"};

struct PhaseTotals {
  std::array<int64_t, kNumPhases> ns{};  // 0: the phase did not occur
};

namespace phases_internal {
inline thread_local PhaseTotals g_current;  // this thread's request in progress
inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace phases_internal

// Starts a new request on this thread (forgets what was accumulated).
inline void ResetPhases() { phases_internal::g_current = PhaseTotals{}; }
// The calling thread's totals since ResetPhases, and resets them.
inline PhaseTotals TakePhases() {
  PhaseTotals t = phases_internal::g_current;
  phases_internal::g_current = PhaseTotals{};
  return t;
}

// Adds `ns` (a time measured by the caller) to phase `p` of this thread's request; a
// phase that occurred counts at least 1 ns.
inline void AddPhase(Phase p, int64_t ns) {
  phases_internal::g_current.ns[static_cast<size_t>(p)] += ns > 0 ? ns : 1;
}

// Adds the time from construction to destruction to phase `p` of this thread's request.
class ScopedPhase {
 public:
  explicit ScopedPhase(Phase p) : phase_(p), start_(phases_internal::NowNs()) {}
  ~ScopedPhase() {
    // Never 0 for a phase that occurred, so "did not occur" stays distinguishable.
    AddPhase(phase_, phases_internal::NowNs() - start_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  const Phase phase_;
  const int64_t start_;
};

}  // namespace kvd::server
