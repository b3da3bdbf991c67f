// L1Cache: construction, handles, writes and the per-shard helpers. Pins and point reads,
// quotas and stats are in l1_cache_read.cc, eviction and Clear in l1_cache_evict.cc, lookup
// locks and their expiry in l1_cache_locks.cc.
#include "l1/l1_cache.h"

#include "common/hex.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>

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

int64_t SecondsToNanos(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

std::string ShortKey(const ChunkKey& key) {
  std::string s = "ns" + std::to_string(key.ns) + "/";
  AppendHex(s, key.chunk_hash.data(), 6);
  return s;
}

// Applies a slot transition from object_state.h; an illegal one is a bug, logged and refused.
bool Transition(SlotRec& s, SlotEvent event) {
  auto next = NextSlotState(s.state, event);
  if (!next) {
    spdlog::error("l1: illegal slot transition: {} on a {} slot", SlotEventName(event),
                  SlotStateName(s.state));
    return false;
  }
  s.state = *next;
  return true;
}

}  // namespace

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kEmpty: return "empty";
    case SlotState::kStaging: return "staging";
    case SlotState::kResident: return "resident";
    case SlotState::kEvicting: return "evicting";
  }
  return "unknown";
}

const char* SlotEventName(SlotEvent event) {
  switch (event) {
    case SlotEvent::kReserve: return "reserve";
    case SlotEvent::kCommit: return "commit";
    case SlotEvent::kAbort: return "abort";
    case SlotEvent::kReclaim: return "reclaim";
    case SlotEvent::kEvict: return "evict";
    case SlotEvent::kFree: return "free";
  }
  return "unknown";
}

