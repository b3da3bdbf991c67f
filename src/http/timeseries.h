// TimeSeries: a fixed-size ring of 1-second samples of the server's counters, kept in
// memory for the dashboard (GET /api/timeseries). Samples hold raw monotonic counters;
// rates are computed when the series is rendered, from consecutive samples.
//
// Threads: Add and ToJson may be called concurrently (one mutex; ToJson copies out
// under it and formats outside).
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "common/mutex.h"
#include "http/stats_source.h"

namespace kvd::http {

struct Sample {
  int64_t unix_ms = 0;            // wall-clock time of the sample (for the chart's x axis)
  double mono_seconds = 0;        // monotonic time (for rates; immune to clock steps)
  uint64_t l1_used_bytes = 0;
  uint64_t l1_capacity_bytes = 0;
  uint64_t l1_entries = 0;
  uint64_t lookup_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t stored_bytes = 0;
  uint64_t retrieved_bytes = 0;
  uint64_t requests = 0;
  uint64_t lookups = 0;
  uint64_t stores = 0;
  uint64_t retrieves = 0;
  uint64_t evictions = 0;
  uint64_t instances = 0;

  static Sample From(const Snapshot& s, int64_t unix_ms, double mono_seconds);
};

class TimeSeries {
 public:
  explicit TimeSeries(size_t capacity);

  void Add(const Sample& s);
  size_t size() const;

  // Columnar JSON of the last `max_points` samples (all when 0):
  //   {"interval_seconds": ..., "capacity": N, "t": [unix_ms...],
  //    "l1_used_bytes": [...], "l1_capacity_bytes": [...], "l1_usage_ratio": [...],
  //    "l1_entries": [...], "instances": [...],
  //    "store_bytes_per_second": [...], "retrieve_bytes_per_second": [...],
  //    "requests_per_second": [...], "lookups_per_second": [...],
  //    "stores_per_second": [...], "retrieves_per_second": [...],
  //    "evictions_per_second": [...],
  //    "lookup_tokens_per_second": [...], "hit_tokens_per_second": [...],
  //    "hit_ratio": [... or null when nothing was looked up in that interval]}
  // Rates at index i cover (t[i-1], t[i]]; index 0 gets the rate over the sample before
  // it when that is still in the ring, else 0.
  std::string ToJson(size_t max_points, double interval_seconds) const;

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<Sample> ring_ KVD_GUARDED_BY(mu_);  // oldest first
};

}  // namespace kvd::http
