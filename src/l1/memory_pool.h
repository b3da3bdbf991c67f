// MemoryPool: one contiguous byte region for cache objects (the allocator that carves it
// up is SizeClassAllocator; the pool only maps it).
//
// The region is either a POSIX shared-memory segment (so worker processes and engine-driven
// clients can map it by name and read/write objects at offsets the server hands out) or an
// anonymous private mapping. Both are sparse: creating the pool touches no page, physical
// memory is used only as pages are first written, so a 64 GiB pool on a smaller machine is
// fine as long as the *used* part fits. Create logs a warning when the capacity exceeds
// /dev/shm's free space.
//
// Backing (shared pools). tmpfs allocates a page when it is first written, and when it
// cannot (a full /dev/shm, a memory cgroup at its limit) the writer gets SIGBUS — kvd's copy
// threads, or an engine-driven client writing a slot it was given. EnsureBacked allocates the
// pages of a range up front (fallocate), in granules of kBackingGranule, each once; when
// tmpfs has no room it fails with ResourceExhausted instead of a signal, and the caller
// gives the range up. L1Cache backs every reservation before handing it out, so no byte of
// the pool is ever written unbacked (issue 11, finding 3). Backed pages stay backed.
//
// Threads: every method is safe from any thread (the mapping is immutable after Create;
// EnsureBacked and backed_bytes use atomics and take no lock).
//
// Ownership: the pool owns the mapping and, when it created one, the shared-memory name. The
// destructor munmaps the region and shm_unlinks the name; pointers into the region are valid
// until then. Processes that mapped the segment keep their mapping after the unlink.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvd::l1 {

struct MemoryPoolOptions {
  // Usable bytes. Rounded DOWN to a multiple of `align`; must be at least `align`.
  uint64_t capacity_bytes = 0;
  // Object alignment and allocation granularity; a power of two (default: one page). The
  // region's base address is a multiple of it too (above a page, the mapping is placed so).
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

  // Makes sure tmpfs has allocated every page of [offset, offset + length) (shared pools;
  // anonymous pools: always OK). ResourceExhausted, with the errno text, when it cannot.
  static constexpr uint64_t kBackingGranule = 2ull << 20;
  Status EnsureBacked(uint64_t offset, uint64_t length);
  // Bytes of the pool whose pages EnsureBacked has allocated.
  uint64_t backed_bytes() const { return backed_bytes_.load(std::memory_order_relaxed); }

  uint8_t* base() const { return base_; }
  uint8_t* At(uint64_t offset) const { return base_ + offset; }
  uint64_t capacity() const { return capacity_; }
  uint64_t align() const { return align_; }
  // "/name" as passed to shm_open (empty for anonymous memory).
  const std::string& shm_name() const { return shm_name_; }
  bool is_shared() const { return !shm_name_.empty(); }

 private:
  MemoryPool(uint8_t* base, uint64_t mapped_bytes, uint64_t capacity, uint64_t align,
             std::string shm_name, int fd);

  uint8_t* const base_;
  const uint64_t mapped_bytes_;  // length passed to mmap (capacity rounded up to a page)
  const uint64_t capacity_;
  const uint64_t align_;
  const std::string shm_name_;  // "/name" when we created (and must unlink) a segment
  const int fd_;                // the segment (shared pools), for fallocate; -1: anonymous

  // One bit per kBackingGranule of the mapping: set once its pages are allocated.
  const size_t granules_;
  std::unique_ptr<std::atomic<uint64_t>[]> backed_;
  std::atomic<uint64_t> backed_bytes_{0};
  std::atomic<bool> fallocate_unsupported_{false};
};

}  // namespace kvd::l1
