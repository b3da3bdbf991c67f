// ZmtpRouter: a ZMQ ROUTER socket on TCP, spoken natively (ZMTP 3.x, NULL mechanism) by the
// thread that serves the requests. libzmq clients (DEALER, REQ, ROUTER) connect to it as to
// a libzmq ROUTER: each connection gets a routing id (the one the peer asked for in its
// READY, when it is free and does not start with a zero byte, else five bytes: 0, then a
// counter), every message received is delivered as [routing id, frames...], and a message
// sent as [routing id, frames...] goes to that connection (dropped, and counted, when no
// such connection exists or it has max_unsent_* waiting).
//
// WHY NOT LIBZMQ'S ROUTER. libzmq's I/O thread reads ahead of the application, up to
// ZMQ_RCVHWM messages per connection, and bounds only the size of each frame
// (ZMQ_MAXMSGSIZE): one message of many maximum-size frames, or a backlog of such messages
// while the serving thread is busy, is buffered whole. Here nothing is read from a
// connection the serving thread has not asked for, so memory per connection is bounded by
// design (see BOUNDS), and a request costs no hop through another thread.
//
// BOUNDS, per connection: the decoder's buffer (16 KiB) and one message being received
// (limits.max_message_bytes, zmtp_codec.h); messages received and not yet taken by
// Receive: at most max_pending_messages / max_pending_bytes, after which the connection is
// not read (TCP pushes back on the client) until Receive takes them, plus what the last read
// completed (one read is at most read_budget bytes, or one message); replies not yet written
// to the socket: at most max_unsent_messages / max_unsent_bytes. A protocol error (bad
// greeting, unsupported mechanism, a frame, message or command over its limit, reserved
// flags) closes that connection only, with one warning line. A connection that has not
// finished its handshake (greeting and READY) handshake_timeout_ms after it was accepted is
// closed (libzmq's ZMQ_HANDSHAKE_IVL, 30 s by default): idle sockets cannot pile up. A
// connection that finished its handshake is never closed for being idle: lmcache's client
// keeps one DEALER connection open for the life of a vLLM worker, idle for hours at times,
// and sets no ZMTP heartbeat (a PING it sends is answered all the same).
//
// CONNECTIONS AND DESCRIPTORS. At most max_connections connections, max_connections_per_address
// from one IP address, and none on a descriptor numbered fd_limit() or above (RLIMIT_NOFILE
// less fd_reserve, at most half of it: a new descriptor is the lowest free one, so that many
// stay free for tier files, tier sockets and HTTP). A new connection beyond a bound replaces
// the connection that has waited longest for its handshake (of the same address for the
// per-address bound), which is closed (evicted; past the descriptor bound the new connection
// moves onto the descriptor that frees, so no kept connection ever holds one of the reserve);
// when none is waiting, the new one is closed at once (rejected, never counted as accepted).
// A connection that finished its handshake is never evicted. When accept fails for lack of descriptors or memory (EMFILE, ENFILE,
// ENOBUFS, ENOMEM) the oldest unfinished handshake is evicted to make room, or else the
// listener leaves the poll set for 100 ms or until a connection closes: never a busy loop.
// Every connection accepted ends counted under one reason (CloseReason): accepted =
// connections + the closed counts.
//
// THREADS. Not thread-safe: one thread calls every method (the request loop's). The fds
// passed to Watch are only polled, never read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "net/zmtp_codec.h"

