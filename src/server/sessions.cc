#include "server/sessions.h"

#include <algorithm>
#include <cstring>

#include "keys/token_hash.h"

namespace kvd::server {

SessionTable::SessionTable(const Clock* clock, uint32_t chunk_size, double ttl_seconds)
    : clock_(clock), chunk_size_(chunk_size), ttl_ns_(static_cast<int64_t>(ttl_seconds * 1e9)) {}

std::shared_ptr<SessionTable::Session> SessionTable::Get(std::string_view id, bool create) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (!create) return nullptr;
    it = sessions_.emplace(std::string(id), std::make_shared<Session>()).first;
  }
  it->second->last_used_ns = clock_->NowNanos();
  return it->second;
}

Result<std::vector<keys::Hash32>> SessionTable::ChunkHashes(std::string_view request_id,
                                                            const wire::TokenIds& tokens,
                                                            size_t num_chunks,
                                                            const SessionIdentity& identity) {
  const size_t n = num_chunks * chunk_size_;
  if (n > tokens.size()) {
    return Status::InvalidArgument("need " + std::to_string(n) + " tokens for " +
                                   std::to_string(num_chunks) + " chunks, got " +
                                   std::to_string(tokens.size()));
  }
  if (const auto& bad = tokens.first_out_of_range(); bad && bad->index < n) {
    return keys::TokenOutOfRange(bad->index, bad->value);
  }
  auto s = Get(request_id, true);
  std::lock_guard<std::mutex> lock(s->mu);
  if (!identity.model_name.empty()) s->identity = identity;
  // Reuse the hashed prefix only if it is the same token sequence.
  const size_t reusable = std::min(s->hashes.size(), num_chunks);
  if (reusable > 0 &&
      std::memcmp(s->tokens.data(), tokens.data(), reusable * chunk_size_ * sizeof(uint32_t)) != 0) {
    s->hashes.clear();
    s->tokens.clear();
  }
  if (s->hashes.size() < num_chunks) {
    const size_t first = s->hashes.size();
    // Copy the chain's start before growing the vector it lives in.
    const keys::Hash32 prev = first == 0 ? keys::NoneHash() : s->hashes.back();
    s->hashes.resize(num_chunks);
    keys::HashTokenChain(prev, tokens.span().subspan(first * chunk_size_, (num_chunks - first) * chunk_size_),
                         chunk_size_, std::span(s->hashes).subspan(first));
    s->tokens.resize(first * chunk_size_);
    s->tokens.insert(s->tokens.end(), tokens.data() + first * chunk_size_, tokens.data() + n);
  }
  return std::vector<keys::Hash32>(s->hashes.begin(), s->hashes.begin() + num_chunks);
}

void SessionTable::SetLookupResult(std::string_view request_id, int64_t hit_chunks) {
  auto s = Get(request_id, true);
  std::lock_guard<std::mutex> lock(s->mu);
  s->lookup_result = hit_chunks;
  s->lookup_generation++;
  s->lookup_running = false;
}

uint64_t SessionTable::BeginLookup(std::string_view request_id) {
  auto s = Get(request_id, true);
  std::lock_guard<std::mutex> lock(s->mu);
  s->lookup_result.reset();
  s->lookup_running = true;
  return ++s->lookup_generation;
}

bool SessionTable::FinishLookup(std::string_view request_id, uint64_t generation,
                                int64_t hit_chunks) {
  auto s = Get(request_id, false);
  if (!s) return false;  // ended meanwhile
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->lookup_generation != generation) return false;
  s->lookup_result = hit_chunks;
  s->lookup_running = false;
  return true;
}

bool SessionTable::LookupCurrent(std::string_view request_id, uint64_t generation) {
  auto s = Get(request_id, false);
  if (!s) return false;
  std::lock_guard<std::mutex> lock(s->mu);
  return s->lookup_running && s->lookup_generation == generation;
}

bool SessionTable::LookupRunning(std::string_view request_id) {
  auto s = Get(request_id, false);
  if (!s) return false;
  std::lock_guard<std::mutex> lock(s->mu);
  return s->lookup_running;
}

std::optional<int64_t> SessionTable::TakeLookupResult(std::string_view request_id) {
  auto s = Get(request_id, false);
  if (!s) return std::nullopt;
  std::lock_guard<std::mutex> lock(s->mu);
  auto r = s->lookup_result;
  s->lookup_result.reset();
  return r;
}

std::pair<SessionIdentity, std::vector<keys::Hash32>> SessionTable::End(
    std::string_view request_id) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(request_id);
    if (it == sessions_.end()) return {};
    s = std::move(it->second);
    sessions_.erase(it);
  }
  std::lock_guard<std::mutex> lock(s->mu);
  return {std::move(s->identity), std::move(s->hashes)};
}

size_t SessionTable::Expire() {
  int64_t now = clock_->NowNanos();
  std::lock_guard<std::mutex> lock(mu_);
  return std::erase_if(sessions_, [&](const auto& kv) {
    return now - kv.second->last_used_ns > ttl_ns_;
  });
}

size_t SessionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace kvd::server
