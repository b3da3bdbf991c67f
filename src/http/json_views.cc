#include "http/json_views.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "http/prometheus.h"

namespace kvd::http {

using json = nlohmann::ordered_json;

namespace {

// Model names come from clients: never let invalid UTF-8 throw while serialising.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A counter or gauge series as a JSON count (0 when absent).
uint64_t Count(const std::vector<metrics::FamilySnapshot>& f, const std::string& name,
               const std::vector<std::string>& labels) {
  const metrics::Series* s = metrics::FindSeries(f, name, labels);
  return s == nullptr || !(s->value > 0) ? 0 : static_cast<uint64_t>(std::llround(s->value));
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
  json ops = json::object();
  json in_flight = json::object();
  for (const auto& o : s.ops) {
    ops[o.name] = {
        {"requests", o.requests},
        {"in_flight", o.in_flight},
        {"mean_ms", o.requests ? 1e3 * o.latency_sum_seconds / static_cast<double>(o.requests) : 0.0},
        {"p50_ms", 1e3 * HistogramQuantile(s.latency_bounds, o.buckets, 0.5)},
        {"p99_ms", 1e3 * HistogramQuantile(s.latency_bounds, o.buckets, 0.99)}};
    if (o.in_flight > 0) in_flight[o.name] = o.in_flight;
  }
  const auto& l1 = s.l1;
  const auto& c = s.counters;
  json j = {
      {"is_healthy", health.healthy},
      {"server", "kvd"},
      {"version", version},
      {"uptime_seconds", s.uptime_seconds},
      {"chunk_size", s.chunk_size},
      {"l1",
       {{"used_bytes", l1.used_bytes},
        {"total_bytes", l1.capacity_bytes},
        {"usage_ratio", l1.capacity_bytes ? static_cast<double>(l1.used_bytes) /
                                                static_cast<double>(l1.capacity_bytes)
                                          : 0.0},
        {"entries", l1.entries},
        {"locked_entries", l1.locked_entries},
        {"resident_objects", l1.resident_objects},
        {"staging_objects", l1.staging_objects},
        {"pinned_objects", l1.pinned_objects},
        {"evictions", l1.evictions},
        {"evicted_bytes", l1.evicted_bytes},
        {"populated_bytes", l1.populated_bytes},
        {"page_kind", l1.page_kind},
        {"lookup_locks", l1.lookup_locks},
        {"shed_lookup_locks", l1.shed_lookup_locks}}},
      {"instances", std::move(instances)},
      {"tiers", TiersJson(s.families)},
      {"l2_policies", L2PoliciesJson(s.families)},
      {"sessions", s.sessions},
      {"session_bytes", s.session_bytes},
      {"sessions_evicted", s.sessions_evicted},
      {"pending_engine_driven", {{"stores", s.pending_engine_stores},
                                 {"retrieves", s.pending_engine_retrieves}}},
      {"counters",
       {{"lookups", c.lookups},
        {"lookup_tokens", c.lookup_tokens},
        {"hit_tokens", c.hit_tokens},
        {"hit_ratio", c.lookup_tokens ? static_cast<double>(c.hit_tokens) /
                                            static_cast<double>(c.lookup_tokens)
                                      : 0.0},
        {"stores", c.stores},
        {"store_failures", c.store_failures},
        {"stored_chunks", c.stored_chunks},
        {"stored_bytes", c.stored_bytes},
        {"retrieves", c.retrieves},
        {"retrieve_failures", c.retrieve_failures},
        {"retrieved_chunks", c.retrieved_chunks},
        {"retrieved_bytes", c.retrieved_bytes},
        {"requests", s.total_requests()},
        {"unknown_ops", s.unknown_ops}}},
      {"ops", std::move(ops)},
      {"kv_events", KvEventsJson(s.families)},
      {"metrics", FamiliesJson(s.families)},
  };
  if (!health.healthy) j["unhealthy_reason"] = health.reason;
  if (!in_flight.empty()) j["in_flight"] = std::move(in_flight);
  return Dump(j);
}

std::string VersionJson(const std::string& version) {
  return Dump({{"name", "kvd"}, {"version", version}, {"lmcache_protocol", "0.5.6"}});
}

}  // namespace kvd::http
