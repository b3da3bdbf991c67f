// ZmtpRouter's listening and admission: the listener (Bind), accepting connections under the
// connection and descriptor bounds (evicting the oldest unfinished handshake or rejecting),
// pausing accept when out of descriptors, and closing handshakes that stalled. The contract
// is in zmtp_router.h ("CONNECTIONS AND DESCRIPTORS", "HANDSHAKE").
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "net/zmtp_router.h"
#include "net/zmtp_router_state.h"

namespace kvd::net {
namespace {

using zmtp_router_detail::kAcceptPauseNs;
using zmtp_router_detail::kBacklog;
using zmtp_router_detail::kListenKey;
using zmtp_router_detail::kMaxEvents;
using zmtp_router_detail::NowNs;

// The peer's IP address (an IPv4 peer of a "::" listener as IPv4) and "ip:port" for logs.
void PeerAddress(const sockaddr_storage& ss, std::string* ip, std::string* address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    *ip = host;
    *address = *ip + ":" + std::to_string(ntohs(a->sin_port));
    return;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof(host));
      *ip = host;
      *address = *ip + ":" + std::to_string(ntohs(a->sin6_port));
      return;
    }
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    *ip = host;
    *address = "[" + *ip + "]:" + std::to_string(ntohs(a->sin6_port));
    return;
  }
  *ip = "?";
  *address = "?";
}

// Descriptors are numbered below this (RLIMIT_NOFILE's soft limit).
int DescriptorLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 30)) {
    return 1 << 30;
  }
  return static_cast<int>(rl.rlim_cur);
}

// The address to listen on for `host` (see Bind).
Result<sockaddr_storage> ResolveHost(const std::string& host_in, int port, socklen_t* len) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  if (host == "*") host = "0.0.0.0";
  sockaddr_storage ss{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  // inet_aton takes every IPv4 spelling libzmq's resolver takes ("0", "0x0", "127.1").
  if (inet_aton(host.c_str(), &v4->sin_addr) != 0) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in);
    return ss;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in6);
    return ss;
  }
  // A network interface's name (as libzmq's tcp:// transport takes): its IPv4 address, else
  // its IPv6 address.
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    const sockaddr* found = nullptr;
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || host != i->ifa_name) continue;
      if (i->ifa_addr->sa_family == AF_INET) {
        found = i->ifa_addr;
        break;
      }
      if (i->ifa_addr->sa_family == AF_INET6 && !found) found = i->ifa_addr;
    }
    if (found) {
      const size_t n = found->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&ss, found, n);
      if (found->sa_family == AF_INET) {
        v4->sin_port = htons(static_cast<uint16_t>(port));
      } else {
        v6->sin6_port = htons(static_cast<uint16_t>(port));
      }
      *len = static_cast<socklen_t>(n);
    }
    freeifaddrs(list);
    if (found) return ss;
  }
  return Status::InvalidArgument("'" + host_in + "' is not an IP address or a network interface");
}

}  // namespace

ZmtpRouter::ZmtpRouter(const Options& options) : options_(options), impl_(std::make_unique<Impl>()) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  const int limit = DescriptorLimit();
  fd_limit_ = limit - static_cast<int>(std::min<uint64_t>(options_.fd_reserve, static_cast<uint64_t>(limit / 2)));
  impl_->ready.reserve(64);
  impl_->dirty.reserve(64);
}

Status ZmtpRouter::Bind(const std::string& host, int port) {
  const std::string where = "tcp://" + (host.find(':') != std::string::npos && host.front() != '['
                                            ? "[" + host + "]"
                                            : host) +
                            ":" + std::to_string(port);
  if (epoll_fd_ < 0) return Status::Unavailable("cannot listen on " + where + ": epoll: " + std::strerror(errno));
  if (listen_fd_ >= 0) return Status::FailedPrecondition("already listening");
  socklen_t len = 0;
  auto addr = ResolveHost(host, port, &len);
  if (!addr.ok()) return Status::Unavailable("cannot listen on " + where + ": " + addr.status().message());
  const int family = addr->ss_family;
  const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable("cannot listen on " + where + ": " + std::strerror(errno));
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // "::" takes IPv4 connections too, as libzmq does with ZMQ_IPV6.
  if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), len) != 0 || listen(fd, kBacklog) != 0) {
    const int e = errno;
    close(fd);
    return Status::Unavailable("cannot listen on " + where + ": " + std::strerror(e));
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  port_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  listen_fd_ = fd;
  return Status::Ok();
}

ZmtpRouter::Peer* ZmtpRouter::OldestHandshake(const std::string* address) {
  for (const auto& [deadline, key] : impl_->handshakes) {
    Peer* p = impl_->Find(key);
    if (!p || p->fd < 0 || p->phase == Peer::Phase::kOpen) continue;
    if (address == nullptr || p->ip == *address) return p;
  }
  return nullptr;
}

void ZmtpRouter::PauseAccept(int64_t now_ns) {
  if (!accept_paused_) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  accept_paused_ = true;
  accept_resume_ns_ = now_ns + kAcceptPauseNs;
  impl_->stats.accept_pauses++;
}

