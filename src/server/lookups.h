// Lookups: the scheduler's side of a request's session. LOOKUP computes the hit prefix of
// a prompt, read-locks it for the workers' RETRIEVEs and records the result for
// QUERY_PREFETCH_STATUS; FREE_LOOKUP_LOCKS gives locks back; END_SESSION forgets the
// request's hashes and refreshes its chunks' recency.
//
// Without tiers a LOOKUP hashes the prompt only as far as L1 can hit (LookupChunkKeys: in
// batches, up to the first chunk L1 lacks); the request's STOREs hash the rest, once.
//
// With tiers, a prefix that continues past L1 is prefetched: the lookup read-locks its L1
// prefix, asks the tiers for the rest (l2::TierSet::Prefetch) and answers at once;
// QUERY_PREFETCH_STATUS answers "running" (nil) until the loaded chunks are in L1 and
// read-locked, then the whole hit count.
//
// Visibility (issue 26, item 2). Chunks whose asynchronous (GPU) STORE copy was submitted
// but not committed yet (PendingCommits) count as present for hashing, and the lookup waits
// (at most PendingCommits::kLookupWait, without holding its request mutex or any L1 lock)
// until those of its prefix are committed before it probes and locks: a client that saw its
// STORE's event complete finds its chunks. A commit that fails or is still not done by then
// is a miss, as before. ZmqServer runs LOOKUPs on the pool while any commit is pending.
//
// Thread-safe (SessionTable, L1Cache and LookupResults are). A lookup and a prefetch
// completion of the same request are serialized by the request's mutex
// (LookupResults::RequestMutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "server/config.h"
#include "server/instance_registry.h"
#include "server/lookup_results.h"
#include "server/pending_commits.h"
#include "server/service_context.h"
#include "server/chunk_keys.h"
#include "server/service_counters.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

class Lookups {
 public:
  // Borrows the context's config, clock, L1, sessions, registry, counters, tiers (a lookup
  // prefetches from them; null: none) and pending commits (a lookup waits for them); all
  // must outlive this object.
  explicit Lookups(const ServiceContext& context);

  // LOOKUP: hit prefix (in chunks), read-locked, recorded for QueryPrefetchStatus. A model
  // no worker registered has 0 hits.
  Status Lookup(const wire::LookupRequest& req);
  // The requests' lookup results (QUERY_PREFETCH_STATUS takes one, WAIT_PREFETCH_STATUS
  // watches its changes), their change counter and the request loop's wakeup.
  LookupResults& results() { return results_; }
  const LookupResults& results() const { return results_; }
  // The L1 keys of every full chunk of `key` [start, end) in the namespace its model's workers
  // registered (the request's session caches the hashes, as a LOOKUP's), or nothing
  // (namespace_known false) when no worker of the model registered or the namespace is
  // unknown. Takes no lock. For the blend lookup's segmented prefix.
  Result<RequestChunks> ChunkKeys(const wire::CacheKey& key);
  // FREE_LOOKUP_LOCKS: releases the locks a lookup took on a range.
  Status FreeLookupLocks(const wire::LookupRequest& req);
  // END_SESSION.
  void EndSession(std::string_view request_id);

  // Read locks one lookup takes per object slot (one per reader of the object).
  static uint32_t ReadLocksPerSlot(const wire::CacheKey& key, int64_t tp_size);

  // The tier format of a registered instance of the model (nullopt: none registered).
  std::optional<l2::ObjectFormat> TierFormatFor(const std::string& model, int64_t world_size) const;

 private:
  // The chunks of the hit prefix whose asynchronous STORE commit is still in flight: up to the
  // first chunk that is neither pending nor resident (the prefix ends there whatever commits).
  std::vector<l1::ChunkKey> PendingInPrefix(const RequestChunks& chunks) const;
  // A lookup whose prefix continues in the tiers, while they load it.
  struct Prefetching {
    std::shared_ptr<const RequestChunks> chunks;  // every chunk the lookup asked for
    size_t l1_hits = 0;                           // its prefix L1 held (read-locked)
    uint32_t world = 0, readers = 0;
    std::string request_id;
    uint64_t generation = 0;                      // LookupResult::Begin's
    LookupValues* counts = nullptr;
  };
  // The tiers loaded the next `loaded` chunks of `p` into L1 (the prefetch's completion, on a
  // tiers thread): the whole prefix locked again and recorded, unless a later lookup of the
  // request (or the end of its entry) superseded it.
  void OnPrefetched(const Prefetching& p, size_t loaded);

  const ServerConfig& config_;
  l1::L1Cache* const l1_;
  SessionTable* const sessions_;
  const InstanceRegistry* const registry_;
  ServiceCounters* const counters_;
  l2::TierSet* const tiers_;
  const std::shared_ptr<PendingCommits> pending_;
  // Results, changes, wakeup and the per-request mutexes (lookup_results.h).
  LookupResults results_;
};

}  // namespace kvd::server
