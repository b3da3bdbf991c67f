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
#include <cctype>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

namespace kvd::http {
namespace {

constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
constexpr size_t kReadBytes = 64 << 10;
constexpr auto kStopGrace = std::chrono::seconds(2);
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

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

const char* ReasonPhrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string ErrorResponse(int status, const std::string& detail) {
  const std::string body = nlohmann::json{{"detail", detail}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  return "HTTP/1.1 " + std::to_string(status) + " " + ReasonPhrase(status) +
         "\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Whether the head of `response` has `Connection: close` (a handler may ask for it).
bool AsksToClose(std::string_view response) {
  const size_t end = response.find("\r\n\r\n");
  std::string_view head = response.substr(0, end);
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos) {
    const size_t next = head.find("\r\n", pos + 2);
    std::string line(head.substr(pos + 2, next == std::string_view::npos ? std::string_view::npos : next - pos - 2));
    for (char& c : line) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (line.rfind("connection:", 0) == 0 && line.find("close") != std::string::npos) return true;
    pos = next;
  }
  return false;
}

bool IsHealthcheck(std::string_view request) {
  for (std::string_view m : {"GET /healthcheck", "HEAD /healthcheck"}) {
    if (request.substr(0, m.size()) == m && request.size() > m.size() &&
        (request[m.size()] == ' ' || request[m.size()] == '?')) {
      return true;
    }
  }
  return false;
}

// The request bytes for httplib, the response bytes from it. The whole request is already
// here, so httplib's interim "100 Continue" (the loop sent its own when the client waited
// for one) is dropped.
class BufferStream final : public httplib::Stream {
 public:
  BufferStream(std::string_view in, std::string* out, const std::string& peer_ip, int peer_port,
               const std::string& local_ip, int local_port)
      : in_(in), out_(out), peer_ip_(peer_ip), local_ip_(local_ip), peer_port_(peer_port),
        local_port_(local_port) {}

  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (out_->empty() && std::string_view(ptr, size) == kContinue) return static_cast<ssize_t>(size);
    out_->append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_ip_;
    port = peer_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_ip_;
    port = local_port_;
  }
  // Not a socket: httplib uses it only to refuse descriptors past FD_SETSIZE when built
  // with select(), which cannot happen with a negative one.
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  std::string* out_;
  const std::string& peer_ip_;
  const std::string& local_ip_;
  int peer_port_, local_port_;
};

}  // namespace

struct ConnectionLoop::Conn {
  enum class State { kReading, kBusy, kWriting, kDraining };
  Conn(uint64_t id_in, int fd_in, const FramingLimits& limits) : id(id_in), fd(fd_in), framer(limits) {}

  const uint64_t id;
  const int fd;
  std::string peer_ip, local_ip;
  int peer_port = 0, local_port = 0;
  State state = State::kReading;
  uint32_t watching = 0;           // epoll events registered (0: not in the epoll set)
  std::string in;                  // received, not yet handed over
  size_t in_flight = 0;            // bytes of the request a handler has (kBusy)
  RequestFramer framer;
  bool started = false;            // a byte of the current request has arrived
  bool continue_sent = false;
  Clock::time_point deadline{};
  Clock::time_point waiting_since{};  // when it began to wait for its current request
  std::string out;                 // the response being written
  size_t out_pos = 0;
  bool close_after = false;        // close once `out` is written
  bool linger = false;             // ... after dropping what the client still sends
  size_t drained = 0;
  size_t served = 0;
};

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

void ConnectionLoop::OnEvent(Conn& c, uint32_t events, Clock::time_point now) {
  switch (c.state) {
    case Conn::State::kReading:
      if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadRequest(c, now);
      break;
    case Conn::State::kWriting:
      if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) Flush(c, now);
      break;
    case Conn::State::kDraining:
      if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) Drain(c);
      break;
    case Conn::State::kBusy:
      break;  // not watched
  }
}

