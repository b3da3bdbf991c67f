#include "server/sessions.h"

#include <algorithm>
#include <cstring>

#include "keys/token_hash.h"

namespace kvd::server {

SessionTable::SessionTable(const Clock* clock, uint32_t chunk_size, double ttl_seconds,
                           SessionLimits limits, uint64_t chunk_key_memo_bytes)
    : clock_(clock),
      chunk_size_(chunk_size),
      ttl_ns_(static_cast<int64_t>(ttl_seconds * 1e9)),
      limits_{std::max<uint64_t>(1, limits.max_sessions), limits.max_bytes},
      memo_(chunk_key_memo_bytes, chunk_size) {}

uint64_t SessionTable::SessionBytes(const Session& s, size_t id_size) {
  // The map node, the LRU node and the session object, roughly; then what they own.
  constexpr uint64_t kOverhead = sizeof(Session) + 128;
  return kOverhead + id_size + s.tokens.capacity() * sizeof(uint32_t) +
         s.hashes.capacity() * sizeof(keys::Hash32) + s.identity.model_name.capacity() +
         s.identity.cache_salt.capacity() + s.identity.key_namespace.capacity();
}

uint64_t SessionTable::UnsharedSessionBytes(const Session& s, size_t id_size) {
  return SessionBytes(s, id_size);
}

template <typename It>
SessionTable::SessionPtr SessionTable::RemoveLocked(It it) {
  SessionPtr s = std::move(it->second);
  lru_.erase(s->lru_pos);
  bytes_ -= s->accounted_bytes;
  s->accounted_bytes = 0;
  s->in_table = false;
  sessions_.erase(it);
  return s;
}

bool SessionTable::EvictOldestLocked(const Session* keep, std::vector<SessionPtr>& dropped) {
  for (auto pos = lru_.rbegin(); pos != lru_.rend(); ++pos) {
    auto it = sessions_.find(*pos);
    if (it->second.get() == keep) continue;
    dropped.push_back(RemoveLocked(it));
    ++evicted_;
    return true;
  }
  return false;
}

void SessionTable::AccountLocked(Session& s, uint64_t bytes, std::vector<SessionPtr>& dropped) {
  if (!s.in_table) return;  // ended or evicted meanwhile: nothing to account
  bytes_ = bytes_ - s.accounted_bytes + bytes;
  s.accounted_bytes = bytes;
  while (bytes_ > limits_.max_bytes && EvictOldestLocked(&s, dropped)) {
  }
}

SessionTable::SessionPtr SessionTable::Get(std::string_view id, bool create) {
  std::vector<SessionPtr> dropped;  // destroyed after the lock is released
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (!create) return nullptr;
    while (sessions_.size() >= limits_.max_sessions && EvictOldestLocked(nullptr, dropped)) {
    }
    it = sessions_.emplace(std::string(id), std::make_shared<Session>()).first;
    Session& s = *it->second;
    lru_.push_front(it->first);
    s.lru_pos = lru_.begin();
    s.in_table = true;
    AccountLocked(s, UnsharedSessionBytes(s, id.size()), dropped);
  } else {
    lru_.splice(lru_.begin(), lru_, it->second->lru_pos);
  }
  it->second->last_used_ns = clock_->NowNanos();
  return it->second;
}

namespace {

// Hashes of chunks [first, num_chunks) of `tokens`, chained from `prev`, into out[first..),
// through the memo of keys hashed recently in `domain`.
void HashFrom(keys::ChunkKeyMemo& memo, uint64_t domain, const keys::Hash32& prev,
              const wire::TokenIds& tokens, size_t first, size_t num_chunks, uint32_t chunk_size,
              std::vector<keys::Hash32>& out, std::atomic<uint64_t>& hashed_chunks) {
  out.resize(num_chunks);
  hashed_chunks.fetch_add(num_chunks - first, std::memory_order_relaxed);
  memo.HashChain(domain, prev,
                 tokens.span().subspan(first * chunk_size, (num_chunks - first) * chunk_size),
                 chunk_size, std::span(out).subspan(first));
}

}  // namespace

Status SessionTable::CheckTokens(const wire::TokenIds& tokens, size_t num_chunks,
                                uint32_t chunk_size) {
  const size_t n = num_chunks * chunk_size;
  if (n > tokens.size()) {
    return Status::InvalidArgument("need " + std::to_string(n) + " tokens for " +
                                   std::to_string(num_chunks) + " chunks, got " +
                                   std::to_string(tokens.size()));
  }
  if (const auto& bad = tokens.first_out_of_range(); bad && bad->index < n) {
    return keys::TokenOutOfRange(bad->index, bad->value);
  }
  return Status::Ok();
}

