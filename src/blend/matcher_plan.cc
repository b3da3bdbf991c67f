// PlanRegistration, SelectNonOverlapping and MatcherPartition (matcher_plan.h).
#include "blend/matcher_plan.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "keys/blake3.h"

namespace kvd::blend {

Result<std::vector<WindowToRegister>> PlanRegistration(const StoredRange& stored,
                                                       uint32_t chunk_size, bool lmcache_parity) {
  if (chunk_size == 0) return Status::InvalidArgument("blend: chunk size must be > 0");
  const int64_t c = chunk_size;
  const int64_t n_tokens = static_cast<int64_t>(stored.tokens.size());
  if (stored.start < 0 || stored.start % c != 0) {
    return Status::InvalidArgument("blend: stored range start " + std::to_string(stored.start) +
                                   " is not a non-negative multiple of the chunk size " +
                                   std::to_string(c));
  }
  if (stored.end < stored.start)
    return Status::InvalidArgument("blend: stored range ends before it starts");
  if (stored.start > n_tokens)
    return Status::InvalidArgument("blend: stored range starts past the tokens");
  const int64_t effective_end = std::min(stored.end, n_tokens);
  const size_t n_chunks = static_cast<size_t>((effective_end - stored.start) / c);
  if (stored.committed.size() != n_chunks || stored.keys.size() != n_chunks) {
    return Status::InvalidArgument("blend: " + std::to_string(n_chunks) +
                                   " full chunks stored, but " +
                                   std::to_string(stored.committed.size()) + " commit flags and " +
                                   std::to_string(stored.keys.size()) + " keys");
  }
  for (const StorageKey& k : stored.keys) {
    if (k.size() == 0) return Status::InvalidArgument("blend: empty storage key");
  }
  const size_t first = lmcache_parity && stored.start == 0 ? 1 : 0;
  std::vector<WindowToRegister> out;
  for (size_t i = first; i < n_chunks; ++i) {
    if (stored.committed[i] == 0) continue;
    const int64_t st = stored.start + static_cast<int64_t>(i) * c;
    WindowToRegister w;
    w.tokens = stored.tokens.subspan(static_cast<size_t>(st), chunk_size);
    w.old_st = st;
    w.key = stored.keys[i];
    w.origin = st + c > stored.blended_from ? Origin::kBlended : Origin::kOriginal;
    out.push_back(w);
  }
  return out;
}

std::vector<MatchCandidate> SelectNonOverlapping(std::span<const MatchCandidate> candidates,
                                                 int64_t prefix_tokens) {
  std::vector<MatchCandidate> sorted;
  for (const MatchCandidate& m : candidates) {
    if (m.cur_st >= prefix_tokens) sorted.push_back(m);
  }
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [](const MatchCandidate& a, const MatchCandidate& b) { return a.cur_st < b.cur_st; });
  std::vector<MatchCandidate> kept;
  int64_t covered_end = std::numeric_limits<int64_t>::min();
  for (const MatchCandidate& m : sorted) {
    if (m.cur_st >= covered_end) {
      kept.push_back(m);
      covered_end = m.cur_ed;
    }
  }
  return kept;
}

Partition MatcherPartition(std::string_view model_name, int64_t world_size,
                           std::string_view cache_salt) {
  keys::Blake3Hasher hasher;
  const auto put_u64 = [&](uint64_t v) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(v >> (8 * i));
    hasher.Update(le, sizeof(le));
  };
  put_u64(model_name.size());
  hasher.Update(model_name.data(), model_name.size());
  put_u64(static_cast<uint64_t>(world_size));
  put_u64(cache_salt.size());
  hasher.Update(cache_salt.data(), cache_salt.size());
  const keys::Hash32 h = hasher.Finalize();
  Partition p = 0;
  for (int i = 0; i < 8; ++i) p |= uint64_t{h[i]} << (8 * i);
  return p;
}

}  // namespace kvd::blend
