#include "server/zmq_server.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/handlers.h"
#include "server/metrics.h"
#include "wire/codec.h"

namespace kvd::server {

// ---- TaskPool ------------------------------------------------------------------------

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void TaskPool::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskPool::PostToLane(const std::string& lane, std::function<void()> task,
                          size_t max_parallel) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Lane& l = lanes_[lane];
    l.max_parallel = std::max<size_t>(1, max_parallel);
    l.tasks.push_back(std::move(task));
    if (l.runners >= l.max_parallel) return;  // a runner of the lane will pick it up
    ++l.runners;
    ++l.queued;
    queue_.push_back([this, lane] { RunLane(lane); });
  }
  cv_.notify_one();
}

void TaskPool::RunLane(const std::string& lane) {
  std::function<void()> task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Lane& l = lanes_[lane];
    --l.queued;
    task = std::move(l.tasks.front());
    l.tasks.pop_front();
  }
  task();
  bool again = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  if (again) cv_.notify_one();
}

void TaskPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

// ---- ZmqServer -----------------------------------------------------------------------

namespace {

std::string ClientTag(const std::string& identity) {
  static const char* kHex = "0123456789abcdef";
  std::string s = "client-";
  for (unsigned char c : identity.substr(0, 8)) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

}  // namespace

struct ZmqServer::Impl {
  const ServerConfig config;
  KvService* service;
  RequestMetrics* metrics;  // not owned
  zmq::context_t ctx{1};
  zmq::socket_t socket{ctx, zmq::socket_type::router};
  int wake_fd = -1;
  std::mutex out_mu;
  std::deque<std::vector<std::string>> outbox;  // guarded by out_mu
  std::unique_ptr<TaskPool> pool;

  Impl(const ServerConfig& c, KvService* s, RequestMetrics* m) : config(c), service(s), metrics(m) {
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int threads = c.max_workers > 0
                      ? c.max_workers
                      : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 16);
    pool = std::make_unique<TaskPool>(threads);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::rcvhwm, 0);
    socket.set(zmq::sockopt::sndhwm, 0);
  }
  ~Impl() {
    pool.reset();
    if (wake_fd >= 0) close(wake_fd);
  }

  void Reply(std::vector<std::string> frames) {
    {
      std::lock_guard<std::mutex> lock(out_mu);
      outbox.push_back(std::move(frames));
    }
    uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }

  void FlushOutbox() {
    uint64_t n;
    (void)!read(wake_fd, &n, sizeof(n));
    std::deque<std::vector<std::string>> out;
    {
      std::lock_guard<std::mutex> lock(out_mu);
      out.swap(outbox);
    }
    for (auto& frames : out) Send(frames);
  }

  void Send(const std::vector<std::string>& frames) {
    try {
      for (size_t i = 0; i < frames.size(); ++i) {
        auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
        socket.send(zmq::buffer(frames[i]), flags);
      }
    } catch (const zmq::error_t& e) {
      spdlog::warn("could not send a reply: {}", e.what());
    }
  }

  void OnRequest(std::vector<zmq::message_t>& msg) {
    // [identity, uid, op, payload...]
    if (msg.size() < 3) {
      spdlog::warn("dropping a message of {} frame(s): expected [uid, op, payload...]",
                   msg.size() == 0 ? 0 : msg.size() - 1);
      return;
    }
    std::string identity = msg[0].to_string();
    std::string uid = msg[1].to_string();
    std::string opf = msg[2].to_string();
    auto op = wire::DecodeOp(opf);
    if (!op.ok()) {
      metrics->CountUnknownOp();
      spdlog::warn("request from {}: {}; replying nil", ClientTag(identity), op.status().ToString());
      Send({identity, uid, opf, wire::EncodeNil()});
      return;
    }
    const wire::OpInfo* info = *op;
    auto payloads = std::make_shared<std::vector<std::string>>();
    payloads->reserve(msg.size() - 3);
    for (size_t i = 3; i < msg.size(); ++i) payloads->push_back(msg[i].to_string());
    const int64_t began = metrics->Begin(info->op);
    auto run = [this, info, identity, uid, opf, payloads, began]() {
      std::vector<std::string_view> views(payloads->begin(), payloads->end());
      std::string reply;
      try {
        reply = HandleRequest(*service, *info, views, ClientTag(identity));
      } catch (const std::exception& e) {
        spdlog::error("{} from {}: internal error: {}", info->name, ClientTag(identity), e.what());
        reply = wire::EncodeNil();
      }
      metrics->End(info->op, began);
      return std::vector<std::string>{identity, uid, opf, std::move(reply)};
    };
    switch (info->dispatch) {
      case wire::Dispatch::kInline:
        Send(run());
        break;
      case wire::Dispatch::kInstanceLane:
        pool->PostToLane(identity, [this, run] { Reply(run()); });
        break;
      case wire::Dispatch::kPool:
        // Per-connection lane, as wide as the pool: a client's requests still run in
        // parallel, but a flooding client cannot push everyone else's behind its backlog.
        pool->PostToLane(identity + "/pool", [this, run] { Reply(run()); }, pool->threads());
        break;
    }
  }
};

ZmqServer::ZmqServer(const ServerConfig& config, KvService* service, RequestMetrics* metrics)
    : impl_(std::make_unique<Impl>(config, service, metrics)) {}

ZmqServer::~ZmqServer() = default;

Status ZmqServer::Bind() {
  std::string ep = impl_->config.ZmqEndpoint();
  try {
    impl_->socket.bind(ep);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("cannot listen on " + ep + ": " + e.what());
  }
  return Status::Ok();
}

void ZmqServer::Run(const std::atomic<bool>& stop) {
  Impl& s = *impl_;
  zmq::pollitem_t items[] = {
      {s.socket.handle(), 0, ZMQ_POLLIN, 0},
      {nullptr, s.wake_fd, ZMQ_POLLIN, 0},
  };
  std::vector<zmq::message_t> msg;
  while (!stop.load()) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (items[1].revents & ZMQ_POLLIN) s.FlushOutbox();
    if (items[0].revents & ZMQ_POLLIN) {
      // Drain what is waiting, bounded so replies are never starved.
      for (int i = 0; i < 256; ++i) {
        msg.clear();
        auto r = zmq::recv_multipart(s.socket, std::back_inserter(msg), zmq::recv_flags::dontwait);
        if (!r) break;
        s.OnRequest(msg);
      }
    }
  }
  // Stop accepting; let queued transfers finish and deliver their replies.
  s.pool.reset();
  s.FlushOutbox();
  // Let those replies leave before the socket closes (linger is 0 while serving).
  s.socket.set(zmq::sockopt::linger, 2000);
}

}  // namespace kvd::server
