#include "server/lookup_results.h"

#include <algorithm>

namespace kvd::server {
namespace {

// The map node, the LRU node and the entry, roughly, besides the id's characters.
constexpr uint64_t kEntryOverhead = 160;

}  // namespace

LookupResults::LookupResults(const Clock* clock, Limits limits)
    : clock_(clock),
      limits_{std::max<uint64_t>(1, limits.max_results), limits.max_bytes, limits.ttl_seconds},
      ttl_ns_(static_cast<int64_t>(limits.ttl_seconds * 1e9)) {}

void LookupResults::RemoveLocked(Map::iterator it) {
  lru_.erase(it->second.lru_pos);
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

void LookupResults::TouchLocked(Map::iterator it) {
  lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
  it->second.last_used_ns = clock_->NowNanos();
}

LookupResults::Entry* LookupResults::TouchLocked(std::string_view request_id) {
  auto it = entries_.find(request_id);
  if (it == entries_.end()) return nullptr;
  TouchLocked(it);
  return &it->second;
}

LookupResults::Entry& LookupResults::TouchOrCreateLocked(std::string_view request_id) {
  if (Entry* e = TouchLocked(request_id)) return *e;
  const uint64_t bytes = kEntryOverhead + request_id.size();
  bool dropped = false;
  while (!lru_.empty() &&
         (entries_.size() >= limits_.max_results || bytes_ + bytes > limits_.max_bytes)) {
    RemoveLocked(entries_.find(lru_.back()));
    ++evicted_;
    dropped = true;
  }
  if (dropped) CountChange();  // a waiter of an evicted entry answers now
  auto it = entries_.emplace(std::string(request_id), Entry{}).first;
  lru_.push_front(it->first);
  it->second.lru_pos = lru_.begin();
  it->second.bytes = bytes;
  it->second.last_used_ns = clock_->NowNanos();
  bytes_ += bytes;
  return it->second;
}

void LookupResults::Set(std::string_view request_id, int64_t hits) {
  {
    MutexLock lock(&mu_);
    TouchOrCreateLocked(request_id).result.Set(++last_generation_, hits);
  }
  CountChange();
}

uint64_t LookupResults::Begin(std::string_view request_id) {
  MutexLock lock(&mu_);
  const uint64_t generation = ++last_generation_;
  TouchOrCreateLocked(request_id).result.Begin(generation);
  return generation;
}

bool LookupResults::Finish(std::string_view request_id, uint64_t generation, int64_t hits) {
  MutexLock lock(&mu_);
  Entry* e = TouchLocked(request_id);
  return e != nullptr && e->result.Finish(generation, hits);
}

bool LookupResults::Current(std::string_view request_id, uint64_t generation) {
  MutexLock lock(&mu_);
  const Entry* e = TouchLocked(request_id);
  return e != nullptr && e->result.Current(generation);
}

bool LookupResults::Running(std::string_view request_id) {
  MutexLock lock(&mu_);
  const Entry* e = TouchLocked(request_id);
  return e != nullptr && e->result.running();
}

std::optional<int64_t> LookupResults::Take(std::string_view request_id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end()) return 0;
  if (it->second.result.running()) {
    TouchLocked(it);  // polled: kept while its prefetch runs
    return std::nullopt;
  }
  const int64_t hits = it->second.result.Take().value_or(0);
  RemoveLocked(it);  // none is left: the entry has nothing more to tell
  return hits;
}

void LookupResults::SessionEnded(std::string_view request_id) {
  {
    MutexLock lock(&mu_);
    if (auto it = entries_.find(request_id); it != entries_.end()) RemoveLocked(it);
  }
  CountChange();
}

size_t LookupResults::Expire() {
  const int64_t now = clock_->NowNanos();
  size_t n = 0;
  {
    MutexLock lock(&mu_);
    // The LRU list is ordered by last use: the expired entries are at its end.
    while (!lru_.empty()) {
      auto it = entries_.find(lru_.back());
      if (now - it->second.last_used_ns <= ttl_ns_) break;
      RemoveLocked(it);
      ++n;
    }
  }
  if (n > 0) CountChange();
  return n;
}

void LookupResults::PrefetchEnded() {
  CountChange();
  MutexLock lock(&wakeup_mu_);
  if (wakeup_) wakeup_();
}

void LookupResults::SetWakeup(std::function<void()> wakeup) {
  MutexLock lock(&wakeup_mu_);
  wakeup_ = std::move(wakeup);
}

size_t LookupResults::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

uint64_t LookupResults::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

uint64_t LookupResults::evicted() const {
  MutexLock lock(&mu_);
  return evicted_;
}

}  // namespace kvd::server
