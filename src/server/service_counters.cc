#include "server/service_counters.h"

#include <utility>

namespace kvd::server {
namespace {

uint64_t Load(const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); }

// One of lmcache's four transfer counters, per device.
metrics::CollectorHandle TransferFamily(metrics::Registry& registry, const ServiceCounters& c,
                                        const char* name, const char* help,
                                        std::atomic<uint64_t> TransferValues::*field) {
  return registry.AddCollected(
      {name, help, metrics::Kind::kCounter, {"device"}, {}},
      [&c, field](metrics::SeriesSink& sink) {
        auto add = [&](const std::array<std::string, 1>& labels, const TransferValues& v) {
          sink.Add({labels[0]}, static_cast<double>(Load(v.*field)));
        };
        c.transfers.ForEach(add);
        const TransferValues& other = c.transfers.overflow();
        if (Load(other.submitted_stores) + Load(other.submitted_retrieves) > 0) {
          add(c.transfers.overflow_labels(), other);
        }
      });
}

// lmcache's l0_l1 store or load throughput histogram, per (device, engine_id, model_name).
metrics::CollectorHandle ThroughputFamily(metrics::Registry& registry, const ServiceCounters& c,
                                          const char* name, const char* help,
                                          ThroughputHistogram ThroughputValues::*which) {
  metrics::FamilyDesc desc{name, help, metrics::Kind::kHistogram,
                           {"device", "engine_id", "model_name"},
                           {kThroughputBoundsGBps.begin(), kThroughputBoundsGBps.end()}};
  desc.one_decimal_bounds = true;  // "5.0", as lmcache's exporter writes them
  return registry.AddCollected(std::move(desc), [&c, which](metrics::SeriesSink& sink) {
    auto add = [&](const std::array<std::string, 3>& labels, const ThroughputValues& v) {
      const ThroughputHistogram& h = v.*which;
      std::vector<uint64_t> buckets;
      uint64_t n = 0;
      for (const auto& b : h.buckets) n += buckets.emplace_back(Load(b));
      if (n == 0) return;  // as lmcache: a label set shows once it has a sample
      sink.AddHistogram({labels[0], labels[1], labels[2]}, std::move(buckets),
                        h.sum.load(std::memory_order_relaxed));
    };
    c.throughput.ForEach(add);
    add(c.throughput.overflow_labels(), c.throughput.overflow());
  });
}

// One of lmcache's lookup counters, per (cache_salt, model_name): `value` of the block.
template <typename F>
metrics::CollectorHandle LookupFamily(metrics::Registry& registry, const ServiceCounters& c,
                                      const char* name, const char* help, F value) {
  return registry.AddCollected(
      {name, help, metrics::Kind::kCounter, {"cache_salt", "model_name"}, {}},
      [&c, value](metrics::SeriesSink& sink) {
        auto add = [&](const std::array<std::string, 2>& labels, const LookupValues& v) {
          sink.Add({labels[1], labels[0]}, static_cast<double>(value(v)));
        };
        c.lookups.ForEach(add);
        if (Load(c.lookups.overflow().lookups) > 0) add(c.lookups.overflow_labels(), c.lookups.overflow());
      });
}

}  // namespace

