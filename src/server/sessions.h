// SessionTable: per-request state shared by the scheduler's LOOKUP and the workers'
// STORE/RETRIEVE of one vLLM request (keyed by request_id): the chained chunk hashes
// computed so far (so each chunk is hashed once per request, not once per TP worker).
// Sessions idle longer than the TTL expire. The request's LOOKUP result is kept apart, with
// bounds of its own (lookup_results.h).
//
// Bounded (issue 11, finding 8): at most SessionLimits::max_sessions sessions holding at most
// SessionLimits::max_bytes (tokens, hashes, identity, bookkeeping) in all. Creating one more,
// or growing one past the byte bound, evicts the least recently used others; a session that
// alone would exceed the bound keeps nothing (its hashes are computed and returned, not
// cached). Only LOOKUP creates a session (SessionUse::kCreate): STORE,
// RETRIEVE and the engine-driven ops use one if it exists (kIfExists), so a late store after
// END_SESSION cannot bring a session back for another TTL.
//
// Thread-safe. The table lock (mu_) is held only to find/create/account a session, never
// across hashing; hashing runs under the session's own lock so concurrent workers of one
// request wait for, and then reuse, one computation. Lock order: a session's mu, then mu_.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "keys/chunk_hasher.h"
#include "keys/chunk_key_memo.h"
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

struct SessionLimits {
  uint64_t max_sessions = 65536;
  uint64_t max_bytes = uint64_t{1} << 30;
};

// Whether a call may create the request's session.
enum class SessionUse { kCreate, kIfExists };

class SessionTable {
 public:
  // `chunk_key_memo_bytes`: memory for the chunk keys of recently hashed prefixes, shared
  // by all requests (keys/chunk_key_memo.h); 0: none.
  SessionTable(const Clock* clock, uint32_t chunk_size, double ttl_seconds,
               SessionLimits limits = {}, uint64_t chunk_key_memo_bytes = 0);

  // Hashes of full chunks [0, num_chunks) of `tokens` for this request. The token
  // prefix already hashed is compared with `tokens`; if a client reuses a request id
  // with other tokens, the hashes are recomputed (never reused for different tokens).
  // `identity` (model, world size, salt) is remembered so END_SESSION can refresh the
  // request's chunks in L1.
  // A token the client sent outside [0, 2^32) within those chunks is an InvalidArgument
  // naming its index and value.
  // With kIfExists and no session for the request, the hashes are computed and nothing is
  // kept.
  Result<std::vector<keys::Hash32>> ChunkHashes(std::string_view request_id,
                                                const wire::TokenIds& tokens,
                                                size_t num_chunks,
                                                const SessionIdentity& identity = {},
                                                SessionUse use = SessionUse::kCreate);

  // Whether the cache holds chunk `chunk` of the request, whose hash is `hash` (a hint for
  // how far a lookup can hit; see ChunkHashesWhilePresent).
  using ChunkPresent = std::function<bool(size_t chunk, const keys::Hash32& hash)>;
  // For a LOOKUP, which can hit only a prefix: as ChunkHashes (kCreate), but the chunks not
  // hashed yet are hashed in batches of 1, 2, 4, ... chunks, and before each batch `present`
  // is asked about the last chunk hashed so far; hashing stops when it answers false (no
  // chunk past an absent one can hit). Returns the hashes of chunks [0, k), 1 <= k <=
  // num_chunks for num_chunks >= 1 (k == num_chunks when every answer was true). The rest is
  // hashed by a later call (a STORE of the request). `present` runs under the session's
  // lock: it must not call into this table.
  Result<std::vector<keys::Hash32>> ChunkHashesWhilePresent(std::string_view request_id,
                                                            const wire::TokenIds& tokens,
                                                            size_t num_chunks,
                                                            const SessionIdentity& identity,
                                                            const ChunkPresent& present);

  // The checks ChunkHashes makes of the client's tokens for chunks [0, num_chunks):
  // InvalidArgument when there are too few, or one is outside [0, 2^32).
  static Status CheckTokens(const wire::TokenIds& tokens, size_t num_chunks, uint32_t chunk_size);

  // Opens the request's session (a LOOKUP's, which may hash nothing yet: nothing of its
  // namespace is cached, or no worker of its model registered), so that the request's STOREs,
  // which use a session only if it exists, hash each chunk once for all its workers. Touches
  // it when it exists.
  void Open(std::string_view request_id);

