// L1Cache: the in-memory tier. Chunk entries in a sharded index over one memory pool, with
// write reservations, read pins, per-request read locks and a pluggable eviction policy.
// Stores opaque byte objects; knows nothing of ZMQ, msgpack, tensors or CUDA.
//
// WHAT IT HOLDS. One entry per ChunkKey (an interned namespace plus the chunk hash). An entry
// has `num_slots` object slots, fixed when it is created (callers use num_slots = world size,
// slot = rank). A chunk is a hit only when ALL its slots are resident; eviction removes
// whole entries. Slot states, entry locks and every legal transition: object_state.h.
//
// THE CONTRACT (what callers may rely on):
//   * ReserveWrite -> WriteReservation: exclusive right to fill one slot. Its bytes are the
//     writer's until Commit (the slot becomes resident and visible) or until the handle is
//     destroyed (abort: memory freed). A writer must finish within the write TTL — after it
//     the slot can be reclaimed, Commit then returns false and the memory may already belong
//     to another object — unless it marked the reservation MarkCopyInFlight: then the memory
//     is the reservation's until Commit or Abort, whatever the TTL (for copies whose timing
//     the cache does not control, e.g. a GPU copy that runs when the client's event fires).
//   * PinForRead -> ReadPin: a resident object's bytes, stable until the pin is destroyed
//     (not even Clear frees them earlier). Pins never expire.
//   * LookupAndLock: the prefix of keys that is resident, read-locked for `owner` (a lookup
//     request id). Locks belong to that owner alone: only its ReleaseLocks /
//     ReleaseAllLocks, its next LookupAndLock, Clear, the read TTL or - oldest first, when
//     max_read_lock_slots counters are in use - the read-lock bound release them. A lookup is
//     never refused a lock because many others hold the same chunk.
//   * Locked (pinned, read-locked, being written) entries are never evicted, and are not on
//     the policy's candidate list.
//   * Recency of a batch (Touch, the locks of one lookup, CommitInReverse) is applied last key
//     first, so a request's later chunks are the older ones (lmcache's order: they go first).
//   * The policy hears a lookup's hits as uses of a request (eviction::UseInfo: the chunk's
//     position, the request's chunks, its hit length); read pins, Touch and new entries carry
//     no request information.
//
// THREADS. Every method is thread-safe, and none holds a cache-wide lock: the index has 64
// shards, each with its own mutex (held for a probe and a few field updates, never during a
// copy); lookup locks live in 64 shards of their own; the allocator's lock is held for a
// free-list pop or push. Handles (WriteReservation, ReadPin) are move-only, may be used and
// destroyed on any thread, but one handle must not be used from two threads at once. All
// handles must be destroyed before the cache. stats() takes no lock the request path needs.
//
// OWNERSHIP. The cache owns the pool, the entries and the policy. Pointers from handles are
// into the pool (see above for how long they stay valid); the pool's base and shm name are
// valid for the cache's lifetime.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "eviction/eviction_policy.h"
#include "eviction/quota_book.h"
#include "l1/chunk_key.h"
#include "l1/chunk_table.h"
#include "l1/l1_listener.h"
#include "l1/memory_pool.h"
#include "l1/namespaces.h"
#include "l1/object_state.h"
#include "l1/pool_populator.h"
#include "l1/size_class_allocator.h"

