// The http module's only view of the server: StatsSource (what routes read) and AdminPort
// (what the admin routes change), narrow interfaces the process (src/cli/main.cc) implements
// over KvService, the L1 cache and the request metrics, and the plain-data Snapshot. The http module never includes server headers.
//
// Threads: every method may be called concurrently from HTTP worker threads and from the
// HttpServer's sampler thread; implementations must be thread-safe and should not block
// for long (a healthcheck may wait for a bounded probe).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "common/status.h"

namespace kvd::http {

struct Health {
  bool healthy = true;
  std::string reason;  // why not, when !healthy
};

struct L1View {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t entries = 0;           // chunk entries in the table
  uint64_t locked_entries = 0;    // entries that cannot be evicted right now
  uint64_t resident_objects = 0;
  uint64_t staging_objects = 0;
  uint64_t pinned_objects = 0;
  uint64_t evictions = 0;         // entries evicted since start
  uint64_t evicted_bytes = 0;
  uint64_t populated_bytes = 0;   // pool bytes populated ahead of use (--l1-populate)
  std::string page_kind = "regular";  // "regular", "hugetlb" or "thp" (--l1-use-hugepages)
  uint64_t lookup_locks = 0;      // lookup requests holding read locks
  uint64_t shed_lookup_locks = 0; // holds released early at the read-lock bound (since start)
};

// Monotonic counters since the process started (the lookup ones: every label set summed).
struct CacheCounters {
  uint64_t lookups = 0;           // LOOKUP requests
  uint64_t lookup_tokens = 0;     // tokens of full chunks looked up
  uint64_t hit_tokens = 0;        // of which hits
  uint64_t hit_l1_tokens = 0;     // ... found in L1
  uint64_t hit_l2_tokens = 0;     // ... brought into L1 from the tiers
  uint64_t stores = 0;            // STORE / PREPARE_STORE requests
  uint64_t store_failures = 0;
  uint64_t stored_chunks = 0;
  uint64_t stored_bytes = 0;
  uint64_t retrieves = 0;         // RETRIEVE / PREPARE_RETRIEVE requests
  uint64_t retrieve_failures = 0;
  uint64_t retrieved_chunks = 0;
  uint64_t retrieved_bytes = 0;
};

struct InstanceView {
  int64_t instance_id = 0;
  bool engine_driven = false;
  std::string model_name;
  int64_t world_size = 0;
  std::string layout;             // one-line description of the registered layout
  uint64_t object_bytes = 0;      // bytes of one chunk object
  double idle_seconds = 0;
  bool pinged = false;
};

// Server time of one phase (decode, hash, index, copy) of an op's requests.
struct PhaseView {
  std::string name;
  std::vector<uint64_t> buckets;  // per latency bucket, not cumulative; bounds in Snapshot
  double sum_seconds = 0;
};

struct OpView {
  std::string name;
  uint64_t requests = 0;
  uint64_t in_flight = 0;
  std::vector<uint64_t> buckets;  // per latency bucket, not cumulative; bounds in Snapshot
  double latency_sum_seconds = 0;
  std::vector<PhaseView> phases;  // phases the op's requests went through
  uint64_t refused = 0;           // answered with a failure unread (connection queue bound)
};

// The request loop's thread: how long each wake-up kept every client waiting.
struct LoopView {
  uint64_t iterations = 0;
  std::vector<uint64_t> buckets;  // wall time per wake-up, per latency bucket, not cumulative
  double sum_seconds = 0;
  double longest_seconds = 0;
  double longest_inline_seconds = 0;  // the longest request run on the loop's thread
  std::string longest_inline_op;
};

struct Snapshot {
  double uptime_seconds = 0;
  int64_t chunk_size = 0;
  L1View l1;
  CacheCounters counters;
  std::vector<InstanceView> instances;
  uint64_t sessions = 0;
  uint64_t session_bytes = 0;
  uint64_t sessions_evicted = 0;
  uint64_t chunk_key_memo_hits = 0, chunk_key_memo_misses = 0, chunk_key_memo_bytes = 0;
  uint64_t pending_engine_stores = 0;
  uint64_t pending_engine_retrieves = 0;
  std::vector<double> latency_bounds;  // upper bounds (s) of OpView::buckets; +Inf implied
  std::vector<OpView> ops;             // ops that have seen requests
  uint64_t unknown_ops = 0;
  LoopView loop;
  // Every family of the metrics registry (common/metrics.h), counters net of the last
  // /metrics/reset: rendered generically by /metrics, /status and the dashboard.
  std::vector<metrics::FamilySnapshot> families;

