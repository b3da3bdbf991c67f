#include "l1/memory_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << 26)  // MAP_HUGE_SHIFT = 26, log2(2 MiB) = 21
#endif

namespace kvd::l1 {
namespace {

std::string ErrnoText(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

uint64_t RoundUp(uint64_t v, uint64_t align) { return (v + align - 1) / align * align; }

// Creates a fresh segment, replacing a stale one of the same name. Returns the fd.
Result<int> CreateSegment(const std::string& name, uint64_t size) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    spdlog::warn("l1: shared-memory segment {} already exists (left by a crashed run?); "
                 "unlinking it and creating a new one", name);
    if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
      return Status::Internal(ErrnoText(("shm_unlink " + name).c_str(), errno));
    }
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return Status::Internal(ErrnoText(("shm_open " + name).c_str(), errno));
  // ftruncate only sets the length: tmpfs files are sparse, no page is allocated here.
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return Status::Internal(ErrnoText(("ftruncate " + name).c_str(), err));
  }
  return fd;
}

void WarnIfShmTooSmall(uint64_t capacity) {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) return;
  uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (capacity > avail) {
    spdlog::warn("l1: pool capacity {} bytes exceeds free space in /dev/shm ({} bytes); "
                 "stores will fail (ResourceExhausted) once it is full", capacity, avail);
  }
}

// Reserves `bytes` of address space whose start is a multiple of `align` (> a page): an
// inaccessible mapping of bytes + align, trimmed to the aligned part. The caller maps over it
// (MAP_FIXED) or makes it accessible.
void* ReserveAligned(uint64_t bytes, uint64_t align) {
  void* raw = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (raw == MAP_FAILED) return MAP_FAILED;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) & ~(uintptr_t{align} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t tail = start + bytes + align - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  return reinterpret_cast<void*>(aligned);
}

std::string GiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

}  // namespace

const char* PageKindName(PageKind kind) {
  switch (kind) {
    case PageKind::kRegular: return "regular";
    case PageKind::kHugeTlb: return "hugetlb";
    case PageKind::kTransparentHuge: return "thp";
  }
  return "?";
}

Result<PageKind> MemoryPool::ChooseHugePages(uint64_t capacity, const HugePageInfo& info,
                                             std::string* note) {
  const uint64_t needed = (capacity + kHugePageBytes - 1) / kHugePageBytes;
  if (info.free_2m_pages >= 0 && static_cast<uint64_t>(info.free_2m_pages) >= needed) {
    return PageKind::kHugeTlb;
  }
  const std::string reserved =
      info.free_2m_pages < 0
          ? std::string("the reserved 2 MiB huge-page pool cannot be read")
          : "the reserved pool has " + std::to_string(info.free_2m_pages) +
                " free 2 MiB huge pages, " + std::to_string(needed) + " needed for " +
                GiB(capacity) + " (sysctl vm.nr_hugepages=" + std::to_string(needed) + ")";
  if (info.thp_usable()) {
    *note = "l1: --l1-use-hugepages: " + reserved +
            "; backing L1 with transparent huge pages (madvise) instead";
    return PageKind::kTransparentHuge;
  }
  return Status::FailedPrecondition(
      "--l1-use-hugepages: " + reserved + ", and transparent huge pages are off (" +
      (info.thp_enabled.empty() ? std::string("not in this kernel")
                                : "/sys/kernel/mm/transparent_hugepage/enabled is " +
                                      info.thp_enabled) +
      ")");
}

Result<std::string> MemoryPool::NormalizeShmName(std::string_view name) {
  std::string_view body = name;
  if (!body.empty() && body.front() == '/') body.remove_prefix(1);
  if (body.empty()) return Status::InvalidArgument("shared-memory name is empty");
  if (body.size() > kMaxShmNameLength) {
    return Status::InvalidArgument("shared-memory name longer than " +
                                   std::to_string(kMaxShmNameLength) + " characters");
  }
  if (body.find('/') != std::string_view::npos) {
    return Status::InvalidArgument("shared-memory name '" + std::string(name) +
                                   "' may contain '/' only as its first character");
  }
  if (body.find("..") != std::string_view::npos || body == ".") {
    return Status::InvalidArgument("shared-memory name '" + std::string(name) +
                                   "' must not contain '..' or be '.'");
  }
  if (body.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("shared-memory name contains a NUL byte");
  }
  return "/" + std::string(body);
}