namespace kvd::l1 {

struct L1CacheOptions {
  uint64_t capacity_bytes = 0;
  uint64_t align = 4096;            // allocation granularity (--l1-align-bytes)
  // Lazy growth (--l1-use-lazy, --l1-init-size-gb): the part of the pool handed out at first;
  // it grows in steps as stores need room, before anything is evicted (size_class_allocator.h).
  // SizeClassAllocator::kAll: the whole pool from the start.
  uint64_t initial_bytes = SizeClassAllocator::kAll;
  std::string shm_name;             // empty: anonymous memory (see MemoryPoolOptions)
  bool use_hugepages = false;       // anonymous pools only (MemoryPoolOptions::use_hugepages)
  // Background population of the pool's pages ahead of the allocator (pool_populator.h);
  // started by Create, stopped by the destructor.
  PopulatorOptions populate{.mode = PopulateMode::kOff};
  std::string eviction_policy = "LRU";  // a name eviction::MakePolicy accepts
  double read_ttl_seconds = 300;
  // Bound on lookup read-lock counters (chunk x slot) held at once; at the bound the oldest
  // holds are released early (l1_cache_locks.h). 2^24: at most ~100 MB of hold records
  // (2 B per counter + 4 B per chunk).
  uint64_t max_read_lock_slots = uint64_t{1} << 24;
  // Bound on lookup holds (owners) at once, with the same early release of the oldest: a hold
  // of one chunk costs one counter but ~200 B of record plus its owner's request id (at most
  // wire::kMaxRequestIdBytes), so the counter bound alone let gigabytes of holds pile up
  // (issue 27, finding 6). The server sets it to --max-sessions: ~80 MB at 65,536.
  uint64_t max_lookup_holds = 65536;
  double write_ttl_seconds = 600;
  double eviction_watermark = 0.8;  // EvictToWatermark acts when used/capacity >= this
  double eviction_ratio = 0.2;      // ... and then frees about this fraction of capacity
  const Clock* clock = nullptr;     // required; must outlive the cache
  L1Listener* listener = nullptr;   // optional; told of completed and removed entries
                                    // (l1_listener.h); must outlive the cache
};

// A snapshot of one slot, for diagnostics and tests.
struct SlotInfo {
  SlotState state = SlotState::kEmpty;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t read_locks = 0;  // lookup requests holding the entry
  uint32_t pins = 0;        // ReadPins on the entry
  bool write_lock_live = false;
  bool copy_in_flight = false;  // staging under MarkCopyInFlight: the write lock cannot expire
};

struct L1Stats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;         // pool bytes allocated (staging, resident and detached)
  uint64_t entries = 0;            // entries in the index
  uint64_t detached_entries = 0;   // removed from the index, waiting for their last handle/lock
  uint64_t resident_objects = 0;   // resident slots whose memory is held (index + detached)
  uint64_t staging_objects = 0;    // staging slots whose memory is held (index + detached)
  uint64_t locked_entries = 0;     // entries off the evictable list (written, locked, pinned)
  uint64_t pinned_objects = 0;     // live ReadPins
  uint64_t lookup_locks = 0;       // lookup requests holding read locks
  uint64_t shed_lookup_locks = 0;  // of those, released early at the read-lock bound
  uint64_t evictions = 0;          // entries evicted since creation
  uint64_t evicted_bytes = 0;
  uint64_t lookup_keys = 0;        // keys examined by LookupAndLock
  uint64_t lookup_hits = 0;        // of which hits
  uint64_t reservations = 0;       // successful ReserveWrite calls
  uint64_t commits = 0;            // successful Commit calls
  uint64_t aborts = 0;             // reservations that ended without a commit
  uint64_t write_conflicts = 0;    // ReserveWrite answered AlreadyExists
  uint64_t write_exhausted = 0;    // ReserveWrite answered ResourceExhausted
  uint64_t reclaimed_writes = 0;   // staging slots taken back after write-lock expiry
  uint64_t removed = 0;            // entries removed by RemoveIfIdle (not evictions)
  uint64_t copies_in_flight = 0;   // staging slots held by MarkCopyInFlight (index + detached)
  uint64_t backed_bytes = 0;       // pool bytes whose pages are allocated (memory_pool.h)
  uint64_t backing_failures = 0;   // reservations given up: tmpfs could not back their pages
  uint64_t populated_bytes = 0;    // pool prefix populated ahead of use (pool_populator.h)
};

// Quota of one cache salt (the /quota API). Bytes; usage is what the salt's entries hold.
struct QuotaInfo {
  std::string cache_salt;
  std::optional<uint64_t> limit_bytes;  // nullopt: none set (effective limit 0)
  uint64_t usage_bytes = 0;
};

class L1Cache;

// Exclusive right to fill one staging slot. Move-only. Destroying it without Commit aborts the
// write: the slot returns to empty, its memory is freed, and the entry is removed if it has no
// other non-empty slot.
class WriteReservation {
 public:
  WriteReservation() = default;  // an empty handle; valid() is false
  WriteReservation(WriteReservation&& other) noexcept;
  WriteReservation& operator=(WriteReservation&& other) noexcept;
  WriteReservation(const WriteReservation&) = delete;
  WriteReservation& operator=(const WriteReservation&) = delete;
  ~WriteReservation();

