// ChunkIo: what a transfer does to L1, whoever copies the bytes. Both transfer modes use it
// (kvd_copy_transfers.h: kvd's copy engine copies; worker_copy_transfers.h: the worker copies
// through the pool's shared memory); what differs between them, who copies and when the copy
// is over, stays with them.
//
//   write  KeysToWrite      the request's chunk keys, namespace interned, tokens bound in
//                           the KV-event log (before anything of the request can commit)
//          Reserve          -> ChunkWrites: a write reservation for each chunk that holds KV
//                           and is neither resident nor being written by another writer
//          ...              the bytes are copied into the reservations
//          CommitLastFirst  the reservations, last chunk first (l1::CommitInReverse); the
//                           keys that committed are handed on: StoreBehind to the tiers (the
//                           "stored" KV events follow from the commits themselves)
//   read   KeysToRead       the request's chunk keys (an unknown namespace is not interned)
//          Pin              -> ChunkPins: a read pin on each of the first n chunks, in order
//          ...              the bytes are copied out of the pinned objects
//          Release          the pins, then the tiers hear the chunks were read
//
// INVARIANTS. A ChunkWrites that is not committed aborts every reservation it holds when it
// is destroyed (or Abort), so a store that fails anywhere before its commit leaves nothing of
// itself visible. A request's chunks commit last first: a lookup, which hits a prefix, gains
// none of them before the earliest one commits, and the later chunks are the older ones for
// eviction (lmcache's order). A ChunkPins drops its pins when released or destroyed; no path
// keeps one. Nothing here takes lookup locks or releases them: the callers do, in the order
// each mode has always done (see there).
//
// THREADS. ChunkIo is thread-safe (it only reads its pointers; L1, SessionTable and the
// KV-event log are thread-safe). ChunkWrites and ChunkPins are move-only handles like the L1
// handles they hold: usable and destroyable on any thread (an engine's completion thread),
// one thread at a time.
//
// OWNERSHIP. ChunkIo borrows the cache, the sessions, the tiers and the KV-event log; all
// must outlive it. ChunkWrites and ChunkPins hold no pointer to ChunkIo (they may outlive
// it inside a copy's completion) but must be destroyed before the L1 cache; a ChunkPins keeps
// the tier set's pointer to tell it of the read (the tier set must outlive the pins).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "l1/chunk_key.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "server/chunk_keys.h"
#include "server/instance_registry.h"
#include "server/kv_events.h"
#include "server/service_context.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

// A worker names its own model and world size in every key (issue 11, finding 6): objects of
// one model must never be written or read through another model's instance. InvalidArgument
// ("<op>: key names model ...") when `key` names another model or world size than `inst`.
Status KeyMatchesInstance(const char* op, const wire::CacheKey& key, const Instance& inst);

// One request's write reservations, in request order. Move-only.
class ChunkWrites {
 public:
  ChunkWrites() = default;
  ChunkWrites(ChunkWrites&&) noexcept = default;
  ChunkWrites& operator=(ChunkWrites&&) noexcept = default;
  ~ChunkWrites() = default;  // aborts what was not committed (request order)

  size_t size() const { return reservations_.size(); }
  bool empty() const { return reservations_.empty(); }
  // Reservation j (0 <= j < size()): the chunk's index in the request, its key, and the
  // bytes to fill (valid until CommitLastFirst or Abort).
  int64_t chunk(size_t j) const { return chunks_[j]; }
  const l1::ChunkKey& key(size_t j) const { return keys_[j]; }
  const l1::WriteReservation& reservation(size_t j) const { return reservations_[j]; }
  // Bytes of all the reservations (as reserved; unchanged by commit or abort).
  uint64_t bytes() const { return bytes_; }
  // The object slot written (the worker's rank).
  uint32_t slot() const { return slot_; }

  // Commits the reservations last first. Returns the keys that committed, in commit order;
  // a reservation that lost its slot meanwhile (its write TTL passed) is logged at debug
  // level with `lost_log` and its bytes are discarded. Every handle is empty afterwards.
  std::vector<l1::ChunkKey> CommitLastFirst(std::string_view lost_log);
  // Aborts what was not committed (request order); size() and bytes() stay.
  void Abort();
  // Keeps the first n reservations and aborts the others (request order); size() and
  // bytes() become those of the n kept. Nothing when n >= size().
  void Truncate(size_t n);

 private:
  friend class ChunkIo;
  std::vector<l1::WriteReservation> reservations_;
  std::vector<l1::ChunkKey> keys_;   // parallel to reservations_
  std::vector<int64_t> chunks_;      // parallel to reservations_
  uint64_t bytes_ = 0;
  uint32_t slot_ = 0;
};

// One request's read pins on its first n chunks, in request order. Move-only.
class ChunkPins {
 public:
  ChunkPins() = default;
  ChunkPins(ChunkPins&&) noexcept = default;
  ChunkPins& operator=(ChunkPins&&) noexcept = default;
  ~ChunkPins() = default;  // drops the pins (request order) without telling the tiers

  size_t size() const { return pins_.size(); }
  const l1::ReadPin& operator[](size_t i) const { return pins_[i]; }
  auto begin() const { return pins_.begin(); }
  auto end() const { return pins_.end(); }

