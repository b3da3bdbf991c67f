// Test helpers: is a range of memory mapped into this process (resident in its page
// tables)? Two independent views: /proc/self/smaps for the mapping that holds an address,
// and the minor page faults this thread takes while writing one byte per page.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace kvd::l1::testing
