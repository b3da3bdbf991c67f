#include "server/kv_events.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

namespace kvd::server {

// L1 keys of objects kept apart by layout are interned under "<model>@<namespace>"
// (chunk_keys.h); model names never contain '@', and subscribers ask for the model.
std::string KvEventLog::ModelOf(const l1::ChunkKey& key) const {
  if (namespaces_ == nullptr) return std::string();
  const std::string& m = namespaces_->Get(key.ns).model_name;
  return m.substr(0, m.find('@'));
}
size_t KvEventLog::HashKey::operator()(const Hash& h) const noexcept {
  size_t v;
  std::memcpy(&v, h.data(), sizeof(v));
  return v;
}

size_t KvEventLog::ModelHashKey::operator()(const ModelHash& k) const noexcept {
  return HashKey{}(k.hash) ^ (std::hash<std::string>{}(k.model) * 0x9e3779b97f4a7c15ULL);
}

KvEventLog::KvEventLog(size_t capacity, const Clock* clock)
    : capacity_(std::max<size_t>(1, capacity)),
      clock_(clock),
      incarnation_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count()) {}

void KvEventLog::Bind(std::string_view model_name, std::span<const Binding> chunks) {
  // The model as subscribers ask for it (a key namespace never reaches here, but the same
  // cut as ModelOf keeps the two spellings equal).
  const std::string model(model_name.substr(0, model_name.find('@')));
  MutexLock lock(&mu_);
  for (const auto& c : chunks) {
    ModelHash key{model, c.hash};
    auto [it, fresh] = bindings_.try_emplace(key);
    if (!fresh) continue;  // another rank of the same store bound it
    PendingBinding& b = it->second;
    b.parent = c.parent;
    b.tokens.assign(c.tokens.begin(), c.tokens.end());
    b.age = binding_order_.insert(binding_order_.end(), std::move(key));
  }
  if (bindings_.size() > kMaxBindings) {
    // Stores that never completed (aborted, failed) leave bindings behind: drop the older half.
    while (bindings_.size() > kMaxBindings / 2) {
      bindings_.erase(binding_order_.front());
      binding_order_.pop_front();
    }
  }
}

void KvEventLog::OnEntryComplete(const l1::ChunkKey& key) {
  {
    MutexLock lock(&mu_);
    std::string model = ModelOf(key);
    auto it = bindings_.find(ModelHash{model, key.chunk_hash});
    if (it == bindings_.end()) {
      ++unbound_stores_;
      return;
    }
    wire::KvEventRecord r;
    r.kind = "stored";
    r.model_name = std::move(model);
    r.block_hashes.push_back(key.chunk_hash);
    r.parent_block_hash = it->second.parent;
    r.token_ids = std::move(it->second.tokens);
    binding_order_.erase(it->second.age);
    bindings_.erase(it);
    ++stored_records_;
    if (r.parent_block_hash && bindings_.contains(ModelHash{r.model_name, *r.parent_block_hash}) &&
        num_held_ < kMaxBindings) {
      // The parent is being stored too (its commit follows): its record goes first.
      ModelHash parent{r.model_name, *r.parent_block_hash};
      held_hashes_.insert(ModelHash{r.model_name, key.chunk_hash});
      held_[std::move(parent)].push_back(Held{std::move(r), clock_->NowNanos()});
      ++num_held_;
      return;
    }
    AppendStoredChainLocked(std::move(r));
  }
  Wake();
}

void KvEventLog::AppendStoredChainLocked(wire::KvEventRecord record) {
  std::vector<wire::KvEventRecord> todo;  // a stack: children of what was just written
  todo.push_back(std::move(record));
  while (!todo.empty()) {
    wire::KvEventRecord r = std::move(todo.back());
    todo.pop_back();
    ModelHash written{r.model_name, r.block_hashes.front()};
    AppendLocked(std::move(r));
    auto h = held_.find(written);
    if (h == held_.end()) continue;
    std::vector<Held> children = std::move(h->second);
    held_.erase(h);
    num_held_ -= children.size();
    for (auto c = children.rbegin(); c != children.rend(); ++c) {
      held_hashes_.erase(ModelHash{c->record.model_name, c->record.block_hashes.front()});
      todo.push_back(std::move(c->record));
    }
  }
}

void KvEventLog::FlushHeld() {
  bool appended = false;
  {
    MutexLock lock(&mu_);
    if (num_held_ == 0) return;
    const int64_t now = clock_->NowNanos();
    // Roots: records waiting for a parent that is not itself held (its store did not
    // complete, or it was already cached).
    std::vector<ModelHash> due;
    for (const auto& [parent, children] : held_) {
      if (held_hashes_.contains(parent)) continue;
      for (const auto& c : children) {
        if (now - c.since_ns >= kMaxHoldNanos) {
          due.push_back(parent);
          break;
        }
      }
    }
    for (const auto& parent : due) {
      auto h = held_.find(parent);
      if (h == held_.end()) continue;
      std::vector<Held> children = std::move(h->second);
      held_.erase(h);
      num_held_ -= children.size();
      for (auto& c : children) {
        held_hashes_.erase(ModelHash{c.record.model_name, c.record.block_hashes.front()});
        AppendStoredChainLocked(std::move(c.record));
      }
      appended = true;
    }
  }
  if (appended) Wake();
}

void KvEventLog::OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause) {
  if (keys.empty()) return;
  {
    MutexLock lock(&mu_);
    removed_records_ += AppendPerModelLocked(keys, "removed", "CPU");
  }
  Wake();
}

