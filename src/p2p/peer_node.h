// PeerNode: one kvd's membership of a P2P fleet (docs/p2p.md), between its L1 cache and its
// P2pAgent:
//
//   PUBLISH. As an l1::L1Listener it hears every chunk that becomes complete in L1 (a lookup
//   now hits it) and queues it for the fleet directory; every complete chunk that leaves L1
//   (evicted, cleared) is queued for withdrawal. Directory keys name a chunk as L1 does
//   (ChunkDirectoryKey), so one entry covers every rank's object of the chunk.
//
//   SERVE. Peers ask for objects by their tier name (l2::RespKey of an l2::ObjectKey, layout
//   tag included). An object is served only when (1) its name parses, (2) its model and layout
//   tag are a format this server has registered (AddFormat: a worker of that layout registered
//   here, so the bytes of such an L1 object are what the reader expects), (3) the asked range
//   is the whole object of that format, and (4) its L1 slot is resident: it is pinned
//   (l1::ReadPin) while UCX sends it, and the pin is dropped when the send ends or fails, so a
//   reader that dies leaves no lock behind. An object not in L1 answers NotFound (and only
//   that: readers act on it, see LOAD); an ask this node cannot serve (malformed, a format not
//   registered here, not a whole object) InvalidArgument. Peers that do not present the
//   fleet's secret are refused by the transport before any of this runs (ucx_transport.h).
//
//   LOAD. tier() is an l2::Tier that only loads (Tier::stores() is false), placed last in the
//   server's TierSet, so the usual prefetch reserves L1 slots, loads into them, commits, and
//   QUERY_PREFETCH_STATUS reports the hit. Exists asks the directory (one round trip per
//   call, bounded by lookup_timeout_s); Load asks the directory again for owners it did not
//   just see, reads from one live owner per chunk (bounded by load_timeout_s) and answers a
//   miss for every object that did not arrive whole. An owner that answers NotFound (the
//   chunk is not in its L1: its withdrawal was lost) is removed from that chunk's entry
//   (FleetDirectory::Forget), so a stale entry costs the fleet one failed probe.
//
// THREADS. All methods are thread-safe. The listener methods run under an L1 shard mutex and
// only queue (P2pAgent::Publish/Withdraw take the agent's mutex: lock order L1 shard -> agent).
// `serve` runs on the agent's UCX thread and takes L1 pins there. The tier runs its calls on
// its own worker threads.
//
// OWNERSHIP. The node owns the agent and the tier's workers. Attach(l1) borrows the cache
// until Detach() (also run by the destructor), which closes the tier, leaves the directory
// (the node key is deleted, so its entries die at once), stops the agent (every pin it held
// is dropped) and turns the listener methods into no-ops: call it before the cache is
// destroyed. The node itself, being the cache's listener, may outlive the cache.
// Before Attach, nothing is served or published.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>
#include <memory>
#include <string>
#include <utility>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l1/l1_listener.h"
#include "l2/object_key.h"
#include "l2/tier.h"
#include "p2p/p2p_agent.h"

namespace kvd::p2p {

// The directory key of one L1 chunk: model as interned in L1 (with its key namespace), world
// size, cache salt and chunk hash.
std::string ChunkDirectoryKey(const std::string& l1_model, int32_t world_size,
                              const std::string& cache_salt, const std::array<uint8_t, 32>& hash);

class PeerNode : public l1::L1Listener {
 public:
  struct Options {
    P2pAgent::Options agent;
    double lookup_timeout_s = 30;  // a directory lookup (the tier's Exists)
    double load_timeout_s = 30;    // one read from a peer (the tier's Load)
    int tier_threads = 4;
    // Told of the chunks each load brought in whole (every rank's object), on a tier worker
    // thread, before the TierSet commits them (the KV-event log's "loaded" records). May be
    // empty; must be thread-safe and quick.
    std::function<void(std::span<const l1::ChunkKey>)> on_loaded;
  };
  // What this node saw (the agent's own counters are in P2pAgent::Stats).
  struct Stats {
    P2pAgent::Stats agent;
    uint64_t published = 0, withdrawn = 0;        // chunks queued
    uint64_t lookups = 0, lookup_failures = 0;    // directory lookups by the tier
    uint64_t lookup_keys = 0, lookup_hits = 0;    // chunks asked / held by a live peer
    uint64_t load_objects = 0, loaded_objects = 0, loaded_bytes = 0;
    uint64_t load_misses = 0;                     // objects asked that did not arrive
    uint64_t stale_entries_forgotten = 0;         // entries whose owner lacked the chunk
    double load_seconds = 0;                      // summed read latency
    uint64_t served_objects = 0, served_bytes = 0;
    uint64_t serve_refusals = 0;                  // asks answered with an error
  };

