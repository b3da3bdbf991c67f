// SizeClassAllocator: hands out ranges of the pool in units of `align` bytes, by size class.
//
// A size class is one exact object size (objects of one model are all the same size, so a
// deployment has a handful). Freed ranges go onto the free list of their length in units and
// are reused whole by the next allocation of that length: with one object size, an
// allocation never needs more than one freed object. Ranges never handed out before are
// taken from the frontier (a bump pointer: the high-water mark of the pool). When neither
// has room, the bitmap of used units is searched for a free run (mixed sizes).
//
// For eviction that frees no more than needed, the allocator also answers "which allocations
// border the free run around this unit" (NeighboursOf): the cache evicts the owners of
// neighbouring ranges until the run is long enough (AllocateAround), so an allocation evicts
// at most the bytes it needs plus one object, whatever the sizes around it.
//
// Lazy growth (--l1-use-lazy): the allocator may start with only the first `initial_bytes`
// of the pool to hand out (the committed region) and grow it by `grow_step_bytes` at a time,
// up to the capacity, when an allocation finds no room in it: growth comes before the
// caller's eviction, so a lazy pool evicts only once it has grown to the capacity. Every
// range handed out lies in the committed region, which never shrinks.
//
// Every allocation records an owner id (the L1's global entry ref) for its first unit.
//
// Metadata: two bits per unit (used, start of an allocation) and 4 bytes per unit for the
// owner, all in sparse anonymous mappings (only the parts that cover used units are ever
// touched), plus 4 bytes per freed range on a free list.
//
// Threads: thread-safe; one internal mutex, held for O(1) work on the common paths (free-list
// pop, bump, free) and never while calling out.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace kvd::l1 {

class SizeClassAllocator {
 public:
  static constexpr uint32_t kNoOwner = 0xFFFFFFFFu;
  static constexpr uint32_t kMaxClasses = 4096;

  static constexpr uint64_t kAll = ~uint64_t{0};
  static constexpr uint64_t kDefaultGrowStep = uint64_t{1} << 30;

  // `capacity_bytes` is rounded down to a multiple of `align` (a power of two); at most
  // 2^32 - 2 units. `initial_bytes` (rounded up to `align`, capped at the capacity) is the
  // committed region at start; kAll: all of it, no growth. `grow_step_bytes` > 0.
  // InvalidArgument otherwise; Internal when the metadata cannot be mapped.
  static Result<std::unique_ptr<SizeClassAllocator>> Create(
      uint64_t capacity_bytes, uint64_t align, uint64_t initial_bytes = kAll,
      uint64_t grow_step_bytes = kDefaultGrowStep);
  ~SizeClassAllocator();
  SizeClassAllocator(const SizeClassAllocator&) = delete;
  SizeClassAllocator& operator=(const SizeClassAllocator&) = delete;

  // The class of objects of exactly `bytes` bytes, created on first use. InvalidArgument for
  // 0 bytes; ResourceExhausted above the capacity or after kMaxClasses distinct sizes.
  Result<uint16_t> ClassFor(uint64_t bytes) KVD_EXCLUDES(mu_);
  // Lock-free. Precondition: `cls` came from ClassFor.
  uint64_t ClassBytes(uint16_t cls) const { return classes_[cls].bytes; }
  uint32_t ClassUnits(uint16_t cls) const { return classes_[cls].units; }

  // A range for one object of class `cls`, owned by `owner`: free list, then frontier, then
  // bitmap search, in the committed region, then growth of that region (lazy pools).
  // nullopt when nothing fits in the whole capacity (the caller may evict and retry).
  std::optional<uint32_t> Allocate(uint16_t cls, uint32_t owner) KVD_EXCLUDES(mu_);
  // A range for `cls` inside the free run that contains the free unit `unit`; nullopt when
  // that run is too short (or `unit` is in use).
  std::optional<uint32_t> AllocateAround(uint16_t cls, uint32_t unit, uint32_t owner)
      KVD_EXCLUDES(mu_);
  // Returns the range starting at `unit` of class `cls`. Precondition: it was allocated and
  // not freed since (checked: a bad free is logged and ignored).
  void Free(uint32_t unit, uint16_t cls) KVD_EXCLUDES(mu_);

