// Request phases: where a request's server time goes (decode, hash, index, copy), for the
// per-phase series in /metrics that explain a slow request.
//
// The thread handling a request accumulates phase time in a thread-local PhaseTotals
// (ScopedPhase marks a region); the socket loop takes the totals when the request is done
// and hands them to RequestMetrics::RecordPhases. A region nested in another of the same
// request counts in both (keep phases disjoint where they are marked). Costs two
// steady_clock reads per region; no lock, no allocation.
//
// Threads: each thread has its own totals; Take/Reset act on the calling thread's only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace kvd::server {

enum class Phase : uint8_t { kDecode, kHash, kIndex, kCopy };
inline constexpr size_t kNumPhases = 4;
inline constexpr std::array<const char*, kNumPhases> kPhaseNames = {"decode", "hash", "index", "copy"};

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

// Adds the time from construction to destruction to phase `p` of this thread's request.
class ScopedPhase {
 public:
  explicit ScopedPhase(Phase p) : phase_(p), start_(phases_internal::NowNs()) {}
  ~ScopedPhase() {
    // Never 0 for a phase that occurred, so "did not occur" stays distinguishable.
    const int64_t d = phases_internal::NowNs() - start_;
    phases_internal::g_current.ns[static_cast<size_t>(phase_)] += d > 0 ? d : 1;
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  const Phase phase_;
  const int64_t start_;
};

}  // namespace kvd::server
