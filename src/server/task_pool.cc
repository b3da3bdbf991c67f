#include "server/task_pool.h"

#include <algorithm>

namespace kvd::server {

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

TaskPool::~TaskPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

void TaskPool::Post(UniqueTask task) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
  }
  cv_.NotifyOne();
}

void TaskPool::PostToLane(const std::string& lane, UniqueTask task, size_t max_parallel) {
  {
    MutexLock lock(&mu_);
    Lane& l = lanes_[lane];
    l.max_parallel = std::max<size_t>(1, max_parallel);
    l.tasks.push_back(std::move(task));
    if (l.runners >= l.max_parallel) return;  // a runner of the lane will pick it up
    ++l.runners;
    ++l.queued;
    queue_.push_back([this, lane] { RunLane(lane); });
  }
  cv_.NotifyOne();
}

void TaskPool::RunLane(const std::string& lane) {
  UniqueTask task;
  {
    MutexLock lock(&mu_);
    Lane& l = lanes_[lane];
    --l.queued;
    task = std::move(l.tasks.front());
    l.tasks.pop_front();
  }
  task();
  bool again = false;
  {
    MutexLock lock(&mu_);
    auto it = lanes_.find(lane);
    Lane& l = it->second;
    if (l.tasks.size() > l.queued) {
      // Back to the end of the queue: other lanes' tasks go first.
      again = true;
      ++l.queued;
      queue_.push_back([this, lane] { RunLane(lane); });
    } else if (--l.runners == 0 && l.tasks.empty()) {
      lanes_.erase(it);  // idle lanes cost nothing
    }
  }
  if (again) cv_.NotifyOne();
}

void TaskPool::WorkerLoop() {
  for (;;) {
    UniqueTask task;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kvd::server