  struct Neighbour {
    uint32_t owner = kNoOwner;  // kNoOwner: none (pool end, frontier, or `unit` in use)
    uint32_t unit = 0;          // first unit of the neighbouring allocation
  };
  struct Neighbours {
    uint32_t run_units = 0;  // length of the free run around `unit`
    Neighbour before, after;
  };
  // The allocations just before and just after the free run containing `unit`.
  Neighbours NeighboursOf(uint32_t unit) const KVD_EXCLUDES(mu_);
  // The owner recorded for the allocation starting at `unit`, or kNoOwner.
  uint32_t OwnerAt(uint32_t unit) const KVD_EXCLUDES(mu_);

  // When no allocation is live, forgets the free lists and restarts from unit 0 (so that a
  // cleared pool is reused sequentially); returns whether it did.
  bool ResetIfIdle() KVD_EXCLUDES(mu_);

  uint64_t align() const { return align_; }
  uint32_t units() const { return units_; }
  uint64_t capacity_bytes() const { return uint64_t{units_} * align_; }
  uint64_t used_bytes() const { return used_units_.load(std::memory_order_relaxed) * align_; }
  uint64_t frontier_bytes() const { return frontier_.load(std::memory_order_relaxed) * align_; }
  // The committed region: [0, committed_bytes()) may be handed out (lazy growth, above).
  uint64_t committed_bytes() const { return uint64_t{limit_.load(std::memory_order_relaxed)} * align_; }
  size_t live_allocations() const { return live_.load(std::memory_order_relaxed); }

 private:
  struct SizeClass {
    uint64_t bytes = 0;
    uint32_t units = 0;
    uint32_t list = 0;  // index into free_lists_
  };
  SizeClassAllocator(uint32_t units, uint64_t align, uint32_t limit, uint32_t grow_units);
  bool MapMetadata();

  bool Used(uint32_t u) const KVD_REQUIRES(mu_);
  bool RangeFree(uint32_t u, uint32_t n) const KVD_REQUIRES(mu_);
  void Take(uint32_t u, uint32_t n, uint32_t owner) KVD_REQUIRES(mu_);
  // [start, end) of the free run containing free unit u, within [0, units_).
  std::pair<uint32_t, uint32_t> RunAround(uint32_t u) const KVD_REQUIRES(mu_);
  std::optional<uint32_t> SearchRun(uint32_t n) KVD_REQUIRES(mu_);
  // Free list, frontier, search, all within the committed region.
  std::optional<uint32_t> AllocateCommitted(const SizeClass& c, uint32_t owner) KVD_REQUIRES(mu_);
  void CompactList(std::vector<uint32_t>& list, uint32_t n) KVD_REQUIRES(mu_);

  const uint32_t units_;
  const uint64_t align_;
  const uint32_t grow_units_;  // growth step of the committed region, in units
  mutable Mutex mu_;
  // Anonymous, sparse, zero-filled arrays (MAP_NORESERVE: pages appear when written). The
  // pointers are set once by Create; what they point to is guarded by mu_.
  uint64_t* used_bits_ KVD_PT_GUARDED_BY(mu_) = nullptr;   // 1 = unit in use
  uint64_t* start_bits_ KVD_PT_GUARDED_BY(mu_) = nullptr;  // 1 = first unit of an allocation
  uint32_t* owner_ KVD_PT_GUARDED_BY(mu_) = nullptr;       // owner of the allocation starting at a unit
  size_t bits_bytes_ = 0;   // mapped length of each bit array
  size_t owner_bytes_ = 0;  // mapped length of owner_

  SizeClass classes_[kMaxClasses];  // [0, num_classes_) are set; immutable once set
  std::atomic<uint32_t> num_classes_{0};
  std::unordered_map<uint64_t, uint16_t> class_of_bytes_ KVD_GUARDED_BY(mu_);
  std::unordered_map<uint32_t, uint32_t> list_of_units_ KVD_GUARDED_BY(mu_);
  std::vector<std::vector<uint32_t>> free_lists_ KVD_GUARDED_BY(mu_);  // by length in units
  // Written under mu_, read lock-free by the stats accessors.
  std::atomic<uint64_t> used_units_{0};
  std::atomic<uint32_t> frontier_{0};
  std::atomic<uint32_t> limit_{0};  // committed region [0, limit_); frontier_ <= limit_ <= units_
  std::atomic<size_t> live_{0};
};

}  // namespace kvd::l1
