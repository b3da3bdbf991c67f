// RespTier: the `resp` adapter (one Redis/Valkey server) and the `valkey` adapter
// (standalone, or a Redis/Valkey Cluster with cluster_mode). Objects are string values under
// lmcache 0.5.6's keys (object_key.h: RespKey, behind "<key_prefix>@" when set), raw bytes.
//
// PROTOCOL. Debian's hiredis (RespConnection) speaks RESP; this file adds what hiredis lacks:
// cluster slot routing (cluster_slots.h) from CLUSTER SLOTS (CLUSTER SHARDS where SLOTS is
// unknown), MOVED (the slot map is updated and re-read), ASK (ASKING then the command, once),
// TRYAGAIN/CLUSTERDOWN (retried after a pause, map re-read). A node that cannot be reached is
// backed off (0.2 s doubling to 5 s) and the map is re-read from any reachable node or seed,
// so a failed-over slot is found at its new master; a node that comes back is used again.
//
// COMMANDS. Store: SET key value NX [EX ttl_seconds] (objects are immutable: an existing key
// answers OK with 0 bytes). Exists: EXISTS, pipelined per node. Load: GET, exactly the
// expected size or Internal; the value is read from the socket into the destination (no
// reply object, no second copy) and the value of a SET is written from the caller's bytes.
// Delete: STRLEN + DEL. Scan: SCAN over every master, then STRLEN.
//
// INTEGRITY (issue 27, finding 4). lmcache's values carry no checksum, so beside each object
// it writes kvd SETs a sum key (SumKey: "<key>.kvdsum" or "{<key>}.kvdsum", in the object's
// hash slot, so on the object's node in a cluster) holding "kvdsum1 <size> <crc32c>", with
// the same TTL. A load GETs the sum key first (one more small round trip), then the object:
// bytes that differ from it are Internal (a counted corrupt miss), so a value overwritten in
// place with same-size bytes is not served; an object without one (lmcache's) is read
// unverified, as before. Delete removes both; Scan skips sum keys. This guards against
// writers that do not know of the sum key, not against one that rewrites both.
//
// THREADS. num_workers threads, each owning one connection per node it talks to; store and
// load items of one batch are spread over them, an exists batch runs on one. Nothing blocks
// the caller: an unreachable server makes calls answer Unavailable after at most
// connection_timeout (first attempt) and then at once while backed off. Create() never waits
// for the server: kvd starts with the tier unreachable and keeps retrying.
//
// SHUTDOWN (issue 27, finding 11). Close() lets queued and running operations finish for at
// most close_grace_s (5 s). What is left then is abandoned: queued operations answer
// Unavailable without running, running ones are interrupted (their sockets are shut down, so
// a server that accepts connections and never answers, e.g. one stopped with SIGSTOP, cannot
// hold them) and are not retried; the count is logged and kept in abandoned(). A connection
// attempt already under way when the grace ends may still take up to connection_timeout
// (plus request_timeout for AUTH/SELECT) before it gives up.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "l2/cluster_slots.h"
#include "l2/resp_connection.h"
#include "l2/tier.h"

namespace kvd::l2 {

struct RespTierOptions {
  std::string type = "resp";          // "resp" or "valkey": only reported
  std::vector<RespEndpoint> seeds;    // resp: one; valkey: startup_nodes
  bool cluster = false;
  std::string key_prefix;
  std::optional<int64_t> ttl_seconds;
  RespConnectOptions connect;
  int num_workers = 8;
  double close_grace_s = 5;  // Close(): how long unfinished operations may still run
};

// The sum key kvd keeps beside object key `key` (see INTEGRITY above).
std::string SumKey(const std::string& key);

class RespTier final : public Tier {
 public:
  static Result<std::unique_ptr<RespTier>> Create(const RespTierOptions& options);
  ~RespTier() override;

  std::string_view type() const override { return options_.type; }
  std::string Describe() const override;
  void Store(std::vector<StoreItem> items, Done done) override;
  void Exists(std::vector<ObjectKey> keys, Done done) override;
  void Load(std::vector<LoadItem> items, Done done) override;
  void Delete(std::vector<ObjectKey> keys, Done done) override;
  void Scan(ScanDone done) override;
  TierHealth Health() const override;
  void Close() override;

