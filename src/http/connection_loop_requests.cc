// ConnectionLoop: requests and answers. On the I/O thread, a connection's events: reading a
// request and framing it (RequestFramer, "100 Continue"), handing it whole to the handler
// threads (Dispatch), taking their answers back and writing them (Flush), lingering after an
// error answer (Drain, Refuse). On the handler threads, serving a buffered request through
// httplib's routes (ServeBuffered). Sockets, accepting and deadlines are in connection_loop.cc.
#include "http/connection_loop.h"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "http/connection_loop_internal.h"

namespace kvd::http {
namespace {

using detail::Seconds;

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

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

// ---- I/O thread --------------------------------------------------------------------------

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
