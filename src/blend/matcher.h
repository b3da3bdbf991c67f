// Matcher: CacheBlend's non-prefix token-range matcher. It finds, anywhere in a request's
// tokens, the windows of `window` tokens (the chunk size) that an earlier STORE committed,
// so that their KV can be reused at a new position (re-RoPE + scatter, blend/rope*.h,
// blend/scatter*.h).
//
// What it holds: one fingerprint per registered stored chunk: the chunk's polynomial hash H
// (blend/poly_hash.h, the same as lmcache 0.5.6's), its storage key (the chained chunk hash
// the chunk's objects are stored under), old_st (the token position it was stored at), a
// 128-bit BLAKE3 digest of its tokens, its partition and its origin (an original store, or a
// re-store of KV that was itself blended). Fingerprints are found through a direct-address
// table of 2^20 slots indexed by H & (2^20 - 1); at most options.max_ids (<= 2^20) live at
// once. A query is hashed at every token offset with the rolling hash; a slot hit is checked
// against the full 64-bit H, then confirmed with the digest of the query's window, before it
// is reported.
//
// Default mode versus lmcache 0.5.6 (options.lmcache_parity = false):
//  - every reported match is confirmed by the digest: an engineered 64-bit H collision (a
//    short-vector problem with a public base) is refused;
//  - a slot keeps a chain of up to options.max_chain fingerprints: a newer registration with
//    the same slot does not hide an older one, and an original registration is never
//    replaced by a blended copy (at a position, an original is reported before any blended
//    copy of the same content; among equals, the newest). A full chain takes a new
//    fingerprint only by dropping one it supersedes (the oldest blended one, for an original;
//    else the oldest copy of the same content that is not preferred over it); otherwise the
//    registration is refused (refused_slot);
//  - matches never cross partitions (the caller's key for model, world size and cache salt;
//    e.g. l1's NamespaceId, or MatcherPartition() in matcher_plan.h);
//  - chunk 0 of a stored prompt is registered (PlanRegistration, matcher_plan.h);
//  - removal is synchronous (Remove, when a chunk's objects have left every tier) and frees
//    the fingerprint's id for reuse;
//  - Probe starts at min_cur_st, so a window repeated after the prefix can still match.
// Parity mode (options.lmcache_parity = true, `--blend-lmcache-parity`) gives lmcache's
// answers exactly, for differential tests: no digest check, one fingerprint per slot (the
// newest registration overwrites the slot; removing any fingerprint empties its slot, even
// when a newer one had overwritten it), partitions ignored, chunk 0 skipped when the stored
// range starts at 0, ids never reused (the 2^20 cap counts every registration ever made, a
// batch that would pass it is refused whole), a window seen before min_cur_st is not reported
// again after it, and the server removes fingerprints through Strike (2 strikes, none while
// a registration of the key is in flight).
//
// Threads: every method is safe to call concurrently. Register (a background registration
// thread), Remove / Strike (eviction callbacks, lookups) take the table's lock exclusively;
// Probe (lookup threads) takes it shared; the window hashes and digests of a registration are
// computed before the lock is taken.
// Ownership: the matcher copies what it keeps (keys, digests, positions); token spans are
// borrowed for the call only. Returned candidates are plain values.
// Invariants (default mode): an id is in exactly one slot chain iff it is live; its slot is
// H & (2^20 - 1); a live (partition, key) has exactly one id; a slot's occupancy bit is set
// iff its chain is non-empty; no chain is longer than max_chain.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "blend/matcher_lock.h"
#include "common/status.h"

namespace kvd::blend {

inline constexpr uint32_t kMatcherTableBits = 20;
inline constexpr uint32_t kMatcherTableSlots = 1u << kMatcherTableBits;
inline constexpr uint32_t kMatcherMaxIds = 1u << 20;

// The caller's partition key: matches never cross partitions (ignored in parity mode).
using Partition = uint64_t;

// Where a stored chunk's KV came from: a normal prefill, or a prefill that reused blended KV
// (approximate: it is never preferred over an original of the same content).
enum class Origin : uint8_t { kOriginal = 0, kBlended = 1 };

// A stored chunk's storage key: the chained chunk hash its objects are stored under, 32 bytes
// (BLAKE3) or 8 bytes (lmcache's builtin hasher, big-endian). A plain value.
class StorageKey {
 public:
  StorageKey() = default;
  // Fails unless bytes.size() is 8 or 32.
  static Result<StorageKey> FromBytes(std::span<const uint8_t> bytes);
  static StorageKey FromHash32(const std::array<uint8_t, 32>& hash);

  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  size_t size() const { return size_; }
  bool operator==(const StorageKey& other) const {
    return size_ == other.size_ && bytes_ == other.bytes_;
  }

