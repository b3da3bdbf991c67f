// L1Cache: lookups and their per-request read locks, and the expiry sweep of read and write
// locks.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "l1/l1_cache.h"
#include "l1/l1_cache_locks.h"

namespace kvd::l1 {
namespace {

using detail::EntryRec;
using detail::GlobalRef;
using detail::kNoRef;
using detail::LocalOf;

using Hold = L1Cache::Locks::Hold;

}  // namespace

void L1Cache::EndHold(uint32_t gref) {
  Shard& sh = ShardOfRef(gref);
  const uint32_t local = LocalOf(gref);
  MutexLock lock(&sh.mu);
  ApplyLock(sh, local, LockEvent::kHoldEnd);
  MaybeFreeRecordLocked(sh, local);
  PublishCandidateLocked(sh);
}

namespace {

// Releases chunks [lo, hi) of a hold, last first (so the request's later chunks become the
// older ones). With `slot`, one reader of that slot per chunk; a chunk goes when its last
// reader does.
template <class EndHold>
void ReleaseRange(Hold& h, uint64_t lo, uint64_t hi, std::optional<uint32_t> slot,
                  std::atomic<uint64_t>* held_slots, EndHold&& end_hold) {
  for (uint64_t i = hi; i-- > lo;) {
    if (h.grefs[i] == kNoRef) continue;
    uint16_t* readers = &h.readers[i * h.num_slots];
    if (slot) {
      if (*slot >= h.num_slots || readers[*slot] == 0) continue;
      --readers[*slot];
      if (std::any_of(readers, readers + h.num_slots, [](uint16_t r) { return r != 0; })) continue;
    } else {
      std::fill(readers, readers + h.num_slots, 0);
    }
    end_hold(h.grefs[i]);
    h.grefs[i] = kNoRef;
    --h.live;
    held_slots->fetch_sub(h.num_slots, std::memory_order_relaxed);
  }
}

}  // namespace

size_t L1Cache::ReleaseHoldsDueBy(int64_t cutoff_ns, uint64_t* holds) {
  size_t released = 0;
  for (auto& ls : locks_->shards) {
    MutexLock owner_lock(&ls.mu);
    for (auto it = ls.holds.begin(); it != ls.holds.end();) {
      if (it->second.deadline_ns > cutoff_ns) {
        ++it;
        continue;
      }
      released += it->second.live;
      ReleaseRange(it->second, 0, it->second.grefs.size(), std::nullopt, &locks_->held_slots,
                   [this](uint32_t gref) { EndHold(gref); });
      it = ls.holds.erase(it);
      locks_->owners.fetch_sub(1, std::memory_order_relaxed);
      ++*holds;
    }
  }
  return released;
}

void L1Cache::ShedOldestHolds(uint64_t need) {
  if (!locks_->shed_mu.TryLock()) return;  // another lookup is making room
  ShedOldestHoldsOnce(need);
  locks_->shed_mu.Unlock();
}

void L1Cache::ShedOldestHoldsOnce(uint64_t need) {
  const uint64_t max = locks_->max_held_slots;
  const uint64_t used = locks_->held_slots.load(std::memory_order_relaxed);
  // Room for this lookup, and a quarter of the bound for the next ones; a single lookup never
  // sheds more than half of the bound. The same for the number of holds (this lookup adds one).
  const uint64_t target = max - std::max(max / 4, std::min(need, max / 2));
  const uint64_t max_holds = locks_->max_holds;
  const uint64_t holds_used = locks_->owners.load(std::memory_order_relaxed);
  const uint64_t holds_target = max_holds - std::max<uint64_t>(max_holds / 4, 1);
  if (used <= target && holds_used <= holds_target) return;
  // Deadlines are the take time plus the read TTL, so the oldest holds have the earliest; all
  // lie within one TTL from now (an expired one the sweep has not reached counts as now).
  // Counters and holds per deadline bucket (1/256 of the TTL), then a cutoff at the bucket
  // that frees enough: one pass to count, one to release, no sort.
  constexpr int kBuckets = 256;
  std::array<uint64_t, kBuckets> slots_in{};
  std::array<uint64_t, kBuckets> holds_in{};
  const int64_t now = clock_->NowNanos();
  const int64_t width = read_ttl_ns_ / kBuckets + 1;
  for (auto& ls : locks_->shards) {
    MutexLock owner_lock(&ls.mu);
    for (const auto& [owner, h] : ls.holds) {
      const auto b = static_cast<size_t>(
          std::clamp<int64_t>((h.deadline_ns - now) / width, 0, kBuckets - 1));
      slots_in[b] += uint64_t{h.live} * h.num_slots;
      holds_in[b] += 1;
    }
  }
  uint64_t freed = 0;
  uint64_t freed_holds = 0;
  int64_t cutoff = now;
  for (int b = 0; b < kBuckets && (used - std::min(freed, used) > target ||
                                   holds_used - std::min(freed_holds, holds_used) > holds_target);
       ++b) {
    freed += slots_in[static_cast<size_t>(b)];
    freed_holds += holds_in[static_cast<size_t>(b)];
    cutoff = b == kBuckets - 1 ? INT64_MAX : now + (b + 1) * width - 1;
  }
  uint64_t holds = 0;
  const size_t chunks = ReleaseHoldsDueBy(cutoff, &holds);
  locks_->shed.fetch_add(holds, std::memory_order_relaxed);
  const double min_age_s =
      cutoff == INT64_MAX ? 0.0
                          : static_cast<double>(std::max<int64_t>(0, now - (cutoff - read_ttl_ns_))) / 1e9;
  spdlog::warn("l1: {} of {} read-lock counters and {} of {} lookup holds in use (lookups that "
               "are never retrieved or freed?): released the {} oldest lookup holds early ({} "
               "chunks, each taken at least {:.1f} s ago; the read TTL is {:.0f} s)",
               used, max, holds_used, max_holds, holds, chunks, min_age_s,
               static_cast<double>(read_ttl_ns_) / 1e9);
}

size_t L1Cache::LookupAndLock(std::string_view owner, uint64_t first_chunk,
                              std::span<const ChunkKey> keys, uint32_t num_slots,
                              uint32_t readers_per_slot) {
  const uint16_t readers = static_cast<uint16_t>(std::min<uint32_t>(readers_per_slot, 0xFFFF));
  if (readers > 0 && num_slots > 0) {
    const uint64_t need = uint64_t{keys.size()} * num_slots;
    if (locks_->held_slots.load(std::memory_order_relaxed) + need > locks_->max_held_slots ||
        locks_->owners.load(std::memory_order_relaxed) + 1 > locks_->max_holds) {
      ShedOldestHolds(need);
    }
  }
  Locks::LockShard& ls = locks_->For(owner);
  MutexLock owner_lock(&ls.mu);
  auto end_hold = [this](uint32_t gref) { EndHold(gref); };
  if (auto it = ls.holds.find(std::string(owner)); it != ls.holds.end()) {
    ReleaseRange(it->second, 0, it->second.grefs.size(), std::nullopt, &locks_->held_slots, end_hold);
    ls.holds.erase(it);
    locks_->owners.fetch_sub(1, std::memory_order_relaxed);
  }
  // How many chunks the bounds on reader counters and holds still allow this lookup to lock
  // (less than asked only when shedding could not make room: another thread was shedding).
  size_t allowed = keys.size();
  if (readers > 0 && num_slots > 0) {
    const uint64_t used = locks_->held_slots.load(std::memory_order_relaxed);
    const uint64_t room = used >= locks_->max_held_slots ? 0 : locks_->max_held_slots - used;
    allowed = std::min<uint64_t>(allowed, room / num_slots);
    if (locks_->owners.load(std::memory_order_relaxed) >= locks_->max_holds) allowed = 0;
    if (allowed < keys.size()) {
      spdlog::warn("l1: {} read-lock counters and {} lookup holds in use; a lookup locks at most "
                   "{} of {} chunks",
                   used, locks_->owners.load(std::memory_order_relaxed), allowed, keys.size());
    }
  }

  // Pass 1: the resident prefix, each hit locked (a transient lock when the caller wants
  // none) so that it cannot go before pass 2.
  std::vector<uint32_t> grefs;
  grefs.reserve(keys.size());
  for (size_t i = 0; i < allowed; ++i) {
    const ChunkKey& key = keys[i];
    const uint64_t digest = ChunkKeyDigest(key, seed_);
    Shard& sh = ShardFor(digest);
    MutexLock lock(&sh.mu);
    const uint32_t local = sh.Find(key, digest);
    if (local == kNoRef) break;
    EntryRec* e = sh.Rec(local);
    bool hit = e->num_slots == num_slots;
    for (uint32_t s = 0; hit && s < e->num_slots; ++s) {
      hit = e->slots()[s].state == SlotState::kResident;
    }
    if (!hit || !ApplyLock(sh, local, LockEvent::kHoldBegin)) break;
    PublishCandidateLocked(sh);
    grefs.push_back(GlobalRef(sh.id(), local));
  }

  // Pass 2, last hit first: the policy hears of the hits in lmcache's order, as uses of this
  // request; transient locks are dropped (their release sets the recency).
  auto chunk_no = [&](size_t i) {
    return static_cast<uint32_t>(std::min<uint64_t>(first_chunk + i, UINT32_MAX));
  };
  for (size_t i = grefs.size(); i-- > 0;) {
    Shard& sh = ShardOfRef(grefs[i]);
    const uint32_t local = LocalOf(grefs[i]);
    MutexLock lock(&sh.mu);
    sh.policy->Access(local, eviction::UseInfo{chunk_no(i), chunk_no(keys.size()),
                                               chunk_no(grefs.size())});
    if (readers == 0) {
      ApplyLock(sh, local, LockEvent::kHoldEnd);
      MaybeFreeRecordLocked(sh, local);
    }
    PublishCandidateLocked(sh);
  }

  const size_t hits = grefs.size();
  lookup_keys_.fetch_add(keys.size(), std::memory_order_relaxed);
  lookup_hits_.fetch_add(hits, std::memory_order_relaxed);
  if (readers > 0 && hits > 0) {
    Hold h;
    h.first_chunk = first_chunk;
    h.num_slots = num_slots;
    h.grefs = std::move(grefs);
    h.readers.assign(hits * num_slots, readers);
    h.live = static_cast<uint32_t>(hits);
    h.deadline_ns = clock_->NowNanos() + read_ttl_ns_;
    locks_->held_slots.fetch_add(hits * num_slots, std::memory_order_relaxed);
    locks_->owners.fetch_add(1, std::memory_order_relaxed);
    ls.holds.emplace(std::string(owner), std::move(h));
  }
  return hits;
}

void L1Cache::ReleaseLocks(std::string_view owner, uint64_t first_chunk, uint64_t count,
                           std::optional<uint32_t> slot) {
  Locks::LockShard& ls = locks_->For(owner);
  MutexLock owner_lock(&ls.mu);
  auto it = ls.holds.find(std::string(owner));
  if (it == ls.holds.end()) return;
  Hold& h = it->second;
  const uint64_t lo = std::max(first_chunk, h.first_chunk);
  const uint64_t hi = std::min(first_chunk + count, h.first_chunk + h.grefs.size());
  if (lo < hi) {
    ReleaseRange(h, lo - h.first_chunk, hi - h.first_chunk, slot, &locks_->held_slots,
                 [this](uint32_t gref) { EndHold(gref); });
  }
  if (h.live == 0) {
    ls.holds.erase(it);
    locks_->owners.fetch_sub(1, std::memory_order_relaxed);
  }
}

void L1Cache::ReleaseAllLocks(std::string_view owner) {
  Locks::LockShard& ls = locks_->For(owner);
  MutexLock owner_lock(&ls.mu);
  auto it = ls.holds.find(std::string(owner));
  if (it == ls.holds.end()) return;
  ReleaseRange(it->second, 0, it->second.grefs.size(), std::nullopt, &locks_->held_slots,
               [this](uint32_t gref) { EndHold(gref); });
  ls.holds.erase(it);
  locks_->owners.fetch_sub(1, std::memory_order_relaxed);
}

size_t L1Cache::ExpireLocks() {
  const int64_t now = clock_->NowNanos();
  uint64_t holds = 0;
  size_t released = ReleaseHoldsDueBy(now, &holds);
  for (auto& shp : shards_) {
    Shard& sh = *shp;
    MutexLock lock(&sh.mu);
    std::vector<uint64_t> expired;
    for (const auto& [key, rec] : sh.staging) {
      if (!WriteLockHolds(rec, now)) expired.push_back(key);  // never a copy in flight
    }
    for (uint64_t key : expired) {
      const uint32_t local = static_cast<uint32_t>(key >> 16);
      const uint32_t slot = static_cast<uint32_t>(key & 0xFFFF);
      EntryRec* e = sh.Rec(local);
      spdlog::info("l1: write lock of slot {} expired (writer gone?); reclaiming it", slot);
      FreeSlotLocked(sh, e, slot, e->in_table() ? SlotEvent::kReclaim : SlotEvent::kEvict);
      EraseStagingLocked(sh, sh.staging.find(key));
      ApplyLock(sh, local, LockEvent::kWriteEnd);
      sh.counters.reclaimed_writes.Add(1);
      RemoveIfEmptyLocked(sh, local);
      MaybeFreeRecordLocked(sh, local);
      ++released;
    }
    if (!expired.empty()) PublishCandidateLocked(sh);
  }
  return released;
}

}  // namespace kvd::l1
