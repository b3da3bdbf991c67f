// EvictionPolicy: decides "who goes next"; the table that owns the entries decides "where is
// it" and whether memory is needed. A policy never owns or frees cache memory.
//
// ENTRIES. The owner (the L1 chunk table, or the trace simulator) names its entries by
// 32-bit EntryIds and keeps one Hook per entry inside the entry itself (intrusive: the
// policy's lists cost no allocation per entry). The policy reaches hooks through the
// HookArena it was built with. Policies may keep extra state of their own (ARC's and
// S3-FIFO's ghost lists of recently evicted keys; that is metadata, not cache memory).
//
// LIFECYCLE of one entry, as the owner reports it:
//
//        Insert            Hold                      Evicted (after Victim() named it,
//   ───────────▶ evictable ─────▶ held (not          │ or any evictable entry)
//                  ▲  │   ◀─────  offered)           ▼
//                  │  │  Release                    gone (a ghost may remember its key)
//             Access  │
//                     └──── Erase (from evictable or held) ──▶ gone, no ghost
//
//   * Insert(id, use): a new entry; it starts evictable. `use` (UseInfo) says what the owner
//     knows of the request it came with; zeros where it knows nothing.
//   * Access(id, use): a hit (lookup, read, touch). Allowed while held.
//   * Hold(id) / Release(id): the entry stops / starts being a candidate (it is pinned, read
//     locked or being written). Held entries are never returned by Victim() and are not on
//     the policy's candidate lists, so eviction never re-walks them. Holds do not nest: the
//     owner calls Hold when the entry's first reason appears and Release when the last goes.
//   * Victim(): the entry the policy would evict next, or nullopt when it has none (every
//     entry held, or a policy that never evicts). Calling it does not remove anything, but
//     it may reorganise the policy's lists (S3-FIFO moves entries between queues).
//   * Evicted(id): the owner removed the evictable entry `id` to free memory.
//   * Erase(id): the owner removed `id` for another reason (abort, clear).
//
// RANKING ACROSS INSTANCES. A sharded owner runs one policy instance per shard, all built
// with the same PolicyContext::clock, and evicts the best Candidate over all shards: lower
// `priority` first, then larger `age` (ticks of the shared clock since the entry's last
// use). For LRU that gives the exact global LRU order.
//
// THREADS. A policy instance is not thread-safe: its owner serialises every call (the L1
// calls it under the shard's mutex). The shared clock is atomic; QuotaBook is thread-safe.
// A policy never calls back into its owner except through HookArena::hook().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eviction/quota_book.h"

namespace kvd::eviction {

using EntryId = uint32_t;
inline constexpr EntryId kNoEntry = 0xFFFFFFFFu;

// Per-entry policy state, stored inside the owner's entry. 16 bytes.
struct Hook {
  EntryId prev = kNoEntry;  // list links (policy-defined lists)
  EntryId next = kNoEntry;
  uint32_t stamp = 0;       // shared-clock tick of the entry's last use (set by the policy)
  uint8_t queue = 0;        // policy-defined list id; 0 = on no list
  uint8_t bits = 0;         // policy-defined (frequency, flags)
  uint16_t group = 0;       // isolation group (cache-salt id); set by the owner before Insert
};
static_assert(sizeof(Hook) == 16);

// How a policy reaches an entry. Implemented by the owner; both must work for every id between
// Insert and Evicted/Erase.
class HookArena {
 public:
  virtual Hook& hook(EntryId id) = 0;
  // A 64-bit digest of the entry's identity (ghost lists remember evicted entries by it).
  virtual uint64_t key(EntryId id) = 0;

