// ChunkTable internals (used only by L1Cache): the entry records and one shard of the
// sharded, open-addressing index from ChunkKey to entry.
//
// ENTRY RECORD. One per chunk: a 64-byte header followed by its slots inline (8 bytes each),
// so a TP=1 entry is 72 bytes and a TP=8 entry 128. Records of one slot count live in one
// EntryArena (blocks of 4096 records, never moved, never unmapped before the cache), so a
// record's address and its 26-bit ref are stable for its whole life; eviction links are the
// intrusive eviction::Hook inside the header.
//
// REFS. A shard-local ref is (arena << 22 | index): 16 arenas (distinct slot counts) of up to
// 4M records per shard. A global ref is (shard << 26 | local ref); handles and the
// allocator's owner map hold global refs.
//
// INDEX. Linear probing over two arrays: the local ref of each bucket and an 8-bit tag of the
// key's digest (most mismatches are rejected without touching the record). Deletion shifts
// the following run back (no tombstones). The table doubles at 80% load.
//
// THREADS. Nothing here locks: every access to a Shard's fields happens with Shard::mu held
// (L1Cache takes it), except the Counter fields, which are written under the lock and read
// without it (stats).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "eviction/eviction_policy.h"
#include "l1/chunk_key.h"
#include "l1/object_state.h"

namespace kvd::l1::detail {

inline constexpr uint32_t kNoRef = 0xFFFFFFFFu;
inline constexpr uint32_t kShardBits = 6;
inline constexpr uint32_t kShards = 1u << kShardBits;
inline constexpr uint32_t kArenaBits = 4;
inline constexpr uint32_t kMaxArenas = 1u << kArenaBits;
inline constexpr uint32_t kIndexBits = 22;
inline constexpr uint32_t kLocalBits = kArenaBits + kIndexBits;
inline constexpr uint32_t kNoUnit = 0xFFFFFFFFu;

inline uint32_t GlobalRef(uint32_t shard, uint32_t local) { return shard << kLocalBits | local; }
inline uint32_t ShardOf(uint32_t gref) { return gref >> kLocalBits; }
inline uint32_t LocalOf(uint32_t gref) { return gref & ((1u << kLocalBits) - 1); }

struct SlotRec {
  uint32_t unit = kNoUnit;  // first allocator unit (kNoUnit: no memory)
  uint16_t cls = 0;         // size class: the object's exact byte size
  SlotState state = SlotState::kEmpty;
  uint8_t spare = 0;
};
static_assert(sizeof(SlotRec) == 8);

inline constexpr uint8_t kInTable = 1;   // EntryRec::flags: reachable through the index
inline constexpr uint8_t kDetached = 2;  // removed while referenced; freed with its last handle
inline constexpr uint8_t kFree = 0x80;   // on the arena's free list

struct EntryRec {
  std::array<uint8_t, 32> chunk_hash;
  NamespaceId ns;
  eviction::Hook hook;
  uint16_t num_slots;
  EntryLocks locks;
  uint16_t handles;  // live WriteReservations and ReadPins referring to the record
  uint8_t flags;
  uint8_t spare;

  SlotRec* slots() { return reinterpret_cast<SlotRec*>(this + 1); }
  const SlotRec* slots() const { return reinterpret_cast<const SlotRec*>(this + 1); }
  bool in_table() const { return flags & kInTable; }
  ChunkKey key() const { return ChunkKey{ns, chunk_hash}; }
};
static_assert(sizeof(EntryRec) == 64);

// Records of one slot count. Not thread-safe (the shard's mutex).
class EntryArena {
 public:
  static constexpr uint32_t kBlockRecords = 4096;
  static constexpr uint32_t kMaxRecords = 1u << kIndexBits;

  explicit EntryArena(uint16_t num_slots)
      : num_slots_(num_slots), stride_(sizeof(EntryRec) + sizeof(SlotRec) * num_slots) {}

  uint16_t num_slots() const { return num_slots_; }
  uint32_t live() const { return live_; }
  size_t reserved_bytes() const { return blocks_.size() * size_t{kBlockRecords} * stride_; }

  // A fresh record (header and slots zeroed, slots empty); nullopt when the arena is full.
  std::optional<uint32_t> Allocate() {
    uint32_t index;
    if (free_head_ != kNoRef) {
      index = free_head_;
      std::memcpy(&free_head_, Raw(index) + offsetof(EntryRec, hook), sizeof(free_head_));
    } else {
      if (next_ >= kMaxRecords) return std::nullopt;
      if (next_ / kBlockRecords >= blocks_.size()) {
        blocks_.emplace_back(new uint8_t[size_t{kBlockRecords} * stride_]);
      }
      index = next_++;
    }
    ++live_;
    uint8_t* raw = Raw(index);
    std::memset(raw, 0, sizeof(EntryRec));
    auto* rec = reinterpret_cast<EntryRec*>(raw);
    rec->num_slots = num_slots_;
    rec->hook = eviction::Hook{};
    for (uint16_t i = 0; i < num_slots_; ++i) rec->slots()[i] = SlotRec{};
    return index;
  }
  // Returns false (and changes nothing) for a record that is already free.
  bool Free(uint32_t index) {
    uint8_t* raw = Raw(index);
    auto* rec = reinterpret_cast<EntryRec*>(raw);
    if (rec->flags & kFree) return false;
    rec->flags = kFree;  // a stale ref sees "not in table"
    std::memcpy(raw + offsetof(EntryRec, hook), &free_head_, sizeof(free_head_));
    free_head_ = index;
    --live_;
    return true;
  }
  // Precondition: index < next_ (any record ever handed out, live or freed).
  EntryRec* At(uint32_t index) { return reinterpret_cast<EntryRec*>(Raw(index)); }
  bool Valid(uint32_t index) const { return index < next_; }

