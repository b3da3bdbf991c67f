// ZmtpRouter's connections once accepted: the handshake's commands, reading and decoding,
// writing, routing replies by id, closing. Listening and admission (the bounds, eviction,
// handshake timeouts) are in zmtp_admission.cc; the state both share in zmtp_router_state.h.
#include "net/zmtp_router.h"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <unordered_map>

#include "net/zmtp_router_state.h"

namespace kvd::net {
namespace {

using zmtp_router_detail::kListenKey;
using zmtp_router_detail::kMaxEvents;
using zmtp_router_detail::kMaxIov;
using zmtp_router_detail::kWatchKey;
using zmtp_router_detail::NowNs;

std::string_view View(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

}  // namespace

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
