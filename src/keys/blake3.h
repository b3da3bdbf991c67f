// BLAKE3 hash function (kvd's own implementation, written from the BLAKE3 spec).
//
// Supports the default hash mode, keyed hashing and key derivation, with 32-byte
// or arbitrary-length (extendable) output. Large inputs are hashed many chunks at
// a time with SSE4.1 or AVX2 code chosen at runtime (__builtin_cpu_supports);
// a portable scalar compression function is the reference and the fallback.
//
// Thread safety: a Blake3Hasher is a plain value with no shared state; one
// instance must not be updated from two threads at once, but const methods
// (Finalize) may run concurrently. The free functions are thread-safe.
// SetBlake3ImplForTesting changes a process-wide setting read when a hasher is
// constructed or reset; it is meant for tests and benchmarks only.
// Ownership: the hasher owns all its state inline (about 2.9 KiB, no heap use);
// Update() does not retain the caller's buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/hex.h"

namespace kvd::keys {

using Hash32 = std::array<uint8_t, 32>;

namespace internal {
struct Blake3Backend;
}  // namespace internal

inline constexpr size_t kBlake3KeyLen = 32;
inline constexpr size_t kBlake3OutLen = 32;

// Incremental BLAKE3 hasher. Feed input with Update() in pieces of any size, then
// read the output with Finalize(); Finalize() does not change the state, so more
// input may follow and Finalize() may be called again.
class Blake3Hasher {
 public:
  // Default (unkeyed) hash mode.
  Blake3Hasher();
  // Keyed hash mode with a 32-byte key.
  static Blake3Hasher Keyed(const uint8_t key[kBlake3KeyLen]);
  // Key derivation mode: the hasher's input is the key material.
  static Blake3Hasher DeriveKey(std::string_view context);

  void Update(const void* data, size_t len);
  // Writes out_len bytes of (extendable) output; the first 32 are the hash.
  void Finalize(uint8_t* out, size_t out_len) const;
  Hash32 Finalize() const;
  // Forgets all input; keeps the mode and key.
  void Reset();

 private:
  static constexpr size_t kChunkLen = 1024;
  // 2^64 bytes is 2^54 chunks: at most 53 canonical entries plus 2 unmerged.
  static constexpr size_t kMaxStack = 56;

  Blake3Hasher(const uint32_t key_words[8], uint8_t flags);
  // Merges the top of the CV stack until it has one entry per set bit of
  // `chunks` (done only once more input is known to follow those chunks).
  void MergeStack(uint64_t chunks);
  // Appends the chaining value of the next 2^level chunks to the stack.
  void PushCv(const uint8_t cv[32], unsigned level);
  // Compresses the buffered (complete) chunk and pushes its chaining value.
  void FlushBufferedChunk();

  uint32_t key_[8];
  uint8_t flags_;  // mode flags applied to every compression
  const internal::Blake3Backend* backend_;
  uint64_t chunk_counter_ = 0;  // chunks covered by cv_stack_
  size_t cv_stack_len_ = 0;
  size_t buf_len_ = 0;  // bytes of the chunk after them, buffered in buf_
  uint8_t cv_stack_[kMaxStack][32];
  alignas(32) uint8_t buf_[kChunkLen];
};

// One-shot default-mode hash.
Hash32 Blake3(const void* data, size_t len);

// Lower-case hexadecimal encoding, e.g. for logs and tests.
using kvd::HexEncode;  // common/hex.h
inline std::string HexEncode(const Hash32& h) { return kvd::HexEncode(h.data(), h.size()); }

// Implementation selection. kAuto picks the fastest one the CPU supports.
enum class Blake3Impl { kAuto, kPortable, kSse41, kAvx2 };
bool Blake3ImplSupported(Blake3Impl impl);
// The implementation new hashers use now (never kAuto).
Blake3Impl Blake3ActiveImpl();
const char* Blake3ImplName(Blake3Impl impl);
// Forces an implementation for hashers constructed or reset afterwards. Returns
// false (and changes nothing) if the CPU does not support it. Tests/benchmarks only.
bool SetBlake3ImplForTesting(Blake3Impl impl);

}  // namespace kvd::keys
