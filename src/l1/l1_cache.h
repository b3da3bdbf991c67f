// L1Cache: the in-memory tier. A chunk table over a MemoryPool with read/write locks, pins
// and pluggable eviction. Stores opaque byte objects; knows nothing of ZMQ, msgpack, tensors
// or CUDA.
//
// ENTRIES AND SLOTS. One entry per ChunkKey. An entry has `num_slots` object slots, fixed when
// it is created (callers use num_slots = world_size x object groups, slot = rank x groups +
// group). A chunk is a hit only when ALL its slots are resident. Eviction removes whole
// entries, never single slots.
//
// SLOT STATES (all transitions happen under the cache mutex):
//
//            ReserveWrite                 Commit
//   kEmpty ───────────────▶ kStaging ───────────────▶ kResident
//      ▲                       │                          │
//      │  abort (reservation   │                          │ entry evicted / cleared
//      │  destroyed without    │                          ▼ (memory freed, entry removed)
//      │  Commit), or write    │                        [gone]
//      └── lock expired and ───┘
//          slot reclaimed by another ReserveWrite, evicted or cleared
//
//   kStaging: memory allocated, being written, invisible to lookups and pins. Guarded by a
//             write lock (the reservation) that expires write_ttl after ReserveWrite —
//             unless the reservation is marked "copy in flight" (below).
//   kResident: committed bytes, immutable until the entry is removed. Never overwritten: a
//             second ReserveWrite of the slot gets AlreadyExists.
//   Read locks (per slot, counted, capped at kMaxReadLocksPerSlot) are taken by
//   LookupPrefixAndLock for a later retrieve and expire read_ttl after their last refresh;
//   expired read locks count as zero. Pins (ReadPin handles) cover an in-flight copy and
//   never expire.
//
// COPY IN FLIGHT. A copy engine (CPU or GPU) writes a staging slot, or reads a resident one,
// at a time the cache does not control: a GPU copy runs when the client's event fires. So
// memory an engine copy may still touch must never be given to another object, whatever the
// TTLs say:
//   * WriteReservation::MarkCopyInFlight(): from then on the slot's write lock does not
//     expire; the slot stays staging and is neither reclaimed, evicted nor freed by Clear
//     until the reservation is committed or aborted — which the engine's completion does.
//   * A ReadPin is already such a hold: it never expires, and a pinned slot is neither
//     evicted nor freed by Clear until the pin is destroyed (by the completion).
//   A copy that never completes therefore holds its memory until its engine is cancelled and
//   reports completion (the server cancels instances whose copies outlive the TTLs); the
//   memory is reused only after that.
//
// INVARIANTS.
//   * An entry is evictable iff it is in the table and none of its slots has a pin, a live
//     (unexpired) read lock, or a staging write under a live (unexpired) write lock.
//   * The memory of a slot is freed exactly once: by abort, by reclaim after write-lock
//     expiry, by eviction, by Clear, or — for a slot that Clear found pinned or staging under
//     a live write lock — when its last handle is destroyed. A slot's memory is never freed
//     while it is pinned or while its write lock is live.
//   * An entry in the table always has at least one non-empty slot, except transiently inside
//     one call.
//   * An entry struct lives while it is in the table or any handle refers to it; entries
//     removed (evicted, cleared) while referenced are "detached" and destroyed with their last
//     handle.
//
// THREADS. Every method is thread-safe (one mutex; bytes are never copied under it). Handles
// (WriteReservation, ReadPin) are move-only, may be used and destroyed on any thread, but one
// handle must not be used from two threads at once. All handles must be destroyed before the
// cache. Data pointers from handles are used without the lock: a ReadPin's bytes are stable
// until it is destroyed; a WriteReservation's bytes belong to the writer until Commit/abort,
// or until its write lock expires (after that the cache may give the memory to someone else,
// so writers must finish within write_ttl, or mark the reservation MarkCopyInFlight).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "l1/chunk_key.h"
#include "l1/eviction_policy.h"
#include "l1/l1_listener.h"
#include "l1/memory_pool.h"

