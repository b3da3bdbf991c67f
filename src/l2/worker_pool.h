// WorkerPool: a fixed set of threads running queued tasks in FIFO order, and RunBatch, which
// spreads the items of one tier call over the pool and answers the call once when the last
// item finished. Used by the tiers for their blocking I/O.
//
// Threads: Submit and Close are thread-safe. Close stops accepting tasks, runs every task
// already queued, and joins the threads; it is idempotent and called by the destructor.
// Tasks must not call Close on their own pool.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "l2/tier.h"

namespace kvd::l2 {

class WorkerPool {
 public:
  WorkerPool(int threads, std::string name);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False (and the task is dropped) once Close has begun.
  bool Submit(std::function<void()> task) KVD_EXCLUDES(mu_);
  void Close() KVD_EXCLUDES(mu_);
  size_t queued() const KVD_EXCLUDES(mu_);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Run() KVD_EXCLUDES(mu_);

  const std::string name_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ KVD_GUARDED_BY(mu_);
  bool closed_ KVD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Runs `item(i)` for i in [0, n) on `pool` (each item is one task) and calls `done` with the
// results in item order after the last one. n == 0 answers at once on the calling thread.
// When the pool is closed, every item not run answers Unavailable.
void RunBatch(WorkerPool& pool, size_t n, std::function<ItemResult(size_t)> item,
              Tier::Done done);

}  // namespace kvd::l2
