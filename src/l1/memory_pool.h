// MemoryPool: one contiguous byte region plus an offset allocator over it.
//
// The region is either a POSIX shared-memory segment (so worker processes and engine-driven
// clients can map it by name and read/write objects at offsets the server hands out) or an
// anonymous private mapping. Both are sparse: creating the pool touches no page, physical
// memory is used only as pages are first written, so a 64 GiB pool on a smaller machine is
// fine as long as the *used* part fits (writing to a shared segment beyond what /dev/shm can
// hold raises SIGBUS; Create logs a warning when the capacity exceeds /dev/shm's free space).
//
// Threads: NOT thread-safe. The owner (L1Cache) serialises every call except base(),
// capacity(), align(), shm_name() and is_shared(), which are immutable after Create.
//
// Ownership: the pool owns the mapping and, when it created one, the shared-memory name. The
// destructor munmaps the region and shm_unlinks the name; pointers into the region are valid
// until then. Processes that mapped the segment keep their mapping after the unlink.
//
// Allocator: best-fit over an ordered map of free ranges (offset -> length) with a secondary
// index by (length, offset); freeing coalesces with both neighbours. Every allocation is
// rounded up to a multiple of `align` and starts at a multiple of `align`.
// Invariants: free ranges never overlap, never touch (they would have been merged), and
// free bytes + used bytes == capacity().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/status.h"

namespace kvd::l1 {

struct MemoryPoolOptions {
  // Usable bytes. Rounded DOWN to a multiple of `align`; must be at least `align`.
  uint64_t capacity_bytes = 0;
  // Allocation granularity and offset alignment; a power of two (default: one page).
  uint64_t align = 4096;
  // Empty: anonymous private memory. Otherwise "name" or "/name" of a POSIX shared-memory
  // segment to create; a segment of that name left over by a crashed run is replaced.
  std::string shm_name;
};

class MemoryPool {
 public:
  // Maps the region. Fails with InvalidArgument for bad options or names, Internal when a
  // system call fails (the message carries errno text). Never touches the region's pages.
  static Result<std::unique_ptr<MemoryPool>> Create(const MemoryPoolOptions& options);

  // Checks a shared-memory name and returns it in the "/name" form shm_open wants. Accepts
  // "name" or "/name"; rejects empty names, '/' after the leading one, "..", NUL bytes and
  // names longer than kMaxShmNameLength (not counting the leading '/').
  static Result<std::string> NormalizeShmName(std::string_view name);
  static constexpr size_t kMaxShmNameLength = 200;

  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Reserves round_up(max(size, 1), align) bytes; returns the offset, or nullopt when no free
  // range is large enough (the caller may evict and retry).
  std::optional<uint64_t> Allocate(uint64_t size);
  // Returns the allocation starting at `offset` to the free map. Returns false (and changes
  // nothing) when `offset` is not the start of a live allocation, e.g. on a double free.
  bool Free(uint64_t offset);
  // Bytes actually reserved for the live allocation at `offset` (0 if none).
  uint64_t AllocatedSize(uint64_t offset) const;

  uint8_t* base() const { return base_; }
  uint8_t* At(uint64_t offset) const { return base_ + offset; }
  uint64_t capacity() const { return capacity_; }
  uint64_t align() const { return align_; }
  uint64_t used_bytes() const { return used_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  // Length of the largest free range (0 when full).
  uint64_t largest_free_range() const;
  size_t num_free_ranges() const { return free_by_offset_.size(); }
  size_t num_allocations() const { return allocated_.size(); }
  // "/name" as passed to shm_open (empty for anonymous memory).
  const std::string& shm_name() const { return shm_name_; }
  bool is_shared() const { return !shm_name_.empty(); }

 private:
  MemoryPool(uint8_t* base, uint64_t mapped_bytes, uint64_t capacity, uint64_t align,
             std::string shm_name);
  void InsertFree(uint64_t offset, uint64_t length);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint8_t* const base_;
  const uint64_t mapped_bytes_;  // length passed to mmap (capacity rounded up to a page)
  const uint64_t capacity_;
  const uint64_t align_;
  const std::string shm_name_;  // "/name" when we created (and must unlink) a segment

  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;               // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_length_;    // (length, offset)
  std::unordered_map<uint64_t, uint64_t> allocated_;          // offset -> reserved length
};

}  // namespace kvd::l1
