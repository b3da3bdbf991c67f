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
// Population. Backing allocates a page; the first write to it still faults, once per 4 KiB
// page (zeroing it and mapping it). Populate does that work ahead of time for a range
// (MADV_POPULATE_WRITE after EnsureBacked), without changing its bytes; PoolPopulator
// (pool_populator.h) calls it from a background thread ahead of the allocator.
//
// Huge pages (--l1-use-hugepages; anonymous pools only, as in lmcache). The pool comes from
// the reserved hugetlb pool of 2 MiB pages (MAP_HUGETLB, reserved at mmap) when it has enough
// free pages for the capacity; otherwise from transparent huge pages (an anonymous mapping,
// 2 MiB aligned, with MADV_HUGEPAGE) when the kernel allows them (enabled = always or
// madvise), and Create logs one line saying so; with neither, Create fails, as lmcache
// refuses to start. A 2 MiB page is zeroed and mapped in one fault instead of 512.
//
// Threads: every method is safe from any thread (the mapping is immutable after Create;
// EnsureBacked, Populate and backed_bytes use atomics and take no lock).
//
// Ownership: the pool owns the mapping and, when it created one, the shared-memory name. The
// destructor munmaps the region and shm_unlinks the name; pointers into the region are valid
// until then. Processes that mapped the segment keep their mapping after the unlink.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <string_view>

#include "common/status.h"
#include "l1/host_memory.h"

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
  // Huge pages (see above); InvalidArgument together with shm_name.
  bool use_hugepages = false;
  // What the host offers (tests); unset: read from /sys when use_hugepages is set.
  std::optional<HugePageInfo> huge_page_info;
  // Populate by one atomic no-op write per page instead of MADV_POPULATE_WRITE (tests; kvd
  // does this by itself on kernels before 5.14, which lack it).
  bool populate_by_touch = false;
};

// Which pages back a pool.
enum class PageKind : uint8_t { kRegular, kHugeTlb, kTransparentHuge };
const char* PageKindName(PageKind kind);  // "regular", "hugetlb", "thp"

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

  // --l1-use-hugepages: the kind of huge page a pool of `capacity` bytes gets on a host
  // offering `info` (see above). `note` is set to the line to log when the choice is not the
  // reserved pool. FailedPrecondition, in one line saying what to change, when neither kind
  // is available.
  static Result<PageKind> ChooseHugePages(uint64_t capacity, const HugePageInfo& info,
                                          std::string* note);

  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Makes sure tmpfs has allocated every page of [offset, offset + length) (shared pools;
  // anonymous pools: always OK). ResourceExhausted, with the errno text, when it cannot.
  static constexpr uint64_t kBackingGranule = 2ull << 20;
  Status EnsureBacked(uint64_t offset, uint64_t length);
  // Bytes of the pool whose pages EnsureBacked has allocated.
  uint64_t backed_bytes() const { return backed_bytes_.load(std::memory_order_relaxed); }

  // Backs (EnsureBacked) and then maps every page of [offset, offset + length) into this
  // process's page tables, writable, so that writing them takes no page fault. The bytes are
  // not changed, so other threads may be writing the range meanwhile. A range that cannot be
  // backed is not touched (no SIGBUS): ResourceExhausted (a full /dev/shm, no memory left),
  // with the errno text; InvalidArgument for a range outside the pool.
  Status Populate(uint64_t offset, uint64_t length);

  uint8_t* base() const { return base_; }
  uint8_t* At(uint64_t offset) const { return base_ + offset; }
  uint64_t capacity() const { return capacity_; }
  uint64_t align() const { return align_; }
  // "/name" as passed to shm_open (empty for anonymous memory).
  const std::string& shm_name() const { return shm_name_; }
  bool is_shared() const { return !shm_name_.empty(); }
  PageKind page_kind() const { return page_kind_; }

 private:
  MemoryPool(uint8_t* base, uint64_t mapped_bytes, uint64_t capacity, uint64_t align,
             std::string shm_name, int fd, PageKind kind, bool populate_by_touch);

  uint8_t* const base_;
  const uint64_t mapped_bytes_;  // length passed to mmap (capacity rounded up to a page)
  const uint64_t capacity_;
  const uint64_t align_;
  const std::string shm_name_;  // "/name" when we created (and must unlink) a segment
  const int fd_;                // the segment (shared pools), for fallocate; -1: anonymous
  const PageKind page_kind_;

  // One bit per kBackingGranule of the mapping: set once its pages are allocated.
  const size_t granules_;
  std::unique_ptr<std::atomic<uint64_t>[]> backed_;
  std::atomic<uint64_t> backed_bytes_{0};
  std::atomic<bool> fallocate_unsupported_{false};
  std::atomic<bool> populate_by_touch_;  // MADV_POPULATE_WRITE unavailable (or a test's choice)
};

}  // namespace kvd::l1