Result<std::unique_ptr<MemoryPool>> MemoryPool::Create(const MemoryPoolOptions& options) {
  if (!IsPowerOfTwo(options.align)) {
    return Status::InvalidArgument("pool align must be a power of two, got " +
                                   std::to_string(options.align));
  }
  uint64_t capacity = options.capacity_bytes / options.align * options.align;
  if (capacity == 0) {
    return Status::InvalidArgument("pool capacity " + std::to_string(options.capacity_bytes) +
                                   " is smaller than align " + std::to_string(options.align));
  }
  if (options.use_hugepages && !options.shm_name.empty()) {
    return Status::InvalidArgument("huge pages are for an anonymous pool, not shared memory (" +
                                   options.shm_name + ")");
  }
  PageKind kind = PageKind::kRegular;
  if (options.use_hugepages) {
    std::string note;
    auto chosen = ChooseHugePages(capacity, options.huge_page_info ? *options.huge_page_info
                                                                   : ReadHugePageInfo(),
                                  &note);
    if (!chosen.ok()) return chosen.status();
    kind = *chosen;
    if (!note.empty()) spdlog::warn("{}", note);
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // Huge pages: whole 2 MiB pages, and a base on a 2 MiB boundary.
  const uint64_t unit = kind == PageKind::kRegular ? page : kHugePageBytes;
  const uint64_t mapped = RoundUp(capacity, unit);
  const uint64_t base_align = std::max(options.align, unit);

  std::string name;
  void* addr = MAP_FAILED;
  int fd = -1;
  // mmap places a mapping at a page boundary; a larger alignment needs a reserved window.
  void* at = nullptr;
  int fixed = 0;
  // (hugetlb mappings are placed on a 2 MiB boundary by the kernel itself).
  if (base_align > (kind == PageKind::kHugeTlb ? kHugePageBytes : page)) {
    at = ReserveAligned(mapped, base_align);
    if (at == MAP_FAILED) return Status::Internal(ErrnoText("mmap (aligned reservation)", errno));
    fixed = MAP_FIXED;
  }
  if (kind == PageKind::kHugeTlb) {
    // No MAP_NORESERVE: the pages are reserved now, so a later fault cannot find the pool
    // empty (SIGBUS). Fails when another process took them since they were counted.
    addr = mmap(at, mapped, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB | fixed, -1, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      if (at != nullptr) munmap(at, mapped);
      return Status::FailedPrecondition(ErrnoText(
          ("--l1-use-hugepages: cannot map " + GiB(mapped) +
           " of 2 MiB huge pages (are enough reserved? sysctl vm.nr_hugepages=" +
           std::to_string(mapped / kHugePageBytes) + "): mmap MAP_HUGETLB").c_str(), err));
    }
  } else if (options.shm_name.empty()) {
    // MAP_NORESERVE: do not charge the whole capacity against overcommit up front.
    addr = mmap(at, mapped, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | fixed, -1, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      if (at != nullptr) munmap(at, mapped);
      return Status::Internal(ErrnoText("mmap anonymous pool", err));
    }
    if (kind == PageKind::kTransparentHuge && madvise(addr, mapped, MADV_HUGEPAGE) != 0) {
      const int err = errno;
      munmap(addr, mapped);
      return Status::FailedPrecondition(ErrnoText(
          "--l1-use-hugepages: transparent huge pages refused: madvise MADV_HUGEPAGE", err));
    }
  } else {
    auto normalized = NormalizeShmName(options.shm_name);
    auto created = normalized.ok() ? CreateSegment(*normalized, mapped) : Result<int>(normalized.status());
    if (!created.ok()) {
      if (at != nullptr) munmap(at, mapped);
      return created.status();
    }
    name = std::move(normalized).value();
    fd = *created;  // kept for fallocate (EnsureBacked)
    addr = mmap(at, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE | fixed, fd, 0);
    int err = errno;
    if (addr == MAP_FAILED) {
      if (at != nullptr) munmap(at, mapped);
      close(fd);
      shm_unlink(name.c_str());
      return Status::Internal(ErrnoText(("mmap " + name).c_str(), err));
    }
    WarnIfShmTooSmall(mapped);
  }
  spdlog::info("l1: memory pool of {} bytes ({}{}), align {}", capacity,
               name.empty() ? std::string("anonymous") : "shm " + name,
               kind == PageKind::kHugeTlb          ? ", reserved 2 MiB huge pages"
               : kind == PageKind::kTransparentHuge ? ", transparent huge pages"
                                                    : "",
               options.align);
  return std::unique_ptr<MemoryPool>(new MemoryPool(static_cast<uint8_t*>(addr), mapped, capacity,
                                                    options.align, std::move(name), fd, kind,
                                                    options.populate_by_touch));
}

MemoryPool::MemoryPool(uint8_t* base, uint64_t mapped_bytes, uint64_t capacity, uint64_t align,
                       std::string shm_name, int fd, PageKind kind, bool populate_by_touch)
    : base_(base),
      mapped_bytes_(mapped_bytes),
      capacity_(capacity),
      align_(align),
      shm_name_(std::move(shm_name)),
      fd_(fd),
      page_kind_(kind),
      granules_((mapped_bytes + kBackingGranule - 1) / kBackingGranule),
      backed_(std::make_unique<std::atomic<uint64_t>[]>((granules_ + 63) / 64)),
      populate_by_touch_(populate_by_touch) {
  for (size_t w = 0; w < (granules_ + 63) / 64; ++w) backed_[w].store(0);
}

Status MemoryPool::EnsureBacked(uint64_t offset, uint64_t length) {
  if (fd_ < 0 || length == 0 || fallocate_unsupported_.load(std::memory_order_relaxed)) {
    return Status::Ok();
  }
  if (offset >= mapped_bytes_ || length > mapped_bytes_ - offset) {
    return Status::InvalidArgument("range outside the pool");
  }
  const size_t first = offset / kBackingGranule;
  const size_t last = (offset + length - 1) / kBackingGranule;
  for (size_t g = first; g <= last; ++g) {
    const uint64_t bit = uint64_t{1} << (g % 64);
    if (backed_[g / 64].load(std::memory_order_acquire) & bit) continue;
    const uint64_t start = g * kBackingGranule;
    const uint64_t len = std::min(kBackingGranule, mapped_bytes_ - start);
    // Two threads may back one granule at once: fallocate of allocated pages changes nothing.
    if (fallocate(fd_, 0, static_cast<off_t>(start), static_cast<off_t>(len)) != 0) {
      const int err = errno;
      if (err == EOPNOTSUPP || err == ENOSYS) {
        if (!fallocate_unsupported_.exchange(true)) {
          spdlog::warn("l1: the pool's filesystem does not support fallocate; its pages are "
                       "allocated on first write (a full /dev/shm then raises SIGBUS)");
        }
        return Status::Ok();
      }
      return Status::ResourceExhausted(
          ErrnoText(("cannot back " + std::to_string(len) + " bytes of the L1 pool in " +
                     shm_name_ + " (is /dev/shm full?): fallocate").c_str(), err));
    }
    if ((backed_[g / 64].fetch_or(bit, std::memory_order_acq_rel) & bit) == 0) {
      backed_bytes_.fetch_add(len, std::memory_order_relaxed);
    }
  }
  return Status::Ok();
}

Status MemoryPool::Populate(uint64_t offset, uint64_t length) {
  if (offset >= mapped_bytes_ || length > mapped_bytes_ - offset) {
    return Status::InvalidArgument("range outside the pool");
  }
  if (length == 0) return Status::Ok();
  if (Status st = EnsureBacked(offset, length); !st.ok()) return st;
  // Whole pages around the range (the base is page aligned).
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const uint64_t end = std::min(mapped_bytes_, RoundUp(offset + length, page));
  if (!populate_by_touch_.load(std::memory_order_relaxed)) {
    for (int attempt = 0;; ++attempt) {
      if (madvise(base_ + start, end - start, MADV_POPULATE_WRITE) == 0) return Status::Ok();
      const int err = errno;
      if ((err == EINTR || err == EAGAIN) && attempt < 3) continue;
      if (err == EINVAL) {  // a kernel before 5.14
        if (!populate_by_touch_.exchange(true)) {
          spdlog::info("l1: MADV_POPULATE_WRITE is not supported by this kernel; L1 pages are "
                       "populated by touching them");
        }
        break;
      }
      // EFAULT is what a SIGBUS would have been (no page to be had), ENOMEM no memory.
      return Status::ResourceExhausted(ErrnoText(
          ("cannot populate " + std::to_string(end - start) + " bytes of the L1 pool at offset " +
           std::to_string(start) + ": madvise MADV_POPULATE_WRITE").c_str(), err));
    }
  }
  // A shared pool whose filesystem cannot fallocate has no backing to trust: a write there
  // could raise SIGBUS, so leave it to the first store (which runs the same risk anyway).
  if (fd_ >= 0 && fallocate_unsupported_.load(std::memory_order_relaxed)) {
    return Status::FailedPrecondition(
        "the L1 pool's pages cannot be backed ahead of use (no fallocate), so they are not "
        "populated");
  }
  // One atomic no-op write per page: faults the page in writable and cannot lose a
  // concurrent writer's byte (a compare-and-swap of the byte with itself, retried if a writer
  // changed it in between). Not `fetch_or(0)`: clang turns that idempotent read-modify-write
  // into a plain load (even through a volatile pointer), which maps the shared zero page and
  // populates nothing.
  for (uint64_t p = start; p < end; p += page) {
    uint8_t* byte = base_ + p;
    uint8_t seen = 0;  // a page never written holds 0: one write fault, no read fault first
    while (!__atomic_compare_exchange_n(byte, &seen, seen, /*weak=*/false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
  }
  return Status::Ok();
}

MemoryPool::~MemoryPool() {
  if (fd_ >= 0) close(fd_);
  if (munmap(base_, mapped_bytes_) != 0) {
    spdlog::error("l1: munmap of pool failed: {}", std::strerror(errno));
  }
  if (!shm_name_.empty() && shm_unlink(shm_name_.c_str()) != 0) {
    spdlog::warn("l1: shm_unlink {} failed: {}", shm_name_, std::strerror(errno));
  }
}

}  // namespace kvd::l1
