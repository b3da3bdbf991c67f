// ConnectionLoop: serves HTTP/1.1 connections for the routes of an httplib::Server without
// giving a thread to a connection that waits for the network.
//
// One I/O thread owns the listening socket and every connection (epoll, non-blocking). It
// accepts, reads each request as it arrives (RequestFramer bounds the head and the body
// before they are buffered), and writes responses. A request that has arrived whole goes to a
// pool of handler threads, which run httplib's parser and routes over the buffered bytes
// (RoutedServer::ServeOne) and hand the response bytes back to the I/O thread. So a client
// that sends slowly, reads slowly or sends nothing holds a descriptor and its buffers, never
// a thread: /healthcheck is answered whatever such clients do (and it goes first in the
// handler queue, so handlers busy with large answers do not delay it either).
//
// Deadlines (ConnectionLimits): a request must arrive whole (head and body) within
// request_timeout of its first byte, else it is answered 408 and the connection closed; a
// connection waiting for its first or next request is closed after idle_timeout; a response
// not taken by the client within write_timeout closes the connection. After an error answer
// (4xx) kvd stops writing, reads and drops what the client still sends for at most
// linger_seconds / linger_bytes (so the client can read the answer before the close), then
// closes.
//
// Capacity: at most max_connections connections, and max_connections_per_peer from one
// address; a new connection beyond either bound closes the connection that has waited longest
// for its request (of that address, for the per-peer bound), and is itself closed when none
// is waiting (all are being served). Request bytes held across connections, received or
// being handled, are bounded by max_buffered_bytes (beyond: 503). When accept fails for lack of descriptors, the oldest
// waiting connection is closed to make room, or accepting pauses for 100 ms (never a busy
// loop).
//
// Threads: Listen and Start from one thread, then Stop (also from the destructor), which
// stops accepting, lets the requests being served finish and write their answers (at most
// 2 s), closes every connection and joins the threads. stats() may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "http/httplib_wrap.h"
#include "http/request_framer.h"

namespace kvd::http {

// httplib's server with its per-request entry point public: the loop hands it one buffered
// request at a time (httplib's own accept loop and threads are not used).
class RoutedServer : public httplib::Server {
 public:
  // Parses the request `stream` reads, routes it and writes the response to `stream`.
  // `close_connection`: the response says `Connection: close`; `connection_closed` is set
  // when the request asked to close. False: no request could be read or written.
  bool ServeOne(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
    return process_request(stream, close_connection, connection_closed, nullptr);
  }
};

struct ConnectionLimits {
  FramingLimits framing;
  double request_timeout_seconds = 10;   // first byte of a request -> its last byte
  double idle_timeout_seconds = 5;       // waiting for the first byte of a (next) request
  double write_timeout_seconds = 10;     // a response ready -> its last byte taken
  double linger_seconds = 1;             // after an error answer, input dropped this long ...
  size_t linger_bytes = 256 << 10;       // ... and at most this much
  size_t max_connections = 256;
  size_t max_connections_per_peer = 64;
  size_t max_requests_per_connection = 1000;
  uint64_t max_buffered_bytes = 256ull << 20;  // request bytes held, all connections together
  int handler_threads = 4;
};

// Counters since Start (relaxed atomics).
struct ConnectionStats {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> closed{0};
  std::atomic<uint64_t> open{0};
  std::atomic<uint64_t> timed_out{0};       // 408: a request not whole within the timeout
  std::atomic<uint64_t> idle_closed{0};     // no request within the idle timeout
  std::atomic<uint64_t> refused{0};         // 4xx/5xx before routing: bounds, malformed, 503
  std::atomic<uint64_t> evicted{0};         // closed to make room for a new connection
  std::atomic<uint64_t> rejected{0};        // new connections closed at once (all busy)
  std::atomic<uint64_t> write_timeouts{0};  // responses the client did not take in time
};

class ConnectionLoop {
 public:
  // `server` (its routes registered) must outlive the loop.
  ConnectionLoop(RoutedServer* server, ConnectionLimits limits);
  ~ConnectionLoop();
  ConnectionLoop(const ConnectionLoop&) = delete;
  ConnectionLoop& operator=(const ConnectionLoop&) = delete;

  // Binds and listens on host:port (0: an ephemeral port). Unavailable with the reason
  // (strerror, or "cannot resolve") when it cannot.
  Status Listen(const std::string& host, int port);
  int port() const { return port_; }
  // Starts the I/O thread and the handler threads (after Listen).
  void Start();
  void Stop();

  const ConnectionStats& stats() const { return stats_; }

  // Runs one whole request (its bytes as received: request line, headers, body) through
  // `server`'s routes on the calling thread, as a handler thread does; returns the response
  // bytes. `*close`: the connection would be closed after it. For the handler threads, and
  // for tests and fuzzing (no socket, no bounds: frame the request with RequestFramer first).
  static std::string ServeBuffered(RoutedServer* server, std::string_view request,
                                   bool close_after = false, bool* close = nullptr,
                                   const std::string& peer_ip = "127.0.0.1", int peer_port = 0,
                                   const std::string& local_ip = "127.0.0.1", int local_port = 0);

 private:
  struct Conn;
  struct Job {
    uint64_t conn = 0;
    std::string request;  // the whole request, as received
    std::string peer_ip, local_ip;
    int peer_port = 0, local_port = 0;
    bool close_after = false;
  };
  struct Done {
    uint64_t conn = 0;
    std::string response;
    bool close = false;
  };
  using Clock = std::chrono::steady_clock;

  // I/O thread.
  void Run();
  void Accept(Clock::time_point now);
  void OnEvent(Conn& c, uint32_t events, Clock::time_point now);
  void ReadRequest(Conn& c, Clock::time_point now);
  void ScanRequest(Conn& c, Clock::time_point now);
  void Dispatch(Conn& c);
  void TakeResponses(Clock::time_point now);
  void Flush(Conn& c, Clock::time_point now);
  void Drain(Conn& c);
  void Refuse(Conn& c, int status, std::string reason, Clock::time_point now);
  void CheckDeadlines(Clock::time_point now);
  int NextTimeoutMs(Clock::time_point now) const;
  // Closes the connection that has waited longest for its request (of `peer` if given).
  bool EvictOldestWaiting(const std::string* peer);
  void Watch(Conn& c, uint32_t events);
  void Close(uint64_t id);
  // Closes every connection not being served or answered (reading or draining): stopping.
  void CloseWaiting();
  void PauseAccept(Clock::time_point now);
  void Wake();
  // Handler threads.
  void HandlerLoop();
  Done Serve(Job job);

  RoutedServer* const server_;
  const ConnectionLimits limits_;
  ConnectionStats stats_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_requested_{false};
  std::thread io_thread_;
  std::vector<std::thread> handlers_;
  bool started_ = false;
  bool stopped_ = false;

  // Owned by the I/O thread.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, size_t> per_peer_;
  uint64_t next_id_ = 2;  // 0: the listening socket, 1: the wake-up eventfd
  uint64_t buffered_ = 0;  // request bytes held by all connections and their handlers
  bool accept_paused_ = false;
  Clock::time_point accept_resume_{};
  Clock::time_point last_accept_warning_{};
  std::vector<char> scratch_;

  Mutex jobs_mu_;
  CondVar jobs_cv_;
  std::deque<Job> jobs_ KVD_GUARDED_BY(jobs_mu_);
  bool handlers_stop_ KVD_GUARDED_BY(jobs_mu_) = false;

  Mutex done_mu_;
  std::vector<Done> done_ KVD_GUARDED_BY(done_mu_);
};

}  // namespace kvd::http
