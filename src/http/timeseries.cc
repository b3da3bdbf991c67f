#include "http/timeseries.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

namespace kvd::http {

Sample Sample::From(const Snapshot& s, int64_t unix_ms, double mono_seconds) {
  const std::vector<metrics::FamilySnapshot>& f = s.families;
  // Every value is a non-negative count; a family that is absent reads 0.
  auto one = [&](const char* family) { return static_cast<uint64_t>(std::max(0.0, metrics::ValueOf(f, family))); };
  auto sum = [&](const char* family) { return static_cast<uint64_t>(std::max(0.0, metrics::SumOf(f, family))); };
  Sample x;
  x.unix_ms = unix_ms;
  x.mono_seconds = mono_seconds;
  x.l1_used_bytes = one("lmcache_mp_l1_memory_usage_bytes");
  x.l1_capacity_bytes = one("kvd_l1_capacity_bytes");
  x.l1_entries = one("kvd_l1_entries");
  x.lookup_tokens = sum("lmcache_mp_lookup_requested_tokens_total");
  x.hit_tokens = sum("lmcache_mp_lookup_hit_tokens_total");
  x.stored_bytes = one("kvd_stored_bytes_total");
  x.retrieved_bytes = one("kvd_retrieved_bytes_total");
  x.requests = sum("kvd_requests_total");
  x.lookups = sum("lmcache_mp_lookups_requests_total");
  x.stores = one("kvd_store_requests_total");
  x.retrieves = one("kvd_retrieve_requests_total");
  x.evictions = one("lmcache_mp_l1_evicted_chunks_total");
  x.instances = s.instances.size();
  return x;
}

TimeSeries::TimeSeries(size_t capacity) : capacity_(std::max<size_t>(capacity, 2)) {}

void TimeSeries::Add(const Sample& s) {
  MutexLock lock(&mu_);
  ring_.push_back(s);
  while (ring_.size() > capacity_) ring_.pop_front();
}

size_t TimeSeries::size() const {
  MutexLock lock(&mu_);
  return ring_.size();
}

std::string TimeSeries::ToJson(size_t max_points, double interval_seconds) const {
  std::vector<Sample> v;
  {
    MutexLock lock(&mu_);
    v.assign(ring_.begin(), ring_.end());
  }
  size_t first = 0;  // first sample to output
  if (max_points > 0 && v.size() > max_points) first = v.size() - max_points;

  using json = nlohmann::ordered_json;
  json t = json::array(), used = json::array(), cap = json::array(), ratio = json::array(),
       entries = json::array(), instances = json::array(), store_bps = json::array(),
       retrieve_bps = json::array(), rps = json::array(), lps = json::array(),
       sps = json::array(), rtps = json::array(), eps = json::array(), ltps = json::array(),
       htps = json::array(), hit = json::array();
  // Counter delta per second; counters never go backwards, but be safe.
  auto rate = [](uint64_t now, uint64_t before, double dt) {
    return now >= before && dt > 0 ? static_cast<double>(now - before) / dt : 0.0;
  };
  for (size_t i = first; i < v.size(); ++i) {
    const Sample& s = v[i];
    t.push_back(s.unix_ms);
    used.push_back(s.l1_used_bytes);
    cap.push_back(s.l1_capacity_bytes);
    ratio.push_back(s.l1_capacity_bytes ? static_cast<double>(s.l1_used_bytes) /
                                              static_cast<double>(s.l1_capacity_bytes)
                                        : 0.0);
    entries.push_back(s.l1_entries);
    instances.push_back(s.instances);
    if (i == 0) {
      for (json* a : {&store_bps, &retrieve_bps, &rps, &lps, &sps, &rtps, &eps, &ltps, &htps}) {
        a->push_back(0.0);
      }
      hit.push_back(nullptr);
      continue;
    }
    const Sample& p = v[i - 1];
    const double dt = s.mono_seconds - p.mono_seconds;
    store_bps.push_back(rate(s.stored_bytes, p.stored_bytes, dt));
    retrieve_bps.push_back(rate(s.retrieved_bytes, p.retrieved_bytes, dt));
    rps.push_back(rate(s.requests, p.requests, dt));
    lps.push_back(rate(s.lookups, p.lookups, dt));
    sps.push_back(rate(s.stores, p.stores, dt));
    rtps.push_back(rate(s.retrieves, p.retrieves, dt));
    eps.push_back(rate(s.evictions, p.evictions, dt));
    ltps.push_back(rate(s.lookup_tokens, p.lookup_tokens, dt));
    htps.push_back(rate(s.hit_tokens, p.hit_tokens, dt));
    const uint64_t looked = s.lookup_tokens >= p.lookup_tokens ? s.lookup_tokens - p.lookup_tokens : 0;
    const uint64_t hits = s.hit_tokens >= p.hit_tokens ? s.hit_tokens - p.hit_tokens : 0;
    if (looked > 0) {
      hit.push_back(static_cast<double>(std::min(hits, looked)) / static_cast<double>(looked));
    } else {
      hit.push_back(nullptr);
    }
  }
  json out = {{"interval_seconds", interval_seconds},
              {"capacity", capacity_},
              {"t", std::move(t)},
              {"l1_used_bytes", std::move(used)},
              {"l1_capacity_bytes", std::move(cap)},
              {"l1_usage_ratio", std::move(ratio)},
              {"l1_entries", std::move(entries)},
              {"instances", std::move(instances)},
              {"store_bytes_per_second", std::move(store_bps)},
              {"retrieve_bytes_per_second", std::move(retrieve_bps)},
              {"requests_per_second", std::move(rps)},
              {"lookups_per_second", std::move(lps)},
              {"stores_per_second", std::move(sps)},
              {"retrieves_per_second", std::move(rtps)},
              {"evictions_per_second", std::move(eps)},
              {"lookup_tokens_per_second", std::move(ltps)},
              {"hit_tokens_per_second", std::move(htps)},
              {"hit_ratio", std::move(hit)}};
  return out.dump();
}

}  // namespace kvd::http
