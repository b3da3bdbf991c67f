// ServiceContext: what KvService's parts (Lookups, KvdCopyTransfers, WorkerCopyTransfers and
// their ChunkIo) are built from. KvService builds the shared state first — config, clock, L1,
// sessions, instance registry, counters, tiers, KV-event log, the pending-commit table and the
// store hook — and hands each part one complete context in its constructor: no part is told
// anything afterwards.
//
// OWNERSHIP. Every pointer is borrowed from KvService, which destroys its parts before what
// they borrow. `pending_commits` is shared: asynchronous copy completions hold it and may run
// after the part that submitted them is gone.
//
// THREADS. A context is copied into the parts at construction and never changes.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "common/clock.h"
#include "l1/chunk_key.h"
#include "server/config.h"

namespace kvd::l1 {
class L1Cache;
}
namespace kvd::l2 {
class TierSet;
}
namespace kvd::p2p {
class PeerNode;
}
namespace kvd::wire {
struct CacheKey;
}

namespace kvd::server {

class InstanceRegistry;
class KvEventLog;
class PendingCommits;
struct ServiceCounters;
class SessionTable;
struct RequestChunks;

// A store's chunks as committed, for whoever indexes stored content (CacheBlend's
// fingerprints, server/blend_ops.h). Valid during the hook's call only.
struct CommittedStore {
  const wire::CacheKey* key = nullptr;       // the request's key (tokens from position 0)
  const RequestChunks* chunks = nullptr;     // every chunk of the stored range
  std::span<const l1::ChunkKey> committed;   // those this store committed
  uint32_t slot = 0;                         // the worker's rank
};
// Called after a store's commit, on the committing thread (a copy's completion or the
// request's thread); must be thread-safe and must not call back into a transfer.
using StoreCommittedHook = std::function<void(const CommittedStore&)>;

struct ServiceContext {
  const ServerConfig* config = nullptr;
  const Clock* clock = nullptr;
  l1::L1Cache* l1 = nullptr;
  SessionTable* sessions = nullptr;
  InstanceRegistry* registry = nullptr;
  ServiceCounters* counters = nullptr;
  l2::TierSet* tiers = nullptr;        // null: no tiers (nothing written behind or prefetched)
  KvEventLog* kv_events = nullptr;     // null: KV events off
  p2p::PeerNode* peers = nullptr;      // null: P2P off; told each registered object format
  // Chunks of asynchronous STOREs not committed yet (pending_commits.h): the lmcache-driven
  // stores list them, lookups and retrieves wait for them. Never null.
  std::shared_ptr<PendingCommits> pending_commits;
  StoreCommittedHook store_hook;       // empty: nobody indexes stored content
};

}  // namespace kvd::server
