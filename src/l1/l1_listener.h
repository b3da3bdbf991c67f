// L1Listener: an observer of the chunk table's visible contents, for the KV-event stream
// (server/kv_events.h) and anything else that must learn what L1 holds without polling it.
//
// WHAT IS REPORTED. Only transitions a reader can see:
//   OnEntryComplete   an entry's last slot was committed, so a lookup of its key now hits.
//                     Called once per entry (a resident slot is never written again).
//   OnEntriesRemoved  complete entries left the table: evicted (background round, a store
//                     that did not fit, or RemoveIfIdle for the tiers) or cleared. Entries that never became complete (some
//                     slots still empty or staging) are not reported: no lookup ever hit them.
//                     One call covers a batch of entries removed under one hold of one index
//                     shard's mutex (an eviction: one entry; Clear: one call per shard).
//   Keys carry the interned namespace id: L1Cache::namespaces().Get(key.ns) gives the model,
//   world size and cache salt.
//
// THREADS AND LOCKS. Both methods are called by L1Cache with the mutex of the index shard
// that holds the key held, on whatever thread made the change; events of one key therefore
// arrive in the order they happened. Different shards call concurrently: an implementation
// must be thread-safe, quick, must not throw, must not block on anything that can wait for
// the cache, and must not call back into the L1Cache. Lock order: L1 shard mutex ->
// listener's own locks. `keys` is valid only during the call.
//
// OWNERSHIP. L1CacheOptions::listener is not owned; it must outlive the cache.
#pragma once

#include <span>

#include "l1/chunk_key.h"

namespace kvd::l1 {

enum class RemovalCause { kEvicted, kCleared };

class L1Listener {
 public:
  virtual ~L1Listener() = default;
  virtual void OnEntryComplete(const ChunkKey& key) = 0;
  virtual void OnEntriesRemoved(std::span<const ChunkKey> keys, RemovalCause cause) = 0;
};

}  // namespace kvd::l1
