// ConnectionLoop (internal): the state of one connection (ConnectionLoop::Conn) and the
// helper both halves of the loop use: connection_loop.cc (sockets, accept, the epoll loop,
// capacity and deadlines) and connection_loop_requests.cc (reading and framing requests,
// handing them to the handler threads, writing the answers). A Conn is owned by the loop's
// conns_ and read and written only on the I/O thread. Not for use outside these two files.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "http/connection_loop.h"
#include "http/request_framer.h"

namespace kvd::http {
namespace detail {

inline std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace detail

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

}  // namespace kvd::http