  // Counters for tests and /status.
  uint64_t redirects() const { return redirects_.load(); }
  uint64_t map_refreshes() const { return map_refreshes_.load(); }
  uint64_t reconnects() const { return reconnects_.load(); }
  // Operations Close() abandoned (queued or running when its grace ended).
  uint64_t abandoned() const { return abandoned_.load(); }
  // Loads checked against the checksum kvd wrote beside the object, loads of objects without
  // one (written by lmcache, or the checksum write failed), and loads refused because the
  // bytes differ from it (answered Internal: a corrupt miss in the TierSet's counters).
  uint64_t verified() const { return verified_.load(); }
  uint64_t unverified() const { return unverified_.load(); }
  uint64_t checksum_mismatches() const { return checksum_mismatches_.load(); }

 private:
  struct Worker {
    // By "host:port". Used by the worker's own thread; changed (and a connection closed)
    // only with `mu` held, which Close() takes to interrupt the connections. Not
    // KVD_GUARDED_BY(mu): the worker's own thread reads it without `mu` (only it writes).
    std::map<std::string, std::unique_ptr<RespConnection>> conns;
    Mutex mu;
  };
  using Task = std::function<void(Worker&)>;
  struct Queued {
    Task task;
    std::function<void()> on_closed;  // answers the task's callers when it never runs
  };

  explicit RespTier(const RespTierOptions& options);
  void Submit(Task task, std::function<void()> on_closed) KVD_EXCLUDES(q_mu_);
  void RunWorker() KVD_EXCLUDES(q_mu_);

  // One command on the node that owns `key` (cluster) or the server, following redirects,
  // reconnecting and re-reading the slot map as needed.
  // `sink`: see RespConnection::Command (a GET read into its destination).
  Result<ReplyPtr> Run(Worker& w, std::string_view key, const std::vector<RespArg>& args,
                       BulkSink* sink = nullptr);
  Result<RespConnection*> Conn(Worker& w, const RespEndpoint& ep);
  void DropConn(Worker& w, const RespEndpoint& ep, const Status& why);
  std::optional<RespEndpoint> Route(std::string_view key);
  // Re-reads the slot map (cluster) from a reachable node; rate-limited unless forced.
  void RefreshMap(Worker& w, bool force);
  std::vector<RespEndpoint> Masters();
  ItemResult StoreOne(Worker& w, const StoreItem& item);
  ItemResult LoadOne(Worker& w, const LoadItem& item);
  std::vector<ItemResult> ExistsBatch(Worker& w, const std::vector<ObjectKey>& keys);
  void NoteError(const std::string& what) KVD_EXCLUDES(health_mu_);
  void NoteOk() KVD_EXCLUDES(health_mu_);

  const RespTierOptions options_;

  Mutex q_mu_;
  CondVar q_cv_;
  CondVar idle_cv_;  // Close() waits on it for the queue to drain
  std::deque<Queued> queue_ KVD_GUARDED_BY(q_mu_);
  bool closed_ KVD_GUARDED_BY(q_mu_) = false;
  int running_ KVD_GUARDED_BY(q_mu_) = 0;  // tasks being run
  std::vector<Worker*> workers_ KVD_GUARDED_BY(q_mu_);  // each worker while its thread runs
  std::vector<std::thread> threads_;
  // Set once Close()'s grace ended: no reconnects, no retries, nothing more is waited for.
  std::atomic<bool> abandon_{false};
  std::atomic<uint64_t> abandoned_{0};

  // A reader/writer lock: routing reads the map on every command, a refresh writes it.
  mutable SharedMutex map_mu_;
  SlotMap map_ KVD_GUARDED_BY(map_mu_);
  bool have_map_ KVD_GUARDED_BY(map_mu_) = false;
  int64_t map_read_ns_ KVD_GUARDED_BY(map_mu_) = 0;

  Mutex backoff_mu_;
  struct Backoff {
    int64_t until_ns = 0;
    int64_t step_ns = 0;
    Status last;  // why the last connect failed
  };
  std::map<std::string, Backoff> backoff_ KVD_GUARDED_BY(backoff_mu_);

  mutable Mutex health_mu_;
  std::string last_error_ KVD_GUARDED_BY(health_mu_);
  int64_t last_error_ns_ KVD_GUARDED_BY(health_mu_) = 0;
  bool ever_ok_ KVD_GUARDED_BY(health_mu_) = false;
  std::atomic<bool> last_ok_{false};

  std::atomic<uint64_t> redirects_{0}, map_refreshes_{0}, reconnects_{0};
  std::atomic<uint64_t> verified_{0}, unverified_{0}, checksum_mismatches_{0};
};

}  // namespace kvd::l2
