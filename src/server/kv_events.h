// KvEventLog: the server's record of CPU-cache changes for KV-event subscribers (the
// `kv_event_stream` capability of lmcache 0.5.6: vLLM's KV-aware routers learn from it
// which prefixes this server holds and when they go away).
//
// RECORDS. A bounded, sequenced log (seq 1, 2, ...; the oldest records fall off when it is
// full). "stored": one chunk became visible to lookups (its L1 entry completed, every rank
// committed), with its hash, its parent's hash and its tokens. "removed": chunks that had
// been stored left L1 (eviction or clear), one record per model. The tokens come from token
// bindings that the store paths record (Bind) before they commit; a chunk that completes
// without one is counted as unbound and not announced, as in lmcache.
//
// ORDER. As in lmcache, a parent's "stored" record precedes its children's. The store paths
// commit a request's chunks last first (l1::CommitInReverse), so a chunk that completes while
// its parent is bound and not yet complete is held back until the parent's record is written
// (then the children follow, in chain order), or for at most kMaxHoldNanos (FlushHeld: the
// parent's store failed or the parent was already cached); at most kMaxBindings are held.
//
// READING. Read(model, cursor, max) returns the next records of `model` after `cursor`,
// with lmcache's semantics: next_cursor (where to resume), lost (records between the cursor
// and the oldest one were dropped, or the cursor is from the future), incarnation (changes
// when the server restarts). Streams (kv_event_streams.h) are built on top.
//
// THREADS. Every method is thread-safe (one mutex). The L1Listener methods run with the L1
// mutex held (lock order: L1 -> this); they do not call into L1. The wake-up callback runs
// after a record was appended, outside this object's mutex (still under L1's when called
// from a listener method): it must only signal (the ZMQ loop's eventfd). FlushHeld is called
// periodically (the ZMQ loop, every wake-up or at least every 100 ms).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "l1/l1_listener.h"
#include "l1/namespaces.h"
#include "wire/messages.h"

namespace kvd::server {

class KvEventLog final : public l1::L1Listener {
 public:
  using Hash = std::array<uint8_t, 32>;
  static constexpr size_t kMaxBindings = 16384;  // pending token bindings (trimmed by half)
  static constexpr int64_t kMaxHoldNanos = 200'000'000;  // see ORDER

  // capacity >= 1: records kept for replay (--kv-event-log-size). Borrows `clock` (the time
  // records are held back, see ORDER).
  KvEventLog(size_t capacity, const Clock* clock);

  // One chunk a store of `model_name` is about to write: its hash, its parent's (none for
  // the first chunk of a sequence) and its tokens. Bindings are per (model, hash): two
  // models may store chunks with the same hash. A (model, hash) already bound keeps its
  // binding (the tokens of a chained hash do not change).
  struct Binding {
    Hash hash;
    std::optional<Hash> parent;
    std::span<const uint32_t> tokens;
  };
  void Bind(std::string_view model_name, std::span<const Binding> chunks);

  // The cache's namespace table, which names the model of a key (l1_listener.h). Set once,
  // after the cache is created and before it stores anything; not owned, outlives this log.
  void AttachNamespaces(const l1::Namespaces* namespaces) { namespaces_ = namespaces; }

  // l1::L1Listener
  void OnEntryComplete(const l1::ChunkKey& key) override;
  void OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause cause) override;

  // Chunks a P2P load brought into L1 from a peer (p2p/peer_node.h): one record per model,
  // kind "loaded", medium "P2P" (kvd's own; lmcache's adapter announces only medium "CPU"
  // records, so it passes these by). The chunks' "stored" records come as for any chunk.
  void OnLoadedFromPeer(std::span<const l1::ChunkKey> keys);

  // lmcache's read_kv_events. max_events >= 1.
  wire::KvEventBatch Read(const std::string& model_name, int64_t cursor, size_t max_events) const;
  // Writes the records held back longer than kMaxHoldNanos (see ORDER).
  void FlushHeld();
  // The sequence number the next record gets (1 + the newest record's).
  int64_t next_seq() const;
  int64_t incarnation() const { return incarnation_; }

