#include "l1/eviction_thread.h"

#include <spdlog/spdlog.h>

namespace kvd::l1 {

EvictionThread::EvictionThread(L1Cache& cache, std::chrono::milliseconds period)
    : cache_(cache), period_(period), thread_([this] { Run(); }) {}

EvictionThread::~EvictionThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EvictionThread::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

uint64_t EvictionThread::rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_;
}

void EvictionThread::Run() {
  spdlog::debug("l1: eviction thread started, period {} ms", period_.count());
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period_, [this] { return stop_ || wake_; });
    if (stop_) break;
    wake_ = false;
    lock.unlock();
    cache_.EvictToWatermark();
    lock.lock();
    ++rounds_;
  }
  spdlog::debug("l1: eviction thread stopped");
}

}  // namespace kvd::l1
