// The tiers' metric families, registered by their owner (issue 29, item 1): lmcache 0.5.6's
// lmcache_mp_l2_* (unlabelled sums over the tiers, or one series per tier labelled l2_name,
// as lmcache exports them), then kvd_l2_* for what lmcache does not count (per-tier detail,
// health, skips, bytes, the prefetch policy's state). Everything /metrics, /status and the
// dashboard show of the tiers comes from these families; the HTTP side renders them without
// knowing TierSet.
//
// Collected, not updated: the families read TierSet::stats() once per collection (the first
// family takes it, the others reuse it).
// Strings (a tier's type, description and health, the policies) are `*_info` gauges whose
// labels carry them (value 1).
//
// Threads: the collectors call TierSet::stats(), which is thread-safe. Ownership: the handles
// must be destroyed before the TierSet (KvService keeps them in its metric handles).
#pragma once

#include <vector>

#include "common/metrics.h"
#include "l2/tier_set.h"

namespace kvd::l2 {

std::vector<metrics::CollectorHandle> RegisterTierMetrics(const TierSet& tiers,
                                                          metrics::Registry& registry);

}  // namespace kvd::l2
