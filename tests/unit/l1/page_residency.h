// Test helpers: is a range of memory mapped into this process (resident in its page
// tables)? Three independent views: /proc/self/pagemap (the "present" bit of each page),
// /proc/self/smaps for the mapping that holds an address, and the minor page faults this
// thread takes while writing one byte per page (not under ThreadSanitizer, whose shadow
// memory takes faults of its own on every first write).
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <vector>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "l1/host_memory.h"

namespace kvd::l1::testing {

struct MappingRss {
  bool found = false;
  uint64_t size = 0;             // the mapping's length
  uint64_t rss = 0;              // Rss: bytes of it mapped into this process
  uint64_t anon_huge = 0;        // AnonHugePages: of which transparent huge pages
  uint64_t private_hugetlb = 0;  // Private_Hugetlb: hugetlb pages
};

// The smaps entry of the mapping that contains `addr`.
inline MappingRss RssOfMapping(const void* addr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  MappingRss out;
  bool in_it = false;
  while (std::getline(in, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    // A mapping's first line: "start-end perms offset dev inode [path]" in hex.
    if (line.find('-') != std::string::npos && std::sscanf(line.c_str(), "%llx%c%llx", &lo, &dash, &hi) == 3 &&
        dash == '-' && line.find(':') > line.find(' ')) {
      if (in_it) break;
      in_it = a >= lo && a < hi;
      if (in_it) {
        out.found = true;
        out.size = hi - lo;
      }
      continue;
    }
    if (!in_it) continue;
    auto field = [&](const char* key, uint64_t* dst) {
      const std::string k = std::string(key) + ":";
      if (line.rfind(k, 0) == 0) *dst = std::stoull(line.substr(k.size())) * 1024;
    };
    field("Rss", &out.rss);
    field("AnonHugePages", &out.anon_huge);
    field("Private_Hugetlb", &out.private_hugetlb);
  }
  return out;
}

// A sanitizer's shadow memory takes faults of its own when the test writes the pool (ASan:
// one shadow page per 8 pool pages; TSan: more), so fault counts prove nothing there; the
// pagemap residency checks still run.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kFaultsCountable = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kFaultsCountable = false;
#else
inline constexpr bool kFaultsCountable = true;
#endif
#else
inline constexpr bool kFaultsCountable = true;
#endif

// How many 4 KiB pages of [p, p + n) are mapped into this process (pagemap bit 63).
inline uint64_t PagesMapped(const void* p, uint64_t n) {
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return 0;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / 4096;
  const uint64_t pages = (n + 4095) / 4096;
  std::vector<uint64_t> entries(pages);
  const ssize_t want = static_cast<ssize_t>(pages * 8);
  const ssize_t got = pread(fd, entries.data(), static_cast<size_t>(want), static_cast<off_t>(first * 8));
  close(fd);
  if (got != want) return 0;
  uint64_t mapped = 0;
  for (uint64_t e : entries) mapped += (e >> 63) & 1;
  return mapped;
}

inline uint64_t ThreadMinorFaults() {
  struct rusage ru {};
  getrusage(RUSAGE_THREAD, &ru);
  return static_cast<uint64_t>(ru.ru_minflt);
}

// Minor faults taken while writing one byte into each 4 KiB page of [p, p + n).
inline uint64_t FaultsWriting(uint8_t* p, uint64_t n) {
  const uint64_t before = ThreadMinorFaults();
  for (uint64_t off = 0; off < n; off += 4096) {
    *reinterpret_cast<volatile uint8_t*>(p + off) = static_cast<uint8_t>(off >> 12 | 1);
  }
  return ThreadMinorFaults() - before;
}

// [p, p + n) is populated: every page mapped, and writing it takes (almost) no fault.
inline void ExpectPopulated(uint8_t* p, uint64_t n) {
  EXPECT_EQ(PagesMapped(p, n), n / 4096);
  if (kFaultsCountable) {
    EXPECT_LT(FaultsWriting(p, n), 16u + n / (4u << 20));
  }
}

// [p, p + n) is not populated: no page mapped, and writing it faults once per page (where
// the kernel does not map anonymous memory in 2 MiB pages by itself: THP "always").
inline void ExpectNotPopulated(uint8_t* p, uint64_t n) {
  EXPECT_EQ(PagesMapped(p, n), 0u);
  if (ReadHugePageInfo().thp_enabled != "always") {
    EXPECT_GE(FaultsWriting(p, n), n / 4096 - 16);
  }
}

}  // namespace kvd::l1::testing
