#include "net/zmtp_router.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <unordered_map>

namespace kvd::net {
namespace {

constexpr uint64_t kListenKey = 0;
constexpr uint64_t kWatchKey = 1;
constexpr uint64_t kFirstPeerKey = 2;
constexpr int kMaxEvents = 64;
constexpr int kMaxIov = 64;
constexpr int kBacklog = 100;  // libzmq's ZMQ_BACKLOG default
constexpr int64_t kAcceptPauseNs = 100'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

std::string_view View(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

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

// One queued piece of output: a frame header and its body, or raw bytes (greeting, command).
struct OutPiece {
  uint8_t hdr[9] = {};
  uint8_t hdr_len = 0;
  zmq::message_t body;
  std::string raw;
  size_t size() const { return hdr_len + body.size() + raw.size(); }
};

struct ZmtpRouter::Peer {
  Peer(uint64_t k, int f, const ZmtpLimits& limits) : key(k), fd(f), decoder(limits) {}
  uint64_t key;
  int fd;
  std::string ip;                    // the peer's IP address (per-address bound)
  std::string address;               // ip:port, for logs
  std::string id;                    // routing id, set at READY
  enum class Phase : uint8_t { kGreeting, kReady, kOpen } phase = Phase::kGreeting;
  ZmtpDecoder decoder;
  // Received messages not yet taken: their frames in order, and frames per message. Flat
  // vectors cleared when drained (no allocation in steady state).
  std::vector<zmq::message_t> pending_frames;
  std::vector<uint32_t> pending_counts;
  size_t pending_frame_head = 0, pending_count_head = 0;
  uint64_t pending_bytes = 0;
  bool in_ready = false;             // listed in Impl::ready
  // Output not yet written: pieces from out_head, the first one written up to out_offset.
  std::vector<OutPiece> out;
  size_t out_head = 0, out_offset = 0;
  uint64_t out_bytes = 0;
  uint32_t out_messages = 0;         // messages queued (counted at their last frame)
  bool in_dirty = false;             // listed in Impl::dirty
  bool reading = true;               // EPOLLIN wanted
  bool writing = false;              // EPOLLOUT wanted
  bool closed = false;               // fd closed; kept while messages are pending

  size_t pending_messages() const { return pending_counts.size() - pending_count_head; }
  bool OverPending(const Options& o) const {
    return pending_messages() >= o.max_pending_messages || pending_bytes >= o.max_pending_bytes;
  }
  void QueueRaw(std::string bytes) {
    OutPiece piece;
    piece.raw = std::move(bytes);
    out_bytes += piece.size();
    out.push_back(std::move(piece));
  }
};

struct ZmtpRouter::Impl {
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers;
  std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>> ids;
  std::vector<uint64_t> ready;       // peers with pending messages, round robin from ready_head
  size_t ready_head = 0;
  std::vector<uint64_t> dirty;       // peers with output queued since the last Flush
  std::vector<uint64_t> dead;        // peers closed during this Wait (Reap)
  // Peers accepted and their handshake deadlines, in accept order (so in deadline order);
  // entries of peers that finished or went are skipped when they come due.
  std::deque<std::pair<int64_t, uint64_t>> handshakes;
  std::unordered_map<std::string, uint32_t> per_address;  // open connections per IP address
  uint64_t next_key = kFirstPeerKey;
  uint32_t next_id;
  Stats stats;
  int64_t last_error_log_ns = 0;
  uint64_t errors_not_logged = 0;
  int64_t last_drop_log_ns = 0;

  Impl() : next_id(std::random_device{}()) {}

  Peer* Find(uint64_t key) {
    auto it = peers.find(key);
    return it == peers.end() ? nullptr : it->second.get();
  }
};

// Decoder callbacks of one connection.
class ZmtpRouter::PeerSink final : public ZmtpSink {
 public:
  PeerSink(ZmtpRouter& r, Peer& p) : router_(r), peer_(p) {}

  Status OnGreeting(uint8_t, uint8_t) override {
    static constexpr std::pair<std::string_view, std::string_view> kProps[] = {
        {"Socket-Type", "ROUTER"}, {"Identity", ""}};
    peer_.QueueRaw(EncodeReady(kProps));
    MarkDirty();
    peer_.phase = Peer::Phase::kReady;
    return Status::Ok();
  }

  Status OnCommand(std::string_view name, std::string_view data) override {
    if (peer_.phase == Peer::Phase::kReady) {
      if (name != "READY") {
        return Status::InvalidArgument("expected the READY command, got '" + std::string(name) + "'");
      }
      auto props = ParseProperties(data);
      if (!props.ok()) return props.status();
      std::string socket_type, identity;
      for (auto& [k, v] : *props) {
        if (EqualsIgnoreCase(k, "Socket-Type")) socket_type = v;
        if (EqualsIgnoreCase(k, "Identity")) identity = v;
      }
      if (socket_type != "DEALER" && socket_type != "REQ" && socket_type != "ROUTER") {
        return Status::InvalidArgument("a " + (socket_type.empty() ? std::string("socket of no type") : socket_type) +
                                       " socket cannot talk to a ROUTER");
      }
      Impl& im = *router_.impl_;
      if (!identity.empty() && identity[0] != '\0') {
        // libzmq's ROUTER refuses a second connection asking for a routing id in use.
        if (im.ids.count(identity)) {
          return Status::AlreadyExists("routing id already used by another connection");
        }
        peer_.id = std::move(identity);
      } else {
        do {
          peer_.id = router_.NextRoutingId();
        } while (im.ids.count(peer_.id));
      }
      im.ids.emplace(peer_.id, peer_.key);
      peer_.phase = Peer::Phase::kOpen;
      return Status::Ok();
    }
    if (peer_.phase != Peer::Phase::kOpen) return Status::InvalidArgument("a command before the greeting");
    if (name == "PING") {  // ZMTP 3.1 heartbeat: TTL (2 bytes) and a context to echo
      if (data.size() < 2 || data.size() > 2 + 16) return Status::InvalidArgument("malformed PING");
      peer_.QueueRaw(EncodeCommand("PONG", data.substr(2)));
      MarkDirty();
    }
    return Status::Ok();  // PONG, and commands of other socket types, are ignored
  }

  Status OnMessage(std::vector<zmq::message_t>& frames) override {
    if (peer_.phase != Peer::Phase::kOpen) return Status::InvalidArgument("a message before READY");
    for (auto& f : frames) {
      peer_.pending_bytes += f.size();
      peer_.pending_frames.push_back(std::move(f));
    }
    peer_.pending_counts.push_back(static_cast<uint32_t>(frames.size()));
    frames.clear();
    if (!peer_.in_ready) {
      peer_.in_ready = true;
      router_.impl_->ready.push_back(peer_.key);
    }
    return Status::Ok();
  }

 private:
  static bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  }
  void MarkDirty() {
    if (!peer_.in_dirty) {
      peer_.in_dirty = true;
      router_.impl_->dirty.push_back(peer_.key);
    }
  }
  ZmtpRouter& router_;
  Peer& peer_;
};

const char* ZmtpRouter::CloseReasonName(CloseReason r) {
  switch (r) {
    case CloseReason::kPeer: return "peer";
    case CloseReason::kProtocolError: return "protocol_error";
    case CloseReason::kHandshakeTimeout: return "handshake_timeout";
    case CloseReason::kEvicted: return "evicted";
  }
  return "?";
}

const char* ZmtpRouter::RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kPerAddress: return "per_address";
    case RejectReason::kTotal: return "total";
    case RejectReason::kDescriptors: return "descriptors";
  }
  return "?";
}

