#include "l1/l1_cache.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace kvd::l1 {
namespace detail {

struct Slot {
  SlotState state = SlotState::kEmpty;
  uint32_t read_locks = 0;      // meaningful only while now < read_deadline
  uint32_t pins = 0;            // live ReadPins on this slot
  uint64_t offset = 0;          // pool offset (staging, resident)
  uint64_t size = 0;            // requested size (staging, resident)
  uint64_t writer = 0;          // token of the owning reservation (staging only, else 0)
  int64_t write_deadline = 0;   // staging only
  bool copy_in_flight = false;  // staging only: the write lock does not expire
  int64_t read_deadline = 0;
};

struct Entry {
  explicit Entry(const ChunkKey& k, uint32_t num_slots) : key(k), slots(num_slots) {}
  ChunkKey key;
  std::vector<Slot> slots;
  uint32_t handles = 0;   // live WriteReservations and ReadPins referring to this entry
  bool in_table = true;   // false: detached, destroyed with its last handle
};

}  // namespace detail

namespace {

using detail::Entry;
using detail::Slot;

EntryId IdOf(const Entry* e) { return reinterpret_cast<EntryId>(e); }
Entry* FromId(EntryId id) { return reinterpret_cast<Entry*>(id); }

int64_t SecondsToNanos(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

bool ReadLocked(const Slot& s, int64_t now) { return s.read_locks > 0 && now < s.read_deadline; }
bool WriteLocked(const Slot& s, int64_t now) {
  return s.state == SlotState::kStaging && (s.copy_in_flight || now < s.write_deadline);
}

bool Complete(const Entry& e) {
  for (const Slot& s : e.slots) {
    if (s.state != SlotState::kResident) return false;
  }
  return true;
}

std::string ShortKey(const ChunkKey& key) {
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (int i = 0; i < 6; ++i) {
    hex.push_back(kHex[key.chunk_hash[i] >> 4]);
    hex.push_back(kHex[key.chunk_hash[i] & 15]);
  }
  return key.model_name + "/" + std::to_string(key.world_size) + "/" + hex;
}

}  // namespace

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kEmpty: return "empty";
    case SlotState::kStaging: return "staging";
    case SlotState::kResident: return "resident";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Handles

WriteReservation::WriteReservation(WriteReservation&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      entry_(std::exchange(other.entry_, nullptr)),
      slot_(other.slot_),
      token_(other.token_),
      data_(std::exchange(other.data_, nullptr)),
      offset_(other.offset_),
      size_(other.size_) {}

WriteReservation& WriteReservation::operator=(WriteReservation&& other) noexcept {
  if (this != &other) {
    Abort();
    cache_ = std::exchange(other.cache_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
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
  return cache->CommitWrite(std::exchange(entry_, nullptr), slot_, token_);
}

void WriteReservation::Abort() {
  if (cache_ == nullptr) return;
  L1Cache* cache = std::exchange(cache_, nullptr);
  data_ = nullptr;
  cache->AbortWrite(std::exchange(entry_, nullptr), slot_, token_);
}

bool WriteReservation::MarkCopyInFlight() {
  return cache_ != nullptr && cache_->MarkCopyInFlight(entry_, slot_, token_);
}

ReadPin::ReadPin(ReadPin&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      entry_(std::exchange(other.entry_, nullptr)),
      slot_(other.slot_),
      data_(std::exchange(other.data_, nullptr)),
      offset_(other.offset_),
      size_(other.size_) {}

ReadPin& ReadPin::operator=(ReadPin&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::exchange(other.cache_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
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
  cache->Unpin(std::exchange(entry_, nullptr), slot_);
}

// ---------------------------------------------------------------------------------------------
// Construction

Result<std::unique_ptr<L1Cache>> L1Cache::Create(const L1CacheOptions& options,
                                                 std::unique_ptr<EvictionPolicy> policy) {
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
  MemoryPoolOptions pool_options;
  pool_options.capacity_bytes = options.capacity_bytes;
  pool_options.align = options.align;
  pool_options.shm_name = options.shm_name;
  auto pool = MemoryPool::Create(pool_options);
  if (!pool.ok()) return pool.status();
  if (policy == nullptr) policy = MakeLruPolicy();
  return std::unique_ptr<L1Cache>(
      new L1Cache(options, std::move(pool).value(), std::move(policy)));
}

L1Cache::L1Cache(const L1CacheOptions& options, std::unique_ptr<MemoryPool> pool,
                 std::unique_ptr<EvictionPolicy> policy)
    : clock_(options.clock),
      read_ttl_ns_(SecondsToNanos(options.read_ttl_seconds)),
      write_ttl_ns_(SecondsToNanos(options.write_ttl_seconds)),
      eviction_watermark_(options.eviction_watermark),
      eviction_ratio_(options.eviction_ratio),
      listener_(options.listener),
      pool_(std::move(pool)),
      policy_(std::move(policy)) {}

L1Cache::~L1Cache() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t live = detached_.size();
  for (const auto& [key, entry] : table_) live += entry->handles > 0 ? 1 : 0;
  if (live > 0) {
    spdlog::error("l1: cache destroyed while {} entries still have live handles", live);
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers (mu_ held)

L1Cache::Entry* L1Cache::FindLocked(const ChunkKey& key) const {
  auto it = table_.find(key);
  return it == table_.end() ? nullptr : it->second.get();
}

bool L1Cache::EvictableLocked(const Entry& entry, int64_t now) const {
  if (!entry.in_table) return false;
  for (const Slot& s : entry.slots) {
    if (s.pins > 0 || ReadLocked(s, now) || WriteLocked(s, now)) return false;
  }
  return true;
}

uint64_t L1Cache::FreeSlotMemoryLocked(Entry& entry, uint32_t slot) {
  Slot& s = entry.slots[slot];
  const uint64_t bytes = pool_->AllocatedSize(s.offset);
  if (!pool_->Free(s.offset)) {
    spdlog::error("l1: slot {} of {} had no live allocation at offset {}", slot,
                  ShortKey(entry.key), s.offset);
  }
  if (s.state == SlotState::kResident) --counters_.resident_objects;
  if (s.state == SlotState::kStaging) --counters_.staging_objects;
  if (s.copy_in_flight) --counters_.copies_in_flight;
  s.copy_in_flight = false;
  s.state = SlotState::kEmpty;
  s.writer = 0;
  s.offset = 0;
  s.size = 0;
  s.read_locks = 0;
  return bytes;
}

void L1Cache::RemoveFromTableLocked(Entry* entry, bool tell_policy) {
  if (tell_policy) policy_->OnRemove(IdOf(entry));
  auto it = table_.find(entry->key);
  entry->in_table = false;
  if (entry->handles > 0) {
    detached_.emplace(entry, std::move(it->second));
  }
  table_.erase(it);  // destroys the entry unless it moved to detached_
}

void L1Cache::RemoveIfEmptyLocked(Entry* entry) {
  if (!entry->in_table) return;
  for (const Slot& s : entry->slots) {
    if (s.state != SlotState::kEmpty) return;
  }
  RemoveFromTableLocked(entry, /*tell_policy=*/true);
}

void L1Cache::DropHandleLocked(Entry* entry) {
  --entry->handles;
  if (!entry->in_table && entry->handles == 0) detached_.erase(entry);
}

void L1Cache::NotifyRemovedLocked(RemovalCause cause) {
  if (removed_complete_.empty()) return;
  if (listener_ != nullptr) listener_->OnEntriesRemoved(removed_complete_, cause);
  removed_complete_.clear();
}

uint64_t L1Cache::EvictLocked(Entry* entry) {
  if (listener_ != nullptr && Complete(*entry)) removed_complete_.push_back(entry->key);
  uint64_t freed = 0;
  for (uint32_t i = 0; i < entry->slots.size(); ++i) {
    const Slot& s = entry->slots[i];
    if (s.state == SlotState::kEmpty) continue;
    if (s.state == SlotState::kStaging) {
      ++counters_.reclaimed_writes;
      spdlog::info("l1: evicting expired staging slot {} of {} (writer gone?)", i,
                   ShortKey(entry->key));
    }
    freed += FreeSlotMemoryLocked(*entry, i);
  }
  ++counters_.evictions;
  counters_.evicted_bytes += freed;
  RemoveFromTableLocked(entry, /*tell_policy=*/false);
  return freed;
}

std::optional<uint64_t> L1Cache::AllocateLocked(uint64_t size, const Entry* exclude,
                                                int64_t now) {
  std::optional<uint64_t> offset = pool_->Allocate(size);
  if (offset || size > pool_->capacity()) return offset;
  size_t evicted = 0;
  uint64_t freed = 0;
  policy_->ForEachCandidate([&](EntryId id) {
    Entry* victim = FromId(id);
    if (victim == exclude || !EvictableLocked(*victim, now)) return EvictionPolicy::Verdict::kSkip;
    freed += EvictLocked(victim);
    ++evicted;
    offset = pool_->Allocate(size);
    return offset ? EvictionPolicy::Verdict::kEvictedAndStop : EvictionPolicy::Verdict::kEvicted;
  });
  NotifyRemovedLocked(RemovalCause::kEvicted);
  spdlog::debug("l1: allocation of {} bytes evicted {} entries ({} bytes), {}", size, evicted,
                freed, offset ? "fits now" : "still does not fit");
  return offset;
}

// ---------------------------------------------------------------------------------------------
// Writes

Result<WriteReservation> L1Cache::ReserveWrite(const ChunkKey& key, uint32_t num_slots,
                                               uint32_t slot, uint64_t size) {
  if (num_slots == 0 || num_slots > kMaxSlotsPerEntry) {
    return Status::InvalidArgument("num_slots " + std::to_string(num_slots) + " out of range");
  }
  if (slot >= num_slots) {
    return Status::InvalidArgument("slot " + std::to_string(slot) + " >= num_slots " +
                                   std::to_string(num_slots));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowNanos();
  Entry* entry = FindLocked(key);
  if (entry != nullptr) {
    if (entry->slots.size() != num_slots) {
      return Status::InvalidArgument("entry exists with " + std::to_string(entry->slots.size()) +
                                     " slots, not " + std::to_string(num_slots));
    }
    Slot& s = entry->slots[slot];
    if (s.state == SlotState::kResident) {
      ++counters_.write_conflicts;
      return Status::AlreadyExists("object is already resident");
    }
    if (s.state == SlotState::kStaging) {
      if (WriteLocked(s, now)) {
        ++counters_.write_conflicts;
        return Status::AlreadyExists("object is being written by another writer");
      }
      spdlog::info("l1: reclaiming staging slot {} of {} whose write lock expired", slot,
                   ShortKey(key));
      ++counters_.reclaimed_writes;
      FreeSlotMemoryLocked(*entry, slot);
    }
  }

  std::optional<uint64_t> offset = AllocateLocked(size, entry, now);
  if (!offset) {
    ++counters_.write_exhausted;
    if (entry != nullptr) RemoveIfEmptyLocked(entry);  // e.g. it only held the reclaimed slot
    return Status::ResourceExhausted("no room for " + std::to_string(size) +
                                     " bytes in L1 even after eviction");
  }

  if (entry == nullptr) {
    auto owned = std::make_unique<Entry>(key, num_slots);
    entry = owned.get();
    table_.emplace(key, std::move(owned));
    policy_->OnInsert(IdOf(entry));
  } else {
    policy_->OnAccess(IdOf(entry));
  }
  Slot& s = entry->slots[slot];
  s.state = SlotState::kStaging;
  ++counters_.staging_objects;
  s.offset = *offset;
  s.size = size;
  s.writer = next_token_++;
  s.write_deadline = now + write_ttl_ns_;
  ++entry->handles;
  ++counters_.reservations;
  return WriteReservation(this, entry, slot, s.writer, pool_->At(*offset), *offset, size);
}

bool L1Cache::CommitWrite(Entry* entry, uint32_t slot, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = entry->slots[slot];
  bool committed = false;
  if (s.state == SlotState::kStaging && s.writer == token) {
    if (entry->in_table) {
      s.state = SlotState::kResident;
      --counters_.staging_objects;
      ++counters_.resident_objects;
      if (s.copy_in_flight) --counters_.copies_in_flight;
      s.copy_in_flight = false;
      s.writer = 0;
      policy_->OnAccess(IdOf(entry));
      ++counters_.commits;
      committed = true;
      if (listener_ != nullptr && Complete(*entry)) listener_->OnEntryComplete(entry->key);
    } else {
      spdlog::debug("l1: commit of slot {} of {} after the cache was cleared; discarded", slot,
                    ShortKey(entry->key));
      FreeSlotMemoryLocked(*entry, slot);
      ++counters_.aborts;
    }
  } else {
    spdlog::warn("l1: commit of slot {} of {} failed: write lock expired and the slot was "
                 "reclaimed", slot, ShortKey(entry->key));
    ++counters_.aborts;
  }
  DropHandleLocked(entry);
  return committed;
}

bool L1Cache::MarkCopyInFlight(Entry* entry, uint32_t slot, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = entry->slots[slot];
  if (s.state != SlotState::kStaging || s.writer != token) return false;  // taken back
  if (!s.copy_in_flight) {
    // Still this reservation's (even if its write lock expired, nobody took the memory yet).
    s.copy_in_flight = true;
    ++counters_.copies_in_flight;
  }
  return true;
}

void L1Cache::AbortWrite(Entry* entry, uint32_t slot, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = entry->slots[slot];
  if (s.state == SlotState::kStaging && s.writer == token) FreeSlotMemoryLocked(*entry, slot);
  ++counters_.aborts;
  RemoveIfEmptyLocked(entry);
  DropHandleLocked(entry);
}

// ---------------------------------------------------------------------------------------------
// Reads

size_t L1Cache::LookupPrefixAndLock(std::span<const ChunkKey> keys, uint32_t num_slots,
                                    uint32_t read_locks_per_slot) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowNanos();
  const uint32_t add = std::min(read_locks_per_slot, kMaxReadLocksPerSlot);
  size_t hits = 0;
  // Every key before the first miss is a hit, so each hit can be locked as soon as it is seen.
  for (const ChunkKey& key : keys) {
    Entry* entry = FindLocked(key);
    if (entry == nullptr || entry->slots.size() != num_slots) break;
    bool all_resident = true;
    for (const Slot& s : entry->slots) all_resident &= s.state == SlotState::kResident;
    if (!all_resident) break;
    ++hits;
    if (add > 0) {
      for (Slot& s : entry->slots) {
        const uint32_t live = ReadLocked(s, now) ? s.read_locks : 0;
        s.read_locks = std::min(live + add, kMaxReadLocksPerSlot);
        s.read_deadline = now + read_ttl_ns_;
      }
    }
    policy_->OnAccess(IdOf(entry));
  }
  counters_.lookup_keys += keys.size();
  counters_.lookup_hits += hits;
  return hits;
}

void L1Cache::ReleaseReadLocks(const ChunkKey& key, uint32_t slot, uint32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* entry = FindLocked(key);
  if (entry == nullptr || slot >= entry->slots.size()) return;
  Slot& s = entry->slots[slot];
  const uint32_t live = ReadLocked(s, clock_->NowNanos()) ? s.read_locks : 0;
  s.read_locks = live - std::min(live, n);
}

void L1Cache::ReleaseReadLocksAllSlots(std::span<const ChunkKey> keys, uint32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowNanos();
  for (const ChunkKey& key : keys) {
    Entry* entry = FindLocked(key);
    if (entry == nullptr) continue;
    for (Slot& s : entry->slots) {
      const uint32_t live = ReadLocked(s, now) ? s.read_locks : 0;
      s.read_locks = live - std::min(live, n);
    }
  }
}

Result<ReadPin> L1Cache::PinForRead(const ChunkKey& key, uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* entry = FindLocked(key);
  if (entry == nullptr) return Status::NotFound("chunk not in L1");
  if (slot >= entry->slots.size()) {
    return Status::NotFound("slot " + std::to_string(slot) + " out of range");
  }
  Slot& s = entry->slots[slot];
  if (s.state != SlotState::kResident) return Status::NotFound("object is not resident");
  if (s.pins++ == 0) ++counters_.pinned_objects;
  ++entry->handles;
  policy_->OnAccess(IdOf(entry));
  return ReadPin(this, entry, slot, pool_->At(s.offset), s.offset, s.size);
}

void L1Cache::Unpin(Entry* entry, uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = entry->slots[slot];
  if (--s.pins == 0) --counters_.pinned_objects;
  // A cleared entry kept this slot's memory only for the pins; the last one frees it.
  if (!entry->in_table && s.pins == 0 && s.state == SlotState::kResident) {
    FreeSlotMemoryLocked(*entry, slot);
  }
  DropHandleLocked(entry);
}

bool L1Cache::IsResident(const ChunkKey& key, uint32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* entry = FindLocked(key);
  return entry != nullptr && slot < entry->slots.size() &&
         entry->slots[slot].state == SlotState::kResident;
}

std::optional<SlotInfo> L1Cache::DescribeSlot(const ChunkKey& key, uint32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* entry = FindLocked(key);
  if (entry == nullptr || slot >= entry->slots.size()) return std::nullopt;
  const int64_t now = clock_->NowNanos();
  const Slot& s = entry->slots[slot];
  SlotInfo info;
  info.state = s.state;
  info.offset = s.offset;
  info.size = s.size;
  info.read_locks = ReadLocked(s, now) ? s.read_locks : 0;
  info.pins = s.pins;
  info.write_lock_live = WriteLocked(s, now);
  info.copy_in_flight = s.copy_in_flight;
  return info;
}

void L1Cache::Touch(std::span<const ChunkKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ChunkKey& key : keys) {
    if (Entry* entry = FindLocked(key)) policy_->OnAccess(IdOf(entry));
  }
}

// ---------------------------------------------------------------------------------------------
// Removal

size_t L1Cache::RemoveIfIdle(std::span<const ChunkKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowNanos();
  size_t removed = 0;
  for (const ChunkKey& key : keys) {
    Entry* entry = FindLocked(key);
    if (!entry || !EvictableLocked(*entry, now)) continue;
    for (uint32_t i = 0; i < entry->slots.size(); ++i) {
      if (entry->slots[i].state != SlotState::kEmpty) FreeSlotMemoryLocked(*entry, i);
    }
    ++counters_.removed;
    ++removed;
    RemoveFromTableLocked(entry, /*tell_policy=*/true);
  }
  return removed;
}

void L1Cache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowNanos();
  const size_t cleared = table_.size();
  const uint64_t used_before = pool_->used_bytes();
  size_t deferred = 0;
  for (auto& [key, owned] : table_) {
    Entry* entry = owned.get();
    if (listener_ != nullptr && Complete(*entry)) removed_complete_.push_back(key);
    policy_->OnRemove(IdOf(entry));
    entry->in_table = false;
    for (uint32_t i = 0; i < entry->slots.size(); ++i) {
      const Slot& s = entry->slots[i];
      if (s.state == SlotState::kEmpty) continue;
      // Pinned bytes are being read and live staging bytes are being written: their handles
      // free them. Everything else goes now.
      if (s.pins > 0 || WriteLocked(s, now)) {
        ++deferred;
        continue;
      }
      FreeSlotMemoryLocked(*entry, i);
    }
    if (entry->handles > 0) detached_.emplace(entry, std::move(owned));
  }
  table_.clear();
  NotifyRemovedLocked(RemovalCause::kCleared);
  spdlog::info("l1: cleared {} entries, freed {} bytes, {} objects freed later by their handles",
               cleared, used_before - pool_->used_bytes(), deferred);
}

size_t L1Cache::EvictToWatermark() {
  constexpr size_t kBatch = 256;  // entries per mutex hold
  size_t evicted = 0;
  uint64_t freed = 0;
  uint64_t target = 0;
  uint64_t used_before = 0;
  size_t locked_skips = 0;
  for (bool first = true;; first = false) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = clock_->NowNanos();
    if (first) {
      used_before = pool_->used_bytes();
      const double capacity = static_cast<double>(pool_->capacity());
      if (static_cast<double>(used_before) < eviction_watermark_ * capacity) return 0;
      target = static_cast<uint64_t>(eviction_ratio_ * capacity);
    }
    size_t batch = 0;
    locked_skips = 0;
    policy_->ForEachCandidate([&](EntryId id) {
      Entry* victim = FromId(id);
      if (!EvictableLocked(*victim, now)) {
        ++locked_skips;
        return EvictionPolicy::Verdict::kSkip;
      }
      freed += EvictLocked(victim);
      ++batch;
      return freed >= target || batch >= kBatch ? EvictionPolicy::Verdict::kEvictedAndStop
                                                : EvictionPolicy::Verdict::kEvicted;
    });
    evicted += batch;
    NotifyRemovedLocked(RemovalCause::kEvicted);
    if (batch == 0 || freed >= target) break;
  }
  if (evicted > 0) {
    spdlog::info("l1: eviction round: {} entries, {} bytes freed (target {}), used {} -> {} of {}, "
                 "{} locked entries skipped",
                 evicted, freed, target, used_before, used_before - std::min(used_before, freed),
                 pool_->capacity(), locked_skips);
  } else {
    spdlog::debug("l1: above the eviction watermark but nothing is evictable ({} locked)",
                  locked_skips);
  }
  return evicted;
}

// ---------------------------------------------------------------------------------------------
// Stats

L1Stats L1Cache::stats(bool count_locked) const {
  std::lock_guard<std::mutex> lock(mu_);
  L1Stats st = counters_;
  st.capacity_bytes = pool_->capacity();
  st.used_bytes = pool_->used_bytes();
  st.entries = table_.size();
  st.detached_entries = detached_.size();
  st.locked_entries = 0;
  if (count_locked) {
    // Lock state depends on the time (TTLs), so it is counted by a walk over the table.
    const int64_t now = clock_->NowNanos();
    for (const auto& [key, entry] : table_) st.locked_entries += !EvictableLocked(*entry, now);
  }
  return st;
}

}  // namespace kvd::l1
