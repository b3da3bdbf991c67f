// The http module's only view of the server: StatsSource (what routes read) and AdminPort
// (what the admin routes change), narrow interfaces the process (src/cli/service_stats.cc)
// implements over KvService and the metrics registry, and the plain-data Snapshot. The http
// module never includes server headers.
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

// What the routes show: the registered workers, and every family of the metrics registry
// (common/metrics.h), counters net of the last /metrics/reset. /metrics, /status, the
// dashboard and its time series all read the families by name; the families belong to the
// modules that own the numbers (L1, the service, the request loop, the tiers, ...).
struct Snapshot {
  int64_t chunk_size = 0;
  std::vector<InstanceView> instances;  // ordered by instance id
  std::vector<metrics::FamilySnapshot> families;
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
  // histograms are not touched).
  virtual void ResetMetrics() = 0;
  // Deletes `keys` from tier `index` (waits, bounded): deleted = keys that were there.
  virtual Result<DeleteResult> DeleteL2Objects(size_t index, const std::vector<ObjectKeyRef>& keys) = 0;
};

}  // namespace kvd::http