  uint64_t total_requests() const {
    uint64_t n = 0;
    for (const auto& o : ops) n += o.requests;
    return n;
  }
};

// One cache salt's quota (the /quota routes; the IsolatedLRU policy enforces it).
struct QuotaView {
  std::string cache_salt;               // "" is the un-salted traffic ("_default" in URLs)
  std::optional<uint64_t> limit_bytes;  // nullopt: none set (effective limit 0)
  uint64_t usage_bytes = 0;             // L1 bytes the salt's entries hold
};

// One key of DELETE /cache/objects (lmcache's EncodedObjectKey, hash decoded).
struct ObjectKeyRef {
  std::array<uint8_t, 32> chunk_hash{};
  std::string model_name;
  int64_t kv_rank = 0;         // (world << 24) | (rank << 16) | (world << 8) | rank
  int64_t object_group_id = 0;
  std::string cache_salt;
  std::string layout_tag;      // kvd's extension: names a kvd-private tier object (l2/object_key.h)
};

// One tier (--l2-adapter), as GET/DELETE /cache/objects select it.
struct L2AdapterView {
  std::string type;            // lmcache's type_name: "fs", "resp", ...
  std::string name;            // kvd's l2_name: the type, or "<type>#<index>" when repeated
  bool shared = false;
};

// One object a tier holds (lmcache's KeyEntry).
struct L2ObjectView {
  ObjectKeyRef key;
  uint64_t size_bytes = 0;
};

struct DeleteResult {
  uint64_t deleted = 0;  // keys whose L1 entry was removed
  uint64_t skipped = 0;  // keys whose entry is in use (read, pinned or being written)
  std::string error;     // non-empty: the tier failed on some key (lmcache's "ok": false)
};

// What the HTTP routes may read. Every method is read-only: it changes nothing a client of
// kvd could observe (Collect takes counters net of the last reset, but does not reset them).
class StatsSource {
 public:
  virtual ~StatsSource() = default;
  virtual Health CheckHealth() = 0;
  // Copies counters out; takes no lock the request path needs for longer than a few
  // microseconds (safe for /status, /metrics and the per-second sampler alike).
  virtual Snapshot Collect() = 0;
  // Per-cache-salt quotas (GET /quota/{salt}, GET /quota).
  virtual QuotaView GetQuota(const std::string& cache_salt) = 0;
  virtual std::vector<QuotaView> ListQuotas() = 0;  // salts with a limit set
  // The tiers in priority order (empty: no --l2-adapter).
  virtual std::vector<L2AdapterView> L2Adapters() = 0;
  // Every object tier `index` holds (waits for the tier's listing, bounded).
  virtual Result<std::vector<L2ObjectView>> ListL2Objects(size_t index) = 0;
};

// What the routes that change state may do (POST /clear-cache, /cache/clear, /metrics/reset,
// PUT/DELETE /quota, DELETE /cache/objects). Kept apart from StatsSource so that a route
// that only reads cannot change anything, and the admin surface is one list.
class AdminPort {
 public:
  virtual ~AdminPort() = default;
  // Drops every L1 entry (POST /clear-cache). Returns the number of entries removed.
  virtual uint64_t ClearCache() = 0;
  // Per-cache-salt quotas (PUT/DELETE /quota/{salt}). Quotas are soft: writes are never
  // refused; the IsolatedLRU policy evicts what is over at its next round.
  virtual Status SetQuota(const std::string& cache_salt, uint64_t limit_bytes) = 0;
  virtual bool DeleteQuota(const std::string& cache_salt) = 0;  // true: one was set
  // Removes the L1 entries of `keys` that are idle (DELETE /cache/objects, tier l1); absent
  // keys count in neither field.
  virtual DeleteResult DeleteL1Objects(const std::vector<ObjectKeyRef>& keys, bool force) = 0;
  // POST /metrics/reset: counters of later snapshots start from zero again (gauges and
  // latency histograms are not touched).
  virtual void ResetMetrics() = 0;
  // Deletes `keys` from tier `index` (waits, bounded): deleted = keys that were there.
  virtual Result<DeleteResult> DeleteL2Objects(size_t index, const std::vector<ObjectKeyRef>& keys) = 0;
};

}  // namespace kvd::http
