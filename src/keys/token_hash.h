// Token-chunk hashing at memory speed: the request path's BLAKE3.
//
// A chunk key is BLAKE3(prev || big-endian uint32 of each token), prev being the previous
// chunk's key (32 bytes) or NoneHash() for chunk 0 (see chunk_hasher.h for the scheme and
// its compatibility with lmcache 0.5.6). These functions take tokens as native-order
// uint32 (what wire decoding produces), byte-swap them with vector shuffles into a stack
// buffer and compress that buffer directly: no Blake3Hasher object, no heap. For chunks of
// up to 504 tokens (a message of at most two BLAKE3 chunks, 2,048 bytes; the default
// chunk is 256 tokens = 1,056 bytes) the compressions are called one-shot; longer chunks
// go through the general hasher.
//
// One chain is sequential (chunk i needs chunk i-1's key): its speed is the latency of
// one compression times 17 per 256-token chunk. Which kernel has the lower latency depends
// on the CPU (the row-parallel SSE4.1 one on the Intel machines measured, the scalar one,
// by 25%, on AMD Zen 4), so the automatic implementation times both once per process and
// keeps the faster (TokenChainDescription says which). Independent chains (several requests, or
// several ranges) are hashed side by side in SIMD lanes by HashTokenChains, eight at a time
// with AVX2, which is where the throughput is.
//
// Thread safety: stateless; safe from any thread. The implementation follows
// Blake3ActiveImpl() (SetBlake3ImplForTesting), so tests can compare all of them.
// Ownership: inputs are borrowed for the call; outputs are written to caller memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "keys/blake3.h"

namespace kvd::keys {

// Key of one chunk: BLAKE3(prev || BE32(tokens)). Any number of tokens.
Hash32 HashTokenChunk(const Hash32& prev, std::span<const uint32_t> tokens);

// Keys of out.size() consecutive chunks of chunk_size tokens, chained from `prev`:
// out[i] = HashTokenChunk(out[i-1] (prev for i == 0), tokens[i*C, (i+1)*C)).
// Preconditions: chunk_size > 0, tokens.size() >= out.size() * chunk_size.
void HashTokenChain(const Hash32& prev, std::span<const uint32_t> tokens, uint32_t chunk_size,
                    std::span<Hash32> out);

// One independent chain for HashTokenChains: num_chunks chunks starting at `tokens`
// (num_chunks * chunk_size tokens readable there), chained from `prev`, keys to `out`.
struct TokenChainJob {
  Hash32 prev;
  const uint32_t* tokens = nullptr;
  size_t num_chunks = 0;
  Hash32* out = nullptr;
};

// Same as calling HashTokenChain for each job, but chains run side by side in SIMD lanes
// where the CPU has them (AVX2: 8 lanes). Jobs must not overlap their `out` ranges.
void HashTokenChains(std::span<const TokenChainJob> jobs, uint32_t chunk_size);

// Lanes HashTokenChains runs side by side with the active implementation (1: none).
size_t TokenChainLanes();

// One line for the startup log: the backend and which kernel hashes one chain, with the
// timings that chose it, e.g. "avx2; one chain: portable, 1530 ns per 256-token chunk
// (the other kernel: 2021 ns)". The first call times the kernels (~6 ms).
std::string TokenChainDescription();

}  // namespace kvd::keys
