#include "l2/tier_metrics.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "common/mutex.h"

namespace kvd::l2 {

namespace {

using metrics::Kind;
using PerTierValue = std::function<double(const TierStats&)>;
using SetValue = std::function<double(const TierSetStats&)>;

// The TierSet's stats as read by the first of its families in one collection.
struct StatsMemo {
  Mutex mu;
  TierSetStats stats KVD_GUARDED_BY(mu);
};

// Registers families over one TierSet. The registry collects families in registration order,
// one collection at a time (common/metrics.h), so the first family reads stats() once per
// collection and the others reuse it: one pass over the TierSet's locks per scrape, not one
// per family.
class Families {
 public:
  Families(const TierSet& set, metrics::Registry& registry) : set_(&set), registry_(registry) {}

  // One unlabelled series: the sum over the tiers.
  void Sum(const char* name, Kind kind, const char* help, PerTierValue f) {
    Add(name, kind, help, {}, [f = std::move(f)](const TierSetStats& s, metrics::SeriesSink& out) {
      double v = 0;
      for (const auto& t : s.tiers) v += f(t);
      out.Add(v);
    });
  }
  // One series per tier, labelled l2_name.
  void PerTier(const char* name, Kind kind, const char* help, PerTierValue f) {
    Add(name, kind, help, {"l2_name"}, [f = std::move(f)](const TierSetStats& s, metrics::SeriesSink& out) {
      for (const auto& t : s.tiers) out.Add({t.name}, f(t));
    });
  }
  // By reason, either summed over the tiers or per tier (labels l2_name, reason).
  void ByReason(const char* name, const char* help, bool per_tier,
                std::vector<std::pair<std::string, PerTierValue>> reasons) {
    std::vector<std::string> labels = per_tier ? std::vector<std::string>{"l2_name", "reason"}
                                               : std::vector<std::string>{"reason"};
    Add(name, Kind::kCounter, help, std::move(labels),
        [per_tier, reasons = std::move(reasons)](const TierSetStats& s, metrics::SeriesSink& out) {
          if (per_tier) {
            for (const auto& t : s.tiers) {
              for (const auto& [reason, f] : reasons) out.Add({t.name, reason}, f(t));
            }
            return;
          }
          for (const auto& [reason, f] : reasons) {
            double v = 0;
            for (const auto& t : s.tiers) v += f(t);
            out.Add({reason}, v);
          }
        });
  }
  // One unlabelled series of the set as a whole.
  void Whole(const char* name, Kind kind, const char* help, SetValue f) {
    Add(name, kind, help, {}, [f = std::move(f)](const TierSetStats& s, metrics::SeriesSink& out) {
      out.Add(f(s));
    });
  }
  void Add(const char* name, Kind kind, const char* help, std::vector<std::string> labels,
           std::function<void(const TierSetStats&, metrics::SeriesSink&)> collect) {
    metrics::FamilyDesc d;
    d.name = name;
    d.help = help;
    d.kind = kind;
    d.label_names = std::move(labels);
    const TierSet* set = handles_.empty() ? set_ : nullptr;  // the first family reads
    handles_.push_back(registry_.AddCollected(
        std::move(d), [set, memo = memo_, collect = std::move(collect)](metrics::SeriesSink& out) {
          MutexLock lock(&memo->mu);
          if (set != nullptr) memo->stats = set->stats();
          collect(memo->stats, out);
        }));
  }
  std::vector<metrics::CollectorHandle> Take() { return std::move(handles_); }