namespace kvd::l1 {

struct L1CacheOptions {
  uint64_t capacity_bytes = 0;
  uint64_t align = 4096;
  std::string shm_name;  // empty: anonymous memory (see MemoryPoolOptions)
  double read_ttl_seconds = 300;
  double write_ttl_seconds = 600;
  double eviction_watermark = 0.8;  // EvictToWatermark acts when used/capacity >= this
  double eviction_ratio = 0.2;      // ... and then frees about this fraction of capacity
  const Clock* clock = nullptr;     // required; must outlive the cache
  L1Listener* listener = nullptr;   // optional; told of completed and removed entries
                                    // (l1_listener.h); must outlive the cache
};

enum class SlotState : uint8_t { kEmpty, kStaging, kResident };
const char* SlotStateName(SlotState state);

// A snapshot of one slot, for diagnostics and tests.
struct SlotInfo {
  SlotState state = SlotState::kEmpty;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t read_locks = 0;  // live read locks (0 when expired)
  uint32_t pins = 0;
  bool write_lock_live = false;
  bool copy_in_flight = false;  // staging under MarkCopyInFlight: the write lock cannot expire
};

struct L1Stats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;         // pool bytes allocated (staging, resident and detached)
  uint64_t entries = 0;            // entries in the table
  uint64_t detached_entries = 0;   // removed from the table, waiting for their last handle
  uint64_t resident_objects = 0;   // resident slots whose memory is held (table + detached)
  uint64_t staging_objects = 0;    // staging slots whose memory is held (table + detached)
  uint64_t locked_entries = 0;     // entries not evictable right now (only with stats(true))
  uint64_t pinned_objects = 0;     // slots with at least one live ReadPin (table + detached)
  uint64_t evictions = 0;          // entries evicted since creation
  uint64_t evicted_bytes = 0;
  uint64_t lookup_keys = 0;        // keys examined by LookupPrefixAndLock
  uint64_t lookup_hits = 0;        // of which hits
  uint64_t reservations = 0;       // successful ReserveWrite calls
  uint64_t commits = 0;            // successful Commit calls
  uint64_t aborts = 0;             // reservations dropped without Commit
  uint64_t write_conflicts = 0;    // ReserveWrite answered AlreadyExists
  uint64_t write_exhausted = 0;    // ReserveWrite answered ResourceExhausted
  uint64_t reclaimed_writes = 0;   // staging slots taken back after write-lock expiry
  uint64_t removed = 0;            // entries removed by RemoveIfIdle (not evictions)
  uint64_t copies_in_flight = 0;   // staging slots held by MarkCopyInFlight (table + detached)
};

class L1Cache;
namespace detail {
struct Entry;
}

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
  // reclaimed or evicted, or the cache was cleared); the bytes are then discarded. The handle
  // is empty afterwards either way.
  [[nodiscard]] bool Commit();
  // Gives the slot up now (same as destroying the handle). No-op on an empty handle.
  void Abort();
  // An engine copy into data() is outstanding: the write lock no longer expires, so the
  // memory stays this reservation's until Commit or Abort, however long the copy takes.
  // Returns false (and changes nothing) when the slot is no longer this reservation's (its
  // write lock expired and the slot was reclaimed, evicted or cleared); the caller must then
  // not start the copy. Idempotent.
  [[nodiscard]] bool MarkCopyInFlight();

 private:
  friend class L1Cache;
  WriteReservation(L1Cache* cache, detail::Entry* entry, uint32_t slot, uint64_t token,
                   uint8_t* data, uint64_t offset, uint64_t size)
      : cache_(cache), entry_(entry), slot_(slot), token_(token), data_(data), offset_(offset),
        size_(size) {}

  L1Cache* cache_ = nullptr;
  detail::Entry* entry_ = nullptr;
  uint32_t slot_ = 0;
  uint64_t token_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

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
  ReadPin(L1Cache* cache, detail::Entry* entry, uint32_t slot, const uint8_t* data,
          uint64_t offset, uint64_t size)
      : cache_(cache), entry_(entry), slot_(slot), data_(data), offset_(offset), size_(size) {}

  L1Cache* cache_ = nullptr;
  detail::Entry* entry_ = nullptr;
  uint32_t slot_ = 0;
  const uint8_t* data_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

