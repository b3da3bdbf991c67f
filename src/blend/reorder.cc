#include "blend/reorder.h"

#include <algorithm>
#include <tuple>

namespace kvd::blend {
namespace {

using Piece = std::pair<size_t, size_t>;  // [begin, end) of P
using Run = std::pair<size_t, size_t>;    // (start in P, length)

// Window hash of kReorderMinRun tokens: sum x[j] * kMul^(kReorderMinRun-1-j) mod 2^64. A
// collision costs a token-by-token check, never a wrong plan.
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;

uint64_t WindowHash(std::span<const uint32_t> x) {
  uint64_t h = 0;
  for (size_t j = 0; j < kReorderMinRun; ++j) h = h * kMul + x[j];
  return h;
}

// Step 1 for one prompt P against any number of candidates H.
class Copier {
 public:
  Copier(std::span<const uint32_t> p, const PlanDeadline& deadline) : p_(p), deadline_(deadline) {
    if (p.size() >= kReorderMinRun) {
      uint64_t top = 1;  // kMul^(kReorderMinRun-1)
      for (size_t j = 1; j < kReorderMinRun; ++j) top *= kMul;
      windows_.reserve(p.size() - kReorderMinRun + 1);
      uint64_t h = WindowHash(p);
      for (size_t i = 0;; ++i) {
        windows_.emplace_back(h, static_cast<uint32_t>(i));
        if (i + kReorderMinRun >= p.size()) break;
        h = (h - p[i] * top) * kMul + p[i + kReorderMinRun];
      }
      std::sort(windows_.begin(), windows_.end());  // by hash, then ascending position
    }
    Check();
  }

  bool expired() const { return expired_; }

  // Pieces of P that, laid end to end, equal the beginning of H; the first is P's first
  // keep_prefix tokens, in place.
  std::vector<Piece> Copy(std::span<const uint32_t> h, size_t keep_prefix) {
    const size_t n = p_.size();
    used_.assign(n, 0);
    std::fill(used_.begin(), used_.begin() + static_cast<std::ptrdiff_t>(keep_prefix), 1);
    for (size_t i = n > kReorderMinRun ? n - kReorderMinRun : 0; i < n; ++i) used_[i] = 1;
    std::vector<Piece> pieces;
    if (keep_prefix) pieces.emplace_back(0, keep_prefix);
    size_t k = keep_prefix;
    while (k < h.size() && !expired_) {
      std::optional<Run> piece = Longest(h, k);
      if (!piece) {
        auto glued = Glue(h, k, pieces);
        if (!glued) break;
        const Piece& g = glued->first;
        pieces.push_back(g);
        Mark(g.first, g.second, 1);
        k += g.second - g.first;
        piece = glued->second;
      }
      pieces.emplace_back(piece->first, piece->first + piece->second);
      Mark(piece->first, piece->first + piece->second, 1);
      k += piece->second;
    }
    return pieces;
  }

  const std::vector<uint8_t>& used() const { return used_; }

 private:
  bool Check() {
    if (!expired_ && deadline_.Passed()) expired_ = true;
    return !expired_;
  }
  void Mark(size_t a, size_t b, uint8_t v) { std::fill(used_.begin() + a, used_.begin() + b, v); }

  // Ascending positions of P whose window has the hash of H[k, k + kReorderMinRun).
  std::span<const std::pair<uint64_t, uint32_t>> Starts(std::span<const uint32_t> h, size_t k) const {
    if (k + kReorderMinRun > h.size()) return {};
    const uint64_t key = WindowHash(h.subspan(k));
    auto lo = std::lower_bound(windows_.begin(), windows_.end(), std::make_pair(key, uint32_t{0}));
    auto hi = lo;
    while (hi != windows_.end() && hi->first == key) ++hi;
    return {lo, hi};
  }

  // The longest unused run of P equal to H[k:], at least kReorderMinRun tokens; ties keep the
  // leftmost.
  std::optional<Run> Longest(std::span<const uint32_t> h, size_t k) {
    std::optional<Run> best;
    for (const auto& [hash, start] : Starts(h, k)) {
      const size_t i = start;
      if (used_[i]) continue;
      const size_t n = std::min(p_.size() - i, h.size() - k);  // never grows with i
      if (best && n <= best->second) break;                       // later starts can only tie
      if (!Check()) return std::nullopt;
      size_t m = 0;
      while (m < n && p_[i + m] == h[k + m] && !used_[i + m]) ++m;
      if (m >= kReorderMinRun && (!best || m > best->second)) best = Run{i, m};
    }
    return best;
  }