 private:
  uint8_t* Raw(uint32_t index) {
    return blocks_[index / kBlockRecords].get() + size_t{index % kBlockRecords} * stride_;
  }

  const uint16_t num_slots_;
  const uint32_t stride_;
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  uint32_t free_head_ = kNoRef;  // free records are chained through their hook bytes
  uint32_t next_ = 0;            // records [0, next_) were handed out at least once
  uint32_t live_ = 0;
};

// A single-writer counter: updated with the shard's mutex held, read by stats without it.
class Counter {
 public:
  void Add(int64_t d) { v_.store(v_.load(std::memory_order_relaxed) + d, std::memory_order_relaxed); }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

struct ShardCounters {
  Counter entries, detached, resident_objects, staging_objects, locked_entries, pins;
  Counter evictions, evicted_bytes, reservations, commits, aborts;
  Counter write_conflicts, reclaimed_writes, removed, copies_in_flight;
};

// Write-lock state of a STAGING slot, keyed by (local ref, slot).
struct StagingRec {
  uint64_t token = 0;
  int64_t deadline_ns = 0;
  bool copy_in_flight = false;  // MarkCopyInFlight: the write lock does not expire
};

// The published eviction candidate of a shard: (priority << 32 | stamp), or kNoCandidate.
inline constexpr uint64_t kNoCandidate = ~0ULL;

class Shard final : public eviction::HookArena {
 public:
  Shard(uint32_t id, uint64_t seed) : id_(id), seed_(seed) { ResizeIndex(256); }

  uint32_t id() const { return id_; }

  // --- records (mu held) ---
  EntryRec* Rec(uint32_t local) {
    return arenas_[local >> kIndexBits]->At(local & ((1u << kIndexBits) - 1));
  }
  // A ref that may be stale (from the allocator's owner map): the record if the ref names a
  // record this shard ever handed out, else null. The caller checks in_table() and contents.
  EntryRec* RecIfValid(uint32_t local) {
    const uint32_t a = local >> kIndexBits;
    if (a >= kMaxArenas || !arenas_[a]) return nullptr;
    const uint32_t i = local & ((1u << kIndexBits) - 1);
    return arenas_[a]->Valid(i) ? arenas_[a]->At(i) : nullptr;
  }
  // A new record for `num_slots` slots: nullopt when 16 slot counts are in use or the arena
  // is full.
  std::optional<uint32_t> NewRecord(uint16_t num_slots);
  // Returns false for a record that was already free (a bug in the caller, logged by it).
  bool FreeRecord(uint32_t local) {
    return arenas_[local >> kIndexBits]->Free(local & ((1u << kIndexBits) - 1));
  }

  // --- index (mu held) ---
  uint64_t Digest(const ChunkKey& key) const { return ChunkKeyDigest(key, seed_); }
  uint32_t Find(const ChunkKey& key, uint64_t digest);
  void Insert(uint32_t local, uint64_t digest);
  void Erase(uint32_t local);
  uint32_t size() const { return count_; }
  // Calls f(local) for every indexed record (f must not change the index).
  template <class F>
  void ForEachIndexed(F&& f) {
    for (uint32_t b = 0; b <= mask_; ++b) {
      if (buckets_[b] != kNoRef) f(buckets_[b]);
    }
  }
  void ClearIndex() {
    std::fill(buckets_.begin(), buckets_.end(), kNoRef);
    count_ = 0;
  }
  size_t index_bytes() const { return buckets_.capacity() * 4 + tags_.capacity(); }
  size_t arena_bytes() const;

  // --- eviction::HookArena ---
  eviction::Hook& hook(eviction::EntryId id) override { return Rec(id)->hook; }
  uint64_t key(eviction::EntryId id) override {
    const EntryRec* r = Rec(id);
    return Mix64(ChunkKeyDigest(r->key(), 0) + 0x632be59bd9b4e019ULL);
  }

  Mutex mu;
  std::unique_ptr<eviction::EvictionPolicy> policy KVD_PT_GUARDED_BY(mu);
  std::unordered_map<uint64_t, StagingRec> staging KVD_GUARDED_BY(mu);
  // Lookup holds past EntryLocks::kMax on one entry, by local ref: a hot chunk that more
  // lookups hold at once than 16 bits count. The entry's own count stays at kMax while it has
  // any here. Bounded by the read-lock bound (L1Cache::Locks).
  std::unordered_map<uint32_t, uint32_t> extra_holds KVD_GUARDED_BY(mu);
  ShardCounters counters;
  std::atomic<uint64_t> candidate{kNoCandidate};

 private:
  void ResizeIndex(uint32_t buckets);

  const uint32_t id_;
  const uint64_t seed_;
  std::array<std::unique_ptr<EntryArena>, kMaxArenas> arenas_;
  std::vector<uint32_t> buckets_;
  std::vector<uint8_t> tags_;
  uint32_t mask_ = 0;
  uint32_t count_ = 0;
};

inline uint64_t StagingKey(uint32_t local, uint32_t slot) { return uint64_t{local} << 16 | slot; }

}  // namespace kvd::l1::detail
