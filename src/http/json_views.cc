#include "http/json_views.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "http/prometheus.h"

namespace kvd::http {

using json = nlohmann::ordered_json;

namespace {

// Model names come from clients: never let invalid UTF-8 throw while serialising.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

uint64_t AsCount(double v) { return v > 0 ? static_cast<uint64_t>(std::llround(v)) : 0; }

// A counter or gauge series as a JSON count (0 when absent).
uint64_t Count(const std::vector<metrics::FamilySnapshot>& f, const std::string& name,
               const std::vector<std::string>& labels) {
  const metrics::Series* s = metrics::FindSeries(f, name, labels);
  return s == nullptr ? 0 : AsCount(s->value);
}

double Ratio(uint64_t part, uint64_t whole) {
  return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// lmcache-shaped "l1" key, read from the L1 cache's families (l1/l1_metrics.h).
json L1Json(const std::vector<metrics::FamilySnapshot>& f) {
  auto v = [&](const char* family) { return Count(f, family, {}); };
  std::string page_kind = "regular";
  const metrics::FamilySnapshot* info = metrics::FindFamily(f, "kvd_l1_info");
  if (info != nullptr && !info->series.empty() && info->series[0].label_values.size() == 1) {
    page_kind = info->series[0].label_values[0];
  }
  const uint64_t used = v("lmcache_mp_l1_memory_usage_bytes"), total = v("kvd_l1_capacity_bytes");
  return {{"used_bytes", used},
          {"total_bytes", total},
          {"usage_ratio", Ratio(used, total)},
          {"entries", v("kvd_l1_entries")},
          {"locked_entries", v("kvd_l1_locked_entries")},
          {"resident_objects", v("kvd_l1_resident_objects")},
          {"staging_objects", v("kvd_l1_staging_objects")},
          {"pinned_objects", v("kvd_l1_pinned_objects")},
          {"evictions", v("lmcache_mp_l1_evicted_chunks_total")},
          {"evicted_bytes", v("kvd_l1_evicted_bytes_total")},
          {"populated_bytes", v("kvd_l1_populated_bytes")},
          {"page_kind", page_kind},
          {"lookup_locks", v("kvd_l1_lookup_locks")},
          {"shed_lookup_locks", v("kvd_l1_lookup_locks_shed_total")}};
}

// The request totals: lookups summed over their (cache_salt, model_name) series, the store
// and retrieve counters, and every op's requests.
json CountersJson(const std::vector<metrics::FamilySnapshot>& f) {
  auto v = [&](const char* family) { return Count(f, family, {}); };
  auto sum = [&](const char* family) { return AsCount(metrics::SumOf(f, family)); };
  const uint64_t looked = sum("lmcache_mp_lookup_requested_tokens_total");
  const uint64_t hits = sum("lmcache_mp_lookup_hit_tokens_total");
  return {{"lookups", sum("lmcache_mp_lookups_requests_total")},
          {"lookup_tokens", looked},
          {"hit_tokens", hits},
          {"hit_ratio", Ratio(hits, looked)},
          {"stores", v("kvd_store_requests_total")},
          {"store_failures", v("kvd_store_failures_total")},
          {"stored_chunks", v("lmcache_mp_l1_write_chunks_total")},
          {"stored_bytes", v("kvd_stored_bytes_total")},
          {"retrieves", v("kvd_retrieve_requests_total")},
          {"retrieve_failures", v("kvd_retrieve_failures_total")},
          {"retrieved_chunks", v("lmcache_mp_l1_read_chunks_total")},
          {"retrieved_bytes", v("kvd_retrieved_bytes_total")},
          {"requests", sum("kvd_requests_total")},
          {"unknown_ops", v("kvd_unknown_op_requests_total")}};
}

// Per op that has seen requests: count, in flight, mean and quantiles of its latency.
json OpsJson(const std::vector<metrics::FamilySnapshot>& f) {
  json ops = json::object();
  const metrics::FamilySnapshot* requests = metrics::FindFamily(f, "kvd_requests_total");
  const metrics::FamilySnapshot* latency = metrics::FindFamily(f, "kvd_request_duration_seconds");
  if (requests == nullptr) return ops;
  for (const auto& x : requests->series) {
    if (x.label_values.size() != 1) continue;
    const std::string& op = x.label_values[0];
    const uint64_t n = AsCount(x.value);
    const metrics::Series* h = latency ? metrics::FindSeries(f, latency->desc.name, {op}) : nullptr;
    auto ms = [&](double q) { return h ? 1e3 * HistogramQuantile(latency->desc.bounds, h->buckets, q) : 0.0; };
    ops[op] = {{"requests", n},
               {"in_flight", Count(f, "kvd_requests_in_flight", {op})},
               {"mean_ms", n && h ? 1e3 * h->sum / static_cast<double>(n) : 0.0},
               {"p50_ms", ms(0.5)},
               {"p99_ms", ms(0.99)}};
  }
  return ops;
}

// The tiers behind L1, read from the families the tiers registered (l2/tier_metrics.h):
// one entry per kvd_l2_tier_info series, in registration (priority) order.
json TiersJson(const std::vector<metrics::FamilySnapshot>& f) {
  json out = json::array();
  const metrics::FamilySnapshot* info = metrics::FindFamily(f, "kvd_l2_tier_info");
  if (info == nullptr) return out;
  for (const auto& series : info->series) {
    if (series.label_values.size() < 4) continue;
    const std::string& name = series.label_values[0];
    auto v = [&](const char* family) { return Count(f, family, {name}); };
    auto why = [&](const char* family, const char* reason) { return Count(f, family, {name, reason}); };
    out.push_back({{"name", name},
                   {"type", series.label_values[1]},
                   {"describe", series.label_values[2]},
                   {"healthy", v("kvd_l2_healthy") == 1},
                   {"health", series.label_values[3]},
                   {"capacity_bytes", v("kvd_l2_capacity_bytes")},
                   {"usage_bytes", v("lmcache_mp_l2_usage_bytes")},
                   {"objects", v("kvd_l2_objects")},
                   {"earlier_runs_scanned", v("kvd_l2_earlier_runs_scanned") == 1},
                   {"store", {{"requests", v("kvd_l2_store_requests_total")},
                              {"objects", v("kvd_l2_store_objects_total")},
                              {"stored_objects", v("kvd_l2_stored_objects_total")},
                              {"stored_bytes", v("kvd_l2_stored_bytes_total")},
                              {"already_present", v("kvd_l2_store_existing_objects_total")},
                              {"failed", why("lmcache_mp_l2_store_failed_chunks_total", "error")},
                              {"no_space", why("lmcache_mp_l2_store_failed_chunks_total", "no_space")},
                              {"skipped_over_budget", v("kvd_l2_store_skipped_chunks_total")},
                              {"in_flight_objects", v("kvd_l2_inflight_store_objects")},
                              {"in_flight_bytes", v("kvd_l2_inflight_store_bytes")}}},
                   {"prefetch", {{"asked_objects", v("kvd_l2_prefetch_asked_objects_total")},
                                 {"found_objects", v("kvd_l2_prefetch_found_objects_total")},
                                 {"lookup_errors", v("kvd_l2_lookup_errors_total")},
                                 {"loaded_objects", v("kvd_l2_loaded_objects_total")},
                                 {"loaded_bytes", v("kvd_l2_loaded_bytes_total")},
                                 {"missing", why("lmcache_mp_l2_load_failed_chunks_total", "not_found")},
                                 {"corrupted", why("lmcache_mp_l2_load_failed_chunks_total", "corrupted")},
                                 {"unavailable", why("lmcache_mp_l2_load_failed_chunks_total", "unavailable")},
                                 {"in_flight_objects", v("kvd_l2_inflight_load_objects")}}},
                   {"evicted_objects", v("kvd_l2_evicted_objects_total")},
                   {"evicted_bytes", v("kvd_l2_evicted_bytes_total")}});
  }
  return out;
}

// The store and prefetch policies' state (empty policies and zeros without tiers).
json L2PoliciesJson(const std::vector<metrics::FamilySnapshot>& f) {
  std::string store_policy, prefetch_policy;
  const metrics::FamilySnapshot* info = metrics::FindFamily(f, "kvd_l2_policy_info");
  if (info != nullptr && !info->series.empty() && info->series[0].label_values.size() == 2) {
    store_policy = info->series[0].label_values[0];
    prefetch_policy = info->series[0].label_values[1];
  }
  auto v = [&](const char* family) { return Count(f, family, {}); };
  return {{"store_policy", store_policy},
          {"prefetch_policy", prefetch_policy},
          {"prefetch_requests", v("lmcache_mp_l2_prefetch_lookup_requests_total")},
          {"prefetch_hit_chunks", v("kvd_l2_prefetch_hit_chunks_total")},
          {"prefetch_failed_chunks", v("kvd_l2_prefetch_failed_chunks_total")},
          {"prefetch_timeouts", v("kvd_l2_prefetch_timeouts_total")},
          {"active_prefetch_jobs", v("lmcache_mp_active_prefetch_jobs")},
          {"queued_prefetch_jobs", v("kvd_l2_queued_prefetch_jobs")},
          {"temporary_chunks", v("kvd_l2_temporary_chunks")},
          {"skip_l1_removed_chunks", v("kvd_l2_skip_l1_removed_chunks_total")},
          {"skip_l1_waiting_chunks", v("kvd_l2_skip_l1_waiting_chunks")}};
}

// lmcache's /status key "kv_events", read from the KV-event log's registered families
// (absent when the log is off).
json KvEventsJson(const std::vector<metrics::FamilySnapshot>& f) {
  const bool enabled = metrics::FindFamily(f, "lmcache_mp_kv_events_log_depth") != nullptr;
  auto v = [&](const char* name) { return static_cast<int64_t>(metrics::ValueOf(f, name)); };
  return {{"enabled", enabled},
          {"incarnation", v("kvd_kv_events_incarnation")},
          {"log_depth", v("lmcache_mp_kv_events_log_depth")},
          {"log_capacity", v("kvd_kv_events_log_capacity")},
          {"next_seq", enabled ? v("kvd_kv_events_next_seq") : 1},
          {"lost_markers", 0},
          {"unbound_stores", v("kvd_kv_events_unbound_stores_total")},
          {"subscribers", v("kvd_kv_events_subscribers")},
          {"stored_records", v("kvd_kv_events_stored_records_total")},
          {"removed_records", v("kvd_kv_events_removed_records_total")}};
}

// Every registered family: {name: {type, help, series: [{labels, value} | {labels, count,
// sum, buckets}]}}. Integral values are written as integers.
json FamiliesJson(const std::vector<metrics::FamilySnapshot>& families) {
  json out = json::object();
  for (const auto& f : families) {
    json series = json::array();
    for (const auto& x : f.series) {
      json labels = json::object();
      for (size_t i = 0; i < f.desc.label_names.size() && i < x.label_values.size(); ++i) {
        labels[f.desc.label_names[i]] = x.label_values[i];
      }
      json one = {{"labels", std::move(labels)}};
      if (f.desc.kind == metrics::Kind::kHistogram) {
        one["count"] = x.count();
        one["sum"] = x.sum;
        one["buckets"] = x.buckets;
      } else if (std::isfinite(x.value) && std::fabs(x.value) < 9.0e18 && x.value == std::trunc(x.value)) {
        one["value"] = static_cast<int64_t>(x.value);
      } else {
        one["value"] = x.value;
      }
      series.push_back(std::move(one));
    }
    json fam = {{"type", metrics::KindName(f.desc.kind)}, {"help", f.desc.help}, {"series", std::move(series)}};
    if (f.desc.kind == metrics::Kind::kHistogram) fam["bounds"] = f.desc.bounds;
    out[f.desc.name] = std::move(fam);
  }
  return out;
}

}  // namespace

std::string StatusJson(const Snapshot& s, const Health& health, const std::string& version) {
  const std::vector<metrics::FamilySnapshot>& f = s.families;
  json instances = json::array();
  for (const auto& i : s.instances) {
    instances.push_back({{"instance_id", i.instance_id},
                         // JavaScript numbers lose 64-bit ids (lmcache's are random 63-bit)
                         {"instance_id_str", std::to_string(i.instance_id)},
                         {"mode", i.engine_driven ? "engine_driven" : "lmcache_driven"},
                         {"model_name", i.model_name},
                         {"world_size", i.world_size},
                         {"layout", i.layout},
                         {"object_bytes_per_chunk", i.object_bytes},
                         {"idle_seconds", i.idle_seconds},
                         {"pinged", i.pinged}});
  }
  json j = {
      {"is_healthy", health.healthy},
      {"server", "kvd"},
      {"version", version},
      {"uptime_seconds", metrics::ValueOf(f, "kvd_uptime_seconds")},
      {"chunk_size", s.chunk_size},
      {"l1", L1Json(f)},
      {"instances", std::move(instances)},
      {"tiers", TiersJson(f)},
      {"l2_policies", L2PoliciesJson(f)},
      {"sessions", Count(f, "kvd_active_sessions", {})},
      {"session_bytes", Count(f, "kvd_session_bytes", {})},
      {"sessions_evicted", Count(f, "kvd_sessions_evicted_total", {})},
      {"pending_engine_driven", {{"stores", Count(f, "kvd_engine_driven_pending_operations", {"store"})},
                                 {"retrieves", Count(f, "kvd_engine_driven_pending_operations", {"retrieve"})}}},
      {"counters", CountersJson(f)},
      {"ops", OpsJson(f)},
      {"kv_events", KvEventsJson(f)},
      {"metrics", FamiliesJson(f)},
  };
  if (!health.healthy) j["unhealthy_reason"] = health.reason;
  json in_flight = json::object();
  if (const metrics::FamilySnapshot* fam = metrics::FindFamily(f, "kvd_requests_in_flight")) {
    for (const auto& x : fam->series) {
      if (x.label_values.size() == 1 && x.value > 0) in_flight[x.label_values[0]] = AsCount(x.value);
    }
  }
  if (!in_flight.empty()) j["in_flight"] = std::move(in_flight);
  return Dump(j);
}

std::string VersionJson(const std::string& version) {
  return Dump({{"name", "kvd"}, {"version", version}, {"lmcache_protocol", "0.5.6"}});
}

}  // namespace kvd::http
