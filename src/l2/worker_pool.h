// WorkerPool: a fixed set of threads running queued tasks in FIFO order, and RunBatch, which
// spreads the items of one tier call over the pool and answers the call once when the last
// item finished. Used by the tiers for their blocking I/O.
//
// Threads: Submit and Close are thread-safe. Close stops accepting tasks, runs every task
// already queued, and joins the threads; it is idempotent and called by the destructor.
// Tasks must not call Close on their own pool.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "l2/tier.h"

namespace kvd::l2 {

class WorkerPool {
 public:
  WorkerPool(int threads, std::string name);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False (and the task is dropped) once Close has begun.
  bool Submit(std::function<void()> task);
  void Close();
  size_t queued() const;
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Run();

  const std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool closed_ = false;                      // guarded by mu_
  std::vector<std::thread> threads_;
};

// Runs `item(i)` for i in [0, n) on `pool` (each item is one task) and calls `done` with the
// results in item order after the last one. n == 0 answers at once on the calling thread.
// When the pool is closed, every item not run answers Unavailable.
void RunBatch(WorkerPool& pool, size_t n, std::function<ItemResult(size_t)> item,
              Tier::Done done);

}  // namespace kvd::l2