  // True until Commit or Abort.
  bool valid() const { return cache_ != nullptr; }
  // Writable bytes [data(), data() + size()); the pool offset is what a client mapping the
  // shared segment writes at. Valid while valid() and the write lock has not expired.
  uint8_t* data() const { return data_; }
  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  uint32_t slot() const { return slot_; }

  // Makes the slot resident (visible to lookups). Returns false — and frees nothing twice —
  // when the reservation lost its slot meanwhile (write lock expired and the slot was
  // reclaimed, or the cache was cleared); the bytes are then discarded. The handle is empty
  // afterwards either way.
  [[nodiscard]] bool Commit();
  // Gives the slot up now (same as destroying the handle). No-op on an empty handle.
  void Abort();
  // An engine copy into data() is outstanding: the write lock no longer expires, so the
  // memory stays this reservation's until Commit or Abort, however long the copy takes (the
  // server cancels an instance whose copies outlive the TTLs; its completion then aborts).
  // Returns false (and changes nothing) when the slot is no longer this reservation's (its
  // write lock expired and the slot was reclaimed, or the cache was cleared and the lock had
  // expired); the caller must then not start the copy. Idempotent.
  [[nodiscard]] bool MarkCopyInFlight();

 private:
  friend class L1Cache;
  WriteReservation(L1Cache* cache, uint32_t ref, uint32_t slot, uint64_t token, uint8_t* data,
                   uint64_t offset, uint64_t size)
      : cache_(cache), ref_(ref), slot_(slot), token_(token), data_(data), offset_(offset),
        size_(size) {}

  L1Cache* cache_ = nullptr;
  uint32_t ref_ = 0;
  uint32_t slot_ = 0;
  uint64_t token_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

// Commits a request's reservations last to first, so that its later chunks are the older ones
// (lmcache's order); a lookup, which hits a prefix, gains none of the request's new chunks
// before the earliest of them commits. Returns how many committed; every handle is empty
// afterwards. `on_each(i, committed)` hears each non-empty reservation i, in commit order,
// right after its Commit (committed false: it had lost its slot).
template <typename OnEach>
size_t CommitInReverse(std::span<WriteReservation> reservations, OnEach&& on_each) {
  size_t committed = 0;
  for (size_t i = reservations.size(); i-- > 0;) {
    if (!reservations[i].valid()) continue;
    const bool ok = reservations[i].Commit();
    if (ok) ++committed;
    on_each(i, ok);
  }
  return committed;
}
inline size_t CommitInReverse(std::span<WriteReservation> reservations) {
  return CommitInReverse(reservations, [](size_t, bool) {});
}

// Keeps one resident object readable: its entry cannot be evicted and its memory cannot be
// freed (not even by Clear) until the pin is destroyed. Move-only; never expires.
class ReadPin {
 public:
  ReadPin() = default;
  ReadPin(ReadPin&& other) noexcept;
  ReadPin& operator=(ReadPin&& other) noexcept;
  ReadPin(const ReadPin&) = delete;
  ReadPin& operator=(const ReadPin&) = delete;
  ~ReadPin();

  bool valid() const { return cache_ != nullptr; }
  // The committed bytes [data(), data() + size()), stable while the pin lives.
  const uint8_t* data() const { return data_; }
  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  uint32_t slot() const { return slot_; }
  // Drops the pin now (same as destroying it).
  void Release();

 private:
  friend class L1Cache;
  ReadPin(L1Cache* cache, uint32_t ref, uint32_t slot, const uint8_t* data, uint64_t offset,
          uint64_t size)
      : cache_(cache), ref_(ref), slot_(slot), data_(data), offset_(offset), size_(size) {}

  L1Cache* cache_ = nullptr;
  uint32_t ref_ = 0;
  uint32_t slot_ = 0;
  const uint8_t* data_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

// Drops pins last to first (see CommitInReverse); the vector is empty afterwards.
void ReleaseInReverse(std::vector<ReadPin>& pins);

class L1Cache {
 public:
  static constexpr uint32_t kMaxSlotsPerEntry = 4096;

