// SessionTable: per-request state shared by the scheduler's LOOKUP and the workers'
// STORE/RETRIEVE of one vLLM request (keyed by request_id): the chained chunk hashes
// computed so far (so each chunk is hashed once per request, not once per TP worker)
// and the lookup result waiting to be polled. Sessions idle longer than the TTL expire.
//
// Thread-safe. The table lock is held only to find/create a session; hashing runs
// under the session's own lock so concurrent workers of one request wait for, and
// then reuse, one computation.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "keys/chunk_hasher.h"
#include "wire/messages.h"

namespace kvd::server {

// What a request's chunk keys are made of besides the hashes.
struct SessionIdentity {
  std::string model_name;
  int64_t world_size = 0;
  std::string cache_salt;
  std::string key_namespace;  // see KeyModelName (server/chunk_keys.h)
  bool operator==(const SessionIdentity&) const = default;
};

class SessionTable {
 public:
  SessionTable(const Clock* clock, uint32_t chunk_size, double ttl_seconds);

  // Hashes of full chunks [0, num_chunks) of `tokens` for this request. The token
  // prefix already hashed is compared with `tokens`; if a client reuses a request id
  // with other tokens, the hashes are recomputed (never reused for different tokens).
  // `identity` (model, world size, salt) is remembered so END_SESSION can refresh the
  // request's chunks in L1.
  // A token the client sent outside [0, 2^32) within those chunks is an InvalidArgument
  // naming its index and value.
  Result<std::vector<keys::Hash32>> ChunkHashes(std::string_view request_id,
                                                const wire::TokenIds& tokens,
                                                size_t num_chunks,
                                                const SessionIdentity& identity = {});

  // Lookup results: set by LOOKUP, taken (once) by QUERY_PREFETCH_STATUS.
  void SetLookupResult(std::string_view request_id, int64_t hit_chunks);
  // A lookup whose prefix is still being loaded from the tiers: until FinishLookup with the
  // returned generation, the request's result is "running". A later BeginLookup or
  // SetLookupResult for the request supersedes it (its FinishLookup is then ignored).
  uint64_t BeginLookup(std::string_view request_id);
  // False (and nothing recorded) when superseded or the session ended.
  bool FinishLookup(std::string_view request_id, uint64_t generation, int64_t hit_chunks);
  // True while `generation` is the request's latest lookup and it has not finished.
  bool LookupCurrent(std::string_view request_id, uint64_t generation);
  // True while a BeginLookup has not finished.
  bool LookupRunning(std::string_view request_id);
  // nullopt: no result pending for this request (the caller answers 0).
  std::optional<int64_t> TakeLookupResult(std::string_view request_id);

  // Removes the session; returns its identity and hashes (for touching them in L1).
  std::pair<SessionIdentity, std::vector<keys::Hash32>> End(std::string_view request_id);

  // Drops sessions idle for longer than the TTL; returns how many.
  size_t Expire();
  size_t size() const;

 private:
  struct Session {
    std::mutex mu;
    std::vector<uint32_t> tokens;          // the tokens that `hashes` cover (all < 2^32)
    std::vector<keys::Hash32> hashes;
    std::optional<int64_t> lookup_result;
    uint64_t lookup_generation = 0;
    bool lookup_running = false;
    SessionIdentity identity;
    int64_t last_used_ns = 0;
  };
  std::shared_ptr<Session> Get(std::string_view request_id, bool create);
  // Heterogeneous lookup: find by string_view without building a std::string.
  struct IdHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  const Clock* const clock_;
  const uint32_t chunk_size_;
  const int64_t ttl_ns_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Session>, IdHash, std::equal_to<>> sessions_;  // guarded by mu_
};

}  // namespace kvd::server
