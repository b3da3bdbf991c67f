#include "server/sessions.h"

#include <algorithm>

namespace kvd::server {

SessionTable::SessionTable(const Clock* clock, uint32_t chunk_size, double ttl_seconds)
    : clock_(clock), chunk_size_(chunk_size), ttl_ns_(static_cast<int64_t>(ttl_seconds * 1e9)) {}

std::shared_ptr<SessionTable::Session> SessionTable::Get(const std::string& id, bool create) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (!create) return nullptr;
    it = sessions_.emplace(id, std::make_shared<Session>()).first;
  }
  it->second->last_used_ns = clock_->NowNanos();
  return it->second;
}

Result<std::vector<keys::Hash32>> SessionTable::ChunkHashes(const std::string& request_id,
                                                            std::span<const int64_t> tokens,
                                                            size_t num_chunks,
                                                            const SessionIdentity& identity) {
  if (num_chunks * chunk_size_ > tokens.size()) {
    return Status::InvalidArgument("need " + std::to_string(num_chunks * chunk_size_) +
                                   " tokens for " + std::to_string(num_chunks) +
                                   " chunks, got " + std::to_string(tokens.size()));
  }
  auto s = Get(request_id, true);
  std::lock_guard<std::mutex> lock(s->mu);
  if (!identity.model_name.empty()) s->identity = identity;
  // Reuse the hashed prefix only if it is the same token sequence.
  const size_t reusable = std::min(s->hashes.size(), num_chunks);
  const size_t cmp = reusable * chunk_size_;
  for (size_t i = 0; i < cmp; ++i) {
    if (static_cast<int64_t>(s->tokens[i]) != tokens[i]) {
      s->hashes.clear();
      s->tokens.clear();
      break;
    }
  }
  if (s->hashes.size() < num_chunks) {
    size_t first = s->hashes.size();
    const keys::Hash32& prev = first == 0 ? keys::NoneHash() : s->hashes.back();
    KVD_RETURN_IF_ERROR(keys::AppendChainedChunkHashes(tokens.first(num_chunks * chunk_size_),
                                                       chunk_size_, first, prev, &s->hashes));
    // Hashing succeeded, so every token of these chunks fits in 32 bits.
    const size_t n = num_chunks * chunk_size_;
    s->tokens.resize(n);
    for (size_t i = first * chunk_size_; i < n; ++i) s->tokens[i] = static_cast<uint32_t>(tokens[i]);
  }
  return std::vector<keys::Hash32>(s->hashes.begin(), s->hashes.begin() + num_chunks);
}

void SessionTable::SetLookupResult(const std::string& request_id, int64_t hit_chunks) {
  auto s = Get(request_id, true);
  std::lock_guard<std::mutex> lock(s->mu);
  s->lookup_result = hit_chunks;
}

std::optional<int64_t> SessionTable::TakeLookupResult(const std::string& request_id) {
  auto s = Get(request_id, false);
  if (!s) return std::nullopt;
  std::lock_guard<std::mutex> lock(s->mu);
  auto r = s->lookup_result;
  s->lookup_result.reset();
  return r;
}

std::optional<int64_t> SessionTable::PeekLookupResult(const std::string& request_id) {
  auto s = Get(request_id, false);
  if (!s) return std::nullopt;
  std::lock_guard<std::mutex> lock(s->mu);
  return s->lookup_result;
}

std::pair<SessionIdentity, std::vector<keys::Hash32>> SessionTable::End(
    const std::string& request_id) {
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
