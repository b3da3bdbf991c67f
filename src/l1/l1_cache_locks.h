// L1Cache::Locks (internal): read locks owned by lookup requests.
//
// One Hold per owner (a lookup's request id): the entries of its hit prefix, by global ref,
// and for each chunk and slot the readers that have not released it yet. A chunk is
// unlocked (EntryLocks::holders - 1) when all its readers are done or the hold is dropped.
// Holds are kept in 64 shards by owner, each with its own mutex.
//
// Bound: at most kMaxHeldSlots (chunk x slot) reader counters across all holds; a lookup that
// would exceed it locks, and reports, only the prefix that fits (it never drops another
// owner's locks to make room).
//
// Lock order: a LockShard's mutex, then cache shard mutexes one at a time. The allocation
// path never takes a LockShard mutex while it holds a cache shard mutex.
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
  static constexpr uint64_t kMaxHeldSlots = uint64_t{1} << 24;

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

  std::array<LockShard, 64> shards;
  std::atomic<uint64_t> held_slots{0};  // reader counters in use, for the bound
  std::atomic<uint64_t> owners{0};      // holds in use (stats)
};

}  // namespace kvd::l1
