// The state ZmtpRouter's two source files share (zmtp_router.cc: framing, reading, writing,
// routing; zmtp_admission.cc: listening, accepting, the connection bounds and handshake
// timeouts): a connection (Peer), the router's tables (Impl) and their constants. Private
// to src/net: nothing outside includes it. Threads as ZmtpRouter: one (the request loop's).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "net/zmtp_codec.h"
#include "net/zmtp_router.h"

namespace kvd::net::zmtp_router_detail {

constexpr uint64_t kListenKey = 0;
constexpr uint64_t kWatchKey = 1;
constexpr uint64_t kFirstPeerKey = 2;
constexpr int kMaxEvents = 64;
constexpr int kMaxIov = 64;
constexpr int kBacklog = 100;  // libzmq's ZMQ_BACKLOG default
constexpr int64_t kAcceptPauseNs = 100'000'000;

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// One queued piece of output: a frame header and its body, or raw bytes (greeting, command).
struct OutPiece {
  uint8_t hdr[9] = {};
  uint8_t hdr_len = 0;
  zmq::message_t body;
  std::string raw;
  size_t size() const { return hdr_len + body.size() + raw.size(); }
};

}  // namespace kvd::net::zmtp_router_detail

namespace kvd::net {

using zmtp_router_detail::OutPiece;

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
  std::unordered_map<std::string, uint64_t, zmtp_router_detail::StringHash, std::equal_to<>> ids;
  std::vector<uint64_t> ready;       // peers with pending messages, round robin from ready_head
  size_t ready_head = 0;
  std::vector<uint64_t> dirty;       // peers with output queued since the last Flush
  std::vector<uint64_t> dead;        // peers closed during this Wait (Reap)
  // Peers accepted and their handshake deadlines, in accept order (so in deadline order);
  // entries of peers that finished or went are skipped when they come due.
  std::deque<std::pair<int64_t, uint64_t>> handshakes;
  std::unordered_map<std::string, uint32_t> per_address;  // open connections per IP address
  uint64_t next_key = zmtp_router_detail::kFirstPeerKey;
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

}  // namespace kvd::net
