// The matcher's polynomial window hash (poly_hash.h). Plain scalar loops: one window hash is
// a chain of dependent multiply-adds, a few cycles per token, far below the cost of the
// table probe that follows it (bench/blend/matcher_bench.cc measures both).
#include "blend/poly_hash.h"

namespace kvd::blend {
namespace {

template <typename Token>
void HashWindowsImpl(std::span<const Token> tokens, size_t k, std::span<uint64_t> out) {
  const size_t windows = tokens.size() / k;
  for (size_t w = 0; w < windows; ++w) out[w] = PolyHashWindow(tokens.subspan(w * k, k));
}

template <typename Token>
void RollingHashesImpl(std::span<const Token> tokens, size_t k, std::span<uint64_t> out) {
  const size_t n = tokens.size();
  if (n < k) return;
  const uint64_t pow_k = PolyPower(k);
  uint64_t h = PolyHashWindow(tokens.first(k));
  out[0] = h;
  const Token* t = tokens.data();
  for (size_t p = 1; p + k <= n; ++p) {
    h = PolyRoll(h, static_cast<uint64_t>(t[p - 1]), static_cast<uint64_t>(t[p - 1 + k]), pow_k);
    out[p] = h;
  }
}

}  // namespace

void HashWindows(std::span<const uint32_t> tokens, size_t k, std::span<uint64_t> out) {
  HashWindowsImpl(tokens, k, out);
}
void HashWindows(std::span<const uint64_t> tokens, size_t k, std::span<uint64_t> out) {
  HashWindowsImpl(tokens, k, out);
}
void RollingHashes(std::span<const uint32_t> tokens, size_t k, std::span<uint64_t> out) {
  RollingHashesImpl(tokens, k, out);
}
void RollingHashes(std::span<const uint64_t> tokens, size_t k, std::span<uint64_t> out) {
  RollingHashesImpl(tokens, k, out);
}

}  // namespace kvd::blend
