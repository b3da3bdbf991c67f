// KvEventStreams: subscribe_kv_events streams over the ZMQ socket, as lmcache 0.5.6 frames
// them (transport/zmq_impl/mq.py):
//
//   client -> [uid, "subscribe_kv_events", instance_id, model_name, cursor, max_events]
//   server -> [uid, op, KVEventBatch]            one message per credit; the first right away
//   client -> [uid, "", "ack"]                   one more credit
//   client -> [uid, "", "cancel"]                the client is done
//   server -> [uid, op]                          (no payload) the stream has ended
//
// A batch is sent when the subscriber has credit and there is something to say: the first
// batch (the status, even if empty), records of its model after its cursor, or a loss. Each
// worker instance has at most one stream per connection: a new subscription on the same
// connection ends the previous one; a subscription from another connection naming the same
// instance never touches it (a stream left by a connection that died ends at the idle
// timeout). A
// stream ends when the client cancels, when it has been silent (no request, ping or ack on
// its connection) for the idle timeout, when the server stops, or right after the first
// batch when the log is off (enabled=false tells the client to stop asking).
//
// THREADS. Used only by the ZMQ loop thread (no locks of its own); the log is thread-safe.
// `send` must not re-enter this object.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "server/kv_events.h"
#include "wire/codec.h"

namespace kvd::server {

class KvEventStreams {
 public:
  using Send = std::function<void(std::vector<std::string> frames)>;
  static constexpr size_t kMaxStreams = 4096;
  static constexpr int64_t kMaxEventsPerBatch = 1024;

  // `log` may be null (KV events off: subscribers get enabled=false and the stream ends).
  // idle_timeout_seconds <= 0: streams never time out. Borrows log and clock.
  KvEventStreams(KvEventLog* log, const Clock* clock, double idle_timeout_seconds, Send send);

  // A subscribe_kv_events request.
  void Subscribe(std::string_view identity, std::string_view uid, std::string_view op_frame,
                 wire::Frames payloads);
  // A control message: [uid, "", action]. Returns false when no stream took it: no open
  // stream (identity, uid), or an action other than "ack" / "cancel".
  bool Control(std::string_view identity, std::string_view uid, std::string_view action);
  // Any message from `identity` proves the connection alive. Cheap without streams.
  void Touch(std::string_view identity);
  // Sends what is due and ends idle streams. Cheap when nothing changed.
  void Pump();
  // Ends every stream (server shutdown).
  void CloseAll();

  size_t size() const { return streams_.size(); }

 private:
  using Key = std::pair<std::string, std::string>;  // (identity, uid)
  struct Stream {
    std::string op_frame;
    int64_t instance_id = 0;
    std::string model;
    int64_t cursor = 0;
    size_t max_events = 1;
    bool credit = true;
    bool first = true;
    int64_t read_at_seq = -1;  // log.next_seq() when last read with nothing to send
    int64_t last_seen_ns = 0;
  };
  void End(std::map<Key, Stream>::iterator it);
  // Sends one batch if due. Returns false when the stream must end.
  bool Service(const Key& key, Stream& s, int64_t next_seq);

  KvEventLog* const log_;
  const Clock* const clock_;
  const int64_t idle_timeout_ns_;
  const Send send_;
  std::map<Key, Stream> streams_;
  // The stream of each (connection identity, instance id): a stream belongs to the connection
  // that opened it, so a subscription replaces only its own connection's stream of that
  // instance, never another client's (issue 27, finding 9).
  std::map<std::pair<std::string, int64_t>, Key> by_instance_;
  std::map<std::string, int, std::less<>> per_identity_;  // streams per connection (for Touch)
};

}  // namespace kvd::server
