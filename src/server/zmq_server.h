// ZmqServer: the socket loop. One ROUTER socket, one thread that owns it; handlers run
// inline (cheap ops), on a per-connection lane (a worker's transfers stay in order) or
// on the pool, and hand their reply frames back through a queue that wakes the loop
// (an eventfd polled beside the socket). Only the loop thread touches the socket.
//
// Frames in: [identity, uid, op, payload...]; out: [identity, uid, op, reply] with uid
// and op echoed byte for byte and exactly one reply frame.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "server/config.h"
#include "server/kv_service.h"
#include "server/metrics.h"

namespace kvd::server {

// A fixed set of threads running queued tasks, with optional lanes. Tasks posted to one
// lane start in posting order, at most `max_parallel` of them at a time (1: one after the
// other, in order); lanes run concurrently. A lane never has more than max_parallel entries
// in the shared queue, so lanes are served round-robin: a client flooding its own lane
// delays another lane's next task by at most a few tasks, not by its whole backlog.
class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();  // runs every queued task, then joins
  void Post(std::function<void()> task);
  void PostToLane(const std::string& lane, std::function<void()> task, size_t max_parallel = 1);
  size_t threads() const { return threads_.size(); }

 private:
  struct Lane {
    std::deque<std::function<void()>> tasks;
    size_t runners = 0;  // lane runners queued or running (<= max_parallel)
    size_t queued = 0;   // of which still in queue_ (invariant: queued <= tasks.size())
    size_t max_parallel = 1;
  };
  void RunLane(const std::string& lane);
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;   // guarded by mu_
  std::map<std::string, Lane> lanes_;         // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::thread> threads_;
};

class ZmqServer {
 public:
  // `metrics` (not owned) records per-op counts and latency; it must outlive the server.
  ZmqServer(const ServerConfig& config, KvService* service, RequestMetrics* metrics);
  ~ZmqServer();

  // Binds the socket; a clear error if the address is taken or invalid.
  Status Bind();
  // Serves until `stop` becomes true; then stops accepting, lets queued work finish and
  // sends its replies.
  void Run(const std::atomic<bool>& stop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvd::server
