// ServiceCounters: request and byte counters of the cache service, for /metrics and the
// dashboard. Relaxed atomics: any thread may add, readers see eventually consistent values.
#pragma once

#include <atomic>
#include <cstdint>

namespace kvd::server {

struct ServiceCounters {
  std::atomic<uint64_t> lookups{0}, lookup_chunks{0}, hit_chunks{0};
  // Of hit_chunks: found in L1 / brought into L1 from the tiers by the lookup's prefetch.
  std::atomic<uint64_t> hit_l1_chunks{0}, hit_l2_chunks{0};
  std::atomic<uint64_t> stores{0}, store_failures{0}, stored_chunks{0}, stored_bytes{0};
  std::atomic<uint64_t> retrieves{0}, retrieve_failures{0}, retrieved_chunks{0},
      retrieved_bytes{0};
  // Instances cancelled because a copy of theirs outlived its TTL (issue 11, finding 2).
  std::atomic<uint64_t> cancelled_instances{0};
};

}  // namespace kvd::server