std::vector<metrics::CollectorHandle> ServiceCounters::RegisterMetrics(metrics::Registry& registry,
                                                                       int64_t chunk_size) const {
  std::vector<metrics::CollectorHandle> h;
  const uint64_t chunk = static_cast<uint64_t>(chunk_size);
  using V = LookupValues;
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookups_requests_total", "LOOKUP requests.",
                           [](const V& v) { return Load(v.lookups); }));
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookup_requested_tokens_total",
                           "Tokens (full chunks) asked for by LOOKUP requests.",
                           [chunk](const V& v) { return Load(v.requested_chunks) * chunk; }));
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookup_hit_tokens_total",
                           "Tokens LOOKUP found cached (the contiguous prefix).", [chunk](const V& v) {
                             return (Load(v.hit_l1_chunks) + Load(v.hit_l2_chunks)) * chunk;
                           }));
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookup_hit_l1_tokens_total",
                           "Of the hit tokens: found in L1.",
                           [chunk](const V& v) { return Load(v.hit_l1_chunks) * chunk; }));
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookup_hit_l2_tokens_total",
                           "Of the hit tokens: brought into L1 from the tiers (prefetch).",
                           [chunk](const V& v) { return Load(v.hit_l2_chunks) * chunk; }));
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookup_hit_l1_keys_total",
                           "Hit objects (one per rank of a hit chunk) L1 already held.",
                           [](const V& v) { return Load(v.hit_l1_keys); }));
  h.push_back(LookupFamily(registry, *this, "lmcache_mp_lookup_hit_l2_keys_total",
                           "Hit objects loaded from the tiers into L1.",
                           [](const V& v) { return Load(v.hit_l2_keys); }));
  h.push_back(registry.AddCollected(
      {"lmcache_mp_lookup_early_exit_requests_total",
       "LOOKUP requests answered without probing the cache, by reason.",
       metrics::Kind::kCounter, {"cache_salt", "model_name", "reason"}, {}},
      [this](metrics::SeriesSink& sink) {
        auto add = [&](const std::array<std::string, 2>& labels, const LookupValues& v) {
          for (size_t i = 0; i < v.early_exits.size(); ++i) {
            const uint64_t n = Load(v.early_exits[i]);
            if (n == 0) continue;  // as lmcache: a reason appears once it happened
            sink.Add({labels[1], labels[0], kEarlyExitNames[i]}, static_cast<double>(n));
          }
        };
        lookups.ForEach(add);
        add(lookups.overflow_labels(), lookups.overflow());
      }));
  h.push_back(TransferFamily(registry, *this, "lmcache_mp_num_submitted_stores_total",
                             "STOREs of registered workers submitted for copying.",
                             &TransferValues::submitted_stores));
  h.push_back(TransferFamily(registry, *this, "lmcache_mp_num_finished_stores_total",
                             "STOREs whose copy is over (whatever its outcome).",
                             &TransferValues::finished_stores));
  h.push_back(TransferFamily(registry, *this, "lmcache_mp_num_submitted_retrieves_total",
                             "RETRIEVEs of registered workers submitted for copying.",
                             &TransferValues::submitted_retrieves));
  h.push_back(TransferFamily(registry, *this, "lmcache_mp_num_finished_retrieves_total",
                             "RETRIEVEs whose copy is over (whatever its outcome).",
                             &TransferValues::finished_retrieves));
  h.push_back(ThroughputFamily(registry, *this, "lmcache_mp_l0_l1_store_throughput_GB_per_second",
                               "Copy throughput (GB/s) of STOREs, worker KV to L1, per request.",
                               &ThroughputValues::store));
  h.push_back(ThroughputFamily(registry, *this, "lmcache_mp_l0_l1_load_throughput_GB_per_second",
                               "Copy throughput (GB/s) of RETRIEVEs, L1 to worker KV, per request.",
                               &ThroughputValues::load));
  // Every STORE and RETRIEVE, both transfer modes: lmcache's two L1 chunk counters and kvd's
  // request, failure and byte counters.
  struct Plain {
    const char* name;
    const char* help;
    const std::atomic<uint64_t> ServiceCounters::*value;
  };
  static constexpr Plain kPlain[] = {
      {"lmcache_mp_l1_write_chunks_total", "Chunk objects written into L1.", &ServiceCounters::stored_chunks},
      {"lmcache_mp_l1_read_chunks_total", "Chunk objects read from L1.", &ServiceCounters::retrieved_chunks},
      {"kvd_store_requests_total", "STORE and PREPARE_STORE requests.", &ServiceCounters::stores},
      {"kvd_retrieve_requests_total", "RETRIEVE and PREPARE_RETRIEVE requests.", &ServiceCounters::retrieves},
      {"kvd_stored_bytes_total", "Bytes written into L1 by stores.", &ServiceCounters::stored_bytes},
      {"kvd_retrieved_bytes_total", "Bytes read from L1 by retrieves.", &ServiceCounters::retrieved_bytes},
      {"kvd_store_failures_total", "Store requests that failed.", &ServiceCounters::store_failures},
      {"kvd_retrieve_failures_total", "Retrieve requests that failed.", &ServiceCounters::retrieve_failures},
  };
  for (const Plain& f : kPlain) {
    const std::atomic<uint64_t>* v = &(this->*f.value);
    h.push_back(registry.AddCollected({f.name, f.help, metrics::Kind::kCounter, {}, {}},
                                      [v](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(Load(*v))); }));
  }
  // The three tables' sizes and refusals: {family, kept label sets, refused label sets}.
  auto tables = [this](auto per_table) {
    per_table("lookup", lookups.size(), lookups.refused());
    per_table("transfer", transfers.size(), transfers.refused());
    per_table("l0_l1_throughput", throughput.size(), throughput.refused());
  };
  h.push_back(registry.AddCollected(
      {"kvd_metric_label_sets",
       "Label sets a labelled metric family keeps (at most --metrics-max-label-sets; the "
       "__other__ set not included).",
       metrics::Kind::kGauge, {"family"}, {}},
      [tables](metrics::SeriesSink& sink) {
        tables([&](const char* family, size_t kept, uint64_t) {
          sink.Add({family}, static_cast<double>(kept));
        });
      }));
  h.push_back(registry.AddCollected(
      {"kvd_metric_label_sets_refused_total",
       "Distinct label sets a full family counted under its __other__ label set.",
       metrics::Kind::kCounter, {"family"}, {}},
      [tables](metrics::SeriesSink& sink) {
        tables([&](const char* family, size_t, uint64_t refused) {
          sink.Add({family}, static_cast<double>(refused));
        });
      }));
  return h;
}

}  // namespace kvd::server