 private:
  std::array<uint8_t, 32> bytes_{};  // unused tail bytes are zero
  uint8_t size_ = 0;
};

// BLAKE3 of the window's tokens as little-endian uint32, first 16 bytes.
using WindowDigest = std::array<uint8_t, 16>;
WindowDigest DigestWindow(std::span<const uint32_t> window);

struct MatcherOptions {
  uint32_t window = 256;               // tokens per fingerprint: the server's chunk size
  uint32_t max_ids = kMatcherMaxIds;   // live fingerprints (parity: ever registered), 1..2^20
  uint32_t max_chain = 16;             // default mode: fingerprints per slot, >= 1
  bool dedup_content = false;          // --enable-dedup-content
  bool lmcache_parity = false;         // --blend-lmcache-parity
};

// One window to register. `tokens` holds exactly options.window tokens.
struct WindowToRegister {
  std::span<const uint32_t> tokens;
  int64_t old_st = 0;   // token position the chunk was stored at, >= 0
  StorageKey key;       // non-empty
  Origin origin = Origin::kOriginal;
};

// What Register did with each window of a batch (the counts add up to the batch size).
struct RegisterCounts {
  uint32_t registered = 0;
  uint32_t known = 0;          // the (partition, key) was already registered
  uint32_t deduplicated = 0;   // dedup_content: the same content is live
  uint32_t refused_full = 0;   // no id left (max_ids)
  uint32_t refused_slot = 0;   // default mode: the slot's chain is full
};

// One window of the query equal to a registered one: the query's [cur_st, cur_ed) holds the
// tokens stored at [old_st, old_ed) under `key`.
struct MatchCandidate {
  int64_t old_st = 0;
  int64_t old_ed = 0;
  int64_t cur_st = 0;
  int64_t cur_ed = 0;
  StorageKey key;
  Origin origin = Origin::kOriginal;
};

// What one Probe looked at.
struct ProbeCounts {
  uint64_t positions = 0;       // window offsets hashed
  uint64_t slot_hits = 0;       // offsets whose slot was occupied
  uint64_t hash_hits = 0;       // fingerprints whose full H (and partition) matched
  uint64_t digest_rejects = 0;  // of those, refused by the digest (default mode)
};

enum class StrikeOutcome : uint8_t {
  kPending,  // a registration of the key is in flight: not counted
  kCounted,  // counted, below the threshold
  kRemoved,  // reached the threshold: the fingerprint (if any) was removed
};

struct MatcherStats {
  uint64_t live = 0;            // fingerprints that can match
  uint64_t ids_used = 0;        // ids taken (parity: every registration ever)
  uint64_t registered = 0;      // registrations accepted, ever
  uint64_t refused_full = 0;
  uint64_t refused_slot = 0;
  uint64_t removed = 0;         // by Remove, Strike, or dropped from a full slot chain
  uint64_t capacity_warnings = 0;  // times ids_used went over 80% of max_ids
  uint64_t probes = 0;
  uint64_t positions = 0;
  uint64_t digest_rejects = 0;
};

class Matcher {
 public:
  static constexpr uint32_t kStrikeThreshold = 2;

  // Fails on window == 0, max_ids outside [1, 2^20] or max_chain == 0.
  static Result<std::unique_ptr<Matcher>> Create(const MatcherOptions& options);
  ~Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  const MatcherOptions& options() const { return options_; }

  // Registers a batch of stored windows (one run of committed chunks). A window whose
  // (partition, key) is already registered is skipped (`known`); with dedup_content, one
  // whose content is live is skipped too. Fails, changing nothing, if a window is malformed
  // (token count != window, old_st < 0, empty key).
  Result<RegisterCounts> Register(Partition partition, std::span<const WindowToRegister> windows)
      KVD_EXCLUDES(mu_);

  // Forgets the fingerprint of (partition, key); later probes cannot report it. Returns
  // whether one was registered. Clears the key's strikes. A later Register of the key adds it
  // again: a caller that registers from a queue must not apply a queued job for a chunk whose
  // objects have left meanwhile (default mode has no strikes to clean that up).
  bool Remove(Partition partition, const StorageKey& key) KVD_EXCLUDES(mu_);

  // Appends to *out the windows of `tokens` that equal a registered window of `partition`,
  // in increasing cur_st, at most one per position and each fingerprint once, at the first
  // position >= min_cur_st where it matches (parity: at its first position overall, reported
  // only if that is >= min_cur_st). Queries shorter than a window match nothing. Fails with
  // InvalidArgument if min_cur_st < 0 or out is null. `counts`, if given, is overwritten.
  Status Probe(Partition partition, std::span<const uint32_t> tokens, int64_t min_cur_st,
               std::vector<MatchCandidate>* out, ProbeCounts* counts = nullptr) const
      KVD_EXCLUDES(mu_);

