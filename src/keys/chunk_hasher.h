// Chained token-chunk hashing, bit-compatible with the lmcache 0.5.6 multiprocess
// server started with --hash-algorithm blake3.
//
// Tokens are cut into chunks of chunk_size tokens; only full chunks are hashed (a
// trailing partial chunk is dropped). Chunk i's key is
//   hash_i = BLAKE3(prev_i || big-endian uint32 of each token in chunk i)
// where prev_0 is NoneHash() and prev_i = hash_{i-1} (32 bytes), so a chunk's key
// identifies the whole token prefix up to its end.
//
// Thread safety: all functions are stateless and thread-safe. Ownership: inputs
// are borrowed for the call only; results are appended to the caller's vector.
// These take int64 tokens (as a client may send them), check the range and narrow them
// on the stack (chunks of up to 512 tokens; longer ones are copied to the heap once)
// before hashing with keys/token_hash.h, which is what the request path uses directly on
// the decoded uint32 tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "keys/blake3.h"

namespace kvd::keys {

// The chain seed: BLAKE3 of an 8-byte big-endian signed 0 (lmcache's integer
// prefix) followed by token 0 as big-endian uint32, i.e. BLAKE3 of 12 zero bytes.
const Hash32& NoneHash();

// The error for a token that does not fit in uint32: "token at index <index> has value
// <value>, which does not fit in uint32 [0, 2^32)".
Status TokenOutOfRange(size_t index, int64_t value);

// Hash of one chunk: BLAKE3(prev || tokens as big-endian uint32). Fails with
// InvalidArgument if a token is outside [0, 2^32); `index_base` is added to the
// position reported in the message.
Result<Hash32> HashChunk(const Hash32& prev, std::span<const int64_t> chunk_tokens, size_t index_base = 0);

// Appends the hashes of full chunks [first_chunk, tokens.size() / chunk_size) to
// *out, chaining from `prev`, which must be NoneHash() when first_chunk == 0 and
// the hash of chunk first_chunk - 1 otherwise. `tokens` is the whole sequence
// from token 0. Appends nothing if first_chunk is at or past the last full chunk.
// On error (chunk_size == 0, or a token of a hashed chunk outside [0, 2^32),
// named by index and value in the message) *out is left as it was.
Status AppendChainedChunkHashes(std::span<const int64_t> tokens, uint32_t chunk_size, size_t first_chunk,
                                const Hash32& prev, std::vector<Hash32>* out);

// Convenience: hashes of all full chunks, chaining from NoneHash().
Result<std::vector<Hash32>> ComputeChunkHashes(std::span<const int64_t> tokens, uint32_t chunk_size);

}  // namespace kvd::keys
