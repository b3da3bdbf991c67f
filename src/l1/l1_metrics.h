// The L1 cache's metric families (common/metrics.h): capacity, use, entries, locks and
// evictions, read from L1Cache::stats() at each collection. lmcache 0.5.6's names where it
// has one (lmcache_mp_l1_*), kvd_l1_* otherwise; /metrics, /status's "l1" key and the
// dashboard all read these families.
//
// Threads: the collectors read the cache's relaxed counters from any thread (stats() takes
// no lock). Ownership: the returned handles unregister the families; the cache must outlive
// them.
#pragma once

#include <vector>

#include "common/metrics.h"
#include "l1/l1_cache.h"

namespace kvd::l1 {

[[nodiscard]] std::vector<metrics::CollectorHandle> RegisterL1Metrics(const L1Cache& l1,
                                                                      metrics::Registry& registry);

}  // namespace kvd::l1
