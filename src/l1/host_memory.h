// What the host offers the L1 pool: huge pages (the reserved hugetlb pool, transparent huge
// pages) and how much memory may still be taken before the machine, or the memory cgroup
// kvd runs in, is full. Read from /proc and /sys; the parsers take the files' text so that
// tests can feed them any content.
//
// Threads: free functions without state; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvd::l1 {

inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;  // the 2 MiB huge page

struct HugePageInfo {
  // The reserved hugetlb pool of 2 MiB pages (vm.nr_hugepages), and its pages neither in use
  // nor reserved by another mapping: -1 when unknown.
  int64_t total_2m_pages = -1;
  int64_t free_2m_pages = -1;
  // /sys/kernel/mm/transparent_hugepage/enabled: "always", "madvise", "never", or "" when
  // the kernel has no transparent huge pages.
  std::string thp_enabled;
  bool thp_usable() const { return thp_enabled == "always" || thp_enabled == "madvise"; }
};
HugePageInfo ReadHugePageInfo();

// The selected word of a sysfs choice list ("always [madvise] never" -> "madvise"); "" when
// none is bracketed.
std::string ParseSysfsChoice(std::string_view text);

struct MemoryRoom {
  uint64_t available = 0;  // bytes that may still be taken (the smallest room found)
  uint64_t limit = 0;      // the size that room is part of: MemTotal, or a cgroup's limit
  std::string where;       // "the machine" or "memory cgroup <path>"
};
// MemAvailable of /proc/meminfo, lowered to the room left under the memory limit of kvd's
// cgroup and each of its ancestors (cgroup v2 memory.max / memory.current, or v1
// memory.limit_in_bytes / memory.usage_in_bytes). nullopt when /proc/meminfo cannot be read.
std::optional<MemoryRoom> ReadMemoryRoom();

// Parsers (exposed for tests). MemAvailable and MemTotal in bytes from /proc/meminfo's text.
std::optional<MemoryRoom> ParseMemInfo(std::string_view meminfo);
// The cgroup path of the memory controller in /proc/self/cgroup's text: the v1 line that
// names "memory", else the v2 line "0::<path>". `v1` tells which it was.
std::optional<std::string> ParseMemoryCgroupPath(std::string_view proc_self_cgroup, bool* v1);

}  // namespace kvd::l1