Result<std::vector<keys::Hash32>> SessionTable::ChunkHashes(std::string_view request_id,
                                                            const wire::TokenIds& tokens,
                                                            size_t num_chunks,
                                                            const SessionIdentity& identity,
                                                            SessionUse use) {
  return Hashes(request_id, tokens, num_chunks, identity, use, nullptr);
}

Result<std::vector<keys::Hash32>> SessionTable::ChunkHashesWhilePresent(
    std::string_view request_id, const wire::TokenIds& tokens, size_t num_chunks,
    const SessionIdentity& identity, const ChunkPresent& present) {
  return Hashes(request_id, tokens, num_chunks, identity, SessionUse::kCreate, &present);
}

Result<std::vector<keys::Hash32>> SessionTable::Hashes(std::string_view request_id,
                                                       const wire::TokenIds& tokens,
                                                       size_t num_chunks,
                                                       const SessionIdentity& identity,
                                                       SessionUse use,
                                                       const ChunkPresent* present) {
  if (Status st = CheckTokens(tokens, num_chunks, chunk_size_); !st.ok()) return st;
  auto s = Get(request_id, use == SessionUse::kCreate);
  if (!s) {  // no session and none to create: compute, keep nothing
    std::vector<keys::Hash32> hashes;
    HashFrom(memo_, memo_.Domain(identity.cache_salt), keys::NoneHash(), tokens, 0, num_chunks,
             chunk_size_, hashes, hashed_chunks_);
    return hashes;
  }
  std::vector<SessionPtr> dropped;  // destroyed after both locks are released
  MutexLock lock(&s->mu);
  if (!identity.model_name.empty()) s->identity = identity;
  // Reuse the hashed prefix only if it is the same token sequence.
  const size_t reusable = std::min(s->hashes.size(), num_chunks);
  if (reusable > 0 &&
      std::memcmp(s->tokens.data(), tokens.data(), reusable * chunk_size_ * sizeof(uint32_t)) != 0) {
    s->hashes.clear();
    s->tokens.clear();
  }
  // Chunks [0, done) are hashed; with `present`, in growing batches while it answers true.
  size_t done = std::min(s->hashes.size(), num_chunks);
  if (done < num_chunks) {
    const size_t first = done;
    const uint64_t domain = memo_.Domain(identity.cache_salt);
    for (size_t batch = 1; done < num_chunks; batch *= 2) {
      if (present && done > 0 && !(*present)(done - 1, s->hashes[done - 1])) break;
      const size_t end = present ? std::min(num_chunks, done + batch) : num_chunks;
      // Copy the chain's start before growing the vector it lives in.
      const keys::Hash32 prev = done == 0 ? keys::NoneHash() : s->hashes[done - 1];
      HashFrom(memo_, domain, prev, tokens, done, end, chunk_size_, s->hashes, hashed_chunks_);
      done = end;
    }
    s->tokens.resize(first * chunk_size_);
    s->tokens.insert(s->tokens.end(), tokens.data() + first * chunk_size_,
                     tokens.data() + done * chunk_size_);
  }
  std::vector<keys::Hash32> out(s->hashes.begin(), s->hashes.begin() + done);
  uint64_t bytes = SessionBytes(*s, request_id.size());
  if (bytes > limits_.max_bytes) {
    // Alone larger than the bound: keep nothing (the next call hashes again).
    std::vector<uint32_t>().swap(s->tokens);
    std::vector<keys::Hash32>().swap(s->hashes);
    bytes = SessionBytes(*s, request_id.size());
  }
  {
    MutexLock table(&mu_);
    AccountLocked(*s, bytes, dropped);
  }
  return out;
}

void SessionTable::Open(std::string_view request_id) { (void)Get(request_id, true); }

std::pair<SessionIdentity, std::vector<keys::Hash32>> SessionTable::End(
    std::string_view request_id) {
  SessionPtr s;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(request_id);
    if (it == sessions_.end()) return {};
    s = RemoveLocked(it);
  }
  MutexLock lock(&s->mu);
  return {std::move(s->identity), std::move(s->hashes)};
}

size_t SessionTable::Expire() {
  const int64_t now = clock_->NowNanos();
  std::vector<SessionPtr> dropped;  // destroyed after the lock is released
  MutexLock lock(&mu_);
  // The LRU list is ordered by last use: the expired sessions are at its end.
  while (!lru_.empty()) {
    auto it = sessions_.find(lru_.back());
    if (now - it->second->last_used_ns <= ttl_ns_) break;
    dropped.push_back(RemoveLocked(it));
  }
  return dropped.size();
}

size_t SessionTable::size() const {
  MutexLock lock(&mu_);
  return sessions_.size();
}

bool SessionTable::Contains(std::string_view request_id) const {
  MutexLock lock(&mu_);
  return sessions_.find(request_id) != sessions_.end();
}

uint64_t SessionTable::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

uint64_t SessionTable::evicted() const {
  MutexLock lock(&mu_);
  return evicted_;
}

}  // namespace kvd::server
