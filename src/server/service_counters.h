// ServiceCounters: request and byte counters of the cache service, for /metrics and the
// dashboard. Relaxed atomics: any thread may add, readers (a collection of the metrics
// registry, any thread) see eventually consistent values.
//
// The series lmcache labels come in LabelTables (common/label_table.h), bounded by
// --metrics-max-label-sets: lookups per (model_name, cache_salt), transfers per device, and
// the copy-throughput histograms per (device, engine_id, model_name). A table's block is found
// once per request (lookups: a lock-free probe) or once per registration (transfers: the
// instance keeps pointers to its blocks).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/label_table.h"
#include "common/metrics.h"

namespace kvd::server {

// lmcache's label value for a label set refused by a full table ("__other__" everywhere).
inline constexpr const char* kOverflowLabel = "__other__";

// Why a LOOKUP returned before probing the cache (lmcache's lookup_early_exit reasons, and
// kvd's own).
enum class EarlyExit : uint8_t {
  kNoGpuContext,      // no worker registered the model and world size
  kEmptyChunkHashes,  // the prompt has no full chunk
  kMixedLayouts,      // kvd: the model's workers keep objects in different layouts
  kCount,
};
inline constexpr std::array<const char*, static_cast<size_t>(EarlyExit::kCount)> kEarlyExitNames = {
    "no_gpu_context", "empty_chunk_hashes", "mixed_layouts"};

// Lookup counters of one (model_name, cache_salt). Chunks, not tokens (× chunk size when
// shown); keys are objects: one per rank of a hit chunk.
struct LookupValues {
  std::atomic<uint64_t> lookups{0}, requested_chunks{0};
  std::atomic<uint64_t> hit_l1_chunks{0}, hit_l2_chunks{0};  // hit = l1 + l2
  std::atomic<uint64_t> hit_l1_keys{0}, hit_l2_keys{0};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(EarlyExit::kCount)> early_exits{};
};

// lmcache-driven transfers of one device ("cpu", "cuda:N"): submitted, and finished (the copy
// is over, whatever its outcome).
struct TransferValues {
  std::atomic<uint64_t> submitted_stores{0}, finished_stores{0};
  std::atomic<uint64_t> submitted_retrieves{0}, finished_retrieves{0};
};

// Upper bounds (GB/s) of the throughput histograms: OpenTelemetry's default explicit buckets,
// which lmcache 0.5.6's histograms use (it configures no view). +Inf implied.
inline constexpr std::array<double, 15> kThroughputBoundsGBps = {
    0, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000};

// A histogram of copy throughputs in GB/s (per-bucket counts, not cumulative).
struct ThroughputHistogram {
  std::array<std::atomic<uint64_t>, kThroughputBoundsGBps.size() + 1> buckets{};
  std::atomic<double> sum{0};

  // One copy of `bytes` in `seconds` (nothing when either is not positive, as lmcache).
  void Record(uint64_t bytes, double seconds) {
    if (bytes == 0 || !(seconds > 0)) return;
    const double gbps = static_cast<double>(bytes) / seconds / 1e9;
    size_t i = 0;
    while (i < kThroughputBoundsGBps.size() && gbps > kThroughputBoundsGBps[i]) ++i;
    buckets[i].fetch_add(1, std::memory_order_relaxed);
    sum.fetch_add(gbps, std::memory_order_relaxed);
  }
};

// lmcache's l0_l1 store (worker → L1) and load (L1 → worker) throughput of one
// (device, engine_id, model_name).
struct ThroughputValues {
  ThroughputHistogram store, load;
};

struct ServiceCounters {
  explicit ServiceCounters(size_t max_label_sets = 256)
      : lookups(max_label_sets, {kOverflowLabel, kOverflowLabel}),
        transfers(max_label_sets, {kOverflowLabel}),
        throughput(max_label_sets, {kOverflowLabel, kOverflowLabel, kOverflowLabel}) {}

  // Labels: model_name, cache_salt.
  LabelTable<LookupValues, 2> lookups;
  // Label: device.
  LabelTable<TransferValues, 1> transfers;
  // Labels: device, engine_id, model_name.
  LabelTable<ThroughputValues, 3> throughput;

  // Every STORE / RETRIEVE request, both transfer modes (kvd's own series and /status).
  std::atomic<uint64_t> stores{0}, store_failures{0}, stored_chunks{0}, stored_bytes{0};
  std::atomic<uint64_t> retrieves{0}, retrieve_failures{0}, retrieved_chunks{0},
      retrieved_bytes{0};
  // Instances cancelled because a copy of theirs outlived its TTL (issue 11, finding 2).
  std::atomic<uint64_t> cancelled_instances{0};

  // Registers, collected from the tables above: lmcache's lookup counters per (cache_salt,
  // model_name) (lmcache_mp_lookup*_total, tokens = chunks x `chunk_size`; early exits per
  // reason once one happened), its transfer counters per device
  // (lmcache_mp_num_{submitted,finished}_{stores,retrieves}_total), its copy-throughput
  // histograms (lmcache_mp_l0_l1_{store,load}_throughput_GB_per_second, a series once it has
  // a sample), kvd_metric_label_sets{,_refused_total} per table, and the store/retrieve
  // request, failure, chunk and byte counters above. The overflow label set
  // shows once something was counted under it. The handles must not outlive this object.
  std::vector<metrics::CollectorHandle> RegisterMetrics(metrics::Registry& registry,
                                                        int64_t chunk_size) const;
};

}  // namespace kvd::server