class L1Cache {
 public:
  static constexpr uint32_t kMaxReadLocksPerSlot = 128;
  static constexpr uint32_t kMaxSlotsPerEntry = 4096;

  // Creates the pool and the table. `policy` defaults to LRU. InvalidArgument for bad
  // options (no clock, non-positive TTLs, watermark or ratio outside (0, 1], bad pool
  // options); Internal when the memory cannot be mapped.
  static Result<std::unique_ptr<L1Cache>> Create(const L1CacheOptions& options,
                                                 std::unique_ptr<EvictionPolicy> policy = nullptr);
  ~L1Cache();
  L1Cache(const L1Cache&) = delete;
  L1Cache& operator=(const L1Cache&) = delete;

  // Reserves `size` bytes for slot `slot` of the entry for `key`, creating the entry (with
  // `num_slots` slots) if absent. Evicts unlocked entries in policy order, synchronously, when
  // the allocation does not fit. Errors:
  //   InvalidArgument    num_slots is 0 or > kMaxSlotsPerEntry, slot >= num_slots, or the
  //                      entry exists with a different num_slots;
  //   AlreadyExists      the slot is resident, or staging under another live write lock
  //                      (a staging slot whose write lock expired is reclaimed instead);
  //   ResourceExhausted  no room even after evicting everything evictable (an entry this
  //                      call created is not left behind).
  Result<WriteReservation> ReserveWrite(const ChunkKey& key, uint32_t num_slots, uint32_t slot,
                                        uint64_t size);

  // Counts the leading keys whose entry exists with exactly `num_slots` slots, all resident;
  // stops at the first miss. Adds `read_locks_per_slot` read locks (capped per slot at
  // kMaxReadLocksPerSlot) to every slot of every hit and, when that is > 0, moves their expiry
  // to now + read_ttl. Refreshes the hits' recency. Returns the number of hits.
  size_t LookupPrefixAndLock(std::span<const ChunkKey> keys, uint32_t num_slots,
                             uint32_t read_locks_per_slot);

  // Drops up to `n` read locks of one slot (never below zero). Unknown keys or slots are
  // ignored.
  void ReleaseReadLocks(const ChunkKey& key, uint32_t slot, uint32_t n);
  // Drops up to `n` read locks of every slot of each key (FREE_LOOKUP_LOCKS).
  void ReleaseReadLocksAllSlots(std::span<const ChunkKey> keys, uint32_t n);

  // Pins a resident slot for reading. NotFound when the entry or slot does not exist or the
  // slot is not resident.
  Result<ReadPin> PinForRead(const ChunkKey& key, uint32_t slot);

  bool IsResident(const ChunkKey& key, uint32_t slot) const;
  // Snapshot of one slot; nullopt when the entry or slot does not exist.
  std::optional<SlotInfo> DescribeSlot(const ChunkKey& key, uint32_t slot) const;

  // Refreshes recency of the existing keys (END_SESSION). Unknown keys are ignored.
  void Touch(std::span<const ChunkKey> keys);

  // Removes those of `keys` whose entries are idle — evictable right now: no pin, no live read
  // lock, no staging write under a live write lock — freeing their memory as eviction does
  // (counted in `removed`, not in `evictions`). Busy or absent entries are left alone.
  // Returns how many were removed. Used by the tiers: a chunk prefetched from a tier only for
  // one retrieve (lmcache's default prefetch policy) goes once its readers are done, and so
  // does an L1 copy already written to a tier under --l2-store-policy skip_l1.
  size_t RemoveIfIdle(std::span<const ChunkKey> keys);