  // Creates the pool, the allocator, the index and one policy instance per shard.
  // InvalidArgument for bad options (no clock, non-positive TTLs, watermark or ratio outside
  // (0, 1], unknown policy, bad pool options); Internal when memory cannot be mapped.
  static Result<std::unique_ptr<L1Cache>> Create(const L1CacheOptions& options);
  ~L1Cache();
  L1Cache(const L1Cache&) = delete;
  L1Cache& operator=(const L1Cache&) = delete;

  // Namespaces of chunk keys (model, world size, cache salt). Thread-safe; see namespaces.h.
  Namespaces& namespaces() { return namespaces_; }

  // --- writes ---
  // Reserves `size` bytes for slot `slot` of the entry for `key`, creating the entry (with
  // `num_slots` slots) if absent. When the pool is full, evicts unlocked entries in policy
  // order, synchronously, and no more of them than the object needs (plus one object when
  // sizes differ). Errors:
  //   InvalidArgument    num_slots is 0 or > kMaxSlotsPerEntry, slot >= num_slots, size is 0,
  //                      key.ns was not interned, or the entry exists with another num_slots;
  //   AlreadyExists      the slot is resident, or staging under another live write lock
  //                      (a staging slot whose write lock expired is reclaimed instead);
  //   ResourceExhausted  no room even after evicting everything evictable (an entry this
  //                      call created is not left behind), size above the capacity, too
  //                      many distinct sizes or slot counts, or tmpfs cannot back the
  //                      reserved pages (a full /dev/shm; the reservation is given up).
  // The returned memory is backed (MemoryPool::EnsureBacked): writing it never faults.
  Result<WriteReservation> ReserveWrite(const ChunkKey& key, uint32_t num_slots, uint32_t slot,
                                        uint64_t size);

  // --- lookups and read locks ---
  // Counts the leading keys whose entry exists with exactly `num_slots` slots, all resident;
  // stops at the first miss. With readers_per_slot > 0, read-locks every hit for `owner`:
  // each slot of each hit can then be released once per reader (ReleaseLocks with a slot),
  // and the chunk stays locked until all its slots' readers are done or the lock is dropped.
  // Any locks `owner` held before are released first. `first_chunk` is the chunk index of
  // keys[0] within the owner's request (release ranges use the same numbering). Returns the
  // number of hits.
  size_t LookupAndLock(std::string_view owner, uint64_t first_chunk,
                       std::span<const ChunkKey> keys, uint32_t num_slots,
                       uint32_t readers_per_slot);
  // Releases the owner's locks on chunks [first_chunk, first_chunk + count): with a slot, one
  // reader of that slot per chunk (a RETRIEVE); without, the whole chunk (FREE_LOOKUP_LOCKS).
  // Chunks the owner does not hold are ignored.
  void ReleaseLocks(std::string_view owner, uint64_t first_chunk, uint64_t count,
                    std::optional<uint32_t> slot);
  // Releases every lock of `owner` (a new lookup of the request that locks nothing).
  void ReleaseAllLocks(std::string_view owner);

  // Pins a resident slot for reading. NotFound when the entry or slot does not exist or the
  // slot is not resident; ResourceExhausted when the entry has 65535 pins already.
  Result<ReadPin> PinForRead(const ChunkKey& key, uint32_t slot);

  bool IsResident(const ChunkKey& key, uint32_t slot) const;
  // Snapshot of one slot; nullopt when the entry or slot does not exist.
  std::optional<SlotInfo> DescribeSlot(const ChunkKey& key, uint32_t slot) const;

  // Refreshes recency of the existing keys, last key first (END_SESSION).
  void Touch(std::span<const ChunkKey> keys);

  // Removes those of `keys` whose entries are idle — evictable right now: no pin, no read
  // lock, no staging write — freeing their memory as eviction does (counted in `removed`, not
  // in `evictions`, and not reported to the listener). Busy or absent entries are left alone.
  // Returns how many were removed. Used by the tiers: a chunk prefetched from a tier only for
  // one retrieve (lmcache's default prefetch policy) goes once its readers are done, and so
  // does an L1 copy already written to a tier under --l2-store-policy skip_l1. Complete
  // entries removed are reported to the listener (RemovalCause::kEvicted).
  size_t RemoveIfIdle(std::span<const ChunkKey> keys);

