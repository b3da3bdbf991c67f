// TierIndex: the objects one capacity tier holds (by id: RespKey without a prefix), their
// sizes, which of them a load is reading, and the order they would be evicted in, which an
// eviction::EvictionPolicy keeps (the same policies the L1 uses; tiers use LRU). TierSet
// fills it from what its stores, prefetches and startup scan see, and plans its eviction
// rounds from it (tier_eviction.cc).
//
// ENTRY STATES (as the policy sees them):
//
//      Add / AddOlder        Busy(+1) from 0
//   ─────────────▶ idle ─────────────────────▶ busy (a load reads it: never planned)
//                 ▲ │  ◀─────────────────────
//     Unplan      │ │    Busy(-1) to 0
//   (delete       │ │ PlanVictims
//    failed)      │ ▼
//                planned (its delete is in flight: not offered again) ── Remove ──▶ gone
//
//   Remove works from any state (a delete by the operator, or a tier delete that succeeded);
//   Touch (a write or a hit) makes an idle entry the most recent.
//
// CHUNK SLOTS. An object this run wrote or found for an L1 chunk is also indexed by that
// chunk and rank (ChunkSlot), so that the blend matcher can be told when the last copy of a
// chunk's object leaves the tiers (tier_set.h, ChunkInNoTier). Objects only a scan saw have
// no chunk slot (their namespace is not known); a later write or hit gives them one. An entry planned while a
//   load starts stays planned; the delete decides (the load then answers NotFound or read it
//   before).
//
// THREADS. Not thread-safe: TierSet calls it under the tier's mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "eviction/eviction_policy.h"
#include "l1/chunk_key.h"

namespace kvd::l2 {

// One rank's object of one L1 chunk (the L1 entry's slot).
struct ChunkSlot {
  l1::ChunkKey chunk;
  uint32_t slot = 0;
  bool operator==(const ChunkSlot&) const = default;
};

struct ChunkSlotHash {
  size_t operator()(const ChunkSlot& s) const noexcept {
    return l1::ChunkKeyDigest(s.chunk, 0x5107ull + s.slot);
  }
};

class TierIndex final : private eviction::HookArena {
 public:
  // `policy`: a name eviction::MakePolicy knows that needs no quotas (LRU, ARC, S3-FIFO, LHD);
  // any other name is a programming error (aborts).
  explicit TierIndex(std::string_view policy = "LRU");
  ~TierIndex();
  TierIndex(const TierIndex&) = delete;
  TierIndex& operator=(const TierIndex&) = delete;

  // An object written, found or loaded: added as the most recent (`bytes` its size), or, when
  // present, touched (its size unchanged). `chunk`, when given, is the L1 chunk slot the
  // object holds (kept from its first use that names one).
  void Account(const std::string& id, uint64_t bytes, const ChunkSlot* chunk = nullptr);
  // A hit on `id` (when present): it becomes the most recent.
  void Touch(const std::string& id);
  // Objects of earlier runs (a scan), oldest first, with their sizes: added as less recent
  // than every object already indexed; ids already present are skipped. Returns the bytes
  // added.
  uint64_t AddOlder(const std::vector<std::pair<std::string, uint64_t>>& objects);
  // A load of `id` starts (+1) or ends (-1). A busy object is never planned; the last end
  // makes it the most recent.
  void Busy(const std::string& id, int delta);
  // Plans an eviction round: the ids of the idle objects the policy names first, until their
  // bytes reach `target`. They stay planned until Remove or Unplan.
  std::vector<std::string> PlanVictims(uint64_t target);
  // A planned object whose delete failed: idle again.
  void Unplan(const std::string& id);
  // The object left the tier; returns its bytes (0: it was not indexed). `chunk`, when not
  // null, receives the object's chunk slot, or nullopt when it had none.
  uint64_t Remove(const std::string& id, std::optional<ChunkSlot>* chunk = nullptr);
  // An indexed object holds `slot`.
  bool holds(const ChunkSlot& slot) const { return chunk_slots_.count(slot) != 0; }

  uint64_t usage() const { return usage_; }  // bytes of the indexed objects
  size_t size() const { return ids_.size(); }
  bool contains(const std::string& id) const { return ids_.count(id) != 0; }

 private:
  struct Entry {
    std::string id;
    uint64_t bytes = 0;
    int busy = 0;
    bool planned = false;
    uint64_t last_use = 0;  // recency sequence (AddOlder rebuilds the order from it)
    std::optional<ChunkSlot> chunk;
    eviction::Hook hook;
  };
  eviction::Hook& hook(eviction::EntryId e) override { return entries_[e].hook; }
  uint64_t key(eviction::EntryId e) override;
  eviction::EntryId Slot();
  void Insert(const std::string& id, uint64_t bytes, uint64_t last_use);
  // Held by the policy: busy or planned.
  static bool Held(const Entry& e) { return e.busy > 0 || e.planned; }

  const std::string policy_name_;
  std::atomic<uint32_t> clock_{0};
  std::unique_ptr<eviction::EvictionPolicy> policy_;
  std::vector<Entry> entries_;
  std::vector<eviction::EntryId> free_;
  std::unordered_map<std::string, eviction::EntryId> ids_;
  // Indexed objects per chunk slot (several layouts of one chunk are several objects).
  std::unordered_map<ChunkSlot, uint32_t, ChunkSlotHash> chunk_slots_;
  uint64_t usage_ = 0;
  uint64_t sequence_ = 0;  // last_use of the most recent use
};

}  // namespace kvd::l2
