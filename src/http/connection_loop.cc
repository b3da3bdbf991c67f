// ConnectionLoop: the listening socket and the epoll loop on the I/O thread: Listen, Start,
// Stop, accepting (with the max_connections and per-peer bounds, evicting the connection that
// waited longest), the connection set (Watch, Close) and the deadlines. Reading, framing and
// answering requests, and the handler threads, are in connection_loop_requests.cc.
#include "http/connection_loop.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "http/connection_loop_internal.h"

namespace kvd::http {
namespace {

using detail::Seconds;

constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
constexpr size_t kReadBytes = 64 << 10;
constexpr auto kStopGrace = std::chrono::seconds(2);
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

void AddressOf(const sockaddr_storage& ss, std::string* ip, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    *port = ntohs(a->sin6_port);
  }
  *ip = buf;
}

}  // namespace

ConnectionLoop::ConnectionLoop(RoutedServer* server, ConnectionLimits limits)
    : server_(server), limits_(std::move(limits)), scratch_(kReadBytes) {
  // Keep-Alive headers httplib adds to responses state the loop's bounds.
  server_->set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, limits_.idle_timeout_seconds)));
  server_->set_keep_alive_max_count(std::max<size_t>(1, limits_.max_requests_per_connection));
  server_->set_payload_max_length(limits_.framing.max_body_bytes);
}

ConnectionLoop::~ConnectionLoop() {
  Stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status ConnectionLoop::Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return Status::Unavailable(std::string("cannot resolve: ") + gai_strerror(rc));
  }
  int err = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    // SO_REUSEADDR allows a quick restart; not SO_REUSEPORT, which would let a second kvd
    // bind the same port and silently share it.
    int yes = 1, no = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
      break;
    }
    err = errno;
    ::close(fd);
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) return Status::Unavailable(err == EADDRINUSE ? "address already in use" : std::strerror(err));
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  std::string ip;
  AddressOf(ss, &ip, &port_);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return Status::Unavailable(std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  return Status::Ok();
}

void ConnectionLoop::Start() {
  if (started_ || listen_fd_ < 0) return;
  started_ = true;
  for (int i = 0; i < std::max(1, limits_.handler_threads); ++i) {
    handlers_.emplace_back([this] { HandlerLoop(); });
  }
  io_thread_ = std::thread([this] { Run(); });
}

void ConnectionLoop::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_requested_.store(true);
  if (wake_fd_ >= 0) Wake();
  if (io_thread_.joinable()) io_thread_.join();
  {
    MutexLock lock(&jobs_mu_);
    handlers_stop_ = true;
  }
  jobs_cv_.NotifyAll();
  for (std::thread& t : handlers_) t.join();
  handlers_.clear();
  // Connections left (the I/O thread did not run, or its grace ran out).
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) Close(id);
}

void ConnectionLoop::Wake() {
  const uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  (void)n;
}

// ---- I/O thread --------------------------------------------------------------------------

void ConnectionLoop::Run() {
  std::vector<epoll_event> events(64);
  bool stopping = false;
  Clock::time_point stop_deadline{};
  for (;;) {
    Clock::time_point now = Clock::now();
    if (!stopping && stop_requested_.load()) {
      stopping = true;
      stop_deadline = now + kStopGrace;
      // Closed, not only unwatched: connections still in its backlog are reset at once.
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
      ::close(listen_fd_);
      listen_fd_ = -1;
      accept_paused_ = false;
      CloseWaiting();
    }
    if (stopping && (conns_.empty() || now >= stop_deadline)) return;
    const int timeout = stopping ? 50 : NextTimeoutMs(now);
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) {
      spdlog::error("http: epoll_wait: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    now = Clock::now();
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[static_cast<size_t>(i)].data.u64;
      if (id == kListenId) {
        if (!stopping) Accept(now);
      } else if (id == kWakeId) {
        uint64_t v = 0;
        ssize_t r = ::read(wake_fd_, &v, sizeof(v));
        (void)r;
      } else if (auto it = conns_.find(id); it != conns_.end()) {
        OnEvent(*it->second, events[static_cast<size_t>(i)].events, now);
      }
    }
    TakeResponses(now);
    CheckDeadlines(now);
    // Connections that finished writing their last answer are closed, not kept alive.
    if (stopping) CloseWaiting();
  }
}