  // --- removal and time ---
  // Removes every entry and drops every read lock. Memory that is pinned, or staging under a
  // live write lock, stays allocated until its handle is destroyed; the rest is freed now.
  void Clear();
  // Quota enforcement (IsolatedLRU: salts that must shed lose entries until they are back
  // under their quota), then: if used/capacity >= eviction_watermark, evicts evictable
  // entries in policy order until about eviction_ratio x capacity bytes were freed or nothing
  // evictable is left. Returns the number of entries evicted.
  size_t EvictToWatermark();
  // Releases read locks whose TTL passed and reclaims staging slots whose write lock expired.
  // Runs from the maintenance loop, and from an allocation that finds nothing to evict.
  // Returns the number of locks and slots released.
  size_t ExpireLocks();

  // --- quotas (per cache salt; enforced by the IsolatedLRU policy) ---
  Status SetQuota(std::string_view cache_salt, uint64_t limit_bytes);
  // Returns true when a quota was set.
  bool DeleteQuota(std::string_view cache_salt);
  QuotaInfo GetQuota(std::string_view cache_salt) const;
  std::vector<QuotaInfo> ListQuotas() const;

  // Lock-free sums of per-shard counters.
  L1Stats stats() const;

  // The pool: engine-driven clients map the shared segment and access objects at offsets.
  uint8_t* base() const { return pool_->base(); }
  const std::string& shm_name() const { return pool_->shm_name(); }
  uint64_t capacity_bytes() const { return alloc_->capacity_bytes(); }
  uint64_t align() const { return pool_->align(); }
  PageKind page_kind() const { return pool_->page_kind(); }
  const std::string& policy_name() const { return policy_name_; }

  struct Locks;  // internal: per-owner read locks (l1_cache_locks.h)

 private:
  friend class WriteReservation;
  friend class ReadPin;
  using Shard = detail::Shard;
  using EntryRec = detail::EntryRec;

  L1Cache(const L1CacheOptions& options, std::unique_ptr<MemoryPool> pool,
          std::unique_ptr<SizeClassAllocator> alloc, std::string policy_name);

  // ReserveWrite without backing the reserved pages.
  Result<WriteReservation> ReserveWriteUnbacked(const ChunkKey& key, uint32_t num_slots,
                                                uint32_t slot, uint64_t size);

  Shard& ShardFor(uint64_t digest) { return *shards_[digest >> (64 - detail::kShardBits)]; }
  const Shard& ShardFor(uint64_t digest) const {
    return *shards_[digest >> (64 - detail::kShardBits)];
  }
  Shard& ShardOfRef(uint32_t gref) { return *shards_[detail::ShardOf(gref)]; }

  // Handle callbacks; each takes the shard's mutex.
  bool CommitWrite(uint32_t gref, uint32_t slot, uint64_t token);
  // Ends one lookup hold on the entry `gref` (takes the shard's mutex).
  void EndHold(uint32_t gref);
  // Releases every hold whose deadline is at or before `cutoff_ns` (takes each LockShard
  // mutex in turn; none may be held). Returns the chunks released and counts the holds.
  size_t ReleaseHoldsDueBy(int64_t cutoff_ns, uint64_t* holds);
  // At the read-lock bound: releases the oldest holds until `need` more counters fit and at
  // most 3/4 of the bound is used (l1_cache_locks.h). No LockShard mutex may be held.
  void ShedOldestHolds(uint64_t need);
  void ShedOldestHoldsOnce(uint64_t need);  // ShedOldestHolds' work, with shed_mu held
  void AbortWrite(uint32_t gref, uint32_t slot, uint64_t token);
  bool MarkCopyInFlight(uint32_t gref, uint32_t slot, uint64_t token);
  void Unpin(uint32_t gref);