  static Result<std::unique_ptr<PeerNode>> Start(Options options);
  ~PeerNode() override;
  PeerNode(const PeerNode&) = delete;
  PeerNode& operator=(const PeerNode&) = delete;

  // Registers the L1 pool with UCX and starts serving and publishing from `l1`. Once.
  Status Attach(l1::L1Cache* l1);
  // Stops serving, loading and publishing for good (see OWNERSHIP). Idempotent.
  void Detach();
  // Objects of `model` with `layout_tag` are `object_bytes` long and live in L1 under the
  // model name `l1_model` (server/chunk_keys.h: the model plus its key namespace). Called when
  // a worker of that layout registers; the same format again is a no-op.
  void AddFormat(const std::string& model, const std::string& layout_tag, std::string l1_model,
                 uint64_t object_bytes);
  std::shared_ptr<l2::Tier> tier() const;
  const FleetDirectory::Self& self() const { return self_; }
  Stats stats() const;
  // Registers the kvd_p2p_* families (docs/metrics.md) in `registry`, which must outlive the
  // node; they are removed when the node is destroyed. Once.
  void RegisterMetrics(metrics::Registry& registry);
  // Sends queued directory updates now (tests).
  Status Flush();

  // l1::L1Listener
  void OnEntryComplete(const l1::ChunkKey& key) override;
  void OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause cause) override;

 private:
  class PeerTier;
  friend class PeerTier;
  struct Format {
    std::string l1_model;
    uint64_t object_bytes = 0;
  };
  explicit PeerNode(Options options) : options_(std::move(options)) {}
  Result<ServedBytes> Serve(const ServeAsk& ask);
  // The format of (model, tag), if registered here.
  std::optional<Format> FindFormat(const std::string& model, const std::string& tag) const;
  // The directory key of `key`'s chunk; nullopt when its format is not registered here.
  std::optional<std::string> DirectoryKeyOf(const l2::ObjectKey& key) const;
  std::string DirectoryKeyOf(const l1::ChunkKey& key) const;
  // The directory's owners of `keys` (P2pAgent::Lookup), counted in stats_.
  Result<std::vector<std::vector<FleetDirectory::Owner>>> LookupOwners(const std::vector<std::string>& keys);
  // The tier's calls, on its workers.
  std::vector<l2::ItemResult> ExistsNow(const std::vector<l2::ObjectKey>& keys);
  std::vector<l2::ItemResult> LoadNow(const std::vector<l2::LoadItem>& items);
  // The chunks of `items` every rank's object of which loaded (results[i] OK), as L1 keys.
  std::vector<l1::ChunkKey> WholeChunks(const std::vector<l2::LoadItem>& items,
                                        const std::vector<l2::ItemResult>& results) const;

  Options options_;
  FleetDirectory::Self self_;
  // Null after Detach, which moves it out under listen_mu_ once the tier is closed. The tier's
  // calls read it without the lock (Detach closed the tier first); everyone else holds it.
  std::unique_ptr<P2pAgent> agent_;
  // Whether the listener methods may publish (Attach .. Detach); they hold it while they use
  // agent_, so that Detach cannot reset the agent under them.
  mutable Mutex listen_mu_;
  bool publishing_ KVD_GUARDED_BY(listen_mu_) = false;
  P2pAgent::Stats last_agent_stats_ KVD_GUARDED_BY(listen_mu_);  // kept by Detach
  // Counted by the listener methods, which must not take mu_ (they run under L1's mutexes,
  // and Serve takes L1 pins after mu_).
  std::atomic<uint64_t> published_{0}, withdrawn_{0};
  std::shared_ptr<PeerTier> tier_;
  std::atomic<l1::L1Cache*> l1_{nullptr};

  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, Format> formats_ KVD_GUARDED_BY(mu_);
  Stats stats_ KVD_GUARDED_BY(mu_);

  // The owners the last Exists found per directory key, for the Load of the same prefetch
  // that follows it (which then needs no second round trip). Used for kOwnersFresh only, so
  // a later load asks the directory again (a peer that restarted since is never read through
  // what its earlier life published). Emptied when it would exceed kMaxCachedOwners; an
  // entry whose read failed is erased.
  static constexpr size_t kMaxCachedOwners = 65536;
  static constexpr std::chrono::seconds kOwnersFresh{2};
  struct SeenOwners {
    std::vector<FleetDirectory::Owner> owners;
    std::chrono::steady_clock::time_point seen;
  };
  Mutex owners_mu_;
  std::unordered_map<std::string, SeenOwners> owners_ KVD_GUARDED_BY(owners_mu_);

  std::vector<metrics::CollectorHandle> metric_handles_;  // last: unregistered first
};

}  // namespace kvd::p2p
