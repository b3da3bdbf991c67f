// TaskPool: a fixed set of threads running queued tasks, with optional lanes, for the
// socket loop's long operations (transfers, registrations, long lookups).
//
// Tasks posted to one lane start in posting order, at most `max_parallel` of them at a time
// (1: one after the other, in order); lanes run concurrently. A lane never has more than
// max_parallel entries in the shared queue, so lanes are served round-robin: a client
// flooding its own lane delays another lane's next task by at most a few tasks, not by its
// whole backlog.
//
// Tasks are move-only (UniqueTask), so a task can own the request frames it was handed.
// Thread-safe: Post/PostToLane from any thread. The destructor runs every queued task,
// then joins.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace kvd::server {

// A move-only void() callable.
class UniqueTask {
 public:
  UniqueTask() = default;
  template <typename F>
    requires(!std::is_same_v<std::decay_t<F>, UniqueTask> && std::is_invocable_v<F&>)
  UniqueTask(F&& f) : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(f))) {}
  void operator()() { impl_->Run(); }
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void Run() = 0;
  };
  template <typename F>
  struct Impl final : Base {
    template <typename G>
    explicit Impl(G&& fn) : f(std::forward<G>(fn)) {}
    void Run() override { f(); }
    F f;
  };
  std::unique_ptr<Base> impl_;
};

class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();
  void Post(UniqueTask task);
  void PostToLane(const std::string& lane, UniqueTask task, size_t max_parallel = 1);
  size_t threads() const { return threads_.size(); }

 private:
  struct Lane {
    std::deque<UniqueTask> tasks;
    size_t runners = 0;  // lane runners queued or running (<= max_parallel)
    size_t queued = 0;   // of which still in queue_ (invariant: queued <= tasks.size())
    size_t max_parallel = 1;
  };
  void RunLane(const std::string& lane) KVD_EXCLUDES(mu_);
  void WorkerLoop() KVD_EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<UniqueTask> queue_ KVD_GUARDED_BY(mu_);
  std::map<std::string, Lane> lanes_ KVD_GUARDED_BY(mu_);
  bool stopping_ KVD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvd::server
