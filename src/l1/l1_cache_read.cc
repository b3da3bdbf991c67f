// L1Cache: pins and point reads (residency, slot descriptions, recency), per-salt quotas and
// the stats snapshot. Construction and writes are in l1_cache.cc.
#include <spdlog/spdlog.h>

#include "l1/l1_cache.h"
#include "l1/l1_cache_locks.h"

namespace kvd::l1 {
namespace {

using detail::EntryRec;
using detail::GlobalRef;
using detail::kNoRef;
using detail::kNoUnit;
using detail::LocalOf;
using detail::SlotRec;
using detail::StagingKey;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pins and point reads

Result<ReadPin> L1Cache::PinForRead(const ChunkKey& key, uint32_t slot) {
  const uint64_t digest = ChunkKeyDigest(key, seed_);
  Shard& sh = ShardFor(digest);
  MutexLock lock(&sh.mu);
  const uint32_t local = sh.Find(key, digest);
  if (local == kNoRef) return Status::NotFound("chunk not in L1");
  EntryRec* e = sh.Rec(local);
  if (slot >= e->num_slots) {
    return Status::NotFound("slot " + std::to_string(slot) + " out of range");
  }
  const SlotRec& s = e->slots()[slot];
  if (s.state != SlotState::kResident) return Status::NotFound("object is not resident");
  if (e->handles == EntryLocks::kMax || !ApplyLock(sh, local, LockEvent::kPinBegin)) {
    return Status::ResourceExhausted("too many concurrent readers of one L1 entry");
  }
  ++e->handles;
  sh.counters.pins.Add(1);
  sh.policy->Access(local);
  PublishCandidateLocked(sh);
  const uint64_t offset = uint64_t{s.unit} * alloc_->align();
  return ReadPin(this, GlobalRef(sh.id(), local), slot, pool_->At(offset), offset,
                 alloc_->ClassBytes(s.cls));
}

void L1Cache::Unpin(uint32_t gref) {
  Shard& sh = ShardOfRef(gref);
  const uint32_t local = LocalOf(gref);
  MutexLock lock(&sh.mu);
  EntryRec* e = sh.Rec(local);
  ApplyLock(sh, local, LockEvent::kPinEnd);
  sh.counters.pins.Add(-1);
  --e->handles;
  MaybeFreeRecordLocked(sh, local);
  PublishCandidateLocked(sh);
}

bool L1Cache::IsResident(const ChunkKey& key, uint32_t slot) const {
  const uint64_t digest = ChunkKeyDigest(key, seed_);
  Shard& sh = const_cast<Shard&>(ShardFor(digest));
  MutexLock lock(&sh.mu);
  const uint32_t local = sh.Find(key, digest);
  if (local == kNoRef) return false;
  const EntryRec* e = sh.Rec(local);
  return slot < e->num_slots && e->slots()[slot].state == SlotState::kResident;
}

std::optional<SlotInfo> L1Cache::DescribeSlot(const ChunkKey& key, uint32_t slot) const {
  const uint64_t digest = ChunkKeyDigest(key, seed_);
  Shard& sh = const_cast<Shard&>(ShardFor(digest));
  MutexLock lock(&sh.mu);
  const uint32_t local = sh.Find(key, digest);
  if (local == kNoRef) return std::nullopt;
  const EntryRec* e = sh.Rec(local);
  if (slot >= e->num_slots) return std::nullopt;
  const SlotRec& s = e->slots()[slot];
  SlotInfo info;
  info.state = s.state;
  if (s.unit != kNoUnit) {
    info.offset = uint64_t{s.unit} * alloc_->align();
    info.size = alloc_->ClassBytes(s.cls);
  }
  info.read_locks = e->locks.holders;
  if (auto it = sh.extra_holds.find(local); it != sh.extra_holds.end()) {
    info.read_locks += it->second;
  }
  info.pins = e->locks.pins;
  auto it = sh.staging.find(StagingKey(local, slot));
  info.write_lock_live = s.state == SlotState::kStaging && it != sh.staging.end() &&
                         WriteLockHolds(it->second, clock_->NowNanos());
  info.copy_in_flight = it != sh.staging.end() && it->second.copy_in_flight;
  return info;
}

void L1Cache::Touch(std::span<const ChunkKey> keys) {
  for (size_t i = keys.size(); i-- > 0;) {
    const uint64_t digest = ChunkKeyDigest(keys[i], seed_);
    Shard& sh = ShardFor(digest);
    MutexLock lock(&sh.mu);
    const uint32_t local = sh.Find(keys[i], digest);
    if (local == kNoRef) continue;
    sh.policy->Access(local);
    PublishCandidateLocked(sh);
  }
}

// ---------------------------------------------------------------------------------------------
// Quotas

Status L1Cache::SetQuota(std::string_view cache_salt, uint64_t limit_bytes) {
  auto group = namespaces_.InternSalt(cache_salt);
  if (!group.ok()) return group.status();
  quotas_.SetLimit(*group, limit_bytes);
  return Status::Ok();
}

bool L1Cache::DeleteQuota(std::string_view cache_salt) {
  auto group = namespaces_.FindSalt(cache_salt);
  return group && quotas_.ClearLimit(*group);
}

QuotaInfo L1Cache::GetQuota(std::string_view cache_salt) const {
  QuotaInfo q;
  q.cache_salt = std::string(cache_salt);
  if (auto group = namespaces_.FindSalt(cache_salt)) {
    q.limit_bytes = quotas_.Limit(*group);
    q.usage_bytes = quotas_.Usage(*group);
  }
  return q;
}

std::vector<QuotaInfo> L1Cache::ListQuotas() const {
  std::vector<QuotaInfo> out;
  for (const auto& [group, limit] : quotas_.Limits()) {
    out.push_back({namespaces_.SaltOf(group), limit, quotas_.Usage(group)});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stats

L1Stats L1Cache::stats() const {
  L1Stats st;
  st.capacity_bytes = alloc_->capacity_bytes();
  st.used_bytes = alloc_->used_bytes();
  for (const auto& sh : shards_) {
    const auto& c = sh->counters;
    st.entries += c.entries.Get();
    st.detached_entries += c.detached.Get();
    st.resident_objects += c.resident_objects.Get();
    st.staging_objects += c.staging_objects.Get();
    st.locked_entries += c.locked_entries.Get();
    st.pinned_objects += c.pins.Get();
    st.evictions += c.evictions.Get();
    st.evicted_bytes += c.evicted_bytes.Get();
    st.reservations += c.reservations.Get();
    st.commits += c.commits.Get();
    st.aborts += c.aborts.Get();
    st.write_conflicts += c.write_conflicts.Get();
    st.reclaimed_writes += c.reclaimed_writes.Get();
    st.removed += c.removed.Get();
    st.copies_in_flight += c.copies_in_flight.Get();
  }
  st.write_exhausted = write_exhausted_.load(std::memory_order_relaxed);
  st.backed_bytes = pool_->backed_bytes();
  st.backing_failures = backing_failures_.load(std::memory_order_relaxed);
  st.populated_bytes = populator_ ? populator_->populated_bytes() : 0;
  st.lookup_keys = lookup_keys_.load(std::memory_order_relaxed);
  st.lookup_hits = lookup_hits_.load(std::memory_order_relaxed);
  st.lookup_locks = locks_->owners.load(std::memory_order_relaxed);
  st.shed_lookup_locks = locks_->shed.load(std::memory_order_relaxed);
  return st;
}

}  // namespace kvd::l1
