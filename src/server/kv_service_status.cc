// KvService's read-only status accessors (/status, /metrics, the dashboard). Kept apart
// from the request paths: nothing here changes state, and every lock is held only long
// enough to copy plain data out.
#include <algorithm>
#include <sstream>
#include <tuple>

#include "server/kv_service.h"

namespace kvd::server {
namespace {

std::string EngineDrivenLayout(const Instance& inst) {
  std::ostringstream os;
  os << "engine-driven object [";
  const WorkerCopies& w = inst.worker();
  for (size_t i = 0; i < w.object_shape.size(); ++i) {
    os << (i ? ", " : "") << w.object_shape[i];
  }
  os << "] " << w.dtype;
  return os.str();
}

}  // namespace

ServiceStatus KvService::CountsSnapshot() const {
  ServiceStatus st;
  st.sessions = sessions_.size();
  st.session_bytes = sessions_.bytes();
  st.sessions_evicted = sessions_.evicted();
  const keys::ChunkKeyMemo::Stats memo = sessions_.chunk_key_memo_stats();
  st.chunk_key_memo_hits = memo.hits;
  st.chunk_key_memo_misses = memo.misses;
  st.chunk_key_memo_bytes = memo.bytes;
  std::tie(st.pending_engine_stores, st.pending_engine_retrieves) = worker_copy_.PendingCounts();
  st.device_copies_in_flight = kvd_copy_.copies_in_flight();
  return st;
}

std::vector<metrics::CollectorHandle> KvService::RegisterStatusMetrics(metrics::Registry& registry) const {
  using metrics::Kind;
  static constexpr metrics::StatsFamily<ServiceStatus> kFamilies[] = {
      {"kvd_active_sessions", Kind::kGauge, "Live request sessions.",
       [](const ServiceStatus& s) { return static_cast<double>(s.sessions); }},
      {"kvd_session_bytes", Kind::kGauge, "Bytes the live request sessions hold (token ids, hashes).",
       [](const ServiceStatus& s) { return static_cast<double>(s.session_bytes); }},
      {"kvd_sessions_evicted_total", Kind::kCounter,
       "Request sessions dropped to stay within --max-sessions / --max-session-memory-mb.",
       [](const ServiceStatus& s) { return static_cast<double>(s.sessions_evicted); }},
      {"kvd_chunk_key_memo_hits_total", Kind::kCounter,
       "Chunk keys found in the memo of recently hashed chunks (not hashed again).",
       [](const ServiceStatus& s) { return static_cast<double>(s.chunk_key_memo_hits); }},
      {"kvd_chunk_key_memo_misses_total", Kind::kCounter, "Chunk keys hashed (and remembered).",
       [](const ServiceStatus& s) { return static_cast<double>(s.chunk_key_memo_misses); }},
      {"kvd_chunk_key_memo_bytes", Kind::kGauge, "Memory of the chunk-key memo (--chunk-key-memo-mb).",
       [](const ServiceStatus& s) { return static_cast<double>(s.chunk_key_memo_bytes); }},
  };
  std::vector<metrics::CollectorHandle> handles =
      metrics::AddStatsFamilies(registry, kFamilies, [this] { return CountsSnapshot(); });
  handles.push_back(registry.AddCollected(
      {"kvd_lookup_results", "LOOKUP results held until QUERY_PREFETCH_STATUS takes them (or running).",
       Kind::kGauge, {}, {}},
      [this](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(lookups_.results().size())); }));
  handles.push_back(registry.AddCollected(
      {"kvd_lookup_results_evicted_total",
       "LOOKUP results dropped untaken to stay within --max-sessions / --max-session-memory-mb.",
       Kind::kCounter, {}, {}},
      [this](metrics::SeriesSink& sink) {
        sink.Add(static_cast<double>(lookups_.results().evicted()));
      }));
  handles.push_back(registry.AddCollected(
      {"kvd_registered_instances", "Registered worker instances.", Kind::kGauge, {}, {}},
      [this](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(registry_.size())); }));
  handles.push_back(registry.AddCollected(
      {"kvd_engine_driven_pending_operations",
       "Engine-driven PREPARE_STORE / PREPARE_RETRIEVE awaiting their COMMIT, by op.", Kind::kGauge,
       {"op"}, {}},
      [this](metrics::SeriesSink& sink) {
        const auto [stores, retrieves] = worker_copy_.PendingCounts();
        sink.Add({"store"}, static_cast<double>(stores));
        sink.Add({"retrieve"}, static_cast<double>(retrieves));
      }));
  return handles;
}

ServiceStatus KvService::StatusSnapshot() {
  ServiceStatus st = CountsSnapshot();
  const int64_t now = clock_->NowNanos();
  // Describe() formats strings: done outside the registry's lock, on the shared, immutable
  // instances.
  for (const auto& e : registry_.Snapshot()) {
    const Instance& inst = *e.instance;
    InstanceStatus s;
    s.instance_id = inst.id;
    s.engine_driven = inst.engine_driven();
    s.model_name = inst.model_name;
    s.world_size = inst.world_size;
    s.layout = inst.engine_driven() ? EngineDrivenLayout(inst) : inst.kvd().layout.Describe();
    s.object_bytes = inst.object_bytes;
    s.num_mappings = inst.engine_driven() ? 0 : inst.kvd().num_mappings;
    s.idle_seconds = static_cast<double>(std::max<int64_t>(0, now - e.last_seen_ns)) * 1e-9;
    s.pinged = e.pinged;
    st.instances.push_back(std::move(s));
  }
  return st;
}

}  // namespace kvd::server