size_t KvEventLog::AppendPerModelLocked(std::span<const l1::ChunkKey> keys, const char* kind,
                                        const char* medium) {
  // One record per model, hashes in the given order without repeats (the same chunk under
  // two salts or world sizes is one hash to a router).
  std::map<std::string, std::vector<Hash>> by_model;
  for (const auto& k : keys) {
    auto& v = by_model[ModelOf(k)];
    if (std::find(v.begin(), v.end(), k.chunk_hash) == v.end()) v.push_back(k.chunk_hash);
  }
  for (auto& [model, hashes] : by_model) {
    wire::KvEventRecord r;
    r.kind = kind;
    r.medium = medium;
    r.model_name = model;
    r.block_hashes = std::move(hashes);
    AppendLocked(std::move(r));
  }
  return by_model.size();
}

void KvEventLog::OnLoadedFromPeer(std::span<const l1::ChunkKey> keys) {
  if (keys.empty()) return;
  {
    MutexLock lock(&mu_);
    loaded_records_ += AppendPerModelLocked(keys, "loaded", "P2P");
  }
  Wake();
}

void KvEventLog::AppendLocked(wire::KvEventRecord record) {
  record.seq = next_seq_++;
  log_.push_back(std::move(record));
  while (log_.size() > capacity_) log_.pop_front();
}

void KvEventLog::Wake() {
  // Called under wake_mu_ so that SetWakeup, which takes it, waits for a call in progress:
  // whoever owns what the callback touches (the ZMQ loop's eventfd) may release it once
  // SetWakeup(nullptr) returned.
  MutexLock lock(&wake_mu_);
  if (wake_) wake_();
}

void KvEventLog::SetWakeup(std::function<void()> wake) {
  std::function<void()> old;
  {
    MutexLock lock(&wake_mu_);
    old = std::exchange(wake_, std::move(wake));
  }
  // `old` (and what it captured) is destroyed here, outside the lock.
}

wire::KvEventBatch KvEventLog::Read(const std::string& model_name, int64_t cursor,
                                    size_t max_events) const {
  MutexLock lock(&mu_);
  wire::KvEventBatch b;
  b.enabled = true;
  b.incarnation = incarnation_;
  const int64_t last = next_seq_ - 1;
  const int64_t first = log_.empty() ? last + 1 : log_.front().seq;
  // `cursor` is the client's (any int64 >= 0): compared, never incremented past last.
  b.lost = cursor < first - 1 || cursor > last;
  b.next_cursor = std::min(cursor, last);
  const int64_t skip =
      cursor >= last ? static_cast<int64_t>(log_.size()) : std::max<int64_t>(0, cursor - first + 1);
  for (size_t i = static_cast<size_t>(std::min<int64_t>(skip, static_cast<int64_t>(log_.size())));
       i < log_.size(); ++i) {
    const auto& r = log_[i];
    b.next_cursor = r.seq;
    if (r.model_name == model_name) {
      b.events.push_back(r);
      if (b.events.size() >= max_events) break;
    }
  }
  return b;
}

int64_t KvEventLog::next_seq() const {
  MutexLock lock(&mu_);
  return next_seq_;
}

KvEventLog::Stats KvEventLog::stats() const {
  MutexLock lock(&mu_);
  Stats s;
  s.incarnation = incarnation_;
  s.log_depth = log_.size();
  s.log_capacity = capacity_;
  s.next_seq = next_seq_;
  s.unbound_stores = unbound_stores_;
  s.stored_records = stored_records_;
  s.removed_records = removed_records_;
  s.loaded_records = loaded_records_;
  s.bindings = bindings_.size();
  s.subscribers = subscribers_;
  s.held = num_held_;
  return s;
}

void KvEventLog::RegisterMetrics(metrics::Registry& registry) {
  using metrics::Kind;
  static constexpr metrics::StatsFamily<Stats> kFamilies[] = {
      {"lmcache_mp_kv_events_log_depth", Kind::kGauge,
       "Cache-event records retained for subscribers and reconnects.",
       [](const Stats& s) { return static_cast<double>(s.log_depth); }},
      {"kvd_kv_events_log_capacity", Kind::kGauge, "Cache-event records the log keeps at most (--kv-event-log-size).",
       [](const Stats& s) { return static_cast<double>(s.log_capacity); }},
      {"kvd_kv_events_incarnation", Kind::kGauge, "This log's incarnation (subscribers resume within one).",
       [](const Stats& s) { return static_cast<double>(s.incarnation); }},
      {"kvd_kv_events_next_seq", Kind::kGauge, "Sequence number of the next cache-event record.",
       [](const Stats& s) { return static_cast<double>(s.next_seq); }},
      {"kvd_kv_events_subscribers", Kind::kGauge, "Cache-event streams open now.",
       [](const Stats& s) { return static_cast<double>(s.subscribers); }},
      {"kvd_kv_events_unbound_stores_total", Kind::kCounter,
       "Chunks completed in L1 without the tokens of their store (their stored record carries none).",
       [](const Stats& s) { return static_cast<double>(s.unbound_stores); }},
      {"kvd_kv_events_stored_records_total", Kind::kCounter, "Stored records appended to the log.",
       [](const Stats& s) { return static_cast<double>(s.stored_records); }},
      {"kvd_kv_events_loaded_records_total", Kind::kCounter,
       "Loaded records (chunks brought in from a P2P peer) appended to the log.",
       [](const Stats& s) { return static_cast<double>(s.loaded_records); }},
      {"kvd_kv_events_removed_records_total", Kind::kCounter, "Removed records appended to the log.",
       [](const Stats& s) { return static_cast<double>(s.removed_records); }},
  };
  metric_handles_ = metrics::AddStatsFamilies(registry, kFamilies, [this] { return stats(); });
}

void KvEventLog::set_subscribers(size_t n) {
  MutexLock lock(&mu_);
  subscribers_ = n;
}

}  // namespace kvd::server
