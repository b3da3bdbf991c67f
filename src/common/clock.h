// Clock: the source of time for TTLs, liveness and eviction recency.
//
// Production code uses SteadyClock; tests inject FakeClock and move time by hand
// instead of sleeping. Implementations are safe to call from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvd {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time in nanoseconds since an arbitrary epoch.
  virtual int64_t NowNanos() const = 0;
  double NowSeconds() const { return static_cast<double>(NowNanos()) * 1e-9; }
};

class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

class FakeClock final : public Clock {
 public:
  int64_t NowNanos() const override { return now_.load(std::memory_order_relaxed); }
  void AdvanceSeconds(double s) { now_.fetch_add(static_cast<int64_t>(s * 1e9)); }
  void AdvanceNanos(int64_t ns) { now_.fetch_add(ns); }

 private:
  std::atomic<int64_t> now_{1'000'000'000};
};

}  // namespace kvd
