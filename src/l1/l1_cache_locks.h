// L1Cache::Locks (internal): read locks owned by lookup requests.
//
// One Hold per owner (a lookup's request id): the entries of its hit prefix, by global ref,
// and for each chunk and slot the readers that have not released it yet. A chunk is
// unlocked (EntryLocks::holders - 1) when all its readers are done or the hold is dropped.
// Holds are kept in 64 shards by owner, each with its own mutex.
//
// Bounds: at most max_held_slots (chunk x slot) reader counters across all holds
// (L1CacheOptions::max_read_lock_slots), and at most max_holds holds
// (L1CacheOptions::max_lookup_holds). A lookup that would pass either first releases the
// oldest holds early (ShedOldestHolds: down to 3/4 of the bound, or the room it needs): a
// client that looks up and never retrieves fills the bound in seconds, and refusing new locks
// instead would make every client's lookups miss until those holds expired (the read TTL,
// 300 s). The owners of shed holds lose only the guarantee: their chunks stay in L1 until
// evicted and their RETRIEVEs still read them meanwhile. If shedding cannot make room (another
// thread is shedding), the lookup locks, and reports, only the prefix that fits.
//
// Lock order: a LockShard's mutex, then cache shard mutexes one at a time. The allocation
// path never takes a LockShard mutex while it holds a cache shard mutex. Shedding holds
// shed_mu, then LockShard mutexes one at a time; it is never called with a LockShard mutex
// held.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "l1/l1_cache.h"

namespace kvd::l1 {

struct L1Cache::Locks {
  Locks(uint64_t max_held, uint64_t max_hold_count)
      : max_held_slots(max_held), max_holds(max_hold_count) {}

  struct Hold {
    uint64_t first_chunk = 0;
    uint32_t num_slots = 0;
    std::vector<uint32_t> grefs;     // per chunk; detail::kNoRef once released
    std::vector<uint16_t> readers;   // per chunk x slot: readers still to release
    uint32_t live = 0;               // chunks still locked
    int64_t deadline_ns = 0;
  };
  struct LockShard {
    Mutex mu;
    std::unordered_map<std::string, Hold> holds KVD_GUARDED_BY(mu);
  };

  LockShard& For(std::string_view owner) {
    return shards[Mix64(std::hash<std::string_view>{}(owner)) >> 58];
  }

  const uint64_t max_held_slots;
  const uint64_t max_holds;
  std::array<LockShard, 64> shards;
  std::atomic<uint64_t> held_slots{0};  // reader counters in use, for the bound
  std::atomic<uint64_t> owners{0};      // holds in use (stats)
  std::atomic<uint64_t> shed{0};        // holds released early by ShedOldestHolds (stats)
  Mutex shed_mu;                        // one shedder at a time (guards no data)
};

}  // namespace kvd::l1
