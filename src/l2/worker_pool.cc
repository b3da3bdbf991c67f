#include "l2/worker_pool.h"

#include <atomic>
#include <pthread.h>

namespace kvd::l2 {

WorkerPool::WorkerPool(int threads, std::string name) : name_(std::move(name)) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i] {
      std::string n = (name_ + std::to_string(i)).substr(0, 15);
      pthread_setname_np(pthread_self(), n.c_str());
      Run();
    });
  }
}

WorkerPool::~WorkerPool() { Close(); }

bool WorkerPool::Submit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (closed_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.NotifyOne();
  return true;
}

void WorkerPool::Close() {
  {
    MutexLock lock(&mu_);
    if (closed_ && threads_.empty()) return;
    closed_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
  MutexLock lock(&mu_);
  threads_.clear();
}

size_t WorkerPool::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void WorkerPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      while (!closed_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // closed and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

namespace {
struct BatchState {
  std::vector<ItemResult> results;
  std::atomic<size_t> remaining{0};
  std::function<ItemResult(size_t)> item;
  Tier::Done done;
  void Finish(size_t i, ItemResult r) {
    results[i] = std::move(r);
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) done(std::move(results));
  }
};
}  // namespace

void RunBatch(WorkerPool& pool, size_t n, std::function<ItemResult(size_t)> item,
              Tier::Done done) {
  if (n == 0) {
    done({});
    return;
  }
  auto st = std::make_shared<BatchState>();
  st->results.resize(n);
  st->remaining.store(n);
  st->item = std::move(item);
  st->done = std::move(done);
  for (size_t i = 0; i < n; ++i) {
    if (!pool.Submit([st, i] { st->Finish(i, st->item(i)); })) {
      st->Finish(i, {Status::Unavailable("tier is closed"), 0});
    }
  }
}

}  // namespace kvd::l2
