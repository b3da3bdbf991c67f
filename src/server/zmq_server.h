// ZmqServer: the socket loop. One ROUTER socket, spoken natively (net/zmtp_router.h: no
// libzmq I/O thread between the clients and this loop), and one thread that owns it.
//
// Each wake-up (poll on the socket and an eventfd) the loop takes the replies the pool
// finished, reads up to kMaxReadsPerWake requests and then sends every reply it has in one
// go (replies batched per wake-up). Short operations (PING, QUERY, END_SESSION,
// GET_CHUNK_SIZE, lookups of short prompts, ...: Dispatch::kInline, kInlineUnlessLong in
// the op table) run to completion right there; transfers and registrations go to the
// connection's lane on the TaskPool (a worker's requests stay in order, off the socket
// thread), long lookups and CLEAR to a per-connection pool lane as wide as the pool
// (a long lookup up to kInlineWhenAlonePayloadBytes runs inline when it is the only
// message waiting: a lone client's lookup costs no thread hops).
// A WAIT_PREFETCH_STATUS whose prefetch still runs is parked on the loop, not on a thread
// (prefetch_waits.h), and answered when the prefetch ends or its timeout passes.
// Request frames are moved, never copied: a lane task owns the zmq messages it was
// handed and its reply reuses them for the envelope.
//
// Memory bounds per connection: a frame larger than MaxFrameBytes(), a message larger than
// MaxMessageBytes() or of more than kMaxFramesPerMessage frames closes the connection
// before it is buffered (zmtp_codec.h); the router reads a connection only while fewer
// than zmq_rcvhwm of its messages (and under 1 MiB of them) wait for this loop, so the
// loop never falls behind what it has read; and requests read but not yet answered may
// hold at most max_queued_bytes_per_connection bytes of frames: beyond that a request is
// answered at once with its op's failure reply (counted as refused) and its frames are
// freed. A single request larger than the bound is still accepted when nothing else of its
// connection is queued. A message whose uid frame is over wire::kMaxRequestUidBytes is
// dropped unanswered before anything keeps it (a reply, a parked wait or a KV-event stream
// would hold the uid). docs/reliability.md adds these up.
//
// Steady state of PING / QUERY_PREFETCH_STATUS / END_SESSION: no heap allocation on the
// socket thread (frames are received into reused storage, replies are small messages,
// request ids are views); see bench/alloc_bench.cc.
//
// Frames in: [identity, uid, op, payload...]; out: [identity, uid, op, reply] with uid
// and op echoed byte for byte and exactly one reply frame. Only the loop thread touches
// the socket. Thread-safety: Bind and Run from one thread; the destructor after Run
// returned.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "server/config.h"
#include "server/kv_service.h"
#include "server/metrics.h"
#include "server/task_pool.h"

namespace kvd::server {

class ZmqServer {
 public:
  // Requests whose payload frames add up to at most this many bytes run inline where the
  // op table says kInlineUnlessLong: a LOOKUP of up to ~3-5K tokens, some 30-60 us of
  // decoding and hashing. Longer ones go to the pool, whose threads run them in parallel.
  static constexpr size_t kInlinePayloadBytes = 16 << 10;
  // ...and up to this many bytes (a LOOKUP of up to ~50K tokens, at most ~150 us) when no
  // other message is waiting on the loop: the pool hop and the reply's way back through the
  // loop's eventfd cost a lone client ~100 us, and nobody waits behind an inline request
  // that arrived alone (messages that come meanwhile wait at most that long).
  static constexpr size_t kInlineWhenAlonePayloadBytes = 256 << 10;
  // Requests read per wake-up before the loop sends what it has.
  static constexpr int kMaxReadsPerWake = 256;
  // Replies are sent early, within a wake-up, once inline work since the last send took
  // this long or this many replies are waiting: batching must not delay a reply by more
  // than a few inline requests.
  static constexpr int64_t kSendAfterInlineNs = 100'000;
  static constexpr size_t kSendAfterReplies = 64;

  // The largest frame kvd accepts (a larger one closes its connection): a cache key
  // holding the largest token array the decoders take (DecodeLimits::max_array elements of
  // at most 9 bytes each) plus its strings. Every legal request's frames are smaller.
  static uint64_t MaxFrameBytes();
  // The largest message: its largest frame and 16 MiB for the others.
  static uint64_t MaxMessageBytes();
  // Frames of the largest legal message: identity-less [uid, op] and at most 8 payloads.
  static constexpr uint32_t kMaxFramesPerMessage = 16;

  // `metrics` (not owned) records per-op counts, latency, phases and the loop's wake-ups;
  // it must outlive the server.
  ZmqServer(const ServerConfig& config, KvService* service, RequestMetrics* metrics);
  ~ZmqServer();

  // Listens on the configured host and port (IPv6 addresses such as "::" and "::1" too,
  // "localhost", an interface name); a clear error if the address is taken or invalid.
  Status Bind();
  // Serves until `stop` becomes true; then stops accepting, lets queued work finish and
  // sends its replies.
  void Run(const std::atomic<bool>& stop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvd::server