  // Called after each append (see THREADS). Set before records can be appended, or
  // replace at any time. Once SetWakeup returns, the previous callback is not running and
  // is never called again: its owner may then release what it uses (the ZMQ loop closes
  // its eventfd after SetWakeup(nullptr)). Must not be called from the callback.
  void SetWakeup(std::function<void()> wake);

  struct Stats {
    int64_t incarnation = 0;
    size_t log_depth = 0;
    size_t log_capacity = 0;
    int64_t next_seq = 1;
    uint64_t unbound_stores = 0;  // chunks completed without a token binding
    uint64_t stored_records = 0;
    uint64_t removed_records = 0;
    uint64_t loaded_records = 0;  // kind "loaded" (from a peer)
    size_t bindings = 0;
    size_t subscribers = 0;
    size_t held = 0;  // stored records waiting for their parent's (see ORDER)
  };
  Stats stats() const;
  // Registers the log's families (lmcache_mp_kv_events_log_depth, kvd_kv_events_*) with
  // `registry`, which must outlive this log; they are removed when the log is destroyed.
  // Call once.
  void RegisterMetrics(metrics::Registry& registry);
  // Streams open now (KvEventStreams reports it; shown by stats()).
  void set_subscribers(size_t n);

 private:
  std::string ModelOf(const l1::ChunkKey& key) const;
  void AppendLocked(wire::KvEventRecord record) KVD_REQUIRES(mu_);
  // One record of `kind` and `medium` per model of `keys`; how many it appended.
  size_t AppendPerModelLocked(std::span<const l1::ChunkKey> keys, const char* kind,
                              const char* medium) KVD_REQUIRES(mu_);
  // Appends a stored record, then the records held back waiting for it, in chain order.
  void AppendStoredChainLocked(wire::KvEventRecord record) KVD_REQUIRES(mu_);
  void Wake() KVD_EXCLUDES(mu_, wake_mu_);

  struct HashKey {
    size_t operator()(const Hash& h) const noexcept;
  };
  // A chunk of one model: bindings and held records are per model (the model as the store
  // names it, which is the model ModelOf() reads back from the chunk's L1 key).
  struct ModelHash {
    std::string model;
    Hash hash{};
    bool operator==(const ModelHash&) const = default;
  };
  struct ModelHashKey {
    size_t operator()(const ModelHash& k) const noexcept;
  };
  struct PendingBinding {
    std::optional<Hash> parent;
    std::vector<uint32_t> tokens;
    std::list<ModelHash>::iterator age;  // position in binding_order_
  };

  struct Held {
    wire::KvEventRecord record;
    int64_t since_ns = 0;
  };

  const size_t capacity_;
  const Clock* const clock_;
  const int64_t incarnation_;
  const l1::Namespaces* namespaces_ = nullptr;  // set before the first store (AttachNamespaces)

  mutable Mutex mu_;
  std::deque<wire::KvEventRecord> log_ KVD_GUARDED_BY(mu_);
  int64_t next_seq_ KVD_GUARDED_BY(mu_) = 1;
  std::unordered_map<ModelHash, PendingBinding, ModelHashKey> bindings_ KVD_GUARDED_BY(mu_);
  std::list<ModelHash> binding_order_ KVD_GUARDED_BY(mu_);  // oldest first
  // Stored records held back, by the (model, parent hash) they wait for (see ORDER).
  std::unordered_map<ModelHash, std::vector<Held>, ModelHashKey> held_ KVD_GUARDED_BY(mu_);
  std::unordered_set<ModelHash, ModelHashKey> held_hashes_ KVD_GUARDED_BY(mu_);  // their keys
  size_t num_held_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t unbound_stores_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t stored_records_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t removed_records_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t loaded_records_ KVD_GUARDED_BY(mu_) = 0;
  // Lock order: L1 -> wake_mu_ (Wake runs under L1's mutex from listener methods); never
  // taken with mu_ held. The callback runs with wake_mu_ held (see SetWakeup).
  mutable Mutex wake_mu_;
  std::function<void()> wake_ KVD_GUARDED_BY(wake_mu_);
  size_t subscribers_ KVD_GUARDED_BY(mu_) = 0;
  std::vector<metrics::CollectorHandle> metric_handles_;  // last: unregistered first
};

}  // namespace kvd::server