 private:
  const TierSet* const set_;
  metrics::Registry& registry_;
  const std::shared_ptr<StatsMemo> memo_ = std::make_shared<StatsMemo>();
  std::vector<metrics::CollectorHandle> handles_;
};

double U(uint64_t v) { return static_cast<double>(v); }

}  // namespace

std::vector<metrics::CollectorHandle> RegisterTierMetrics(const TierSet& tiers,
                                                          metrics::Registry& registry) {
  Families f(tiers, registry);
  constexpr Kind kC = Kind::kCounter, kG = Kind::kGauge;
  // lmcache_mp_l2_* as lmcache 0.5.6 exports them (OpenTelemetry names with the unit appended).
  f.Sum("lmcache_mp_l2_store_submitted_requests_total", kC, "Tier store requests submitted.",
        [](const TierStats& t) { return U(t.store_requests); });
  f.Sum("lmcache_mp_l2_store_submitted_objects_chunks_total", kC, "Objects submitted for tier stores.",
        [](const TierStats& t) { return U(t.store_objects); });
  f.PerTier("lmcache_mp_l2_store_completed_requests_total", kC, "Tier store requests completed.",
            [](const TierStats& t) { return U(t.store_completed_requests); });
  f.Sum("lmcache_mp_l2_store_completed_objects_chunks_total", kC, "Objects stored to a tier.",
        [](const TierStats& t) { return U(t.stored_objects + t.store_existing_objects); });
  f.PerTier("lmcache_mp_l2_load_completed_requests_total", kC, "Tier load requests completed.",
            [](const TierStats& t) { return U(t.load_completed_requests); });
  f.Whole("lmcache_mp_l2_prefetch_lookup_requests_total", kC, "Lookups that asked the tiers.",
          [](const TierSetStats& s) { return U(s.prefetch_requests); });
  f.Sum("lmcache_mp_l2_prefetch_lookup_objects_chunks_total", kC, "Objects the tiers were asked about.",
        [](const TierStats& t) { return U(t.prefetch_lookup_objects); });
  f.Sum("lmcache_mp_l2_prefetch_load_submitted_requests_total", kC, "Tier load requests submitted.",
        [](const TierStats& t) { return U(t.load_requests); });
  f.Sum("lmcache_mp_l2_prefetch_load_submitted_objects_chunks_total", kC, "Objects submitted for tier loads.",
        [](const TierStats& t) { return U(t.load_objects); });
  f.Sum("lmcache_mp_l2_prefetch_load_completed_chunks_total", kC, "Objects loaded from a tier into L1.",
        [](const TierStats& t) { return U(t.loaded_objects); });
  f.Sum("lmcache_mp_l2_evicted_objects_chunks_total", kC, "Objects evicted from the tiers.",
        [](const TierStats& t) { return U(t.evicted_objects); });
  f.ByReason("lmcache_mp_l2_prefetch_failure_chunks_total",
             "Objects a tier had but that did not arrive in L1, by reason.", /*per_tier=*/false,
             {{"not_found", [](const TierStats& t) { return U(t.load_missing_objects); }},
              {"corrupted", [](const TierStats& t) { return U(t.load_corrupt_objects); }},
              {"unavailable", [](const TierStats& t) { return U(t.load_failed_objects); }}});
  f.PerTier("lmcache_mp_l2_usage_bytes", kG, "Bytes of objects accounted in the tier.",
            [](const TierStats& t) { return U(t.usage_bytes); });
  f.Sum("lmcache_mp_num_inflight_l2_stores", kG, "Objects being written to tiers.",
        [](const TierStats& t) { return U(t.inflight_store_objects); });
  f.Sum("lmcache_mp_num_inflight_l2_loads", kG, "Objects being loaded from tiers.",
        [](const TierStats& t) { return U(t.inflight_load_objects); });
  f.Whole("lmcache_mp_active_prefetch_jobs", kG, "Lookups loading from the tiers now.",
          [](const TierSetStats& s) { return U(s.active_prefetch_jobs); });
  // kvd_l2_*: what lmcache does not count.
  f.PerTier("kvd_l2_healthy", kG, "1 when the tier's back-end answers.",
            [](const TierStats& t) { return t.health.healthy ? 1.0 : 0.0; });
  f.PerTier("kvd_l2_capacity_bytes", kG, "Declared capacity (max_capacity_gb; 0: none).",
            [](const TierStats& t) { return U(t.capacity_bytes); });
  f.PerTier("kvd_l2_objects", kG, "Objects accounted in the tier.",
            [](const TierStats& t) { return U(t.objects); });
  f.PerTier("kvd_l2_store_skipped_chunks_total", kC,
            "Objects not written to the tier because its in-flight budget was full.",
            [](const TierStats& t) { return U(t.store_skipped_objects); });
  f.ByReason("lmcache_mp_l2_store_failed_chunks_total", "Tier writes that failed, by reason.",
             /*per_tier=*/true,
             {{"no_space", [](const TierStats& t) { return U(t.store_full_objects); }},
              {"error", [](const TierStats& t) { return U(t.store_failed_objects); }}});
  f.ByReason("lmcache_mp_l2_load_failed_chunks_total", "Tier loads that failed, by reason.",
             /*per_tier=*/true,
             {{"corrupted", [](const TierStats& t) { return U(t.load_corrupt_objects); }},
              {"unavailable", [](const TierStats& t) { return U(t.load_failed_objects); }},
              {"not_found", [](const TierStats& t) { return U(t.load_missing_objects); }}});
  f.PerTier("kvd_l2_lookup_errors_total", kC, "Existence checks the tier could not answer.",
            [](const TierStats& t) { return U(t.lookup_errors); });
  f.PerTier("kvd_l2_stored_bytes_total", kC, "Bytes written to the tier.",
            [](const TierStats& t) { return U(t.stored_bytes); });
  f.PerTier("kvd_l2_loaded_bytes_total", kC, "Bytes loaded from the tier.",
            [](const TierStats& t) { return U(t.loaded_bytes); });
  f.PerTier("kvd_l2_store_seconds_total", kC, "Summed duration of tier store batches.",
            [](const TierStats& t) { return t.store_seconds; });
  f.PerTier("kvd_l2_load_seconds_total", kC, "Summed duration of tier load batches.",
            [](const TierStats& t) { return t.load_seconds; });
  f.PerTier("kvd_l2_evicted_bytes_total", kC, "Bytes evicted from the tier.",
            [](const TierStats& t) { return U(t.evicted_bytes); });
  f.Whole("kvd_l2_prefetch_timeouts_total", kC, "Lookups that stopped waiting for their tiers.",
          [](const TierSetStats& s) { return U(s.prefetch_timeouts); });
  f.Whole("kvd_l2_queued_prefetch_jobs", kG, "Lookups waiting for a prefetch slot.",
          [](const TierSetStats& s) { return U(s.queued_prefetch_jobs); });
  // Per-tier detail of what the lmcache families above sum over the tiers (/status shows it).
  f.Add("kvd_l2_tier_info", kG,
        "A configured tier (value 1): its type, description (no credentials) and health.",
        {"l2_name", "type", "describe", "health"},
        [](const TierSetStats& s, metrics::SeriesSink& out) {
          for (const auto& t : s.tiers) out.Add({t.name, t.type, t.describe, t.health.detail}, 1);
        });
  f.PerTier("kvd_l2_earlier_runs_scanned", kG,
            "1 when the tier's index covers objects of earlier runs (capacity tiers).",
            [](const TierStats& t) { return t.scanned ? 1.0 : 0.0; });
  f.PerTier("kvd_l2_store_requests_total", kC, "Tier store requests submitted.",
            [](const TierStats& t) { return U(t.store_requests); });
  f.PerTier("kvd_l2_store_objects_total", kC, "Objects submitted for tier stores.",
            [](const TierStats& t) { return U(t.store_objects); });
  f.PerTier("kvd_l2_stored_objects_total", kC, "Objects written to the tier.",
            [](const TierStats& t) { return U(t.stored_objects); });
  f.PerTier("kvd_l2_store_existing_objects_total", kC, "Objects the tier already held when asked to store them.",
            [](const TierStats& t) { return U(t.store_existing_objects); });
  f.PerTier("kvd_l2_inflight_store_objects", kG, "Objects being written to the tier.",
            [](const TierStats& t) { return U(t.inflight_store_objects); });
  f.PerTier("kvd_l2_inflight_store_bytes", kG, "Bytes being written to the tier.",
            [](const TierStats& t) { return U(t.inflight_store_bytes); });
  f.PerTier("kvd_l2_prefetch_asked_objects_total", kC, "Objects the tier was asked about.",
            [](const TierStats& t) { return U(t.prefetch_lookup_objects); });
  f.PerTier("kvd_l2_prefetch_found_objects_total", kC, "Objects the tier said it holds.",
            [](const TierStats& t) { return U(t.prefetch_found_objects); });
  f.PerTier("kvd_l2_loaded_objects_total", kC, "Objects loaded from the tier into L1.",
            [](const TierStats& t) { return U(t.loaded_objects); });
  f.PerTier("kvd_l2_inflight_load_objects", kG, "Objects being loaded from the tier.",
            [](const TierStats& t) { return U(t.inflight_load_objects); });
  f.PerTier("kvd_l2_evicted_objects_total", kC, "Objects evicted from the tier.",
            [](const TierStats& t) { return U(t.evicted_objects); });
  // The store and prefetch policies' own state.
  f.Add("kvd_l2_policy_info", kG, "The tiers' store and prefetch policies (value 1).",
        {"store_policy", "prefetch_policy"}, [](const TierSetStats& s, metrics::SeriesSink& out) {
          out.Add({s.store_policy, s.prefetch_policy}, 1);
        });
  f.Whole("kvd_l2_prefetch_hit_chunks_total", kC, "Chunks prefetches brought into L1.",
          [](const TierSetStats& s) { return U(s.prefetch_hit_chunks); });
  f.Whole("kvd_l2_prefetch_failed_chunks_total", kC, "Planned prefetch chunks that did not arrive.",
          [](const TierSetStats& s) { return U(s.prefetch_failed_chunks); });
  f.Whole("kvd_l2_temporary_chunks", kG,
          "Prefetched chunks waiting to leave L1 after their retrieve (prefetch policy default).",
          [](const TierSetStats& s) { return U(s.temporary_chunks); });
  f.Whole("kvd_l2_skip_l1_removed_chunks_total", kC,
          "Chunks removed from L1 once the tiers held them (store policy skip_l1).",
          [](const TierSetStats& s) { return U(s.skip_l1_removed_chunks); });
  f.Whole("kvd_l2_skip_l1_waiting_chunks", kG,
          "Chunks in L1 some of whose ranks' objects a tier already holds (store policy skip_l1).",
          [](const TierSetStats& s) { return U(s.skip_l1_waiting_chunks); });
  return f.Take();
}

}  // namespace kvd::l2
