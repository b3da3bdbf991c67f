#include "l1/size_class_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>

#include <spdlog/spdlog.h>

namespace kvd::l1 {
namespace {

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

void* MapSparse(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

inline void SetBits(uint64_t* bits, uint32_t u, uint32_t n, bool value) {
  while (n > 0) {
    const uint32_t bit = u & 63;
    const uint32_t take = std::min<uint32_t>(n, 64 - bit);
    const uint64_t mask = (take == 64 ? ~0ULL : ((1ULL << take) - 1)) << bit;
    if (value) bits[u >> 6] |= mask; else bits[u >> 6] &= ~mask;
    u += take;
    n -= take;
  }
}

}  // namespace

Result<std::unique_ptr<SizeClassAllocator>> SizeClassAllocator::Create(uint64_t capacity_bytes,
                                                                       uint64_t align,
                                                                       uint64_t initial_bytes,
                                                                       uint64_t grow_step_bytes) {
  if (!IsPowerOfTwo(align)) {
    return Status::InvalidArgument("allocation alignment must be a power of two, got " +
                                   std::to_string(align));
  }
  const uint64_t units = capacity_bytes / align;
  if (units == 0) {
    return Status::InvalidArgument("pool capacity " + std::to_string(capacity_bytes) +
                                   " is smaller than its alignment " + std::to_string(align));
  }
  if (units >= 0xFFFFFFFEull) {
    return Status::InvalidArgument("pool of " + std::to_string(capacity_bytes) + " bytes has " +
                                   std::to_string(units) + " units of " + std::to_string(align) +
                                   " bytes; at most 2^32 - 2 (raise --l1-align-bytes)");
  }
  if (grow_step_bytes == 0) return Status::InvalidArgument("pool growth step of 0 bytes");
  const uint64_t initial_units =
      initial_bytes == kAll ? units : std::min<uint64_t>(units, (initial_bytes + align - 1) / align);
  const uint64_t grow_units =
      std::clamp<uint64_t>((grow_step_bytes + align - 1) / align, 1, units);
  std::unique_ptr<SizeClassAllocator> a(new SizeClassAllocator(
      static_cast<uint32_t>(units), align, static_cast<uint32_t>(initial_units),
      static_cast<uint32_t>(grow_units)));
  if (!a->MapMetadata()) return Status::Internal("cannot map the allocator's metadata");
  return a;
}

SizeClassAllocator::SizeClassAllocator(uint32_t units, uint64_t align, uint32_t limit,
                                       uint32_t grow_units)
    : units_(units), align_(align), grow_units_(grow_units), limit_(limit) {}

bool SizeClassAllocator::MapMetadata() {
  MutexLock lock(&mu_);
  bits_bytes_ = (static_cast<size_t>(units_) + 63) / 64 * 8;
  owner_bytes_ = static_cast<size_t>(units_) * 4;
  used_bits_ = static_cast<uint64_t*>(MapSparse(bits_bytes_));
  start_bits_ = static_cast<uint64_t*>(MapSparse(bits_bytes_));
  owner_ = static_cast<uint32_t*>(MapSparse(owner_bytes_));
  return used_bits_ != nullptr && start_bits_ != nullptr && owner_ != nullptr;
}

SizeClassAllocator::~SizeClassAllocator() {
  MutexLock lock(&mu_);
  if (used_bits_) munmap(used_bits_, bits_bytes_);
  if (start_bits_) munmap(start_bits_, bits_bytes_);
  if (owner_) munmap(owner_, owner_bytes_);
}

Result<uint16_t> SizeClassAllocator::ClassFor(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("object of 0 bytes");
  if (bytes > capacity_bytes()) {
    return Status::ResourceExhausted("object of " + std::to_string(bytes) +
                                     " bytes is larger than the pool (" +
                                     std::to_string(capacity_bytes()) + " bytes)");
  }
  // Lock-free fast path: classes are few and immutable once published.
  const uint32_t n = num_classes_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    if (classes_[i].bytes == bytes) return static_cast<uint16_t>(i);
  }
  MutexLock lock(&mu_);
  auto it = class_of_bytes_.find(bytes);
  if (it != class_of_bytes_.end()) return it->second;
  const uint32_t id = num_classes_.load(std::memory_order_relaxed);
  if (id >= kMaxClasses) {
    return Status::ResourceExhausted("L1 has " + std::to_string(kMaxClasses) +
                                     " distinct object sizes, the most it supports");
  }
  SizeClass c;
  c.bytes = bytes;
  c.units = static_cast<uint32_t>((bytes + align_ - 1) / align_);
  auto list = list_of_units_.find(c.units);
  if (list == list_of_units_.end()) {
    list = list_of_units_.emplace(c.units, static_cast<uint32_t>(free_lists_.size())).first;
    free_lists_.emplace_back();
  }
  c.list = list->second;
  classes_[id] = c;
  class_of_bytes_.emplace(bytes, static_cast<uint16_t>(id));
  num_classes_.store(id + 1, std::memory_order_release);
  return static_cast<uint16_t>(id);
}

bool SizeClassAllocator::Used(uint32_t u) const { return (used_bits_[u >> 6] >> (u & 63)) & 1; }

bool SizeClassAllocator::RangeFree(uint32_t u, uint32_t n) const {
  if (u >= units_ || n > units_ - u) return false;
  for (uint32_t end = u + n; u < end;) {
    const uint32_t bit = u & 63;
    const uint32_t take = std::min<uint32_t>(end - u, 64 - bit);
    const uint64_t mask = (take == 64 ? ~0ULL : ((1ULL << take) - 1)) << bit;
    if (used_bits_[u >> 6] & mask) return false;
    u += take;
  }
  return true;
}

void SizeClassAllocator::Take(uint32_t u, uint32_t n, uint32_t owner) {
  SetBits(used_bits_, u, n, true);
  SetBits(start_bits_, u, 1, true);
  owner_[u] = owner;
  used_units_.store(used_units_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  live_.store(live_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (u + n > frontier_.load(std::memory_order_relaxed)) {
    frontier_.store(u + n, std::memory_order_relaxed);
  }
}

std::optional<uint32_t> SizeClassAllocator::AllocateCommitted(const SizeClass& c, uint32_t owner) {
  const uint32_t n = c.units;
  const uint32_t limit = limit_.load(std::memory_order_relaxed);
  // 1. A freed range of exactly this length (entries can be stale: checked against the bitmap).
  auto& list = free_lists_[c.list];
  while (!list.empty()) {
    const uint32_t u = list.back();
    list.pop_back();
    if (RangeFree(u, n)) {
      Take(u, n, owner);
      return u;
    }
  }
  // 2. Never-used memory at the frontier.
  const uint32_t frontier = frontier_.load(std::memory_order_relaxed);
  if (n <= limit - frontier) {
    Take(frontier, n, owner);
    return frontier;
  }
  // 3. Any free run long enough (mixed sizes).
  if (limit - used_units_.load(std::memory_order_relaxed) >= n) {
    if (auto u = SearchRun(n)) {
      Take(*u, n, owner);
      return u;
    }
  }
  return std::nullopt;
}

std::optional<uint32_t> SizeClassAllocator::Allocate(uint16_t cls, uint32_t owner) {
  const SizeClass& c = classes_[cls];
  std::optional<uint32_t> got;
  uint32_t grown_from = 0, grown_to = 0;
  {
    MutexLock lock(&mu_);
    got = AllocateCommitted(c, owner);
    // 4. Lazy pools: grow the committed region (by whole steps, enough for this object at
    // the frontier) before giving up.
    const uint32_t limit = limit_.load(std::memory_order_relaxed);
    if (!got && limit < units_) {
      const uint64_t need = uint64_t{frontier_.load(std::memory_order_relaxed)} + c.units;
      uint64_t next = uint64_t{limit} + grow_units_;
      if (need > next) next += (need - next + grow_units_ - 1) / grow_units_ * grow_units_;
      next = std::min<uint64_t>(next, units_);
      limit_.store(static_cast<uint32_t>(next), std::memory_order_relaxed);
      grown_from = limit;
      grown_to = static_cast<uint32_t>(next);
      got = AllocateCommitted(c, owner);
    }
  }
  if (grown_to != 0) {
    auto level = grown_to == units_ ? spdlog::level::info : spdlog::level::debug;
    spdlog::log(level, "l1: grew the pool's usable part from {} to {} of {} bytes", grown_from * align_,
                uint64_t{grown_to} * align_, capacity_bytes());
  }
  return got;
}

std::pair<uint32_t, uint32_t> SizeClassAllocator::RunAround(uint32_t u) const {
  uint32_t start = u;
  while (start > 0) {
    const uint32_t w = (start - 1) >> 6;
    const uint32_t bit = (start - 1) & 63;
    const uint64_t below = used_bits_[w] & (bit == 63 ? ~0ULL : ((2ULL << bit) - 1));
    if (below != 0) {
      start = w * 64 + (63 - std::countl_zero(below)) + 1;
      break;
    }
    start = w * 64;
  }
  // Free runs end at the committed region's end: nothing past it may be handed out.
  const uint32_t limit = limit_.load(std::memory_order_relaxed);
  uint32_t end = u;
  while (end < limit) {
    const uint32_t w = end >> 6;
    const uint64_t above = used_bits_[w] & (~0ULL << (end & 63));
    if (above != 0) {
      end = std::min<uint32_t>(limit, w * 64 + std::countr_zero(above));
      break;
    }
    end = std::min<uint32_t>(limit, (w + 1) * 64);
  }
  return {start, end};
}

std::optional<uint32_t> SizeClassAllocator::SearchRun(uint32_t n) {
  // First fit over the committed region [0, limit_): whole words at a time where possible.
  const uint32_t limit = limit_.load(std::memory_order_relaxed);
  uint32_t run_start = 0, run = 0;
  for (uint32_t u = 0; u < limit;) {
    if ((u & 63) == 0 && limit - u >= 64) {
      const uint64_t used = used_bits_[u >> 6];
      if (used == 0) {
        if (run == 0) run_start = u;
        run += 64;
        if (run >= n) return run_start;
        u += 64;
        continue;
      }
      if (used == ~0ULL) {
        run = 0;
        u += 64;
        continue;
      }
    }
    if (Used(u)) {
      run = 0;
    } else {
      if (run == 0) run_start = u;
      if (++run >= n) return run_start;
    }
    ++u;
  }
  return std::nullopt;
}

std::optional<uint32_t> SizeClassAllocator::AllocateAround(uint16_t cls, uint32_t unit,
                                                           uint32_t owner) {
  const uint32_t n = classes_[cls].units;
  MutexLock lock(&mu_);
  if (unit >= limit_.load(std::memory_order_relaxed) || Used(unit)) return std::nullopt;
  auto [start, end] = RunAround(unit);
  if (end - start < n) return std::nullopt;
  Take(start, n, owner);
  return start;
}

void SizeClassAllocator::Free(uint32_t unit, uint16_t cls) {
  const SizeClass& c = classes_[cls];
  const uint32_t n = c.units;
  MutexLock lock(&mu_);
  if (unit >= units_ || n > units_ - unit || !((start_bits_[unit >> 6] >> (unit & 63)) & 1)) {
    spdlog::error("l1: free of unit {} (class {}) that is not the start of an allocation", unit, cls);
    return;
  }
  SetBits(used_bits_, unit, n, false);
  SetBits(start_bits_, unit, 1, false);
  owner_[unit] = kNoOwner;
  used_units_.store(used_units_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  live_.store(live_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  auto& list = free_lists_[c.list];
  list.push_back(unit);
  const uint32_t free_units = frontier_.load(std::memory_order_relaxed) -
                              static_cast<uint32_t>(used_units_.load(std::memory_order_relaxed));
  if (list.size() > free_units / n + 1024) CompactList(list, n);
}

void SizeClassAllocator::CompactList(std::vector<uint32_t>& list, uint32_t n) {
  std::sort(list.begin(), list.end());
  list.erase(std::unique(list.begin(), list.end()), list.end());
  // A plain loop: the thread-safety analysis does not see mu_ held inside a lambda.
  size_t kept = 0;
  for (const uint32_t u : list) {
    if (RangeFree(u, n)) list[kept++] = u;
  }
  list.resize(kept);
}

SizeClassAllocator::Neighbours SizeClassAllocator::NeighboursOf(uint32_t unit) const {
  Neighbours out;
  MutexLock lock(&mu_);
  if (unit >= limit_.load(std::memory_order_relaxed) || Used(unit)) return out;
  auto [start, end] = RunAround(unit);
  out.run_units = end - start;
  if (start > 0) {
    // The allocation that ends at start - 1 begins at the nearest start bit at or below it.
    uint32_t u = start - 1;
    for (;;) {
      const uint32_t w = u >> 6;
      const uint32_t bit = u & 63;
      const uint64_t below = start_bits_[w] & (bit == 63 ? ~0ULL : ((2ULL << bit) - 1));
      if (below != 0) {
        const uint32_t s = w * 64 + (63 - std::countl_zero(below));
        out.before = {owner_[s], s};
        break;
      }
      if (w == 0) break;
      u = w * 64 - 1;
    }
  }
  if (end < frontier_.load(std::memory_order_relaxed)) out.after = {owner_[end], end};
  return out;
}

uint32_t SizeClassAllocator::OwnerAt(uint32_t unit) const {
  MutexLock lock(&mu_);
  if (unit >= units_ || !((start_bits_[unit >> 6] >> (unit & 63)) & 1)) return kNoOwner;
  return owner_[unit];
}

bool SizeClassAllocator::ResetIfIdle() {
  MutexLock lock(&mu_);
  if (live_.load(std::memory_order_relaxed) != 0) return false;
  const size_t words = (static_cast<size_t>(frontier_.load(std::memory_order_relaxed)) + 63) / 64;
  std::fill(used_bits_, used_bits_ + words, 0);
  std::fill(start_bits_, start_bits_ + words, 0);
  for (auto& l : free_lists_) std::vector<uint32_t>().swap(l);
  used_units_.store(0, std::memory_order_relaxed);
  live_.store(0, std::memory_order_relaxed);
  frontier_.store(0, std::memory_order_relaxed);  // reuse from the start, sequentially
  return true;
}

}  // namespace kvd::l1