  // Up to kReorderMaxGlue tokens of P equal to H[k:], then a piece for what follows. Glue
  // next to copied text comes first, then the leftmost; it never comes from beyond the copy.
  std::optional<std::pair<Piece, Run>> Glue(std::span<const uint32_t> h, size_t k,
                                            const std::vector<Piece>& pieces) {
    const size_t n = p_.size();
    for (size_t gl = 1; gl <= kReorderMaxGlue; ++gl) {
      if (k + gl >= h.size()) break;
      if (Starts(h, k + gl).empty()) continue;  // no piece can follow
      std::vector<size_t> adjacent, other;
      for (size_t i = 0; i + gl <= n; ++i) {
        if (p_[i] != h[k] || used_[i]) continue;
        bool ok = true;
        for (size_t t = 0; t < gl && ok; ++t) ok = !used_[i + t] && p_[i + t] == h[k + t];
        if (!ok) continue;
        const bool next_to_copy = (i > 0 && used_[i - 1]) || (i + gl < n && used_[i + gl]);
        (next_to_copy ? adjacent : other).push_back(i);
      }
      adjacent.insert(adjacent.end(), other.begin(), other.end());
      size_t copied_end = 0;
      for (const Piece& p : pieces) copied_end = std::max(copied_end, p.second);
      for (size_t i : adjacent) {
        if (!Check()) return std::nullopt;
        Mark(i, i + gl, 1);  // the next piece must not reuse the glue
        std::optional<Run> next = Longest(h, k + gl);
        Mark(i, i + gl, 0);
        if (next && i + gl <= std::max(copied_end, next->first + next->second)) {
          return std::make_pair(Piece{i, i + gl}, *next);
        }
      }
    }
    return std::nullopt;
  }

