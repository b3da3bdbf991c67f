#include "server/zmq_server.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "common/clock.h"
#include "common/mutex.h"
#include "net/zmtp_router.h"
#include "server/handlers.h"
#include "server/kv_event_streams.h"
#include "server/prefetch_waits.h"
#include "server/request_phases.h"
#include "wire/codec.h"

namespace kvd::server {
namespace {

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string_view View(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

// An answered request: the envelope frames it came with and its reply frame.
struct Reply {
  zmq::message_t identity, uid, op, body;
  uint64_t queued_bytes = 0;  // bytes it held against its connection's bound (lane requests)
  // Timing of a request that went through Run (ready_ns 0: not timed, e.g. a refusal).
  const wire::OpInfo* info = nullptr;
  PhaseTotals phases;         // queue..copy
  int64_t handled_ns = 0;     // receipt -> reply ready (its kvd_request_duration_seconds)
  int64_t ready_ns = 0;       // when the reply was ready (WallNs)
};

// What Run measured of one request, for its Reply.
struct RunTiming {
  PhaseTotals phases;
  int64_t handled_ns = 0;
  int64_t ready_ns = 0;
};

// A WAIT_PREFETCH_STATUS parked until its prefetch ends (prefetch_waits.h): its envelope
// (the reply's body is set when it is answered), its op and when it arrived.
struct ParkedWait {
  Reply reply;
  wire::Op op = wire::Op::kWaitPrefetchStatus;
  int64_t began = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace

uint64_t ZmqServer::MaxFrameBytes() {
  const wire::DecodeLimits limits;
  // Token array: a 5-byte array header and elements of at most 9 bytes (int64); the other
  // fields of a key (names, ids, unknown fields the decoder skips) get 4 MiB.
  return 5 + 9 * uint64_t{limits.max_array} + (4u << 20);
}

uint64_t ZmqServer::MaxMessageBytes() { return MaxFrameBytes() + (16u << 20); }

namespace {

net::ZmtpRouter::Options RouterOptions(const ServerConfig& c) {
  net::ZmtpRouter::Options o;
  o.limits.max_frame_bytes = ZmqServer::MaxFrameBytes();
  o.limits.max_message_bytes = ZmqServer::MaxMessageBytes();
  o.limits.max_frames = ZmqServer::kMaxFramesPerMessage;
  o.max_pending_messages = static_cast<uint32_t>(std::max(c.zmq_rcvhwm, 1));
  o.max_unsent_messages = static_cast<uint32_t>(std::max(c.zmq_sndhwm, 1));
  o.handshake_timeout_ms = static_cast<int64_t>(c.handshake_timeout_seconds * 1000);
  o.max_connections = std::max<uint32_t>(c.max_connections, 1);
  o.max_connections_per_address = std::max<uint32_t>(c.max_connections_per_address, 1);
  o.fd_reserve = c.fd_reserve;
  return o;
}

}  // namespace

struct ZmqServer::Impl {
  const ServerConfig config;
  KvService* service;
  RequestMetrics* metrics;  // not owned
  const uint64_t max_queued_bytes;
  net::ZmtpRouter router;
  int wake_fd = -1;
  std::unique_ptr<TaskPool> pool;

  Mutex out_mu;
  std::vector<Reply> outbox KVD_GUARDED_BY(out_mu);  // replies of lane/pool tasks

  // Socket thread only.
  std::vector<Reply> sending;                  // replies of this wake-up
  std::vector<zmq::message_t> frames;          // the request being read
  std::vector<std::string_view> payload_views;
  std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>> queued_bytes;
  int64_t last_refusal_log_ns = 0;
  int64_t last_malformed_log_ns = 0;  // rate limit of the "dropped unanswered" warning
  SteadyClock clock;
  std::unique_ptr<KvEventStreams> streams;  // subscribe_kv_events (kv_event_streams.h)
  PrefetchWaits<ParkedWait> waits;           // parked WAIT_PREFETCH_STATUS requests
  uint64_t prefetch_changes_seen = 0;        // service->lookup_results().changes() at the last check
  net::ZmtpRouter::Stats published;          // the router's counters as last published

  // Publishes the router's connection counters to the metrics when they moved.
  void PublishTransport() {
    const net::ZmtpRouter::Stats t = router.stats();
    if (t == published) return;
    published = t;
    RequestMetrics::TransportSnapshot snap;
    snap.connections = t.connections;
    snap.accepted = t.accepted;
    snap.closed = t.closed;
    snap.protocol_errors = t.protocol_errors;
    snap.handshake_timeouts = t.handshake_timeouts;
    snap.dropped_replies = t.dropped_messages;
    std::copy(std::begin(t.closed_by), std::end(t.closed_by), snap.closed_by.begin());
    std::copy(std::begin(t.rejected), std::end(t.rejected), snap.rejected.begin());
    snap.accept_pauses = t.accept_pauses;
    metrics->SetTransport(snap);
  }

  Impl(const ServerConfig& c, KvService* s, RequestMetrics* m)
      : config(c),
        service(s),
        metrics(m),
        max_queued_bytes(c.max_queued_bytes_per_connection > 0 ? c.max_queued_bytes_per_connection
                                                               : 2 * MaxFrameBytes()),
        router(RouterOptions(c)) {
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    streams = std::make_unique<KvEventStreams>(
        s->kv_events(), &clock, c.worker_reap_timeout_seconds,
        [this](std::vector<std::string> f) { SendFrames(f); });
    if (KvEventLog* log = s->kv_events()) {
      log->SetWakeup([fd = wake_fd] {  // a new record: let the loop pump the streams
        uint64_t one = 1;
        (void)!write(fd, &one, sizeof(one));
      });
    }
    s->lookup_results().SetWakeup([fd = wake_fd] {  // a prefetch ended: let the loop answer its waits
      uint64_t one = 1;
      (void)!write(fd, &one, sizeof(one));
    });
    const int threads = c.max_workers > 0
                            ? c.max_workers
                            : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 16);
    pool = std::make_unique<TaskPool>(threads);
    router.Watch(wake_fd);
    sending.reserve(kMaxReadsPerWake);
    frames.reserve(16);
    payload_views.reserve(16);
  }
  // Ownership order of wake_fd: its writers are the KV-event log's wake-up callback and the
  // pool's tasks (PostReply). Both are stopped before it is closed: SetWakeup(nullptr) returns
  // only once no callback runs or will run (kv_events.h), pool.reset() joins the workers.
  ~Impl() {
    if (KvEventLog* log = service->kv_events()) log->SetWakeup(nullptr);
    service->lookup_results().SetWakeup(nullptr);
    pool.reset();
    if (wake_fd >= 0) close(wake_fd);
    wake_fd = -1;
  }

  // From a pool thread: hands a finished reply to the loop and wakes it.
  void PostReply(Reply r) {
    {
      MutexLock lock(&out_mu);
      outbox.push_back(std::move(r));
    }
    uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }

  // Socket thread: moves finished replies into this wake-up's batch.
  void TakeOutbox() {
    uint64_t n;
    (void)!read(wake_fd, &n, sizeof(n));
    {
      MutexLock lock(&out_mu);
      for (auto& r : outbox) sending.push_back(std::move(r));
      outbox.clear();
    }
    for (const auto& r : sending) {
      if (r.queued_bytes == 0) continue;
      auto it = queued_bytes.find(View(r.identity));
      if (it == queued_bytes.end()) continue;
      it->second -= std::min(it->second, r.queued_bytes);
      if (it->second == 0) queued_bytes.erase(it);
    }
  }

  void SendAll() {
    const bool debug = spdlog::should_log(spdlog::level::debug);
    for (auto& r : sending) {
      const std::string tag = debug && r.ready_ns > 0 ? ClientTag(View(r.identity)) : std::string();
      zmq::message_t out[4] = {std::move(r.identity), std::move(r.uid), std::move(r.op),
                               std::move(r.body)};
      router.Send(out, 4);  // a reply to a client that is gone is dropped (and counted)
      if (r.ready_ns > 0 && r.info != nullptr) RecordReply(r, tag);
    }
    sending.clear();
    router.Flush();
  }

  // Socket thread, after sending a timed reply: its reply phase, and at debug level one
  // line with the request's phase times (`tag`: its client, taken before the send).
  void RecordReply(Reply& r, const std::string& tag) {
    PhaseTotals reply;
    const int64_t reply_ns = WallNs() - r.ready_ns;
    reply.ns[static_cast<size_t>(Phase::kReply)] = reply_ns > 0 ? reply_ns : 1;
    metrics->RecordPhases(r.info->op, reply);
    if (!spdlog::should_log(spdlog::level::debug)) return;
    r.phases.ns[static_cast<size_t>(Phase::kReply)] = reply.ns[static_cast<size_t>(Phase::kReply)];
    std::string parts;
    for (Phase p : {Phase::kQueue, Phase::kDecode, Phase::kHash, Phase::kIndex, Phase::kCopy,
                    Phase::kReply}) {  // in the order they happen
      const size_t i = static_cast<size_t>(p);
      if (r.phases.ns[i] <= 0) continue;
      parts += fmt::format("{}{} {:.3f}", parts.empty() ? "" : ", ", kPhaseNames[i],
                           static_cast<double>(r.phases.ns[i]) * 1e-6);
    }
    spdlog::debug("{} from {}: {:.3f} ms to reply ready, {:.3f} ms to sent (ms per phase: {})",
                  r.info->name, tag, static_cast<double>(r.handled_ns) * 1e-6,
                  static_cast<double>(r.handled_ns + reply.ns[static_cast<size_t>(Phase::kReply)]) *
                      1e-6,
                  parts);
  }

  // Socket thread: sends a stream message now ([identity, uid, op(, batch)]).
  void SendFrames(const std::vector<std::string>& f) {
    std::vector<zmq::message_t> out;
    out.reserve(f.size());
    for (const auto& x : f) out.emplace_back(x.data(), x.size());
    router.Send(out.data(), out.size());
    router.Flush();
  }

  // Socket thread: queues the reply to frames[0..2] (moved out of `frames`); `timing`
  // (with its op) when the request went through Run.
  void ReplyInline(std::string_view body, const wire::OpInfo* info = nullptr,
                   const RunTiming& timing = {}) {
    sending.push_back(Reply{std::move(frames[0]), std::move(frames[1]), std::move(frames[2]),
                            zmq::message_t(body.data(), body.size()), 0, info, timing.phases,
                            timing.handled_ns, timing.ready_ns});
  }

  // Runs one request's handler on the calling thread; returns its reply frame and fills
  // *timing. `queue_ns`: how long it waited for this thread (0: run inline).
  std::string Run(const wire::OpInfo& info, wire::Frames payloads, std::string_view identity,
                  int64_t began, int64_t queue_ns, RunTiming* timing) {
    ResetPhases();
    if (queue_ns > 0) AddPhase(Phase::kQueue, queue_ns);
    std::string reply;
    try {
      reply = HandleRequest(*service, info, payloads, identity);
    } catch (const std::exception& e) {
      spdlog::error("{} from {}: internal error: {}", info.name, ClientTag(identity), e.what());
      reply = wire::EncodeNil();
    }
    timing->phases = TakePhases();
    metrics->RecordPhases(info.op, timing->phases);
    timing->handled_ns = metrics->End(info.op, began);
    timing->ready_ns = began + timing->handled_ns;
    return reply;
  }

  // WAIT_PREFETCH_STATUS for a request whose prefetch runs, with a timeout: parked (no
  // thread waits; AnswerWaits replies). False: it is answered now, as any inline op.
  bool ParkWait(wire::Op op, int64_t began) {
    payload_views.clear();
    for (size_t i = 3; i < frames.size(); ++i) payload_views.push_back(View(frames[i]));
    auto req = wire::DecodeWaitPrefetch(payload_views);
    if (!req.ok()) return false;
    const int64_t now = WallNs();
    const int64_t deadline = PrefetchWaits<ParkedWait>::DeadlineNs(now, req->second);
    if (deadline <= now || !service->lookup_results().Running(req->first)) return false;
    std::string connection(View(frames[0]));
    std::string request_id(req->first);
    // Untimed (ready_ns 0): AnswerWaits records a parked wait's duration itself.
    Reply parked;
    parked.identity = std::move(frames[0]);
    parked.uid = std::move(frames[1]);
    parked.op = std::move(frames[2]);
    ParkedWait w{std::move(parked), op, began};
    if (!waits.Park(std::move(connection), std::move(request_id), deadline, std::move(w))) {
      // Bound reached: answer "still running" now (Park left `w` as it was).
      metrics->CountRefused(op);
      metrics->End(op, began);
      const std::string nil = wire::EncodeNil();
      w.reply.body = zmq::message_t(nil.data(), nil.size());
      sending.push_back(std::move(w.reply));
    }
    frames = std::vector<zmq::message_t>();  // moved from: make it a valid empty vector again
    frames.reserve(16);
    return true;
  }

  // Socket thread: answers the parked waits whose prefetch ended (or whose result went:
  // END_SESSION, expiry, eviction) or whose deadline passed. Looks at them only when
  // something changed or a deadline is due.
  void AnswerWaits(bool all = false) {
    if (waits.empty()) return;
    const uint64_t changes = service->lookup_results().changes();
    const int64_t now = all ? INT64_MAX : WallNs();
    if (changes == prefetch_changes_seen && now < waits.NextDeadlineNs()) return;
    prefetch_changes_seen = changes;
    waits.AnswerReady(
        now, [this](std::string_view id) { return service->lookup_results().Running(id); },
        [this](std::string_view id, ParkedWait w) {
          auto hits = service->QueryPrefetchStatus(id);  // nullopt: still running (timed out)
          const std::string body = hits ? wire::EncodeInt(*hits) : wire::EncodeNil();
          w.reply.body = zmq::message_t(body.data(), body.size());
          metrics->End(w.op, w.began);
          sending.push_back(std::move(w.reply));
        });
  }

  // Returns the time spent running the request here (inline), 0 when it was handed on.
  int64_t OnRequest() {
    // [identity, uid, op, payload...]
    if (frames.size() < 3) {
      metrics->CountMalformedMessage();
      spdlog::warn("dropping a message of {} frame(s): expected [uid, op, payload...]",
                   frames.empty() ? 0 : frames.size() - 1);
      return 0;
    }
    if (frames[1].size() > wire::kMaxRequestUidBytes) {  // any reply would echo it
      metrics->CountMalformedMessage();
      const int64_t now = WallNs();
      if (now - last_malformed_log_ns > 1'000'000'000) {  // at most one line a second
        last_malformed_log_ns = now;
        spdlog::warn("request from {}: dropped unanswered, its uid frame has {} bytes (at most {}; "
                     "lmcache's request uid is a msgpack int)",
                     ClientTag(View(frames[0])), frames[1].size(), wire::kMaxRequestUidBytes);
      }
      return 0;
    }
    streams->Touch(View(frames[0]));
    if (frames[2].size() == 0) {  // a stream control message: [uid, "", "ack" | "cancel"]
      const std::string_view action = frames.size() == 4 ? View(frames[3]) : std::string_view();
      if (frames.size() == 4 && streams->Control(View(frames[0]), View(frames[1]), action)) {
        return 0;  // a live stream took it; its batches are the replies
      }
      // lmcache's server drops these silently. kvd answers [uid, "", error]: the 0.5.6
      // client ends a stream of that uid on it ("Event subscription ended": an op frame
      // that is not the stream's) instead of waiting for batches that never come, and
      // drops it when it has no such request.
      const bool control = frames.size() == 4 && (action == "ack" || action == "cancel");
      const std::string why =
          control ? "no KV-event stream is open for this request uid (it ended or never began)"
                  : "empty op frame: expected an op, or a stream control message [uid, \"\", "
                    "\"ack\" | \"cancel\"]";
      if (!control) {
        metrics->CountUnknownOp();
        spdlog::warn("request from {}: {}", ClientTag(View(frames[0])), why);
      }
      frames.resize(3);
      ReplyInline(wire::EncodeStr(why));
      return 0;
    }
    auto op = wire::DecodeOp(View(frames[2]));
    if (!op.ok()) {
      metrics->CountUnknownOp();
      spdlog::warn("request from {}: {}; replying nil", ClientTag(View(frames[0])),
                   op.status().ToString());
      ReplyInline(wire::EncodeNil());
      return 0;
    }
    const wire::OpInfo& info = **op;
    uint64_t payload_bytes = 0;
    for (size_t i = 3; i < frames.size(); ++i) payload_bytes += frames[i].size();
    wire::Dispatch dispatch = info.dispatch;
    const SocketRule rule = SocketRuleOf(info.op);
    if (rule == SocketRule::kLaneWhenBlend && service->blend() != nullptr) {
      dispatch = wire::Dispatch::kInstanceLane;
    }
    if (dispatch == wire::Dispatch::kInlineUnlessLong) {
      const bool long_request = payload_bytes > kInlinePayloadBytes;
      const bool may_wait =
          rule == SocketRule::kPoolWhileCommitsPending && service->CommitsPending();
      const bool run_here =
          !may_wait && (!long_request || (payload_bytes <= kInlineWhenAlonePayloadBytes &&
                                          !router.HasMessages()));
      dispatch = run_here ? wire::Dispatch::kInline : wire::Dispatch::kPool;
      if (run_here && long_request) SendAll();  // replies already made leave first
    }
    const int64_t began = metrics->Begin(info.op);
    if (rule == SocketRule::kStream) {  // a subscription, not one reply
      payload_views.clear();
      for (size_t i = 3; i < frames.size(); ++i) payload_views.push_back(View(frames[i]));
      streams->Subscribe(View(frames[0]), View(frames[1]), View(frames[2]), payload_views);
      return metrics->End(info.op, began);
    }

    if (rule == SocketRule::kParkWhilePrefetching && ParkWait(info.op, began)) return 0;
    if (dispatch == wire::Dispatch::kInline) {
      payload_views.clear();
      for (size_t i = 3; i < frames.size(); ++i) payload_views.push_back(View(frames[i]));
      RunTiming timing;
      const std::string reply = Run(info, payload_views, View(frames[0]), began, 0, &timing);
      metrics->RecordInline(info.op, timing.handled_ns);
      ReplyInline(reply, &info, timing);
      return timing.handled_ns;
    }

    // Lane or pool: counted against the connection until its reply is taken back.
    const std::string_view identity = View(frames[0]);
    auto it = queued_bytes.find(identity);
    const uint64_t queued = it == queued_bytes.end() ? 0 : it->second;
    if (queued > 0 && queued + payload_bytes > max_queued_bytes) {
      metrics->CountRefused(info.op);
      metrics->End(info.op, began);
      const int64_t now = WallNs();
      if (now - last_refusal_log_ns > 1'000'000'000) {  // at most one line a second
        last_refusal_log_ns = now;
        spdlog::warn("{} from {}: refused, the connection already has {} bytes of requests "
                     "queued (bound {})", info.name, ClientTag(identity), queued, max_queued_bytes);
      }
      ReplyInline(FailureReply(*service, info));
      return 0;
    }
    if (it == queued_bytes.end()) it = queued_bytes.emplace(std::string(identity), 0).first;
    it->second += payload_bytes;
    const std::string lane = dispatch == wire::Dispatch::kInstanceLane ? std::string(identity)
                                                                       : std::string(identity) + "/pool";
    const size_t width = dispatch == wire::Dispatch::kInstanceLane ? 1 : pool->threads();
    pool->PostToLane(
        lane,
        [this, &info, began, payload_bytes, request = std::move(frames)]() mutable {
          const int64_t queue_ns = WallNs() - began;  // waited for its lane and a thread
          std::vector<std::string_view> views;
          views.reserve(request.size() - 3);
          for (size_t i = 3; i < request.size(); ++i) views.push_back(View(request[i]));
          RunTiming timing;
          const std::string reply = Run(info, views, View(request[0]), began, queue_ns, &timing);
          PostReply(Reply{std::move(request[0]), std::move(request[1]), std::move(request[2]),
                          zmq::message_t(reply.data(), reply.size()), payload_bytes, &info,
                          timing.phases, timing.handled_ns, timing.ready_ns});
        },
        width);
    frames = std::vector<zmq::message_t>();  // moved from: make it a valid empty vector again
    frames.reserve(16);
    return 0;
  }
};

ZmqServer::ZmqServer(const ServerConfig& config, KvService* service, RequestMetrics* metrics)
    : impl_(std::make_unique<Impl>(config, service, metrics)) {}

ZmqServer::~ZmqServer() = default;

Status ZmqServer::Bind() {
  const ServerConfig& c = impl_->config;
  Status st = impl_->router.Bind(c.host, c.port);
  if (st.ok()) {
    spdlog::info("request port: at most {} connections, {} per address, on descriptors below {}; "
                 "ZMTP handshake within {} s",
                 c.max_connections, c.max_connections_per_address, impl_->router.fd_limit(),
                 c.handshake_timeout_seconds);
  }
  return st;
}

void ZmqServer::Run(const std::atomic<bool>& stop) {
  Impl& s = *impl_;
  while (!stop.load(std::memory_order_relaxed)) {
    // Wake at least every 100 ms, and in time for the next parked wait's deadline.
    int64_t timeout_ms = 100;
    if (!s.waits.empty()) {
      const int64_t left = s.waits.NextDeadlineNs() - WallNs();
      timeout_ms = std::clamp<int64_t>((left + 999'999) / 1'000'000, 0, 100);
    }
    const net::ZmtpRouter::Events ev = s.router.Wait(static_cast<int>(timeout_ms));
    const int64_t wall0 = WallNs() - ev.io_ns;  // the wake-up began with Wait's reads
    if (ev.watched) s.TakeOutbox();
    if (ev.messages) {
      int64_t inline_since_send = 0;
      for (int i = 0; i < kMaxReadsPerWake; ++i) {
        s.frames.clear();
        if (!s.router.Receive(&s.frames)) break;
        inline_since_send += s.OnRequest();
        if (s.sending.size() >= kSendAfterReplies || inline_since_send >= kSendAfterInlineNs) {
          s.SendAll();
          inline_since_send = 0;
        }
      }
    }
    s.AnswerWaits();
    s.SendAll();
    s.streams->Pump();  // new KV events, fresh credits, idle streams
    if (ev.messages || ev.watched || ev.io_ns > 0) s.metrics->RecordLoopIteration(WallNs() - wall0);
    // Connections also end with no socket event (a handshake timeout, the send of a reply):
    // the counters are published whenever they moved.
    s.PublishTransport();
  }
  s.streams->CloseAll();
  // Stop accepting; let queued transfers finish and deliver their replies.
  s.pool.reset();
  s.TakeOutbox();
  s.AnswerWaits(/*all=*/true);  // parked waits: their status now (nil while still running)
  s.SendAll();
  // Let those replies leave before the connections close.
  s.router.Drain(2000);
}

}  // namespace kvd::server