  // --- helpers that require the shard's mutex ---
  // Applies a lock event and moves the entry on or off the policy's list.
  bool ApplyLock(Shard& sh, uint32_t local, LockEvent event) KVD_REQUIRES(sh.mu);
  // Frees one slot's memory (it must hold some) and makes it empty.
  uint64_t FreeSlotLocked(Shard& sh, EntryRec* e, uint32_t slot, SlotEvent how) KVD_REQUIRES(sh.mu);
  // Removes an entry from the index and from the policy (as evicted, or as erased). The
  // record is freed now when nothing refers to it, else it is detached.
  void UnindexLocked(Shard& sh, uint32_t local, bool evicted) KVD_REQUIRES(sh.mu);
  void RemoveIfEmptyLocked(Shard& sh, uint32_t local) KVD_REQUIRES(sh.mu);
  // Frees a detached record once no handle or lock refers to it (no-op for any other record,
  // including one UnindexLocked already freed).
  void MaybeFreeRecordLocked(Shard& sh, uint32_t local) KVD_REQUIRES(sh.mu);
  // Evicts the evictable entry `local` (telling the policy); returns the units it freed. A
  // complete entry's key is added to `removed` (for the listener) when that is given.
  void EvictLocked(Shard& sh, uint32_t local, std::vector<uint32_t>* freed_units,
                   std::vector<ChunkKey>* removed) KVD_REQUIRES(sh.mu);
  // Drops a staging slot's write-lock record (and its copy-in-flight count).
  void EraseStagingLocked(Shard& sh, std::unordered_map<uint64_t, detail::StagingRec>::iterator it)
      KVD_REQUIRES(sh.mu);
  // True when the staging record's write lock holds at `now` (live, or a copy in flight).
  static bool WriteLockHolds(const detail::StagingRec& rec, int64_t now) {
    return rec.copy_in_flight || now < rec.deadline_ns;
  }
  // Tells the listener (if any) of complete entries removed under one shard hold.
  void NotifyRemoved(std::vector<ChunkKey>& removed, RemovalCause cause) {
    if (listener_ != nullptr && !removed.empty()) listener_->OnEntriesRemoved(removed, cause);
    removed.clear();
  }
  static bool Complete(const EntryRec* e) {
    for (uint32_t i = 0; i < e->num_slots; ++i) {
      if (e->slots()[i].state != SlotState::kResident) return false;
    }
    return true;
  }
  // Re-publishes the shard's best eviction candidate.
  void PublishCandidateLocked(Shard& sh) KVD_REQUIRES(sh.mu);
  uint16_t GroupOf(NamespaceId ns) const { return namespaces_.Get(ns).salt_group; }

  // --- eviction (l1_cache_evict.cc) ---
  // Memory for one object of class `cls` owned by `gref`, evicting as needed.
  std::optional<uint32_t> AllocateEvicting(uint16_t cls, uint32_t gref);
  // The shard holding the best candidate over all shards, or -1.
  int BestShard(bool forced_only) const;
  // Evicts shard s's victim as its policy names it under the shard's lock. forced_only: only
  // if that victim is still forced (a quota shed; the published candidate may be stale once
  // other shards brought the salt back under its quota); otherwise republishes, returns false.
  bool EvictFromShard(uint32_t s, std::vector<uint32_t>* freed_units, uint64_t* freed_bytes,
                      bool forced_only = false);
  // Evicts the owner of the allocation starting at `unit`, if it is still that and evictable.
  bool EvictOwnerOf(uint32_t gref, uint32_t unit, std::vector<uint32_t>* freed_units);

  const Clock* const clock_;
  const int64_t read_ttl_ns_;
  const int64_t write_ttl_ns_;
  const double eviction_watermark_;
  const double eviction_ratio_;
  const std::string policy_name_;
  const uint64_t seed_;
  L1Listener* const listener_;  // may be null

  std::unique_ptr<MemoryPool> pool_;
  std::unique_ptr<SizeClassAllocator> alloc_;
  Namespaces namespaces_;
  eviction::QuotaBook quotas_;
  std::atomic<uint32_t> policy_clock_{0};
  // What the shards' policies share (MakeSharedState; may be null). Outlives them.
  std::unique_ptr<eviction::SharedState> policy_shared_;
  std::atomic<uint64_t> next_token_{1};
  std::atomic<uint64_t> write_exhausted_{0};
  std::atomic<uint64_t> backing_failures_{0};
  std::atomic<uint64_t> lookup_keys_{0};
  std::atomic<uint64_t> lookup_hits_{0};
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<Locks> locks_;
  // Last: destroyed (stopped) first, while the pool and the allocator still exist.
  std::unique_ptr<PoolPopulator> populator_;
};

}  // namespace kvd::l1
