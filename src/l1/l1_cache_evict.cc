// L1Cache: eviction (on the allocation path and by watermark) and Clear.
//
// The best victim over all shards is found without locks: each shard publishes its policy's
// current candidate (priority, shared-clock stamp) after every change, and BestShard compares
// the 64 published values. The chosen shard is then locked and asked again (the answer it
// gives under its lock is the one evicted).
#include <spdlog/spdlog.h>

#include "l1/l1_cache.h"
#include "l1/l1_cache_locks.h"

namespace kvd::l1 {
namespace {

using detail::EntryRec;
using detail::kNoRef;
using detail::kNoUnit;
using detail::LocalOf;
using eviction::EvictionPolicy;

}  // namespace

int L1Cache::BestShard(bool forced_only) const {
  const uint32_t now = policy_clock_.load(std::memory_order_relaxed);
  int best = -1;
  uint32_t best_priority = 0, best_age = 0;
  for (uint32_t s = 0; s < shards_.size(); ++s) {
    const uint64_t c = shards_[s]->candidate.load(std::memory_order_relaxed);
    if (c == detail::kNoCandidate) continue;
    const uint32_t priority = static_cast<uint32_t>(c >> 32);
    const uint32_t age = now - static_cast<uint32_t>(c);
    if (forced_only && priority != EvictionPolicy::kForced) continue;
    if (best < 0 || priority < best_priority || (priority == best_priority && age > best_age)) {
      best = static_cast<int>(s);
      best_priority = priority;
      best_age = age;
    }
  }
  return best;
}

void L1Cache::EvictLocked(Shard& sh, uint32_t local, std::vector<uint32_t>* freed_units,
                          std::vector<ChunkKey>* removed) {
  EntryRec* e = sh.Rec(local);
  if (removed != nullptr && Complete(e)) removed->push_back(e->key());
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < e->num_slots; ++i) {
    const detail::SlotRec& s = e->slots()[i];
    if (s.state == SlotState::kEmpty) continue;
    if (s.unit != kNoUnit && freed_units != nullptr) freed_units->push_back(s.unit);
    bytes += FreeSlotLocked(sh, e, i, SlotEvent::kEvict);
  }
  sh.counters.evictions.Add(1);
  sh.counters.evicted_bytes.Add(static_cast<int64_t>(bytes));
  UnindexLocked(sh, local, /*evicted=*/true);
}

bool L1Cache::EvictFromShard(uint32_t s, std::vector<uint32_t>* freed_units,
                             uint64_t* freed_bytes, bool forced_only) {
  Shard& sh = *shards_[s];
  MutexLock lock(&sh.mu);
  auto c = sh.policy->Victim();
  if (!c || (forced_only && c->priority != EvictionPolicy::kForced)) {
    PublishCandidateLocked(sh);
    return false;
  }
  EntryRec* e = sh.Rec(c->id);
  if (!e->in_table() || e->locks.locked()) {  // a policy bug: never evict a locked entry
    spdlog::error("l1: policy {} offered a locked or removed entry", policy_name_);
    sh.policy->Erase(c->id);
    PublishCandidateLocked(sh);
    return false;
  }
  const uint64_t before = sh.counters.evicted_bytes.Get();
  std::vector<ChunkKey> removed;
  EvictLocked(sh, c->id, freed_units, &removed);
  NotifyRemoved(removed, RemovalCause::kEvicted);
  if (freed_bytes != nullptr) *freed_bytes += sh.counters.evicted_bytes.Get() - before;
  PublishCandidateLocked(sh);
  return true;
}

bool L1Cache::EvictOwnerOf(uint32_t gref, uint32_t unit, std::vector<uint32_t>* freed_units) {
  if (gref == SizeClassAllocator::kNoOwner) return false;
  Shard& sh = ShardOfRef(gref);
  const uint32_t local = LocalOf(gref);
  MutexLock lock(&sh.mu);
  EntryRec* e = sh.RecIfValid(local);
  if (e == nullptr || !e->in_table() || e->locks.locked()) return false;
  // The allocator's owner map is read without this shard's lock: check the record still owns
  // the range before evicting it.
  bool owns = false;
  for (uint32_t i = 0; i < e->num_slots && !owns; ++i) owns = e->slots()[i].unit == unit;
  if (!owns) return false;
  std::vector<ChunkKey> removed;
  EvictLocked(sh, local, freed_units, &removed);
  NotifyRemoved(removed, RemovalCause::kEvicted);
  PublishCandidateLocked(sh);
  return true;
}