void ConnectionLoop::ReadRequest(Conn& c, Clock::time_point now) {
  const ssize_t n = ::recv(c.fd, scratch_.data(), scratch_.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {  // the client closed (a request it had begun is dropped), or an error
    Close(c.id);
    return;
  }
  if (!c.started) {
    c.started = true;
    c.deadline = now + Seconds(limits_.request_timeout_seconds);
  }
  c.in.append(scratch_.data(), static_cast<size_t>(n));
  buffered_ += static_cast<uint64_t>(n);
  if (buffered_ > limits_.max_buffered_bytes) {
    stats_.refused.fetch_add(1, std::memory_order_relaxed);
    Refuse(c, 503, "kvd's HTTP request buffers are full; retry later", now);
    return;
  }
  ScanRequest(c, now);
}

void ConnectionLoop::ScanRequest(Conn& c, Clock::time_point now) {
  const RequestFramer::State st = c.framer.Scan(c.in);
  if (st == RequestFramer::State::kError) {
    stats_.refused.fetch_add(1, std::memory_order_relaxed);
    Refuse(c, c.framer.error_status(), c.framer.error_reason(), now);
    return;
  }
  if (st == RequestFramer::State::kComplete) {
    Dispatch(c);
    return;
  }
  // The client waits for "100 Continue" before it sends the body: the head passed the
  // bounds, so ask for it.
  if (c.framer.head_complete() && c.framer.has_body() && c.framer.expects_continue() &&
      !c.continue_sent && c.in.size() == c.framer.head_size()) {
    c.continue_sent = true;
    if (::send(c.fd, kContinue.data(), kContinue.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(kContinue.size())) {
      Close(c.id);
    }
  }
}

void ConnectionLoop::Dispatch(Conn& c) {
  const size_t size = c.framer.request_size();
  Job job;
  job.conn = c.id;
  // The request's bytes move to the job (a body may be 64 MiB): only what follows it, a
  // pipelined next request, is copied back.
  job.request = std::move(c.in);
  c.in.assign(job.request, size);
  job.request.resize(size);
  job.peer_ip = c.peer_ip;
  job.peer_port = c.peer_port;
  job.local_ip = c.local_ip;
  job.local_port = c.local_port;
  job.close_after = stop_requested_.load() || c.served + 1 >= limits_.max_requests_per_connection;
  c.in_flight = size;  // still counted in buffered_ until its answer comes back
  c.framer.Reset();
  c.started = false;
  c.continue_sent = false;
  c.state = Conn::State::kBusy;
  Watch(c, 0);
  const bool first = IsHealthcheck(job.request);
  {
    MutexLock lock(&jobs_mu_);
    if (first) {
      jobs_.push_front(std::move(job));
    } else {
      jobs_.push_back(std::move(job));
    }
  }
  jobs_cv_.NotifyOne();
}

void ConnectionLoop::TakeResponses(Clock::time_point now) {
  std::vector<Done> done;
  {
    MutexLock lock(&done_mu_);
    done.swap(done_);
  }
  for (Done& d : done) {
    auto it = conns_.find(d.conn);
    if (it == conns_.end()) continue;
    Conn& c = *it->second;
    buffered_ -= c.in_flight;
    c.in_flight = 0;
    c.out = std::move(d.response);
    c.out_pos = 0;
    c.close_after = d.close || stop_requested_.load();
    c.linger = c.close_after;
    c.served++;
    c.state = Conn::State::kWriting;
    c.deadline = now + Seconds(limits_.write_timeout_seconds);
    Flush(c, now);
  }
}

void ConnectionLoop::Flush(Conn& c, Clock::time_point now) {
  while (c.out_pos < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Watch(c, EPOLLOUT);
      return;
    } else {
      Close(c.id);
      return;
    }
  }
  std::string().swap(c.out);  // a large answer's memory goes back now
  c.out_pos = 0;
  if (c.close_after) {
    if (!c.linger || stop_requested_.load()) {
      Close(c.id);
      return;
    }
    // Stop writing, drop what the client still sends for a moment, then close: closing with
    // unread input would reset the connection and could lose the answer before the client
    // reads it.
    ::shutdown(c.fd, SHUT_WR);
    buffered_ -= c.in.size();
    std::string().swap(c.in);
    c.state = Conn::State::kDraining;
    c.drained = 0;
    c.deadline = now + Seconds(limits_.linger_seconds);
    Watch(c, EPOLLIN);
    return;
  }
  // Kept alive: the next request (perhaps already here, pipelined).
  c.state = Conn::State::kReading;
  c.waiting_since = now;
  c.started = !c.in.empty();
  c.deadline = now + Seconds(c.started ? limits_.request_timeout_seconds : limits_.idle_timeout_seconds);
  Watch(c, EPOLLIN);
  if (c.started) ScanRequest(c, now);
}

void ConnectionLoop::Drain(Conn& c) {
  const ssize_t n = ::recv(c.fd, scratch_.data(), scratch_.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    Close(c.id);
    return;
  }
  c.drained += static_cast<size_t>(n);
  if (c.drained > limits_.linger_bytes) Close(c.id);
}

void ConnectionLoop::Refuse(Conn& c, int status, std::string reason, Clock::time_point now) {
  spdlog::debug("http: {} to {}:{}: {}", status, c.peer_ip, c.peer_port, reason);
  buffered_ -= c.in.size();
  std::string().swap(c.in);
  c.framer.Reset();
  c.out = ErrorResponse(status, reason);
  c.out_pos = 0;
  c.close_after = true;
  c.linger = true;
  c.state = Conn::State::kWriting;
  c.deadline = now + Seconds(std::min(limits_.write_timeout_seconds, std::max(1.0, limits_.linger_seconds)));
  Flush(c, now);
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

// ---- handler threads ---------------------------------------------------------------------

void ConnectionLoop::HandlerLoop() {
  for (;;) {
    Job job;
    {
      MutexLock lock(&jobs_mu_);
      while (jobs_.empty() && !handlers_stop_) jobs_cv_.Wait(&jobs_mu_);
      if (handlers_stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Done done = Serve(std::move(job));
    {
      MutexLock lock(&done_mu_);
      done_.push_back(std::move(done));
    }
    Wake();
  }
}

std::string ConnectionLoop::ServeBuffered(RoutedServer* server, std::string_view request, bool close_after,
                                          bool* close, const std::string& peer_ip, int peer_port,
                                          const std::string& local_ip, int local_port) {
  std::string response;
  bool ok = false, client_closes = false;
  try {
    BufferStream stream(request, &response, peer_ip, peer_port, local_ip, local_port);
    ok = server->ServeOne(stream, close_after, client_closes);
  } catch (const std::exception& e) {  // the routes' own exceptions are handled by httplib
    spdlog::error("http: serving a request: {}", e.what());
    response = ErrorResponse(500, "internal error");
  } catch (...) {
    spdlog::error("http: serving a request: unknown error");
    response = ErrorResponse(500, "internal error");
  }
  if (close != nullptr) {
    *close = !ok || client_closes || close_after || response.empty() || AsksToClose(response);
  }
  return response;
}

ConnectionLoop::Done ConnectionLoop::Serve(Job job) {
  Done d;
  d.conn = job.conn;
  d.response = ServeBuffered(server_, job.request, job.close_after, &d.close, job.peer_ip, job.peer_port,
                             job.local_ip, job.local_port);
  return d;
}

}  // namespace kvd::http
