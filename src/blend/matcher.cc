// Matcher (matcher.h): registration, removal, strikes and the probe.
//
// Ids index struct-of-arrays: poly_ and next_ are what the probe touches per slot hit;
// records_ holds the rest. The probe hashes a block of offsets into a local buffer, tests
// each offset's slot against the occupancy bitmap (branch-free), and only then walks the
// slot's chain for the few offsets that hit.
#include "blend/matcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <unordered_set>

#include "blend/poly_hash.h"
#include "keys/blake3.h"

namespace kvd::blend {
namespace {

constexpr uint32_t kNoId = UINT32_MAX;
constexpr uint32_t kNoSlot = UINT32_MAX;
constexpr uint64_t kSlotMask = kMatcherTableSlots - 1;
constexpr size_t kProbeBlock = 512;

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

// --- StorageKey, digest ---------------------------------------------------------------

Result<StorageKey> StorageKey::FromBytes(std::span<const uint8_t> bytes) {
  if (bytes.size() != 8 && bytes.size() != 32) {
    return Status::InvalidArgument("blend: a storage key has 8 or 32 bytes, not " +
                                   std::to_string(bytes.size()));
  }
  StorageKey k;
  std::memcpy(k.bytes_.data(), bytes.data(), bytes.size());
  k.size_ = static_cast<uint8_t>(bytes.size());
  return k;
}

StorageKey StorageKey::FromHash32(const std::array<uint8_t, 32>& hash) {
  StorageKey k;
  k.bytes_ = hash;
  k.size_ = 32;
  return k;
}

WindowDigest DigestWindow(std::span<const uint32_t> window) {
  keys::Hash32 full;
  if constexpr (std::endian::native == std::endian::little) {
    full = keys::Blake3(window.data(), window.size_bytes());
  } else {
    keys::Blake3Hasher hasher;
    for (uint32_t x : window) {
      const uint8_t le[4] = {uint8_t(x), uint8_t(x >> 8), uint8_t(x >> 16), uint8_t(x >> 24)};
      hasher.Update(le, 4);
    }
    full = hasher.Finalize();
  }
  WindowDigest d;
  std::memcpy(d.data(), full.data(), d.size());
  return d;
}

// --- Matcher --------------------------------------------------------------------------

struct Matcher::Record {
  StorageKey key;
  WindowDigest digest{};
  int64_t old_st = 0;
  Partition partition = 0;
  uint32_t slot = kNoSlot;  // parity: the slot the id was written to, kNoSlot once removed
  Origin origin = Origin::kOriginal;
  bool live = false;
};

size_t Matcher::KeyRefHash::operator()(const KeyRef& k) const noexcept {
  uint64_t head = 0;
  std::memcpy(&head, k.key.bytes().data(), std::min<size_t>(8, k.key.size()));
  return Mix(head ^ Mix(k.partition + k.key.size()));
}

Result<std::unique_ptr<Matcher>> Matcher::Create(const MatcherOptions& options) {
  if (options.window == 0) return Status::InvalidArgument("blend matcher: window must be > 0");
  if (options.max_ids == 0 || options.max_ids > kMatcherMaxIds) {
    return Status::InvalidArgument("blend matcher: max_ids must be in [1, 2^20], not " +
                                   std::to_string(options.max_ids));
  }
  if (options.max_chain == 0)
    return Status::InvalidArgument("blend matcher: max_chain must be > 0");
  return std::unique_ptr<Matcher>(new Matcher(options));
}

Matcher::Matcher(const MatcherOptions& options)
    : options_(options),
      pow_window_(PolyPower(options.window)),
      table_(kMatcherTableSlots, kNoId),
      occupied_(kMatcherTableSlots / 64, 0) {}

Matcher::~Matcher() = default;

void Matcher::SetOccupied(uint32_t slot, bool occupied) {
  const uint64_t bit = uint64_t{1} << (slot & 63);
  if (occupied) {
    occupied_[slot >> 6] |= bit;
  } else {
    occupied_[slot >> 6] &= ~bit;
  }
}

Result<RegisterCounts> Matcher::Register(Partition partition,
                                         std::span<const WindowToRegister> windows) {
  std::vector<Prepared> prepared(windows.size());
  for (size_t i = 0; i < windows.size(); ++i) {
    const WindowToRegister& w = windows[i];
    if (w.tokens.size() != options_.window) {
      return Status::InvalidArgument("blend matcher: window " + std::to_string(i) + " has " +
                                     std::to_string(w.tokens.size()) + " tokens, not " +
                                     std::to_string(options_.window));
    }
    if (w.old_st < 0) return Status::InvalidArgument("blend matcher: negative old_st");
    if (w.key.size() == 0) return Status::InvalidArgument("blend matcher: empty storage key");
    prepared[i].h = PolyHashWindow(w.tokens);
    if (!options_.lmcache_parity) prepared[i].digest = DigestWindow(w.tokens);
  }
  WriterLock lock(&mu_);
  RegisterCounts counts = options_.lmcache_parity
                              ? RegisterParity(windows, prepared)
                              : RegisterDefault(Effective(partition), windows, prepared);
  NoteIdsUsed();
  return counts;
}

uint32_t Matcher::TakeId() {
  if (!options_.lmcache_parity && !free_ids_.empty()) {
    const uint32_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  if (records_.size() >= options_.max_ids) return kNoId;
  records_.emplace_back();
  poly_.push_back(0);
  next_.push_back(kNoId);
  return static_cast<uint32_t>(records_.size() - 1);
}

void Matcher::Store(uint32_t id, Partition partition, const WindowToRegister& w,
                    const Prepared& p) {
  Record& r = records_[id];
  r.key = w.key;
  r.digest = p.digest;
  r.old_st = w.old_st;
  r.partition = partition;
  r.origin = w.origin;
  r.live = true;
  r.slot = static_cast<uint32_t>(p.h & kSlotMask);
  poly_[id] = p.h;
  by_key_[KeyRef{partition, w.key}] = id;
  ++live_;
  ++registered_;
}

void Matcher::NoteIdsUsed() {
  const uint64_t used = records_.size() - free_ids_.size();
  const bool over = used * 5 > uint64_t{options_.max_ids} * 4;
  if (over && !over_warning_) {
    ++capacity_warnings_;
    spdlog::warn("blend matcher: {} of {} fingerprint ids in use (over 80%){}", used,
                 options_.max_ids, options_.lmcache_parity ? "; parity mode never reuses ids" : "");
  }
  over_warning_ = over;
}

bool Matcher::ContentLive(Partition partition, const Prepared& p) const {
  for (uint32_t id = table_[p.h & kSlotMask]; id != kNoId; id = next_[id]) {
    const Record& r = records_[id];
    if (poly_[id] == p.h && r.partition == partition && r.digest == p.digest) return true;
  }
  return false;
}

RegisterCounts Matcher::RegisterDefault(Partition partition,
                                        std::span<const WindowToRegister> windows,
                                        std::span<const Prepared> prepared) {
  RegisterCounts counts;
  for (size_t i = 0; i < windows.size(); ++i) {
    const WindowToRegister& w = windows[i];
    const Prepared& p = prepared[i];
    if (by_key_.contains(KeyRef{partition, w.key})) {
      ++counts.known;
      continue;
    }
    if (options_.dedup_content && ContentLive(partition, p)) {
      ++counts.deduplicated;
      continue;
    }
    const uint32_t slot = static_cast<uint32_t>(p.h & kSlotMask);
    // A full chain makes room only by dropping a fingerprint the new one supersedes: the
    // oldest blended one for an original, else the oldest copy of the same content with the
    // same or a lower preference. Either way the probe's answer for that content is unchanged
    // or improved (it reports the newest original, else the newest blended copy).
    uint32_t length = 0, oldest_blended = kNoId, oldest_same = kNoId;
    for (uint32_t id = table_[slot]; id != kNoId; id = next_[id]) {
      ++length;
      const Record& r = records_[id];
      if (r.origin == Origin::kBlended) oldest_blended = id;
      if (poly_[id] == p.h && r.partition == partition && r.digest == p.digest &&
          (w.origin == Origin::kOriginal || r.origin == Origin::kBlended)) {
        oldest_same = id;
      }
    }
    if (length >= options_.max_chain) {
      const uint32_t victim =
          w.origin == Origin::kOriginal && oldest_blended != kNoId ? oldest_blended : oldest_same;
      if (victim == kNoId) {
        ++counts.refused_slot;
        ++refused_slot_;
        continue;
      }
      RemoveLocked(KeyRef{records_[victim].partition, records_[victim].key});
    }
    const uint32_t id = TakeId();
    if (id == kNoId) {
      ++counts.refused_full;
      ++refused_full_;
      continue;
    }
    Store(id, partition, w, p);
    next_[id] = table_[slot];
    table_[slot] = id;
    SetOccupied(slot, true);
    ++counts.registered;
  }
  return counts;
}

RegisterCounts Matcher::RegisterParity(std::span<const WindowToRegister> windows,
                                       std::span<const Prepared> prepared) {
  RegisterCounts counts;
  std::vector<size_t> fresh;
  std::unordered_set<uint64_t> batch_poly;
  for (size_t i = 0; i < windows.size(); ++i) {
    if (by_key_.contains(KeyRef{0, windows[i].key})) {
      ++counts.known;
      continue;
    }
    if (options_.dedup_content) {
      const uint64_t h = prepared[i].h;
      const uint32_t head = table_[h & kSlotMask];
      const bool live = head != kNoId && poly_[head] == h && records_[head].live;
      if (batch_poly.contains(h) || live) {
        ++counts.deduplicated;
        continue;
      }
      batch_poly.insert(h);
    }
    fresh.push_back(i);
  }
  if (fresh.empty()) return counts;
  // As lmcache: ids are never reused, and a batch that would pass the cap is refused whole.
  if (records_.size() + fresh.size() > options_.max_ids) {
    counts.refused_full += static_cast<uint32_t>(fresh.size());
    refused_full_ += fresh.size();
    spdlog::error("blend matcher: {} ids used, cannot add {} more (limit {})", records_.size(),
                  fresh.size(), options_.max_ids);
    return counts;
  }
  for (size_t i : fresh) {
    const uint32_t id = TakeId();
    Store(id, 0, windows[i], prepared[i]);
    table_[records_[id].slot] = id;  // the newest registration owns the slot
    SetOccupied(records_[id].slot, true);
    ++counts.registered;
  }
  return counts;
}

bool Matcher::Remove(Partition partition, const StorageKey& key) {
  WriterLock lock(&mu_);
  const KeyRef ref{Effective(partition), key};
  strikes_.erase(ref);
  return RemoveLocked(ref);
}

bool Matcher::RemoveLocked(const KeyRef& ref) {
  const auto it = by_key_.find(ref);
  if (it == by_key_.end()) return false;
  const uint32_t id = it->second;
  by_key_.erase(it);
  Record& r = records_[id];
  if (options_.lmcache_parity) {
    // As lmcache: the slot is emptied even if a newer registration had overwritten it.
    if (r.slot != kNoSlot) {
      table_[r.slot] = kNoId;
      SetOccupied(r.slot, false);
    }
  } else {
    uint32_t* link = &table_[r.slot];
    while (*link != id) link = &next_[*link];
    *link = next_[id];
    if (table_[r.slot] == kNoId) SetOccupied(r.slot, false);
    next_[id] = kNoId;
    free_ids_.push_back(id);
  }
  r.slot = kNoSlot;
  r.live = false;
  poly_[id] = 0;
  --live_;
  ++removed_;
  return true;
}

void Matcher::BeginPending(Partition partition, std::span<const StorageKey> keys) {
  WriterLock lock(&mu_);
  for (const StorageKey& k : keys) ++pending_[KeyRef{Effective(partition), k}];
}

void Matcher::EndPending(Partition partition, std::span<const StorageKey> keys) {
  WriterLock lock(&mu_);
  for (const StorageKey& k : keys) {
    const auto it = pending_.find(KeyRef{Effective(partition), k});
    if (it != pending_.end() && --it->second == 0) pending_.erase(it);
  }
}

StrikeOutcome Matcher::Strike(Partition partition, const StorageKey& key) {
  WriterLock lock(&mu_);
  const KeyRef ref{Effective(partition), key};
  if (pending_.contains(ref)) return StrikeOutcome::kPending;
  uint32_t& n = strikes_[ref];
  if (++n < kStrikeThreshold) return StrikeOutcome::kCounted;
  strikes_.erase(ref);
  RemoveLocked(ref);
  return StrikeOutcome::kRemoved;
}

void Matcher::ClearStrikes(Partition partition, const StorageKey& key) {
  WriterLock lock(&mu_);
  strikes_.erase(KeyRef{Effective(partition), key});
}

MatcherStats Matcher::Stats() const {
  ReaderLock lock(&mu_);
  MatcherStats s;
  s.live = live_;
  s.ids_used = records_.size() - free_ids_.size();
  s.registered = registered_;
  s.refused_full = refused_full_;
  s.refused_slot = refused_slot_;
  s.removed = removed_;
  s.capacity_warnings = capacity_warnings_;
  s.probes = probes_.load(std::memory_order_relaxed);
  s.positions = positions_.load(std::memory_order_relaxed);
  s.digest_rejects = digest_rejects_.load(std::memory_order_relaxed);
  return s;
}

// --- Probe ----------------------------------------------------------------------------

MatchCandidate Matcher::CandidateFor(uint32_t id, size_t pos) const {
  const Record& r = records_[id];
  MatchCandidate c;
  c.old_st = r.old_st;
  c.old_ed = r.old_st + options_.window;
  c.cur_st = static_cast<int64_t>(pos);
  c.cur_ed = static_cast<int64_t>(pos) + options_.window;
  c.key = r.key;
  c.origin = r.origin;
  return c;
}

namespace {

// Calls on_hit(pos, h) for each offset pos in [first, last] whose window hash h falls in an
// occupied slot, in increasing pos. tokens.size() >= last + k.
template <typename OnHit>
uint64_t ScanOffsets(std::span<const uint32_t> tokens, size_t k, uint64_t pow_k, size_t first,
                     size_t last, const uint64_t* occupied, OnHit&& on_hit) {
  const uint32_t* t = tokens.data();
  uint64_t hs[kProbeBlock];
  uint32_t hit[kProbeBlock];
  uint64_t slot_hits = 0;
  uint64_t h = PolyHashWindow(tokens.subspan(first, k));
  for (size_t p = first; p <= last; p += kProbeBlock) {
    const size_t m = std::min(kProbeBlock, last - p + 1);
    hs[0] = h;
    for (size_t j = 1; j < m; ++j) {
      h = PolyRoll(h, t[p + j - 1], t[p + j - 1 + k], pow_k);
      hs[j] = h;
    }
    if (p + m <= last) h = PolyRoll(h, t[p + m - 1], t[p + m - 1 + k], pow_k);
    size_t n_hit = 0;
    for (size_t j = 0; j < m; ++j) {
      const uint64_t slot = hs[j] & kSlotMask;
      hit[n_hit] = static_cast<uint32_t>(j);
      n_hit += (occupied[slot >> 6] >> (slot & 63)) & 1;
    }
    slot_hits += n_hit;
    for (size_t c = 0; c < n_hit; ++c) on_hit(p + hit[c], hs[hit[c]]);
  }
  return slot_hits;
}

}  // namespace

Status Matcher::Probe(Partition partition, std::span<const uint32_t> tokens, int64_t min_cur_st,
                      std::vector<MatchCandidate>* out, ProbeCounts* counts) const {
  if (out == nullptr) return Status::InvalidArgument("blend matcher: Probe needs an output vector");
  if (min_cur_st < 0) return Status::InvalidArgument("blend matcher: negative min_cur_st");
  ProbeCounts local;
  ProbeCounts& c = counts != nullptr ? *counts : local;
  c = ProbeCounts{};
  probes_.fetch_add(1, std::memory_order_relaxed);
  const size_t k = options_.window;
  if (tokens.size() < k) return Status::Ok();
  {
    ReaderLock lock(&mu_);
    if (options_.lmcache_parity) {
      ProbeParity(tokens, static_cast<size_t>(min_cur_st), out, &c);
    } else if (static_cast<uint64_t>(min_cur_st) <= tokens.size() - k) {
      ProbeDefault(Effective(partition), tokens, static_cast<size_t>(min_cur_st), out, &c);
    }
  }
  positions_.fetch_add(c.positions, std::memory_order_relaxed);
  digest_rejects_.fetch_add(c.digest_rejects, std::memory_order_relaxed);
  return Status::Ok();
}

void Matcher::ProbeDefault(Partition partition, std::span<const uint32_t> tokens, size_t first,
                           std::vector<MatchCandidate>* out, ProbeCounts* counts) const {
  const size_t k = options_.window;
  const size_t last = tokens.size() - k;
  std::unordered_set<uint32_t> seen;
  counts->positions = last - first + 1;
  counts->slot_hits = ScanOffsets(
      tokens, k, pow_window_, first, last, occupied_.data(), [&](size_t pos, uint64_t h) {
        mu_.AssertReaderHeld();  // the callback runs inside this function, under its caller's lock
        // Candidates of this partition with the same H; the digest of the query's window is
        // computed once, and only if one of them has not been reported yet.
        bool unseen = false;
        for (uint32_t id = table_[h & kSlotMask]; id != kNoId; id = next_[id]) {
          if (poly_[id] != h || records_[id].partition != partition) continue;
          ++counts->hash_hits;
          unseen = unseen || !seen.contains(id);
        }
        if (!unseen) return;
        const WindowDigest query = DigestWindow(tokens.subspan(pos, k));
        uint32_t best = kNoId;
        for (uint32_t id = table_[h & kSlotMask]; id != kNoId; id = next_[id]) {
          const Record& r = records_[id];
          if (poly_[id] != h || r.partition != partition) continue;
          if (r.digest != query) {
            ++counts->digest_rejects;
            continue;
          }
          // The chain runs newest first: the first original wins, else the first blended copy.
          if (best == kNoId) best = id;
          if (r.origin == Origin::kOriginal) {
            if (records_[best].origin != Origin::kOriginal) best = id;
            break;
          }
        }
        if (best != kNoId && seen.insert(best).second) out->push_back(CandidateFor(best, pos));
      });
}

void Matcher::ProbeParity(std::span<const uint32_t> tokens, size_t min_cur_st,
                          std::vector<MatchCandidate>* out, ProbeCounts* counts) const {
  const size_t k = options_.window;
  const size_t last = tokens.size() - k;
  std::unordered_set<uint32_t> seen;
  counts->positions = last + 1;
  counts->slot_hits =
      ScanOffsets(tokens, k, pow_window_, 0, last, occupied_.data(), [&](size_t pos, uint64_t h) {
        mu_.AssertReaderHeld();  // as in ProbeDefault
        const uint32_t id = table_[h & kSlotMask];
        if (id == kNoId || seen.contains(id) || poly_[id] != h || !records_[id].live) return;
        ++counts->hash_hits;
        seen.insert(id);
        if (pos >= min_cur_st) out->push_back(CandidateFor(id, pos));
      });
}

}  // namespace kvd::blend