void ZmtpRouter::ResumeAccept() {
  if (!accept_paused_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  accept_paused_ = false;
}

void ZmtpRouter::Accept() {
  Impl& im = *impl_;
  const int64_t now = NowNs();
  for (int i = 0; i < kMaxEvents && !accept_paused_; ++i) {
    sockaddr_storage ss{};
    socklen_t ss_len = sizeof(ss);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &ss_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return;  // EAGAIN
      // Out of descriptors or memory. accept fails so before it looks at its queue: when no
      // connection waits there, there is nothing to make room for.
      pollfd pending{listen_fd_, POLLIN, 0};
      if (poll(&pending, 1, 0) != 1) return;
      // Make room by evicting the oldest unfinished handshake, else take the listener out of
      // the poll set for a moment (it stays readable: polling it would spin).
      if (Peer* victim = OldestHandshake(nullptr)) {
        Close(*victim, CloseReason::kEvicted, Status::Unavailable("evicted: out of descriptors"));
        continue;
      }
      if (now - last_accept_warning_ns_ >= 10'000'000'000) {
        last_accept_warning_ns_ = now;
        spdlog::warn("cannot accept a connection on the request port ({}); accepting pauses for 100 ms "
                     "or until a connection closes ({} open)",
                     std::strerror(err), im.stats.connections);
      }
      PauseAccept(now);
      return;
    }
    std::string ip, address;
    PeerAddress(ss, &ip, &address);
    // The bounds, most specific first. A connection beyond one replaces the oldest unfinished
    // handshake (of its address for the per-address bound); when none waits it is rejected.
    const auto same = im.per_address.find(ip);
    const bool address_full = same != im.per_address.end() && same->second >= options_.max_connections_per_address;
    const bool total_full = im.stats.connections >= options_.max_connections;
    const bool fds_low = fd >= fd_limit_;
    if (address_full || total_full || fds_low) {
      const RejectReason why = address_full ? RejectReason::kPerAddress
                               : total_full ? RejectReason::kTotal
                                            : RejectReason::kDescriptors;
      Peer* victim = OldestHandshake(address_full ? &ip : nullptr);
      if (victim == nullptr) {
        close(fd);
        im.stats.rejected[static_cast<size_t>(why)]++;
        if (now - last_accept_warning_ns_ >= 10'000'000'000) {
          last_accept_warning_ns_ = now;
          spdlog::warn("rejecting a connection from {}: {} (kvd_zmtp_connections_rejected_total counts "
                       "them; logged once per 10 s)",
                       address,
                       why == RejectReason::kPerAddress ? fmt::format("{} connections from that address already",
                                                                      options_.max_connections_per_address)
                       : why == RejectReason::kTotal
                           ? fmt::format("{} connections open already", options_.max_connections)
                           : fmt::format("descriptor {} is past the {} kept for connections", fd, fd_limit_));
        }
        continue;
      }
      Close(*victim, CloseReason::kEvicted,
            Status::Unavailable(std::string("evicted for a new connection: ") + RejectReasonName(why) + " bound"));
      if (fds_low) {
        // The new connection takes the descriptor the victim freed (below fd_limit_, as every
        // kept connection's is): on its own high one it would eat the reserve, one eviction
        // at a time. F_DUPFD gives the lowest free descriptor.
        const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        close(fd);
        if (moved < 0 || moved >= fd_limit_) {
          if (moved >= 0) close(moved);
          im.stats.rejected[static_cast<size_t>(RejectReason::kDescriptors)]++;
          continue;
        }
        fd = moved;
      }
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const uint64_t key = im.next_key++;
    auto peer = std::make_unique<Peer>(key, fd, options_.limits);
    peer->ip = std::move(ip);
    peer->address = std::move(address);
    peer->pending_frames.reserve(16);
    peer->pending_counts.reserve(4);
    peer->out.reserve(16);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = key;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    Peer& p = *peer;
    im.peers.emplace(key, std::move(peer));
    im.per_address[p.ip]++;
    im.stats.accepted++;
    im.stats.connections++;
    // Every new connection is listed (eviction takes the oldest); the deadline only with a
    // timeout. Entries of connections that finished or went are dropped when they come due,
    // or here when they outnumber the connections (no timeout: none comes due).
    im.handshakes.emplace_back(options_.handshake_timeout_ms > 0
                                   ? now + options_.handshake_timeout_ms * 1'000'000
                                   : std::numeric_limits<int64_t>::max(),
                               key);
    if (im.handshakes.size() > 2 * im.stats.connections + 64) {
      std::erase_if(im.handshakes, [&](const auto& h) {
        const Peer* q = im.Find(h.second);
        return !q || q->fd < 0 || q->phase == Peer::Phase::kOpen;
      });
    }
    p.QueueRaw(EncodeGreeting());
    Write(p);
  }
}

void ZmtpRouter::CloseStalledHandshakes(int64_t now_ns) {
  Impl& im = *impl_;
  while (!im.handshakes.empty() && im.handshakes.front().first <= now_ns) {
    const uint64_t key = im.handshakes.front().second;
    im.handshakes.pop_front();
    Peer* p = im.Find(key);
    if (!p || p->fd < 0 || p->phase == Peer::Phase::kOpen) continue;
    Close(*p, CloseReason::kHandshakeTimeout,
          Status::InvalidArgument("no ZMTP handshake within " + std::to_string(options_.handshake_timeout_ms) +
                                  " ms"));
  }
}

}  // namespace kvd::net