void ConnectionLoop::Accept(Clock::time_point now) {
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EMFILE || err == ENFILE) {
        // accept fails so before it looks at its queue: when no connection waits there,
        // there is nothing to make room for (the listener is not readable: no spin).
        pollfd pending{listen_fd_, POLLIN, 0};
        if (poll(&pending, 1, 0) != 1) return;
        if (EvictOldestWaiting(nullptr)) continue;
      }
      if (now - last_accept_warning_ >= std::chrono::seconds(10)) {
        last_accept_warning_ = now;
        spdlog::warn("http: cannot accept a connection ({}); accepting pauses for 100 ms",
                     std::strerror(err));
      }
      PauseAccept(now);
      return;
    }
    std::string peer;
    int peer_port = 0;
    AddressOf(ss, &peer, &peer_port);
    const auto same_peer = per_peer_.find(peer);
    const bool peer_full =
        same_peer != per_peer_.end() && same_peer->second >= limits_.max_connections_per_peer;
    if ((peer_full && !EvictOldestWaiting(&peer)) ||
        (conns_.size() >= limits_.max_connections && !EvictOldestWaiting(nullptr))) {
      ::close(fd);
      stats_.rejected.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    auto c = std::make_unique<Conn>(next_id_++, fd, limits_.framing);
    c->peer_ip = std::move(peer);
    c->peer_port = peer_port;
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) {
      AddressOf(local, &c->local_ip, &c->local_port);
    }
    c->deadline = now + Seconds(limits_.idle_timeout_seconds);
    c->waiting_since = now;
    Conn& ref = *c;
    per_peer_[ref.peer_ip]++;
    conns_.emplace(ref.id, std::move(c));
    stats_.accepted.fetch_add(1, std::memory_order_relaxed);
    stats_.open.fetch_add(1, std::memory_order_relaxed);
    Watch(ref, EPOLLIN);
  }
}

void ConnectionLoop::CloseWaiting() {
  std::vector<uint64_t> waiting;
  for (const auto& [id, c] : conns_) {
    if (c->state == Conn::State::kReading || c->state == Conn::State::kDraining) waiting.push_back(id);
  }
  for (uint64_t id : waiting) Close(id);
}

void ConnectionLoop::PauseAccept(Clock::time_point now) {
  if (!accept_paused_) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  accept_paused_ = true;
  accept_resume_ = now + kAcceptPause;
}

bool ConnectionLoop::EvictOldestWaiting(const std::string* peer) {
  // A connection lingering after its last answer goes first, then the one that has waited
  // longest for a request. Connections being served or answered are kept.
  Conn* victim = nullptr;
  for (const auto& [id, c] : conns_) {
    if (peer != nullptr && c->peer_ip != *peer) continue;
    if (c->state != Conn::State::kReading && c->state != Conn::State::kDraining) continue;
    if (victim == nullptr) {
      victim = c.get();
      continue;
    }
    const bool c_drains = c->state == Conn::State::kDraining;
    const bool v_drains = victim->state == Conn::State::kDraining;
    // Accepted in one batch, connections share a time: the lower id is the older.
    const bool older = c->waiting_since < victim->waiting_since ||
                       (c->waiting_since == victim->waiting_since && c->id < victim->id);
    if ((c_drains && !v_drains) || (c_drains == v_drains && older)) victim = c.get();
  }
  if (victim == nullptr) return false;
  if (victim->state == Conn::State::kReading) stats_.evicted.fetch_add(1, std::memory_order_relaxed);
  Close(victim->id);
  return true;
}

void ConnectionLoop::Watch(Conn& c, uint32_t events) {
  if (events == c.watching) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  if (events == 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  } else if (epoll_ctl(epoll_fd_, c.watching == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd, &ev) != 0) {
    spdlog::warn("http: epoll_ctl: {}", std::strerror(errno));
  }
  c.watching = events;
}

void ConnectionLoop::Close(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (c.watching != 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  buffered_ -= c.in.size() + c.in_flight;
  if (auto p = per_peer_.find(c.peer_ip); p != per_peer_.end() && --p->second == 0) per_peer_.erase(p);
  conns_.erase(it);
  stats_.closed.fetch_add(1, std::memory_order_relaxed);
  stats_.open.fetch_sub(1, std::memory_order_relaxed);
}

void ConnectionLoop::CheckDeadlines(Clock::time_point now) {
  if (accept_paused_ && now >= accept_resume_ && !stop_requested_.load()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    accept_paused_ = false;
  }
  std::vector<uint64_t> due;
  for (const auto& [id, c] : conns_) {
    if (c->state != Conn::State::kBusy && now >= c->deadline) due.push_back(id);
  }
  for (uint64_t id : due) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Conn& c = *it->second;
    if (c.state == Conn::State::kReading && c.started) {
      stats_.timed_out.fetch_add(1, std::memory_order_relaxed);
      char why[96];
      std::snprintf(why, sizeof(why), "the request did not arrive whole within %g s",
                    limits_.request_timeout_seconds);
      Refuse(c, 408, why, now);
    } else {
      if (c.state == Conn::State::kReading) stats_.idle_closed.fetch_add(1, std::memory_order_relaxed);
      if (c.state == Conn::State::kWriting) stats_.write_timeouts.fetch_add(1, std::memory_order_relaxed);
      Close(id);
    }
  }
}

int ConnectionLoop::NextTimeoutMs(Clock::time_point now) const {
  Clock::time_point next = now + std::chrono::seconds(1);
  if (accept_paused_) next = std::min(next, accept_resume_);
  for (const auto& [id, c] : conns_) {
    if (c->state != Conn::State::kBusy) next = std::min(next, c->deadline);
  }
  if (next <= now) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
}

}  // namespace kvd::http