ZmtpRouter::ZmtpRouter(const Options& options) : options_(options), impl_(std::make_unique<Impl>()) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  const int limit = DescriptorLimit();
  fd_limit_ = limit - static_cast<int>(std::min<uint64_t>(options_.fd_reserve, static_cast<uint64_t>(limit / 2)));
  impl_->ready.reserve(64);
  impl_->dirty.reserve(64);
}

ZmtpRouter::~ZmtpRouter() {
  for (auto& [key, p] : impl_->peers) {
    if (p->fd >= 0) close(p->fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

std::string ZmtpRouter::NextRoutingId() {
  // libzmq's form: a zero byte, then a 32-bit counter (big-endian) from a random start.
  const uint32_t n = impl_->next_id++;
  std::string id(5, '\0');
  for (int i = 0; i < 4; ++i) id[1 + i] = static_cast<char>(n >> (24 - 8 * i));
  return id;
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

void ZmtpRouter::Watch(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWatchKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void ZmtpRouter::SetInterest(Peer& p) {
  if (p.fd < 0) return;
  epoll_event ev{};
  ev.events = (p.reading ? EPOLLIN | EPOLLRDHUP : 0u) | (p.writing ? EPOLLOUT : 0u);
  ev.data.u64 = p.key;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, p.fd, &ev);
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

void ZmtpRouter::Read(Peer& p) {
  PeerSink sink(*this, p);
  uint64_t budget = options_.read_budget;
  while (p.fd >= 0 && budget > 0 && !p.OverPending(options_)) {
    std::span<uint8_t> span = p.decoder.WritableSpan();
    if (span.empty()) {  // cannot happen: nothing the decoder waits for exceeds its buffer
      Close(p, CloseReason::kProtocolError, Status::InvalidArgument("internal: the decoder's buffer is full"));
      return;
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(span.size(), budget));
    const ssize_t n = read(p.fd, span.data(), want);
    if (n > 0) {
      budget -= static_cast<uint64_t>(n);
      if (Status s = p.decoder.Commit(static_cast<size_t>(n), sink); !s.ok()) {
        Close(p, CloseReason::kProtocolError, s);
        return;
      }
      if (static_cast<size_t>(n) < want) break;  // drained for now
      continue;
    }
    if (n == 0) {
      Close(p, CloseReason::kPeer, Status::Ok());  // the peer closed
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      Close(p, CloseReason::kPeer, Status::Unavailable(std::strerror(errno)));
    }
    break;
  }
  if (p.fd >= 0 && p.reading && p.OverPending(options_)) {
    p.reading = false;  // Receive resumes it
    SetInterest(p);
  }
  // Replies to commands (READY, PONG) go out with the next flush.
}

void ZmtpRouter::Write(Peer& p) {
  while (p.fd >= 0 && p.out_head < p.out.size()) {
    std::array<iovec, kMaxIov> iov;
    int cnt = 0;
    size_t skip = p.out_offset;
    for (size_t i = p.out_head; i < p.out.size() && cnt + 2 <= kMaxIov; ++i) {
      OutPiece& piece = p.out[i];
      auto add = [&](const void* base, size_t len) {
        if (len <= skip) {
          skip -= len;
          return;
        }
        iov[cnt].iov_base = const_cast<uint8_t*>(static_cast<const uint8_t*>(base)) + skip;
        iov[cnt].iov_len = len - skip;
        skip = 0;
        cnt++;
      };
      add(piece.hdr, piece.hdr_len);
      if (!piece.raw.empty()) add(piece.raw.data(), piece.raw.size());
      if (piece.body.size() > 0) add(piece.body.data(), piece.body.size());
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = static_cast<size_t>(cnt);
    const ssize_t n = sendmsg(p.fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(p, CloseReason::kPeer, Status::Unavailable(std::strerror(errno)));
      return;
    }
    // Advance over what was written.
    size_t left = static_cast<size_t>(n) + p.out_offset;
    p.out_bytes -= static_cast<uint64_t>(n);
    while (p.out_head < p.out.size() && left >= p.out[p.out_head].size()) {
      left -= p.out[p.out_head].size();
      if (p.out[p.out_head].raw.empty() && p.out[p.out_head].hdr_len > 0 &&
          !(p.out[p.out_head].hdr[0] & 0x01)) {
        p.out_messages--;  // a message's last frame is out
      }
      p.out[p.out_head] = OutPiece();
      p.out_head++;
    }
    p.out_offset = left;
  }
  if (p.fd < 0) return;
  if (p.out_head == p.out.size()) {
    p.out.clear();  // keeps its capacity
    p.out_head = p.out_offset = 0;
  } else if (p.out_head > 1024 && p.out_head * 2 > p.out.size()) {
    p.out.erase(p.out.begin(), p.out.begin() + static_cast<std::ptrdiff_t>(p.out_head));
    p.out_head = 0;
  }
  const bool want = p.out_head < p.out.size();
  if (want != p.writing) {
    p.writing = want;
    SetInterest(p);
  }
}

void ZmtpRouter::Close(Peer& p, CloseReason reason, const Status& why) {
  if (p.fd < 0) return;
  if (!why.ok()) {
    const int64_t now = NowNs();
    if (why.code() == StatusCode::kInvalidArgument || why.code() == StatusCode::kAlreadyExists) {
      if (now - impl_->last_error_log_ns >= 1'000'000'000) {
        spdlog::warn("closing the connection from {}: {}{}", p.address, why.message(),
                     impl_->errors_not_logged
                         ? fmt::format(" ({} more such closes in the last second not logged)",
                                       impl_->errors_not_logged)
                         : std::string());
        impl_->last_error_log_ns = now;
        impl_->errors_not_logged = 0;
      } else {
        impl_->errors_not_logged++;
      }
    } else {
      spdlog::debug("connection from {} closed: {}", p.address, why.message());
    }
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.fd, nullptr);
  close(p.fd);
  p.fd = -1;
  p.closed = true;
  Stats& st = impl_->stats;
  st.closed++;
  st.closed_by[static_cast<size_t>(reason)]++;
  if (reason == CloseReason::kProtocolError) st.protocol_errors++;
  if (reason == CloseReason::kHandshakeTimeout) st.handshake_timeouts++;
  st.connections--;
  if (auto a = impl_->per_address.find(p.ip); a != impl_->per_address.end() && --a->second == 0) {
    impl_->per_address.erase(a);
  }
  if (accept_paused_) accept_resume_ns_ = 0;  // a descriptor is free: accept again at the next Wait
  if (!p.id.empty()) {
    auto it = impl_->ids.find(p.id);
    if (it != impl_->ids.end() && it->second == p.key) impl_->ids.erase(it);
  }
  p.out.clear();
  p.out_head = p.out_offset = 0;
  p.out_bytes = 0;
  p.out_messages = 0;
  // Messages it sent before closing are still delivered; the peer goes when they are taken
  // (Receive), or at the end of this Wait (Reap) when there are none.
  impl_->dead.push_back(p.key);
}

void ZmtpRouter::Forget(uint64_t key) { impl_->peers.erase(key); }

void ZmtpRouter::Reap() {
  for (uint64_t key : impl_->dead) {
    Peer* p = impl_->Find(key);
    if (p && p->closed && !p->in_ready && !p->in_dirty) Forget(key);
  }
  impl_->dead.clear();
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

ZmtpRouter::Events ZmtpRouter::Wait(int timeout_ms) {
  Events out;
  Impl& im = *impl_;
  Flush();
  epoll_event events[kMaxEvents];
  const bool have = im.ready_head < im.ready.size();
  int timeout = have ? 0 : timeout_ms;
  if (!im.handshakes.empty() && options_.handshake_timeout_ms > 0) {
    const int64_t now = NowNs();
    CloseStalledHandshakes(now);
    if (!im.handshakes.empty()) {
      const int64_t left_ms = (im.handshakes.front().first - now + 999'999) / 1'000'000;
      if (timeout < 0 || left_ms < timeout) timeout = static_cast<int>(std::max<int64_t>(left_ms, 0));
    }
  }
  if (accept_paused_) {
    const int64_t left_ms = (accept_resume_ns_ - NowNs() + 999'999) / 1'000'000;
    if (left_ms <= 0) {
      ResumeAccept();
      Accept();
    } else if (timeout < 0 || left_ms < timeout) {
      timeout = static_cast<int>(left_ms);
    }
  }
  int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout);
  if (n < 0) n = 0;  // EINTR: report what is there
  const int64_t woke = n > 0 ? NowNs() : 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t key = events[i].data.u64;
    const uint32_t ev = events[i].events;
    if (key == kListenKey) {
      Accept();
      continue;
    }
    if (key == kWatchKey) {
      out.watched = true;
      continue;
    }
    Peer* p = im.Find(key);
    if (!p || p->fd < 0) continue;
    if (ev & EPOLLOUT) Write(*p);
    if (p->fd >= 0 && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
      if (p->reading) {
        Read(*p);
      } else if (ev & (EPOLLHUP | EPOLLERR)) {
        Close(*p, CloseReason::kPeer, Status::Unavailable("connection lost"));
      }
    }
  }
  Flush();  // READY and PONG replies of what was read
  Reap();
  if (woke) out.io_ns = NowNs() - woke;
  out.messages = im.ready_head < im.ready.size();
  return out;
}

bool ZmtpRouter::HasMessages() const { return impl_->ready_head < impl_->ready.size(); }

bool ZmtpRouter::Receive(std::vector<zmq::message_t>* frames) {
  Impl& im = *impl_;
  while (im.ready_head < im.ready.size()) {
    const uint64_t key = im.ready[im.ready_head++];
    if (im.ready_head == im.ready.size()) {
      im.ready.clear();
      im.ready_head = 0;
    }
    Peer* p = im.Find(key);
    if (!p) continue;
    if (p->pending_messages() == 0) {
      p->in_ready = false;
      if (p->closed && !p->in_dirty) Forget(key);
      continue;
    }
    const uint32_t count = p->pending_counts[p->pending_count_head++];
    frames->emplace_back(p->id.data(), p->id.size());
    for (uint32_t i = 0; i < count; ++i) {
      zmq::message_t& f = p->pending_frames[p->pending_frame_head++];
      p->pending_bytes -= f.size();
      frames->push_back(std::move(f));
    }
    if (p->pending_messages() == 0) {
      p->pending_frames.clear();
      p->pending_counts.clear();
      p->pending_frame_head = p->pending_count_head = 0;
      p->in_ready = false;
      if (p->closed) {
        if (!p->in_dirty) Forget(key);
      } else if (!p->reading) {
        p->reading = true;
        SetInterest(*p);
      }
    } else {
      im.ready.push_back(key);  // round robin: its next message after the others'
      if (!p->reading && !p->closed && !p->OverPending(options_)) {
        p->reading = true;
        SetInterest(*p);
      }
    }
    return true;
  }
  return false;
}

bool ZmtpRouter::Send(zmq::message_t* frames, size_t n) {
  Impl& im = *impl_;
  auto drop = [&](const char* why) {
    im.stats.dropped_messages++;
    const int64_t now = NowNs();
    if (now - im.last_drop_log_ns >= 1'000'000'000) {
      im.last_drop_log_ns = now;
      spdlog::warn("dropping a reply: {} ({} dropped so far)", why, im.stats.dropped_messages);
    }
    return false;
  };
  if (n < 2) return drop("a message without frames");
  auto it = im.ids.find(View(frames[0]));
  if (it == im.ids.end()) return drop("its client is gone");
  Peer* p = im.Find(it->second);
  if (!p || p->fd < 0) return drop("its client is gone");
  uint64_t bytes = 0;
  for (size_t i = 1; i < n; ++i) bytes += frames[i].size() + 9;
  if (p->out_messages >= options_.max_unsent_messages ||
      (p->out_bytes > 0 && p->out_bytes + bytes > options_.max_unsent_bytes)) {
    return drop("its client does not read its replies (unsent queue full)");
  }
  for (size_t i = 1; i < n; ++i) {
    OutPiece piece;
    piece.hdr_len = static_cast<uint8_t>(EncodeFrameHeader(frames[i].size(), i + 1 < n, piece.hdr));
    piece.body = std::move(frames[i]);
    p->out_bytes += piece.size();
    p->out.push_back(std::move(piece));
  }
  p->out_messages++;
  if (!p->in_dirty) {
    p->in_dirty = true;
    im.dirty.push_back(p->key);
  }
  return true;
}

void ZmtpRouter::Flush() {
  Impl& im = *impl_;
  for (size_t i = 0; i < im.dirty.size(); ++i) {  // Write may not add to dirty
    Peer* p = im.Find(im.dirty[i]);
    if (!p) continue;
    p->in_dirty = false;
    if (p->fd >= 0) Write(*p);
    if (p->closed && !p->in_ready) Forget(p->key);
  }
  im.dirty.clear();
}

bool ZmtpRouter::Drain(int timeout_ms) {
  const int64_t deadline = NowNs() + int64_t{timeout_ms} * 1'000'000;
  Flush();
  while (true) {
    bool left = false;
    for (auto& [key, p] : impl_->peers) left |= p->fd >= 0 && p->out_head < p->out.size();
    if (!left) return true;
    const int64_t ms = (deadline - NowNs()) / 1'000'000;
    if (ms <= 0) return false;
    epoll_event events[kMaxEvents];
    const int n = epoll_wait(epoll_fd_, events, kMaxEvents, static_cast<int>(std::min<int64_t>(ms, 100)));
    for (int i = 0; i < n; ++i) {
      Peer* p = impl_->Find(events[i].data.u64);
      if (p && p->fd >= 0 && (events[i].events & EPOLLOUT)) Write(*p);
      if (p && p->fd >= 0 && (events[i].events & (EPOLLHUP | EPOLLERR))) {
        Close(*p, CloseReason::kPeer, Status::Unavailable("connection lost"));
      }
    }
  }
}

ZmtpRouter::Stats ZmtpRouter::stats() const { return impl_->stats; }

}  // namespace kvd::net