std::optional<uint32_t> L1Cache::AllocateEvicting(uint16_t cls, uint32_t gref) {
  if (auto u = alloc_->Allocate(cls, gref)) return u;
  bool swept = false;
  std::optional<uint32_t> focus;  // a free unit whose run we are growing
  std::vector<uint32_t> freed;
  size_t evicted = 0;
  for (;;) {
    if (focus) {
      // The run around the last victim is too short for this class (sizes differ): evict the
      // allocations that border it, so that no more is freed than the object needs plus one.
      if (auto u = alloc_->AllocateAround(cls, *focus, gref)) return u;
      const auto nb = alloc_->NeighboursOf(*focus);
      if (EvictOwnerOf(nb.after.owner, nb.after.unit, nullptr) ||
          EvictOwnerOf(nb.before.owner, nb.before.unit, nullptr)) {
        ++evicted;
        continue;
      }
      focus.reset();
    }
    const int s = BestShard(/*forced_only=*/false);
    if (s < 0) {
      if (swept) break;
      ExpireLocks();  // expired read or write locks may free memory or unlock entries
      swept = true;
      if (auto u = alloc_->Allocate(cls, gref)) return u;
      continue;
    }
    freed.clear();
    if (!EvictFromShard(static_cast<uint32_t>(s), &freed, nullptr)) continue;
    ++evicted;
    if (auto u = alloc_->Allocate(cls, gref)) return u;
    for (uint32_t f : freed) {
      if (auto u = alloc_->AllocateAround(cls, f, gref)) return u;
    }
    if (!freed.empty()) focus = freed.front();
  }
  spdlog::debug("l1: allocation of {} bytes failed after evicting {} entries",
                alloc_->ClassBytes(cls), evicted);
  return std::nullopt;
}

size_t L1Cache::EvictToWatermark() {
  // Quotas first: salts that must shed lose their oldest entries whatever the total usage.
  quotas_.UpdateShedding();
  for (auto& shp : shards_) {
    MutexLock lock(&shp->mu);
    PublishCandidateLocked(*shp);  // priorities depend on the quotas just updated
  }
  size_t evicted = 0;
  uint64_t freed = 0;
  for (int s; (s = BestShard(/*forced_only=*/true)) >= 0;) {
    if (EvictFromShard(static_cast<uint32_t>(s), nullptr, &freed, /*forced_only=*/true)) ++evicted;
  }
  const size_t quota_evictions = evicted;

  const uint64_t used_before = alloc_->used_bytes();
  const double capacity = static_cast<double>(alloc_->capacity_bytes());
  if (static_cast<double>(used_before) >= eviction_watermark_ * capacity) {
    const uint64_t target = static_cast<uint64_t>(eviction_ratio_ * capacity);
    uint64_t freed_here = 0;
    bool swept = false;
    while (freed_here < target) {
      const int s = BestShard(/*forced_only=*/false);
      if (s < 0) {
        if (swept) break;
        ExpireLocks();
        swept = true;
        continue;
      }
      if (EvictFromShard(static_cast<uint32_t>(s), nullptr, &freed_here)) ++evicted;
    }
    freed += freed_here;
    spdlog::info("l1: eviction round: {} entries, {} bytes freed (target {}), used {} -> {} of {}",
                 evicted - quota_evictions, freed_here, target, used_before, alloc_->used_bytes(),
                 alloc_->capacity_bytes());
  }
  if (quota_evictions > 0) {
    spdlog::info("l1: {} entries evicted from cache salts over their quota", quota_evictions);
  }
  return evicted;
}

void L1Cache::Clear() {
  // Every read lock goes first (the entries they hold are removed below).
  for (auto& ls : locks_->shards) {
    MutexLock owner_lock(&ls.mu);
    for (auto& [owner, h] : ls.holds) {
      for (uint32_t gref : h.grefs) {
        if (gref != kNoRef) EndHold(gref);
      }
      locks_->held_slots.fetch_sub(uint64_t{h.live} * h.num_slots, std::memory_order_relaxed);
    }
    locks_->owners.fetch_sub(ls.holds.size(), std::memory_order_relaxed);
    ls.holds.clear();
  }
  const int64_t now = clock_->NowNanos();
  const uint64_t used_before = alloc_->used_bytes();
  uint64_t cleared = 0, deferred = 0;
  for (auto& shp : shards_) {
    Shard& sh = *shp;
    MutexLock lock(&sh.mu);
    std::vector<uint32_t> locals;
    locals.reserve(sh.size());
    sh.ForEachIndexed([&](uint32_t local) { locals.push_back(local); });
    std::vector<ChunkKey> removed;
    for (uint32_t local : locals) {
      EntryRec* e = sh.Rec(local);
      if (listener_ != nullptr && Complete(e)) removed.push_back(e->key());
      for (uint32_t i = 0; i < e->num_slots; ++i) {
        const SlotState st = e->slots()[i].state;
        if (st == SlotState::kResident) {
          // Pinned bytes are being read: the last pin frees them.
          if (e->locks.pins > 0) ++deferred; else FreeSlotLocked(sh, e, i, SlotEvent::kEvict);
        } else if (st == SlotState::kStaging) {
          auto it = sh.staging.find(detail::StagingKey(local, i));
          if (it != sh.staging.end() && WriteLockHolds(it->second, now)) {
            ++deferred;  // being written (or copied into): its reservation frees it
            continue;
          }
          FreeSlotLocked(sh, e, i, SlotEvent::kEvict);
          if (it != sh.staging.end()) {
            EraseStagingLocked(sh, it);
            ApplyLock(sh, local, LockEvent::kWriteEnd);
          }
        }
      }
      UnindexLocked(sh, local, /*evicted=*/false);
      ++cleared;
    }
    NotifyRemoved(removed, RemovalCause::kCleared);
    PublishCandidateLocked(sh);
  }
  alloc_->ResetIfIdle();
  spdlog::info("l1: cleared {} entries, freed {} bytes, {} objects freed later by their handles",
               cleared, used_before - alloc_->used_bytes(), deferred);
}

}  // namespace kvd::l1