  // The read is over: drops the pins last first (l1::ReleaseInReverse), then tells the tiers
  // (TierSet::AfterRetrieve: chunks prefetched for this read may leave L1).
  void Release();
  // The same, the pins dropped first to last (the order engine-driven retrieves have used:
  // it decides the eviction order of the chunks the read was the last to hold).
  void ReleaseFirstToLast();

 private:
  friend class ChunkIo;
  void TellTiers();

  std::vector<l1::ReadPin> pins_;
  l2::TierSet* tiers_ = nullptr;
  std::vector<l1::ChunkKey> keys_;  // the request's chunks, with tiers only
};

// Why ChunkIo::Pin stopped: the first chunk it could not pin as asked.
struct PinMiss {
  uint64_t chunk = 0;      // index in the request
  // Valid when the chunk is resident but its object is not the size asked for: the pin
  // taken on it, released when this is destroyed (the caller orders that against its other
  // releases). Empty when the chunk is not resident.
  l1::ReadPin wrong_size;
};

class ChunkIo {
 public:
  // Borrows the context's L1, sessions, tiers (committed chunks are written behind to them
  // and reads reported to them; null: none) and KV-event log (stores bind their chunks'
  // tokens in it; null: none); all must outlive this object.
  explicit ChunkIo(const ServiceContext& context)
      : chunk_size_(context.config->chunk_size),
        l1_(context.l1),
        sessions_(context.sessions),
        tiers_(context.tiers),
        kv_events_(context.kv_events),
        peers_(context.peers),
        store_hook_(context.store_hook) {}

  l2::TierSet* tiers() const { return tiers_; }
  // A worker of `inst`'s object format (tier_format, object_bytes, key namespace) registered:
  // P2P (when on) may now serve and load objects of that format.
  void FormatRegistered(const Instance& inst) const;
  // Told of every store's committed chunks (empty: nobody).
  const StoreCommittedHook& store_hook() const { return store_hook_; }

  // Keys of the chunks of `key` a store writes for `inst` (RequestChunkKeys: namespace
  // interned, the request's session used only if it exists), their tokens bound for the
  // "stored" KV events (BindStoredChunks). The errors of RequestChunkKeys.
  Result<RequestChunks> KeysToWrite(const wire::CacheKey& key, const Instance& inst) const;
  // Keys of the chunks of `key` a retrieve reads for `inst`; an unknown namespace is not
  // interned (namespace_known false, no keys). The errors of RequestChunkKeys.
  Result<RequestChunks> KeysToRead(const wire::CacheKey& key, const Instance& inst) const;

  // Reserves slot `slot` of the entry of each keys[i] for an object of inst.object_bytes
  // (entries of inst.world_size slots), in request order, leaving out the chunks for which
  // `holds_nothing(i)` is true (they hold no KV) and those ReserveWrite answers AlreadyExists
  // (resident, or being written by another writer). With `copy_in_flight` each reservation
  // is marked MarkCopyInFlight as it is made (kvd's engine copies, possibly after the write
  // TTL). Any other error stops at that chunk and is returned (Unavailable "store: chunk i
  // lost its reservation before the copy started" when the mark fails); the reservations
  // made so far are aborted.
  template <typename HoldsNothing>
  Result<ChunkWrites> Reserve(std::span<const l1::ChunkKey> keys, const Instance& inst,
                              uint32_t slot, bool copy_in_flight,
                              HoldsNothing&& holds_nothing) const {
    ChunkWrites writes;
    writes.slot_ = slot;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (holds_nothing(i)) continue;
      if (Status st = ReserveOne(&writes, keys[i], static_cast<int64_t>(i), inst,
                                 copy_in_flight);
          !st.ok()) {
        return st;
      }
    }
    return writes;
  }
  Result<ChunkWrites> Reserve(std::span<const l1::ChunkKey> keys, const Instance& inst,
                              uint32_t slot, bool copy_in_flight) const {
    return Reserve(keys, inst, slot, copy_in_flight, [](size_t) { return false; });
  }

  // Pins slot `slot` of each of the first `n` chunks of `chunks` for reading, in request
  // order, into *pins (replacing what it held). Returns false at the first chunk that is not
  // resident (every chunk, when the namespace is unknown) or whose object is not
  // `object_bytes` long, with *miss saying which; the pins taken before it stay in *pins,
  // for the caller to drop when its lock order says so. Requires n <= chunks.keys.size()
  // when the namespace is known.
  bool Pin(const RequestChunks& chunks, uint64_t n, uint32_t slot, uint64_t object_bytes,
           ChunkPins* pins, PinMiss* miss) const;

 private:
  Status ReserveOne(ChunkWrites* writes, const l1::ChunkKey& key, int64_t chunk,
                    const Instance& inst, bool copy_in_flight) const;

  const int64_t chunk_size_;
  l1::L1Cache* const l1_;
  SessionTable* const sessions_;
  l2::TierSet* const tiers_;
  KvEventLog* const kv_events_;
  p2p::PeerNode* const peers_;
  const StoreCommittedHook store_hook_;
};

// Hands a store's committed chunks (`committed`, from CommitLastFirst) on to the tiers:
// written behind as objects of `inst` in slot `slot` under `cache_salt`. Nothing when
// `tiers` is null or nothing committed. Thread-safe (TierSet::StoreBehind is).
void StoreBehind(l2::TierSet* tiers, std::span<const l1::ChunkKey> committed, const Instance& inst,
                 const std::string& cache_salt, uint32_t slot);

}  // namespace kvd::server
