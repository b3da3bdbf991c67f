#include "server/kv_event_streams.h"

#include <spdlog/spdlog.h>

namespace kvd::server {

KvEventStreams::KvEventStreams(KvEventLog* log, const Clock* clock, double idle_timeout_seconds,
                               Send send)
    : log_(log),
      clock_(clock),
      idle_timeout_ns_(idle_timeout_seconds > 0 ? static_cast<int64_t>(idle_timeout_seconds * 1e9)
                                                : 0),
      send_(std::move(send)) {}

void KvEventStreams::Subscribe(std::string_view identity_view, std::string_view uid_view,
                               std::string_view op_frame_view, wire::Frames payloads) {
  const std::string identity(identity_view), uid(uid_view), op_frame(op_frame_view);
  auto req = wire::DecodeSubscribeKvEvents(payloads);
  Status bad;
  if (!req.ok()) {
    bad = req.status();
  } else if (req->cursor < 0 || req->max_events < 1 || req->max_events > kMaxEventsPerBatch) {
    bad = Status::InvalidArgument("cursor must be >= 0 and max_events in [1, 1024]");
  } else if (streams_.size() >= kMaxStreams && !by_instance_.count({identity, req->instance_id})) {
    bad = Status::ResourceExhausted("too many KV-event streams (" + std::to_string(kMaxStreams) + ")");
  }
  if (!bad.ok()) {
    spdlog::warn("subscribe_kv_events: {}; ending the stream", bad.ToString());
    send_({identity, uid, op_frame});  // an end frame: the client's stream closes
    return;
  }
  if (auto old = by_instance_.find({identity, req->instance_id}); old != by_instance_.end()) {
    auto it = streams_.find(old->second);
    if (it != streams_.end()) End(it);
  }
  const Key key{identity, uid};
  if (auto it = streams_.find(key); it != streams_.end()) End(it);  // uid reused: restart
  Stream s;
  s.op_frame = op_frame;
  s.instance_id = req->instance_id;
  s.model = req->model_name;
  s.cursor = req->cursor;
  s.max_events = static_cast<size_t>(req->max_events);
  s.last_seen_ns = clock_->NowNanos();
  auto [it, _] = streams_.emplace(key, std::move(s));
  by_instance_[{identity, req->instance_id}] = key;
  ++per_identity_[identity];
  if (log_) log_->set_subscribers(streams_.size());
  spdlog::info("kv events: instance {} subscribed for model '{}' from cursor {}",
               req->instance_id, req->model_name, req->cursor);
  if (!Service(key, it->second, log_ ? log_->next_seq() : 0)) End(it);
}

bool KvEventStreams::Control(std::string_view identity, std::string_view uid,
                             std::string_view action) {
  Touch(identity);
  if (action != "ack" && action != "cancel") return false;
  if (streams_.empty()) return false;
  auto it = streams_.find({std::string(identity), std::string(uid)});
  if (it == streams_.end()) return false;  // the stream has ended (or never was)
  if (action == "ack") {
    it->second.credit = true;
    if (!Service(it->first, it->second, log_ ? log_->next_seq() : 0)) End(it);
  } else {
    End(it);
  }
  return true;
}

void KvEventStreams::Touch(std::string_view identity) {
  if (per_identity_.empty() || per_identity_.find(identity) == per_identity_.end()) return;
  const int64_t now = clock_->NowNanos();
  for (auto it = streams_.lower_bound({std::string(identity), std::string()});
       it != streams_.end() && it->first.first == identity; ++it) {
    it->second.last_seen_ns = now;
  }
}

bool KvEventStreams::Service(const Key& key, Stream& s, int64_t next_seq) {
  if (!s.credit) return true;
  if (log_ == nullptr) {
    if (!s.first) return false;  // disabled: the status batch was sent, now end
    wire::KvEventBatch off;      // enabled = false
    send_({key.first, key.second, s.op_frame, wire::EncodeKvEventBatch(off)});
    s.credit = false;
    s.first = false;
    return true;
  }
  if (!s.first && s.read_at_seq == next_seq) return true;  // nothing new since the last read
  wire::KvEventBatch b = log_->Read(s.model, s.cursor, s.max_events);
  s.cursor = b.next_cursor;
  if (!s.first && b.events.empty() && !b.lost) {
    s.read_at_seq = next_seq;
    return true;
  }
  s.read_at_seq = -1;
  send_({key.first, key.second, s.op_frame, wire::EncodeKvEventBatch(b)});
  s.credit = false;
  s.first = false;
  return true;
}

void KvEventStreams::Pump() {
  if (log_) log_->FlushHeld();  // records stay in the log for later subscribers too
  if (streams_.empty()) return;
  const int64_t now = clock_->NowNanos();
  const int64_t next_seq = log_ ? log_->next_seq() : 0;
  for (auto it = streams_.begin(); it != streams_.end();) {
    auto cur = it++;
    Stream& s = cur->second;
    if (idle_timeout_ns_ > 0 && now - s.last_seen_ns > idle_timeout_ns_) {
      spdlog::info("kv events: ending the stream of instance {}: its connection was silent for "
                   "{:.0f} s", s.instance_id, static_cast<double>(now - s.last_seen_ns) * 1e-9);
      End(cur);
      continue;
    }
    if (!Service(cur->first, s, next_seq)) End(cur);
  }
}

void KvEventStreams::End(std::map<Key, Stream>::iterator it) {
  const Key key = it->first;
  send_({key.first, key.second, it->second.op_frame});
  if (auto bi = by_instance_.find({key.first, it->second.instance_id});
      bi != by_instance_.end() && bi->second == key) {
    by_instance_.erase(bi);
  }
  if (auto pi = per_identity_.find(key.first); pi != per_identity_.end() && --pi->second <= 0) {
    per_identity_.erase(pi);
  }
  streams_.erase(it);
  if (log_) log_->set_subscribers(streams_.size());
}

void KvEventStreams::CloseAll() {
  while (!streams_.empty()) End(streams_.begin());
}

}  // namespace kvd::server