const char* LockEventName(LockEvent event) {
  switch (event) {
    case LockEvent::kWriteBegin: return "write-begin";
    case LockEvent::kWriteEnd: return "write-end";
    case LockEvent::kHoldBegin: return "hold-begin";
    case LockEvent::kHoldEnd: return "hold-end";
    case LockEvent::kPinBegin: return "pin-begin";
    case LockEvent::kPinEnd: return "pin-end";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Handles

WriteReservation::WriteReservation(WriteReservation&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      ref_(other.ref_),
      slot_(other.slot_),
      token_(other.token_),
      data_(std::exchange(other.data_, nullptr)),
      offset_(other.offset_),
      size_(other.size_) {}

WriteReservation& WriteReservation::operator=(WriteReservation&& other) noexcept {
  if (this != &other) {
    Abort();
    cache_ = std::exchange(other.cache_, nullptr);
    ref_ = other.ref_;
    slot_ = other.slot_;
    token_ = other.token_;
    data_ = std::exchange(other.data_, nullptr);
    offset_ = other.offset_;
    size_ = other.size_;
  }
  return *this;
}

WriteReservation::~WriteReservation() { Abort(); }

bool WriteReservation::Commit() {
  if (cache_ == nullptr) return false;
  L1Cache* cache = std::exchange(cache_, nullptr);
  data_ = nullptr;
  return cache->CommitWrite(ref_, slot_, token_);
}

void WriteReservation::Abort() {
  if (cache_ == nullptr) return;
  L1Cache* cache = std::exchange(cache_, nullptr);
  data_ = nullptr;
  cache->AbortWrite(ref_, slot_, token_);
}

bool WriteReservation::MarkCopyInFlight() {
  return cache_ != nullptr && cache_->MarkCopyInFlight(ref_, slot_, token_);
}

ReadPin::ReadPin(ReadPin&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      ref_(other.ref_),
      slot_(other.slot_),
      data_(std::exchange(other.data_, nullptr)),
      offset_(other.offset_),
      size_(other.size_) {}

ReadPin& ReadPin::operator=(ReadPin&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::exchange(other.cache_, nullptr);
    ref_ = other.ref_;
    slot_ = other.slot_;
    data_ = std::exchange(other.data_, nullptr);
    offset_ = other.offset_;
    size_ = other.size_;
  }
  return *this;
}

ReadPin::~ReadPin() { Release(); }

void ReadPin::Release() {
  if (cache_ == nullptr) return;
  L1Cache* cache = std::exchange(cache_, nullptr);
  data_ = nullptr;
  cache->Unpin(ref_);
}

void ReleaseInReverse(std::vector<ReadPin>& pins) {
  for (size_t i = pins.size(); i-- > 0;) pins[i].Release();
  pins.clear();
}

// ---------------------------------------------------------------------------------------------
// Construction

Result<std::unique_ptr<L1Cache>> L1Cache::Create(const L1CacheOptions& options) {
  if (options.clock == nullptr) return Status::InvalidArgument("L1 cache needs a clock");
  if (!(options.read_ttl_seconds > 0) || !(options.write_ttl_seconds > 0)) {
    return Status::InvalidArgument("L1 read and write TTLs must be positive");
  }
  if (!(options.eviction_watermark > 0 && options.eviction_watermark <= 1)) {
    return Status::InvalidArgument("L1 eviction watermark must be in (0, 1]");
  }
  if (!(options.eviction_ratio > 0 && options.eviction_ratio <= 1)) {
    return Status::InvalidArgument("L1 eviction ratio must be in (0, 1]");
  }
  auto policy = eviction::CanonicalPolicyName(options.eviction_policy);
  if (!policy) {
    return Status::InvalidArgument("unknown eviction policy '" + options.eviction_policy + "'");
  }
  MemoryPoolOptions pool_options;
  pool_options.capacity_bytes = options.capacity_bytes;
  pool_options.align = options.align;
  pool_options.shm_name = options.shm_name;
  pool_options.use_hugepages = options.use_hugepages;
  auto pool = MemoryPool::Create(pool_options);
  if (!pool.ok()) return pool.status();
  auto alloc = SizeClassAllocator::Create((*pool)->capacity(), options.align, options.initial_bytes);
  if (!alloc.ok()) return alloc.status();
  auto cache = std::unique_ptr<L1Cache>(
      new L1Cache(options, std::move(pool).value(), std::move(alloc).value(), *policy));
  if (options.populate.mode != PopulateMode::kOff) {
    cache->populator_ = std::make_unique<PoolPopulator>(cache->pool_.get(), cache->alloc_.get(),
                                                        options.populate);
    cache->populator_->Start();
  }
  return cache;
}

L1Cache::L1Cache(const L1CacheOptions& options, std::unique_ptr<MemoryPool> pool,
                 std::unique_ptr<SizeClassAllocator> alloc, std::string policy_name)
    : clock_(options.clock),
      read_ttl_ns_(SecondsToNanos(options.read_ttl_seconds)),
      write_ttl_ns_(SecondsToNanos(options.write_ttl_seconds)),
      eviction_watermark_(options.eviction_watermark),
      eviction_ratio_(options.eviction_ratio),
      policy_name_(std::move(policy_name)),
      seed_((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()),
      listener_(options.listener),
      pool_(std::move(pool)),
      alloc_(std::move(alloc)),
      quotas_(options.eviction_watermark, options.eviction_ratio),
      policy_shared_(eviction::MakeSharedState(policy_name_)),
      locks_(std::make_unique<Locks>(std::max<uint64_t>(1, options.max_read_lock_slots),
                                     std::max<uint64_t>(1, options.max_lookup_holds))) {
  shards_.reserve(detail::kShards);
  for (uint32_t i = 0; i < detail::kShards; ++i) {
    auto sh = std::make_unique<Shard>(i, seed_);
    MutexLock lock(&sh->mu);
    sh->policy = eviction::MakePolicy(policy_name_,
                                      {sh.get(), &policy_clock_, &quotas_, policy_shared_.get()});
    shards_.push_back(std::move(sh));
  }
}

L1Cache::~L1Cache() {
  if (populator_) populator_->Stop();
  uint64_t detached = 0;
  for (const auto& sh : shards_) detached += sh->counters.detached.Get();
  if (detached > 0) {
    spdlog::error("l1: cache destroyed while {} removed entries still have live handles",
                  detached);
  }
}

// ---------------------------------------------------------------------------------------------
// Per-shard helpers (shard mutex held)

void L1Cache::PublishCandidateLocked(Shard& sh) {
  auto c = sh.policy->Victim();
  if (!c) {
    sh.candidate.store(detail::kNoCandidate, std::memory_order_relaxed);
    return;
  }
  const uint32_t stamp = policy_clock_.load(std::memory_order_relaxed) - c->age;
  sh.candidate.store(uint64_t{c->priority} << 32 | stamp, std::memory_order_relaxed);
}

bool L1Cache::ApplyLock(Shard& sh, uint32_t local, LockEvent event) {
  EntryRec* e = sh.Rec(local);
  // Holds beyond the entry's 16-bit count go beside it; it keeps kMax (locked) until they
  // are gone. Other locks (writers, pins) are refused at kMax instead.
  if (e->locks.holders == EntryLocks::kMax) {
    if (event == LockEvent::kHoldBegin) {
      ++sh.extra_holds[local];
      return true;
    }
    if (event == LockEvent::kHoldEnd) {
      if (auto it = sh.extra_holds.find(local); it != sh.extra_holds.end()) {
        if (--it->second == 0) sh.extra_holds.erase(it);
        return true;
      }
    }
  }
  auto change = e->locks.Apply(event);
  if (!change) return false;
  if (e->in_table()) {
    if (*change == ListChange::kBecameLocked) {
      sh.policy->Hold(local);
      sh.counters.locked_entries.Add(1);
    } else if (*change == ListChange::kBecameEvictable) {
      sh.policy->Release(local);
      sh.counters.locked_entries.Add(-1);
    }
  }
  return true;
}

uint64_t L1Cache::FreeSlotLocked(Shard& sh, EntryRec* e, uint32_t slot, SlotEvent how) {
  SlotRec& s = e->slots()[slot];
  const SlotState before = s.state;
  if (!Transition(s, how)) return 0;
  if (how == SlotEvent::kEvict) Transition(s, SlotEvent::kFree);
  uint64_t bytes = 0;
  if (s.unit != kNoUnit) {
    bytes = uint64_t{alloc_->ClassUnits(s.cls)} * alloc_->align();
    alloc_->Free(s.unit, s.cls);
    quotas_.AddUsage(e->hook.group, -static_cast<int64_t>(bytes));
    if (before == SlotState::kResident) sh.counters.resident_objects.Add(-1);
    if (before == SlotState::kStaging) sh.counters.staging_objects.Add(-1);
  }
  s.unit = kNoUnit;
  s.cls = 0;
  return bytes;
}

void L1Cache::EraseStagingLocked(Shard& sh,
                                 std::unordered_map<uint64_t, detail::StagingRec>::iterator it) {
  if (it->second.copy_in_flight) sh.counters.copies_in_flight.Add(-1);
  sh.staging.erase(it);
}

void L1Cache::UnindexLocked(Shard& sh, uint32_t local, bool evicted) {
  EntryRec* e = sh.Rec(local);
  sh.Erase(local);
  if (evicted) sh.policy->Evicted(local); else sh.policy->Erase(local);
  if (e->locks.locked()) sh.counters.locked_entries.Add(-1);
  e->flags &= ~detail::kInTable;
  sh.counters.entries.Add(-1);
  if (e->handles > 0 || e->locks.locked()) {
    e->flags |= detail::kDetached;  // counted until its record is freed
    sh.counters.detached.Add(1);
  } else if (!sh.FreeRecord(local)) {
    spdlog::error("l1: entry record {} freed twice", local);
  }
}

void L1Cache::RemoveIfEmptyLocked(Shard& sh, uint32_t local) {
  EntryRec* e = sh.Rec(local);
  if (!e->in_table()) return;
  for (uint32_t i = 0; i < e->num_slots; ++i) {
    if (e->slots()[i].state != SlotState::kEmpty) return;
  }
  UnindexLocked(sh, local, /*evicted=*/false);
}

void L1Cache::MaybeFreeRecordLocked(Shard& sh, uint32_t local) {
  EntryRec* e = sh.Rec(local);
  // Only detached records wait here: one in the index is alive, and one neither in the index
  // nor detached was already freed (by UnindexLocked) and must not be freed twice.
  if (!(e->flags & detail::kDetached) || e->handles > 0 || e->locks.locked()) return;
  // A cleared entry kept its resident memory only for its pins; the last one frees it.
  for (uint32_t i = 0; i < e->num_slots; ++i) {
    if (e->slots()[i].state == SlotState::kResident) FreeSlotLocked(sh, e, i, SlotEvent::kEvict);
  }
  sh.counters.detached.Add(-1);
  if (!sh.FreeRecord(local)) spdlog::error("l1: entry record {} freed twice", local);
}

// ---------------------------------------------------------------------------------------------
// Writes

Result<WriteReservation> L1Cache::ReserveWrite(const ChunkKey& key, uint32_t num_slots,
                                               uint32_t slot, uint64_t size) {
  auto r = ReserveWriteUnbacked(key, num_slots, slot, size);
  if (!r.ok()) return r;
  // Back the reserved pages before anyone writes them (memory_pool.h, Backing), outside the
  // shard mutex: the range is this reservation's alone.
  if (Status st = pool_->EnsureBacked(r->offset(), r->size()); !st.ok()) {
    r->Abort();
    write_exhausted_.fetch_add(1, std::memory_order_relaxed);
    backing_failures_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("l1: {}", st.message());
    return Status::ResourceExhausted(st.message());
  }
  return r;
}

Result<WriteReservation> L1Cache::ReserveWriteUnbacked(const ChunkKey& key, uint32_t num_slots,
                                                       uint32_t slot, uint64_t size) {
  if (num_slots == 0 || num_slots > kMaxSlotsPerEntry) {
    return Status::InvalidArgument("num_slots " + std::to_string(num_slots) + " out of range");
  }
  if (slot >= num_slots) {
    return Status::InvalidArgument("slot " + std::to_string(slot) + " >= num_slots " +
                                   std::to_string(num_slots));
  }
  if (key.ns >= namespaces_.size()) {
    return Status::InvalidArgument("namespace " + std::to_string(key.ns) + " was never interned");
  }
  auto cls = alloc_->ClassFor(size);
  if (!cls.ok()) {
    write_exhausted_.fetch_add(1, std::memory_order_relaxed);
    return cls.status();
  }
  const uint64_t digest = ChunkKeyDigest(key, seed_);
  Shard& sh = ShardFor(digest);
  uint32_t local = kNoRef;
  const uint64_t token = next_token_.fetch_add(1, std::memory_order_relaxed);

  // 1. Claim the slot (create the entry if needed): it is STAGING without memory from here,
  //    so a second writer is refused and the entry is off the evictable list.
  {
    MutexLock lock(&sh.mu);
    const int64_t now = clock_->NowNanos();
    local = sh.Find(key, digest);
    if (local != kNoRef) {
      EntryRec* e = sh.Rec(local);
      if (e->num_slots != num_slots) {
        return Status::InvalidArgument("entry exists with " + std::to_string(e->num_slots) +
                                       " slots, not " + std::to_string(num_slots));
      }
      if (e->handles == EntryLocks::kMax) {
        return Status::ResourceExhausted("too many handles on one L1 entry");
      }
      SlotRec& s = e->slots()[slot];
      if (s.state == SlotState::kResident) {
        sh.counters.write_conflicts.Add(1);
        return Status::AlreadyExists("object is already resident");
      }
      if (s.state == SlotState::kStaging) {
        auto it = sh.staging.find(StagingKey(local, slot));
        if (it != sh.staging.end() && WriteLockHolds(it->second, now)) {
          sh.counters.write_conflicts.Add(1);
          return Status::AlreadyExists("object is being written by another writer");
        }
        spdlog::info("l1: reclaiming staging slot {} of {} whose write lock expired", slot,
                     ShortKey(key));
        sh.counters.reclaimed_writes.Add(1);
        FreeSlotLocked(sh, e, slot, SlotEvent::kReclaim);
        if (it != sh.staging.end()) EraseStagingLocked(sh, it);
        ApplyLock(sh, local, LockEvent::kWriteEnd);
      }
    } else {
      auto created = sh.NewRecord(static_cast<uint16_t>(num_slots));
      if (!created) {
        write_exhausted_.fetch_add(1, std::memory_order_relaxed);
        return Status::ResourceExhausted(
            "L1 shard full, or more than 16 distinct slot counts (world sizes) in use");
      }
      local = *created;
      EntryRec* e = sh.Rec(local);
      e->ns = key.ns;
      e->chunk_hash = key.chunk_hash;
      e->flags = detail::kInTable;
      e->hook.group = GroupOf(key.ns);
      sh.Insert(local, digest);
      sh.counters.entries.Add(1);
      sh.policy->Insert(local);
    }
    EntryRec* e = sh.Rec(local);
    Transition(e->slots()[slot], SlotEvent::kReserve);
    ApplyLock(sh, local, LockEvent::kWriteBegin);
    sh.staging[StagingKey(local, slot)] = {token, now + write_ttl_ns_};
    ++e->handles;
    PublishCandidateLocked(sh);
  }

  // 2. Memory, evicting if needed (no shard lock held: eviction locks other shards).
  const uint32_t gref = GlobalRef(sh.id(), local);
  std::optional<uint32_t> unit = AllocateEvicting(*cls, gref);

  // 3. Attach the memory, or undo the claim.
  MutexLock lock(&sh.mu);
  EntryRec* e = sh.Rec(local);
  SlotRec& s = e->slots()[slot];
  auto it = sh.staging.find(StagingKey(local, slot));
  const bool still_ours = it != sh.staging.end() && it->second.token == token;
  if (!unit || !still_ours) {
    if (unit) alloc_->Free(*unit, *cls);
    if (still_ours) {
      Transition(s, SlotEvent::kAbort);
      EraseStagingLocked(sh, it);
      ApplyLock(sh, local, LockEvent::kWriteEnd);
    }
    --e->handles;
    RemoveIfEmptyLocked(sh, local);
    MaybeFreeRecordLocked(sh, local);
    PublishCandidateLocked(sh);
    write_exhausted_.fetch_add(1, std::memory_order_relaxed);
    if (!still_ours) return Status::ResourceExhausted("write lock expired while waiting for memory");
    return Status::ResourceExhausted("no room for " + std::to_string(size) +
                                     " bytes in L1 even after eviction");
  }
  s.unit = *unit;
  s.cls = *cls;
  const uint64_t reserved = uint64_t{alloc_->ClassUnits(*cls)} * alloc_->align();
  quotas_.AddUsage(e->hook.group, static_cast<int64_t>(reserved));
  sh.counters.staging_objects.Add(1);
  sh.counters.reservations.Add(1);
  const uint64_t offset = uint64_t{*unit} * alloc_->align();
  return WriteReservation(this, gref, slot, token, pool_->At(offset), offset, size);
}

bool L1Cache::CommitWrite(uint32_t gref, uint32_t slot, uint64_t token) {
  Shard& sh = ShardOfRef(gref);
  const uint32_t local = LocalOf(gref);
  MutexLock lock(&sh.mu);
  EntryRec* e = sh.Rec(local);
  auto it = sh.staging.find(StagingKey(local, slot));
  bool committed = false;
  if (it != sh.staging.end() && it->second.token == token) {
    EraseStagingLocked(sh, it);
    if (e->in_table()) {
      Transition(e->slots()[slot], SlotEvent::kCommit);
      sh.counters.staging_objects.Add(-1);
      sh.counters.resident_objects.Add(1);
      sh.counters.commits.Add(1);
      committed = true;
      if (listener_ != nullptr && Complete(e)) listener_->OnEntryComplete(e->key());
    } else {
      spdlog::debug("l1: commit of slot {} of {} after the cache was cleared; discarded", slot,
                    ShortKey(e->key()));
      FreeSlotLocked(sh, e, slot, SlotEvent::kEvict);
      sh.counters.aborts.Add(1);
    }
    ApplyLock(sh, local, LockEvent::kWriteEnd);
  } else {
    spdlog::warn("l1: commit of slot {} of {} failed: write lock expired and the slot was "
                 "reclaimed", slot, ShortKey(e->key()));
    sh.counters.aborts.Add(1);
  }
  --e->handles;
  MaybeFreeRecordLocked(sh, local);
  PublishCandidateLocked(sh);
  return committed;
}

void L1Cache::AbortWrite(uint32_t gref, uint32_t slot, uint64_t token) {
  Shard& sh = ShardOfRef(gref);
  const uint32_t local = LocalOf(gref);
  MutexLock lock(&sh.mu);
  EntryRec* e = sh.Rec(local);
  auto it = sh.staging.find(StagingKey(local, slot));
  if (it != sh.staging.end() && it->second.token == token) {
    EraseStagingLocked(sh, it);
    FreeSlotLocked(sh, e, slot, e->in_table() ? SlotEvent::kAbort : SlotEvent::kEvict);
    ApplyLock(sh, local, LockEvent::kWriteEnd);
  }
  sh.counters.aborts.Add(1);
  --e->handles;
  RemoveIfEmptyLocked(sh, local);
  MaybeFreeRecordLocked(sh, local);
  PublishCandidateLocked(sh);
}

bool L1Cache::MarkCopyInFlight(uint32_t gref, uint32_t slot, uint64_t token) {
  Shard& sh = ShardOfRef(gref);
  const uint32_t local = LocalOf(gref);
  MutexLock lock(&sh.mu);
  auto it = sh.staging.find(StagingKey(local, slot));
  if (it == sh.staging.end() || it->second.token != token) return false;  // taken back
  if (!it->second.copy_in_flight) {
    // Still this reservation's (even if its write lock expired, nobody took the memory yet).
    it->second.copy_in_flight = true;
    sh.counters.copies_in_flight.Add(1);
  }
  return true;
}

size_t L1Cache::RemoveIfIdle(std::span<const ChunkKey> keys) {
  size_t removed = 0;
  for (const ChunkKey& key : keys) {
    const uint64_t digest = ChunkKeyDigest(key, seed_);
    Shard& sh = ShardFor(digest);
    MutexLock lock(&sh.mu);
    const uint32_t local = sh.Find(key, digest);
    if (local == kNoRef) continue;
    EntryRec* e = sh.Rec(local);
    if (e->locks.locked()) continue;
    // A complete entry was visible to lookups: its removal is reported like an eviction.
    std::vector<ChunkKey> reported;
    if (Complete(e)) reported.push_back(key);
    for (uint32_t i = 0; i < e->num_slots; ++i) {
      if (e->slots()[i].state != SlotState::kEmpty) FreeSlotLocked(sh, e, i, SlotEvent::kEvict);
    }
    UnindexLocked(sh, local, /*evicted=*/false);
    sh.counters.removed.Add(1);
    NotifyRemoved(reported, RemovalCause::kEvicted);
    PublishCandidateLocked(sh);
    ++removed;
  }
  return removed;
}

}  // namespace kvd::l1