  // Removes every entry. Memory that is pinned, or staging under a live write lock, stays
  // allocated until its handle is destroyed; everything else is freed now.
  void Clear();

  // If used/capacity >= eviction_watermark, evicts evictable entries in policy order until
  // about eviction_ratio x capacity bytes were freed or nothing evictable is left. Returns the
  // number of entries evicted. Takes the mutex in batches so other calls are not stalled.
  size_t EvictToWatermark();

  // O(1) except with count_locked, which walks the table to count locked entries (the
  // field is 0 otherwise): keep that for on-demand status, not for periodic sampling.
  // Object counts include detached entries whose memory is still held.
  L1Stats stats(bool count_locked = false) const;

  // The pool: engine-driven clients map the shared segment and access objects at offsets.
  uint8_t* base() const { return pool_->base(); }
  const std::string& shm_name() const { return pool_->shm_name(); }
  uint64_t capacity_bytes() const { return pool_->capacity(); }
  uint64_t align() const { return pool_->align(); }
  const char* policy_name() const { return policy_->name(); }

 private:
  friend class WriteReservation;
  friend class ReadPin;
  using Entry = detail::Entry;

  L1Cache(const L1CacheOptions& options, std::unique_ptr<MemoryPool> pool,
          std::unique_ptr<EvictionPolicy> policy);

  // Handle callbacks; each takes the mutex.
  bool CommitWrite(Entry* entry, uint32_t slot, uint64_t token);
  void AbortWrite(Entry* entry, uint32_t slot, uint64_t token);
  bool MarkCopyInFlight(Entry* entry, uint32_t slot, uint64_t token);
  void Unpin(Entry* entry, uint32_t slot);

  // The helpers below require mu_ held.
  Entry* FindLocked(const ChunkKey& key) const;
  bool EvictableLocked(const Entry& entry, int64_t now) const;
  // Allocates, evicting evictable entries other than `exclude` while it does not fit.
  std::optional<uint64_t> AllocateLocked(uint64_t size, const Entry* exclude, int64_t now);
  // Frees the slot's memory and makes it empty; returns the bytes freed. Precondition: the
  // slot is not empty.
  uint64_t FreeSlotMemoryLocked(Entry& entry, uint32_t slot);
  // Evicts an evictable entry: frees all its memory and removes it from the table (the
  // policy has already forgotten it). Returns the bytes freed.
  uint64_t EvictLocked(Entry* entry);
  // Removes an entry from the table (and, if `tell_policy`, from the policy). The struct is
  // destroyed now when no handle refers to it, otherwise kept in detached_.
  void RemoveFromTableLocked(Entry* entry, bool tell_policy);
  // Removes the entry if it is in the table and all its slots are empty.
  void RemoveIfEmptyLocked(Entry* entry);
  // Drops one handle reference; destroys a detached entry with no handles left.
  void DropHandleLocked(Entry* entry);
  // Tells the listener about the complete entries removed since the last call.
  void NotifyRemovedLocked(RemovalCause cause);

  const Clock* const clock_;
  const int64_t read_ttl_ns_;
  const int64_t write_ttl_ns_;
  const double eviction_watermark_;
  const double eviction_ratio_;
  L1Listener* const listener_;  // may be null

  mutable std::mutex mu_;
  // Guarded by mu_:
  std::unique_ptr<MemoryPool> pool_;          // the pointer itself is immutable
  std::unique_ptr<EvictionPolicy> policy_;    // the pointer itself is immutable
  std::unordered_map<ChunkKey, std::unique_ptr<Entry>, ChunkKeyHash> table_;
  std::unordered_map<Entry*, std::unique_ptr<Entry>> detached_;
  uint64_t next_token_ = 1;
  std::vector<ChunkKey> removed_complete_;  // evicted complete entries not yet reported
  L1Stats counters_;  // counters and object counts are maintained; sizes are read in stats()
};

}  // namespace kvd::l1
