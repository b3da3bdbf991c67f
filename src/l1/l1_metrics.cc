#include "l1/l1_metrics.h"

namespace kvd::l1 {
namespace {

using metrics::Kind;

double Ratio(const L1Stats& s) {
  return s.capacity_bytes ? static_cast<double>(s.used_bytes) / static_cast<double>(s.capacity_bytes) : 0.0;
}

constexpr metrics::StatsFamily<L1Stats> kFamilies[] = {
    {"lmcache_mp_l1_evicted_chunks_total", Kind::kCounter, "Chunk entries evicted from L1.",
     [](const L1Stats& s) { return static_cast<double>(s.evictions); }},
    {"lmcache_mp_l1_memory_usage_bytes", Kind::kGauge, "Bytes of L1 in use.",
     [](const L1Stats& s) { return static_cast<double>(s.used_bytes); }},
    {"lmcache_mp_l1_usage_ratio", Kind::kGauge, "Fraction of L1 in use.", Ratio},
    {"kvd_l1_capacity_bytes", Kind::kGauge, "L1 capacity in bytes.",
     [](const L1Stats& s) { return static_cast<double>(s.capacity_bytes); }},
    {"kvd_l1_entries", Kind::kGauge, "Chunk entries in L1.",
     [](const L1Stats& s) { return static_cast<double>(s.entries); }},
    {"kvd_l1_locked_entries", Kind::kGauge, "L1 entries that cannot be evicted now (locked or pinned).",
     [](const L1Stats& s) { return static_cast<double>(s.locked_entries); }},
    {"kvd_l1_resident_objects", Kind::kGauge, "L1 objects whose bytes are complete (readable).",
     [](const L1Stats& s) { return static_cast<double>(s.resident_objects); }},
    {"kvd_l1_staging_objects", Kind::kGauge, "L1 objects being written (reserved, not yet committed).",
     [](const L1Stats& s) { return static_cast<double>(s.staging_objects); }},
    {"kvd_l1_pinned_objects", Kind::kGauge, "L1 objects pinned by in-flight copies.",
     [](const L1Stats& s) { return static_cast<double>(s.pinned_objects); }},
    {"kvd_l1_evicted_bytes_total", Kind::kCounter, "Bytes freed by L1 eviction.",
     [](const L1Stats& s) { return static_cast<double>(s.evicted_bytes); }},
    {"kvd_l1_lookup_locks", Kind::kGauge, "Lookup requests holding read locks on L1 chunks.",
     [](const L1Stats& s) { return static_cast<double>(s.lookup_locks); }},
    {"kvd_l1_lookup_locks_shed_total", Kind::kCounter,
     "Lookup read locks released before their TTL because the read-lock bound was reached (the "
     "oldest first).",
     [](const L1Stats& s) { return static_cast<double>(s.shed_lookup_locks); }},
    {"kvd_l1_populated_bytes", Kind::kGauge, "L1 bytes whose pages are populated ahead of use (--l1-populate).",
     [](const L1Stats& s) { return static_cast<double>(s.populated_bytes); }},
};

}  // namespace

std::vector<metrics::CollectorHandle> RegisterL1Metrics(const L1Cache& l1, metrics::Registry& registry) {
  std::vector<metrics::CollectorHandle> handles =
      metrics::AddStatsFamilies(registry, kFamilies, [&l1] { return l1.stats(); });
  handles.push_back(registry.AddCollected(
      {"kvd_l1_info", "The L1 pool's page kind (--l1-use-hugepages): regular, hugetlb or thp (value is always 1).",
       Kind::kGauge, {"page_kind"}, {}},
      [&l1](metrics::SeriesSink& sink) { sink.Add({PageKindName(l1.page_kind())}, 1); }));
  return handles;
}

}  // namespace kvd::l1