 protected:
  ~HookArena() = default;
};

// What the owner knows of one use of an entry (an Insert or an Access), all optional: a zero
// field means "unknown", and an owner that knows nothing passes UseInfo{}. The L1 and the trace
// simulator fill it from the request the chunk belongs to. Policies that do not look at it
// (LRU, ARC, S3-FIFO, IsolatedLRU, noop) behave the same whatever it says.
struct UseInfo {
  uint32_t position = 0;  // the chunk's index in its request (0: the first chunk)
  uint32_t chunks = 0;    // chunks the request's lookup named (a lookup without tiers names
                          // those up to a miss, not always the whole prompt); 0: unknown
  uint32_t hits = 0;      // leading chunks of the request that were cached when it looked up
  bool last() const { return chunks != 0 && position + 1 == chunks; }
};

// State shared by the instances that are ranked together (the L1's shards), for a policy that
// learns from the whole cache rather than from one shard (LHD). Thread-safe. The owner makes
// one with MakeSharedState (nullptr: the policy shares nothing), keeps it alive longer than
// the instances and passes it to each of them.
class SharedState {
 public:
  virtual ~SharedState() = default;
};

struct PolicyContext {
  HookArena* hooks = nullptr;                // required
  std::atomic<uint32_t>* clock = nullptr;    // required; shared by instances that are ranked together
  QuotaBook* quotas = nullptr;               // required by IsolatedLRU, ignored by the others
  SharedState* shared = nullptr;             // MakeSharedState's; LHD without it learns alone
};

class EvictionPolicy {
 public:
  struct Candidate {
    EntryId id = kNoEntry;
    uint32_t priority = 1;  // kForced: must go even below the eviction watermark (quotas)
    uint32_t age = 0;       // shared-clock ticks since its last use; larger goes first
  };
  static constexpr uint32_t kForced = 0;
  static constexpr uint32_t kNormal = 1;

  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;

  virtual void Insert(EntryId id, const UseInfo& use) = 0;
  virtual void Access(EntryId id, const UseInfo& use) = 0;
  // The same for an owner that knows nothing of the use.
  void Insert(EntryId id) { Insert(id, UseInfo{}); }
  void Access(EntryId id) { Access(id, UseInfo{}); }
  virtual void Hold(EntryId id) = 0;
  virtual void Release(EntryId id) = 0;
  virtual void Evicted(EntryId id) = 0;
  virtual void Erase(EntryId id) = 0;
  virtual std::optional<Candidate> Victim() = 0;

  // Tracked entries, held ones included (ghosts excluded).
  virtual size_t size() const = 0;
  // Bytes of policy-owned metadata beyond the hooks (ghost lists), for stats.
  virtual size_t overhead_bytes() const { return 0; }
};

// True when `a` should be evicted before `b`.
inline bool GoesBefore(const EvictionPolicy::Candidate& a, const EvictionPolicy::Candidate& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  return a.age > b.age;
}

// The policies, by the names `--eviction-policy` accepts (case-insensitive):
//   LRU          least recently used first. The owner reports a request's chunks last to
//                first, so a request's later chunks go first (lmcache's order).
//   ARC          adaptive replacement (Megiddo & Modha, FAST'03): recency list T1 and
//                frequency list T2 with ghost lists B1/B2 steering their target sizes.
//   S3-FIFO      small FIFO (10%) for new entries, main FIFO with a 2-bit frequency and
//                reinsertion, ghost FIFO of keys evicted from the small queue (Yang et al.,
//                SOSP'23).
//   LHD          lowest learned hit index first: entries classed by uses (1, 2, 3, 4+), an
//                index per class and age learned from hits and ghosts of every instance
//                together (hit_index.h); LRU within a class.
//   IsolatedLRU  one LRU per cache salt (Hook::group) with byte quotas from QuotaBook:
//                salts over their quota go first, and eviction rounds shed them down to it.
//   noop         never evicts: a full cache refuses new writes.
// Returns nullptr for an unknown name.
std::unique_ptr<EvictionPolicy> MakePolicy(std::string_view name, const PolicyContext& context);
// The state the instances of policy `name` share (PolicyContext::shared), or nullptr when the
// policy (or the name) has none.
std::unique_ptr<SharedState> MakeSharedState(std::string_view name);
// Canonical spelling of a known name ("lru" -> "LRU"), or nullopt.
std::optional<std::string> CanonicalPolicyName(std::string_view name);
// Every canonical name, in the order above.
const std::vector<std::string>& PolicyNames();

std::unique_ptr<EvictionPolicy> MakeLruPolicy(const PolicyContext& context);
std::unique_ptr<EvictionPolicy> MakeArcPolicy(const PolicyContext& context);
std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy(const PolicyContext& context);
std::unique_ptr<EvictionPolicy> MakeIsolatedLruPolicy(const PolicyContext& context);
std::unique_ptr<EvictionPolicy> MakeNoopPolicy(const PolicyContext& context);
std::unique_ptr<EvictionPolicy> MakeLhdPolicy(const PolicyContext& context);
std::unique_ptr<SharedState> MakeLhdSharedState();

}  // namespace kvd::eviction