  // Removes the session; returns its identity and hashes (for touching them in L1).
  std::pair<SessionIdentity, std::vector<keys::Hash32>> End(std::string_view request_id);

  // Drops sessions idle for longer than the TTL; returns how many.
  size_t Expire();
  size_t size() const;
  bool Contains(std::string_view request_id) const;
  // Bytes the live sessions hold (as accounted for the bound).
  uint64_t bytes() const;
  // Sessions dropped to stay within the bounds (not counting expiry or END_SESSION).
  uint64_t evicted() const;
  // Chunks hashed by ChunkHashes since construction (each chunk of a chain counts once per
  // computation; a reused hash does not count). Lets tests and metrics see repeated hashing.
  // Chunk keys computed (hashed, or found in the chunk-key memo).
  uint64_t hashed_chunks() const { return hashed_chunks_.load(std::memory_order_relaxed); }
  keys::ChunkKeyMemo::Stats chunk_key_memo_stats() const { return memo_.stats(); }
  const SessionLimits& limits() const { return limits_; }

 private:
  struct Session {
    Mutex mu;
    std::vector<uint32_t> tokens KVD_GUARDED_BY(mu);  // what `hashes` cover (all < 2^32)
    std::vector<keys::Hash32> hashes KVD_GUARDED_BY(mu);
    SessionIdentity identity KVD_GUARDED_BY(mu);
    // Guarded by the table's mu_ (SessionTable::mu_, a lock of the enclosing object, which a
    // nested struct's KVD_GUARDED_BY cannot name); the *Locked helpers that touch them
    // KVD_REQUIRES(mu_).
    int64_t last_used_ns = 0;
    // Table bookkeeping, guarded by the table's mu_ (as above).
    bool in_table = false;
    uint64_t accounted_bytes = 0;
    std::list<std::string_view>::iterator lru_pos;  // views the map's key
  };
  using SessionPtr = std::shared_ptr<Session>;
  SessionPtr Get(std::string_view request_id, bool create) KVD_EXCLUDES(mu_);
  // ChunkHashes and ChunkHashesWhilePresent (null `present`: hash all of them).
  Result<std::vector<keys::Hash32>> Hashes(std::string_view request_id,
                                           const wire::TokenIds& tokens, size_t num_chunks,
                                           const SessionIdentity& identity, SessionUse use,
                                           const ChunkPresent* present);
  // Bytes a session holds now (its mu held).
  static uint64_t SessionBytes(const Session& s, size_t id_size) KVD_REQUIRES(s.mu);
  // The same for a session no other thread can reach yet (Get, just created, under mu_):
  // read without its lock, since taking a session's mu under mu_ would invert the lock order
  // (a session's mu, then mu_; TSan reports the inversion even for an unreachable session).
  static uint64_t UnsharedSessionBytes(const Session& s, size_t id_size)
      KVD_NO_THREAD_SAFETY_ANALYSIS;
  // Sets the session's accounted size and evicts others (oldest first) while a bound is
  // exceeded; the evicted sessions are moved to `dropped` (destroyed by the caller, after
  // unlocking). Requires mu_.
  void AccountLocked(Session& s, uint64_t bytes, std::vector<SessionPtr>& dropped)
      KVD_REQUIRES(mu_);
  // Removes the session `it` names from the map, the LRU list and the byte total. Requires mu_.
  template <typename It>
  SessionPtr RemoveLocked(It it) KVD_REQUIRES(mu_);
  // Evicts the least recently used session other than `keep`; false when there is none.
  bool EvictOldestLocked(const Session* keep, std::vector<SessionPtr>& dropped)
      KVD_REQUIRES(mu_);
  // Heterogeneous lookup: find by string_view without building a std::string.
  struct IdHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  const Clock* const clock_;
  const uint32_t chunk_size_;
  const int64_t ttl_ns_;
  const SessionLimits limits_;
  mutable Mutex mu_;
  std::unordered_map<std::string, SessionPtr, IdHash, std::equal_to<>> sessions_
      KVD_GUARDED_BY(mu_);
  std::list<std::string_view> lru_ KVD_GUARDED_BY(mu_);  // most recently used first
  uint64_t bytes_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t evicted_ KVD_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> hashed_chunks_{0};  // relaxed: a statistic
  keys::ChunkKeyMemo memo_;
};

}  // namespace kvd::server