  std::span<const uint32_t> p_;
  const PlanDeadline& deadline_;
  std::vector<std::pair<uint64_t, uint32_t>> windows_;  // (window hash, start), sorted
  std::vector<uint8_t> used_;
  bool expired_ = false;
};

bool SameTokens(std::span<const uint32_t> a, std::span<const uint32_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

std::optional<std::vector<uint32_t>> PlanReorder(std::span<const uint32_t> prompt,
                                                 std::span<const std::span<const uint32_t>> candidates,
                                                 int64_t chunk_size, int64_t baseline_chunks,
                                                 const PlanDeadline& deadline, size_t keep_prefix) {
  const size_t n = prompt.size();
  if (keep_prefix > n || chunk_size <= 0 || n > UINT32_MAX) return std::nullopt;
  using Score = std::tuple<int64_t, int64_t, int64_t>;  // (whole chunks, tokens, -pieces)
  std::optional<Score> best_score;
  std::vector<Piece> best_pieces;
  std::span<const uint32_t> best_h;
  Copier copier(prompt, deadline);
  std::vector<std::span<const uint32_t>> seen;
  for (std::span<const uint32_t> h : candidates) {
    if (copier.expired()) break;
    if (std::any_of(seen.begin(), seen.end(), [&](auto s) { return SameTokens(s, h); })) continue;
    if (h.size() < keep_prefix || !std::equal(h.begin(), h.begin() + keep_prefix, prompt.begin())) continue;
    seen.push_back(h);
    std::vector<Piece> pieces = copier.Copy(h, keep_prefix);
    if (copier.expired()) break;  // out of time: an unfinished copy does not count
    int64_t k = 0;
    for (const Piece& p : pieces) k += static_cast<int64_t>(p.second - p.first);
    const Score score{k / chunk_size, k, -static_cast<int64_t>(pieces.size())};
    if (!best_score || score > *best_score) {
      best_score = score;
      best_pieces = std::move(pieces);
      best_h = h;
    }
  }
  if (!best_score || std::get<0>(*best_score) <= baseline_chunks) return std::nullopt;
  const size_t k = static_cast<size_t>(std::get<1>(*best_score));
  std::vector<uint8_t> used(n, 0);
  std::vector<uint32_t> perm;
  perm.reserve(n);
  size_t copied_end = 0;
  for (const Piece& p : best_pieces) {
    for (size_t i = p.first; i < p.second; ++i) perm.push_back(static_cast<uint32_t>(i));
    std::fill(used.begin() + p.first, used.begin() + p.second, 1);
    copied_end = std::max(copied_end, p.second);
  }
  // Then H's next token (often a separator), if P has it beside a cut before the copy's
  // end: served prompts keep that junction for later copies.
  if (k < best_h.size()) {
    for (size_t i = 0; i < copied_end; ++i) {
      if (!used[i] && prompt[i] == best_h[k] && ((i > 0 && used[i - 1]) || (i + 1 < n && used[i + 1]))) {
        perm.push_back(static_cast<uint32_t>(i));
        used[i] = 1;
        break;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!used[i]) perm.push_back(static_cast<uint32_t>(i));
  }
  bool identity = true;
  for (size_t i = 0; i < n && identity; ++i) identity = perm[i] == i;
  if (identity) return std::nullopt;
  return perm;
}

// ---------------------------------------------------------------------------------------------
// PromptStore

std::string PromptStore::NamespaceKey(const PromptNamespace& ns) {
  std::string k = ns.model_name;
  k += '\x1f';
  k += std::to_string(ns.world_size);
  k += '\x1f';
  k += ns.cache_salt;
  k += '\x1e';
  return k;
}

void PromptStore::Record(const PromptNamespace& ns, std::string_view request_id,
                         std::span<const uint32_t> tokens, std::span<const ChainHash> chain) {
  const std::string prefix = NamespaceKey(ns);
  std::string key = prefix;
  key += request_id;
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    Entry e;
    e.key = key;
    e.ns = ns;
    e.seq = ++seq_;
    e.tokens = std::make_shared<const std::vector<uint32_t>>(tokens.begin(), tokens.end());
    tokens_ += tokens.size();
    entries_.push_back(std::move(e));
    it = index_.emplace(key, std::prev(entries_.end())).first;
    NamespaceUse& use = namespaces_[ns.cache_salt][{ns.model_name, ns.world_size}];
    ++use.prompts;
    use.newest = key;
  } else {
    entries_.splice(entries_.end(), entries_, it->second);  // most recently recorded
  }
  Entry& e = *it->second;
  for (const ChainHash& h : chain) {
    std::string owner = prefix;
    owner.append(reinterpret_cast<const char*>(h.data()), h.size());
    e.hashes.insert(owner);
    owner_[std::move(owner)] = key;
  }
  while (entries_.size() > 1 && tokens_ > max_tokens_) {
    Entry& old = entries_.front();
    tokens_ -= old.tokens->size();
    for (const std::string& o : old.hashes) {
      auto w = owner_.find(o);
      if (w != owner_.end() && w->second == old.key) owner_.erase(w);
    }
    auto salt = namespaces_.find(old.ns.cache_salt);
    if (salt != namespaces_.end()) {
      auto name = salt->second.find({old.ns.model_name, old.ns.world_size});
      if (name != salt->second.end() && --name->second.prompts == 0) salt->second.erase(name);
      if (salt->second.empty()) namespaces_.erase(salt);
    }
    index_.erase(old.key);
    entries_.pop_front();
  }
}

std::optional<PromptNamespace> PromptStore::Resolve(std::string_view model_name, int64_t world_size,
                                                    std::string_view cache_salt) const {
  MutexLock lock(&mu_);
  auto salt = namespaces_.find(std::string(cache_salt));
  if (salt == namespaces_.end()) return std::nullopt;
  std::optional<PromptNamespace> hit;
  size_t hits = 0;
  for (const auto& [name, use] : salt->second) {
    if ((!model_name.empty() && name.first != model_name) || (world_size != 0 && name.second != world_size)) {
      continue;
    }
    if (++hits > 1) return std::nullopt;
    hit = PromptNamespace{name.first, name.second, std::string(cache_salt)};
  }
  return hit;
}

PromptStore::Candidates PromptStore::Find(const PromptNamespace& ns, std::span<const ChainHash> hits,
                                          std::span<const ChainHash> prompt_chain, size_t top_k) const {
  const std::string prefix = NamespaceKey(ns);
  auto owner_key = [&](const ChainHash& h) {
    std::string o = prefix;
    o.append(reinterpret_cast<const char*>(h.data()), h.size());
    return o;
  };
  Candidates out;
  MutexLock lock(&mu_);
  std::unordered_map<const Entry*, size_t> votes;
  for (const ChainHash& h : hits) {
    auto o = owner_.find(owner_key(h));
    if (o != owner_.end()) ++votes[&*index_.at(o->second)];
  }
  std::vector<std::pair<const Entry*, size_t>> ranked(votes.begin(), votes.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first->seq > b.first->seq;
  });
  std::unordered_set<const Entry*> chosen;
  for (size_t i = 0; i < ranked.size() && i < top_k; ++i) chosen.insert(ranked[i].first);
  size_t base = 0;
  const std::string* last_owner = nullptr;
  for (; base < prompt_chain.size(); ++base) {
    auto o = owner_.find(owner_key(prompt_chain[base]));
    if (o == owner_.end()) break;
    last_owner = &o->second;
  }
  if (last_owner) chosen.insert(&*index_.at(*last_owner));
  auto salt = namespaces_.find(ns.cache_salt);
  if (salt != namespaces_.end()) {
    auto name = salt->second.find({ns.model_name, ns.world_size});
    if (name != salt->second.end()) {
      if (auto e = index_.find(name->second.newest); e != index_.end()) chosen.insert(&*e->second);
    }
  }
  std::vector<const Entry*> sorted(chosen.begin(), chosen.end());
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->seq > b->seq; });
  for (const Entry* e : sorted) out.prompts.push_back(e->tokens);
  out.baseline_chunks = static_cast<int64_t>(base);
  return out;
}

size_t PromptStore::prompts() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

size_t PromptStore::tokens() const {
  MutexLock lock(&mu_);
  return tokens_;
}

}  // namespace kvd::blend
