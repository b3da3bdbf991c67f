#include "l1/memory_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

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
                 "writes beyond that will fail with SIGBUS", capacity, avail);
  }
}

}  // namespace

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
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t mapped = RoundUp(capacity, page);

  std::string name;
  void* addr = MAP_FAILED;
  if (options.shm_name.empty()) {
    // MAP_NORESERVE: do not charge the whole capacity against overcommit up front.
    addr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (addr == MAP_FAILED) return Status::Internal(ErrnoText("mmap anonymous pool", errno));
  } else {
    auto normalized = NormalizeShmName(options.shm_name);
    if (!normalized.ok()) return normalized.status();
    name = std::move(normalized).value();
    auto fd = CreateSegment(name, mapped);
    if (!fd.ok()) return fd.status();
    addr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, *fd, 0);
    int err = errno;
    close(*fd);  // the mapping keeps the segment alive
    if (addr == MAP_FAILED) {
      shm_unlink(name.c_str());
      return Status::Internal(ErrnoText(("mmap " + name).c_str(), err));
    }
    WarnIfShmTooSmall(mapped);
  }
  spdlog::info("l1: memory pool of {} bytes ({}), align {}", capacity,
               name.empty() ? std::string("anonymous") : "shm " + name, options.align);
  return std::unique_ptr<MemoryPool>(new MemoryPool(static_cast<uint8_t*>(addr), mapped, capacity,
                                                    options.align, std::move(name)));
}

MemoryPool::MemoryPool(uint8_t* base, uint64_t mapped_bytes, uint64_t capacity, uint64_t align,
                       std::string shm_name)
    : base_(base),
      mapped_bytes_(mapped_bytes),
      capacity_(capacity),
      align_(align),
      shm_name_(std::move(shm_name)) {}

MemoryPool::~MemoryPool() {
  if (munmap(base_, mapped_bytes_) != 0) {
    spdlog::error("l1: munmap of pool failed: {}", std::strerror(errno));
  }
  if (!shm_name_.empty() && shm_unlink(shm_name_.c_str()) != 0) {
    spdlog::warn("l1: shm_unlink {} failed: {}", shm_name_, std::strerror(errno));
  }
}

}  // namespace kvd::l1
