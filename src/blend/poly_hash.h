// The polynomial window hash of CacheBlend's non-prefix matcher, bit-identical to the one
// the lmcache 0.5.6 blend server computes, so that kvd finds the same windows:
//
//   H(x_0 .. x_{k-1}) = sum_i x_i * B^(k-1-i)  (mod 2^64),   B = 0x9E3779B97F4A7C15,
//
// over token ids taken as unsigned 64-bit integers, with wrap-around arithmetic. lmcache
// converts its token list with numpy (dtype uint64), so ids in [0, 2^64) hash as themselves
// and a negative id is refused there (numpy raises OverflowError); kvd's request path keeps
// token ids as uint32 (wire::TokenIds, ids outside [0, 2^32) fail the chunk hash before any
// blend work), whose zero extension is the same number. The uint64 overloads exist for the
// goldens that check ids above 2^32.
//
// The window k is the server's chunk size (256 by default): stored chunks are hashed on
// their own non-overlapping grid (HashWindows), a query at every token offset with the
// rolling update H' = H*B + x_new - x_old*B^k (RollingHashes).
//
// Thread safety: stateless functions; safe from any thread. Ownership: inputs are borrowed
// for the call, outputs written to caller memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvd::blend {

inline constexpr uint64_t kPolyBase = 0x9E3779B97F4A7C15ULL;

// B^e mod 2^64.
constexpr uint64_t PolyPower(uint64_t e) {
  uint64_t result = 1;
  uint64_t b = kPolyBase;
  while (e != 0) {
    if (e & 1) result *= b;
    b *= b;
    e >>= 1;
  }
  return result;
}

// H of one window (all of `window`; any length, 0 hashes to 0).
template <typename Token>
inline uint64_t PolyHashWindow(std::span<const Token> window) {
  static_assert(sizeof(Token) == 4 || sizeof(Token) == 8, "uint32 or uint64 token ids");
  uint64_t h = 0;
  for (Token x : window) h = h * kPolyBase + static_cast<uint64_t>(x);
  return h;
}

// One rolling step: the hash of the window moved right by one token, given the token that
// leaves (x_old), the one that enters (x_new) and B^k for the window length k.
inline uint64_t PolyRoll(uint64_t h, uint64_t x_old, uint64_t x_new, uint64_t base_pow_k) {
  return h * kPolyBase + x_new - x_old * base_pow_k;
}

// Hashes of the non-overlapping windows [w*k, (w+1)*k) for w < tokens.size() / k; a trailing
// partial window is ignored. Writes out[w]. Preconditions: k > 0, out.size() >= tokens.size()/k.
void HashWindows(std::span<const uint32_t> tokens, size_t k, std::span<uint64_t> out);
void HashWindows(std::span<const uint64_t> tokens, size_t k, std::span<uint64_t> out);

// Hashes of the window starting at every offset p in [0, tokens.size() - k]: out[p] = H of
// tokens[p, p+k). Nothing is written when tokens.size() < k. Preconditions: k > 0,
// out.size() >= tokens.size() - k + 1 when tokens.size() >= k.
void RollingHashes(std::span<const uint32_t> tokens, size_t k, std::span<uint64_t> out);
void RollingHashes(std::span<const uint64_t> tokens, size_t k, std::span<uint64_t> out);

}  // namespace kvd::blend
