// EvictionThread: RAII helper that calls L1Cache::EvictToWatermark every `period` on its own
// thread, so usage is brought back under the watermark without waiting for an allocation to
// fail. Construction starts the thread; destruction stops and joins it promptly (it does not
// wait out the period). The cache must outlive the thread object. Uses wall-clock waits, not
// kvd::Clock: tests drive EvictToWatermark directly instead.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "l1/l1_cache.h"

namespace kvd::l1 {

class EvictionThread {
 public:
  EvictionThread(L1Cache& cache, std::chrono::milliseconds period);
  ~EvictionThread();
  EvictionThread(const EvictionThread&) = delete;
  EvictionThread& operator=(const EvictionThread&) = delete;

  // Runs a round now instead of at the end of the current period.
  void Wake();
  // Rounds completed so far.
  uint64_t rounds() const;

 private:
  void Run();

  L1Cache& cache_;
  const std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  bool stop_ = false;
  bool wake_ = false;
  uint64_t rounds_ = 0;
  std::thread thread_;  // last member: started after everything above is initialised
};

}  // namespace kvd::l1