namespace kvd::net {

class ZmtpRouter {
 public:
  struct Options {
    ZmtpLimits limits;
    uint32_t max_pending_messages = 1000;   // per connection, received and not taken (RCVHWM)
    uint64_t max_pending_bytes = 1u << 20;  // per connection, ditto
    uint32_t max_unsent_messages = 100000;  // per connection, queued and not written (SNDHWM)
    uint64_t max_unsent_bytes = 64u << 20;  // per connection, ditto
    uint64_t read_budget = 1u << 20;        // bytes read from one connection per Wait
    int64_t handshake_timeout_ms = 30000;   // greeting and READY within this; 0: no limit
    uint32_t max_connections = 1024;            // open at once, all addresses
    uint32_t max_connections_per_address = 256;  // open at once from one IP address
    uint32_t fd_reserve = 256;  // descriptors kept free (at most half of RLIMIT_NOFILE)
  };
  // Why a connection ended.
  enum class CloseReason : uint8_t {
    kPeer,              // the client closed it, reset it, or the socket failed
    kProtocolError,     // it broke ZMTP or a size limit
    kHandshakeTimeout,  // no greeting and READY within handshake_timeout_ms
    kEvicted,           // an unfinished handshake closed to make room for a new connection
  };
  static constexpr size_t kNumCloseReasons = 4;
  static const char* CloseReasonName(CloseReason r);  // "peer", "protocol_error", ...
  // Why a new connection was closed at once.
  enum class RejectReason : uint8_t { kPerAddress, kTotal, kDescriptors };
  static constexpr size_t kNumRejectReasons = 3;
  static const char* RejectReasonName(RejectReason r);  // "per_address", "total", "descriptors"
  struct Stats {
    uint64_t accepted = 0;          // connections accepted
    uint64_t closed = 0;            // connections closed, for any reason (sum of closed_by)
    uint64_t closed_by[kNumCloseReasons] = {};  // ... per CloseReason
    uint64_t protocol_errors = 0;   // = closed_by[kProtocolError]
    uint64_t handshake_timeouts = 0;  // = closed_by[kHandshakeTimeout]
    uint64_t rejected[kNumRejectReasons] = {};  // new connections closed at once, per reason
    uint64_t accept_pauses = 0;     // times accepting paused for lack of descriptors/memory
    uint64_t dropped_messages = 0;  // messages not sent: no such peer, or its queue full
    uint64_t connections = 0;       // open now
    bool operator==(const Stats&) const = default;
  };

  explicit ZmtpRouter(const Options& options);
  ~ZmtpRouter();
  ZmtpRouter(const ZmtpRouter&) = delete;
  ZmtpRouter& operator=(const ZmtpRouter&) = delete;

  // Listens on tcp://host:port. host: an IPv4 or IPv6 address ("::" takes IPv4 too),
  // "localhost", "*", or a network interface's name. Port 0: any free port (see port()).
  Status Bind(const std::string& host, int port);
  int port() const { return port_; }
  // Connections are accepted only on descriptors below this (see CONNECTIONS AND DESCRIPTORS).
  int fd_limit() const { return fd_limit_; }

  // Also reports readiness of `fd` (e.g. an eventfd) from Wait.
  void Watch(int fd);

  struct Events {
    bool messages = false;  // Receive has a message
    bool watched = false;   // the watched fd is readable
    int64_t io_ns = 0;      // time spent accepting, reading and writing after the wait
  };
  // Accepts connections, reads and writes what the sockets allow, then reports. Returns at
  // once when a message is already waiting; else waits up to timeout_ms.
  Events Wait(int timeout_ms);

  // Takes the next message, round robin over connections: frames = [routing id, frames...]
  // (appended to *frames). False when none is waiting.
  bool Receive(std::vector<zmq::message_t>* frames);
  // True when Receive would return a message now (read by the last Wait, not yet taken).
  // May say true for a connection that has since closed; never false when one waits.
  bool HasMessages() const;

  // Queues [frames[1], ..., frames[n-1]] (moved from) for the connection whose routing id is
  // frames[0]. False when it was dropped (no such connection, or its unsent queue is full).
  // Written at the next Flush or Wait.
  bool Send(zmq::message_t* frames, size_t n);
  // Writes what is queued, as far as the sockets take it now.
  void Flush();
  // Writes until nothing is queued or timeout_ms passed (shutdown). True when all left.
  bool Drain(int timeout_ms);

  Stats stats() const;

 private:
  struct Peer;
  class PeerSink;
  void Accept();
  void Read(Peer& p);
  void Write(Peer& p);
  void Close(Peer& p, CloseReason reason, const Status& why);
  Peer* OldestHandshake(const std::string* address);  // the longest-waiting unfinished one
  void PauseAccept(int64_t now_ns);
  void ResumeAccept();
  void SetInterest(Peer& p);
  void Forget(uint64_t key);
  void Reap();  // forgets the peers closed in this Wait that have nothing left
  void CloseStalledHandshakes(int64_t now_ns);
  std::string NextRoutingId();

  const Options options_;
  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  int port_ = 0;
  int fd_limit_ = 0;
  bool accept_paused_ = false;          // after EMFILE: the listener is out of the poll set ...
  int64_t accept_resume_ns_ = 0;        // ... until then, or until a connection closes
  int64_t last_accept_warning_ns_ = 0;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvd::net