  // Lazy-eviction bookkeeping (parity mode's removal; usable in both modes). A registration
  // job for `keys` has been queued / has been applied: while one is in flight, strikes on
  // the key are not counted. Begin and End calls must pair up.
  void BeginPending(Partition partition, std::span<const StorageKey> keys) KVD_EXCLUDES(mu_);
  void EndPending(Partition partition, std::span<const StorageKey> keys) KVD_EXCLUDES(mu_);
  // A reported match's objects were missing: counts a strike; at kStrikeThreshold the
  // fingerprint is removed (as Remove) and the count reset.
  StrikeOutcome Strike(Partition partition, const StorageKey& key) KVD_EXCLUDES(mu_);
  // A reported match's objects were all found: forgets its strikes.
  void ClearStrikes(Partition partition, const StorageKey& key) KVD_EXCLUDES(mu_);

  MatcherStats Stats() const KVD_EXCLUDES(mu_);

 private:
  struct Record;
  struct KeyRef {
    Partition partition;
    StorageKey key;
    bool operator==(const KeyRef&) const = default;
  };
  struct KeyRefHash {
    size_t operator()(const KeyRef& k) const noexcept;
  };
  // A window's H and digest, computed before the lock is taken.
  struct Prepared {
    uint64_t h;
    WindowDigest digest;
  };

  explicit Matcher(const MatcherOptions& options);
  Partition Effective(Partition p) const { return options_.lmcache_parity ? 0 : p; }
  RegisterCounts RegisterDefault(Partition partition, std::span<const WindowToRegister> windows,
                                 std::span<const Prepared> prepared) KVD_REQUIRES(mu_);
  RegisterCounts RegisterParity(std::span<const WindowToRegister> windows,
                                std::span<const Prepared> prepared) KVD_REQUIRES(mu_);
  // A free id (default: the free list first), or kNoId when max_ids are in use.
  uint32_t TakeId() KVD_REQUIRES(mu_);
  void Store(uint32_t id, Partition partition, const WindowToRegister& w, const Prepared& p)
      KVD_REQUIRES(mu_);
  void NoteIdsUsed() KVD_REQUIRES(mu_);
  bool RemoveLocked(const KeyRef& ref) KVD_REQUIRES(mu_);
  // Default mode: whether a live fingerprint of `partition` has this H and digest.
  bool ContentLive(Partition partition, const Prepared& p) const KVD_REQUIRES_SHARED(mu_);
  void SetOccupied(uint32_t slot, bool occupied) KVD_REQUIRES(mu_);
  void ProbeDefault(Partition partition, std::span<const uint32_t> tokens, size_t first,
                    std::vector<MatchCandidate>* out, ProbeCounts* counts) const
      KVD_REQUIRES_SHARED(mu_);
  void ProbeParity(std::span<const uint32_t> tokens, size_t min_cur_st,
                   std::vector<MatchCandidate>* out, ProbeCounts* counts) const
      KVD_REQUIRES_SHARED(mu_);
  MatchCandidate CandidateFor(uint32_t id, size_t pos) const KVD_REQUIRES_SHARED(mu_);

  const MatcherOptions options_;
  const uint64_t pow_window_;  // B^window

  mutable SharedMutex mu_;
  // Slot -> newest id of its chain (parity: the slot's only id), or kNoId.
  std::vector<uint32_t> table_ KVD_GUARDED_BY(mu_);
  // One bit per slot: its chain is non-empty. 128 KiB, so the probe's first test stays in
  // the core's cache.
  std::vector<uint64_t> occupied_ KVD_GUARDED_BY(mu_);
  // Per id: H (hot, read for every slot hit), next id in the slot chain, the rest.
  std::vector<uint64_t> poly_ KVD_GUARDED_BY(mu_);
  std::vector<uint32_t> next_ KVD_GUARDED_BY(mu_);
  std::vector<Record> records_ KVD_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ids_ KVD_GUARDED_BY(mu_);  // default mode
  std::unordered_map<KeyRef, uint32_t, KeyRefHash> by_key_ KVD_GUARDED_BY(mu_);
  std::unordered_map<KeyRef, uint32_t, KeyRefHash> strikes_ KVD_GUARDED_BY(mu_);
  std::unordered_map<KeyRef, uint32_t, KeyRefHash> pending_ KVD_GUARDED_BY(mu_);
  uint64_t live_ KVD_GUARDED_BY(mu_) = 0;
  bool over_warning_ KVD_GUARDED_BY(mu_) = false;
  uint64_t registered_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t refused_full_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t refused_slot_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t removed_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t capacity_warnings_ KVD_GUARDED_BY(mu_) = 0;
  // Updated by probes under the shared lock.
  mutable std::atomic<uint64_t> probes_{0};
  mutable std::atomic<uint64_t> positions_{0};
  mutable std::atomic<uint64_t> digest_rejects_{0};
};

}  // namespace kvd::blend
