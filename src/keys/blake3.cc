// BLAKE3 tree hashing on top of the per-CPU compression backends, and runtime
// backend selection.
//
// Tree layout: the input is split into 1024-byte chunks; chunk chaining values
// are merged pairwise into parent nodes, the left subtree always holding the
// largest power-of-two number of chunks. The hasher keeps a stack of chaining
// values of complete power-of-two subtrees (sizes non-increasing bottom to top)
// plus a buffer for a trailing partial chunk. Merging is lazy: two equal-size
// subtrees on top of the stack are merged only when more input arrives, because
// until then their parent may be the root (which needs the ROOT flag). For the
// same reason a first chunk of exactly 1024 bytes stays buffered until more input
// arrives. Runs of whole chunks in one Update() are hashed as aligned power-of-two
// subtrees with the backend's hash-many function (all chunks, then each parent
// level) and pushed as their two halves.
//
// Thread safety: see blake3.h. The backend choice is a process-wide atomic.
#include "keys/blake3.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <vector>

#include "keys/blake3_internal.h"

namespace kvd::keys {
namespace internal {
namespace {

constexpr Blake3Backend kPortableBackend = {"portable",         CompressInPlacePortable,
                                            CompressXofPortable, HashManyPortable,
                                            TokenChainPortable, nullptr};
constexpr Blake3Backend kSse41Backend = {"sse4.1",      CompressInPlaceSse41, CompressXofSse41,
                                         HashManySse41, TokenChainSse41,      nullptr};
// One chain is latency-bound: the row-parallel SSE4.1 compression, or on CPUs with four
// scalar ALUs and one-cycle rotates (AMD Zen 4: 25% faster) the portable one; the auto
// backend times both once (OneChainChoice).
constexpr Blake3Backend kAvx2Backend = {"avx2",       CompressInPlaceSse41, CompressXofSse41,
                                        HashManyAvx2, TokenChainSse41,      TokenChains8Avx2};

bool CpuHas(Blake3Impl impl) {
#if defined(__x86_64__) || defined(__i386__)
  switch (impl) {
    case Blake3Impl::kSse41:
      return __builtin_cpu_supports("sse4.1");
    case Blake3Impl::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("sse4.1");
    default:
      return true;
  }
#else
  return impl == Blake3Impl::kPortable || impl == Blake3Impl::kAuto;
#endif
}

Blake3Impl BestImpl() {
  if (CpuHas(Blake3Impl::kAvx2)) return Blake3Impl::kAvx2;
  if (CpuHas(Blake3Impl::kSse41)) return Blake3Impl::kSse41;
  return Blake3Impl::kPortable;
}

const Blake3Backend* BackendFor(Blake3Impl impl) {
  switch (impl) {
    case Blake3Impl::kAvx2:
      return &kAvx2Backend;
    case Blake3Impl::kSse41:
      return &kSse41Backend;
    default:
      return &kPortableBackend;
  }
}

// kAuto until a test forces something else.
std::atomic<Blake3Impl> g_forced_impl{Blake3Impl::kAuto};

constexpr size_t kTimedChunks = 32, kTimedTokens = 256;

// Best time of `trials` runs of kernel over the same kTimedChunks chunks, in ns per chunk.
double NsPerChunk(TokenChainFn kernel, const uint32_t* tokens, int trials) {
  uint8_t prev[32] = {};
  uint8_t out[kTimedChunks * 32];
  double best = 1e300;
  for (int t = 0; t < trials; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    kernel(prev, tokens, kTimedTokens, kTimedChunks, out);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / kTimedChunks);
    prev[0] ^= out[0];  // each trial depends on the last: not folded away
  }
  return best;
}

// Times the backend's one-chain kernel against the portable one and returns the faster
// (the SIMD one unless the portable one is clearly, 5%, faster).
OneChainChoice TimeOneChainKernels(TokenChainFn simd) {
  if (simd == TokenChainPortable) return {TokenChainPortable, "portable", 0, 0};
  std::vector<uint32_t> chunk_tokens(kTimedChunks * kTimedTokens);  // 32 KiB: not on the stack
  uint32_t x = 0x9e3779b9u;
  for (auto& t : chunk_tokens) t = (x = x * 1664525u + 1013904223u) % 200000u;
  const uint32_t* tokens = chunk_tokens.data();
  // Warm up first (caches, branch predictors, and a core that idled may take a few ms to
  // reach its clock: timing a cold start once picked the slower kernel), then alternate the
  // two so that a step or a preemption hits both, keeping each one's best. ~6 ms in all.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3);
  while (std::chrono::steady_clock::now() < warm_until) {
    NsPerChunk(simd, tokens, 1);
    NsPerChunk(TokenChainPortable, tokens, 1);
  }
  double simd_ns = 1e300, portable_ns = 1e300;
  for (int round = 0; round < 10; ++round) {
    simd_ns = std::min(simd_ns, NsPerChunk(simd, tokens, 2));
    portable_ns = std::min(portable_ns, NsPerChunk(TokenChainPortable, tokens, 2));
  }
  if (portable_ns < 0.95 * simd_ns) return {TokenChainPortable, "portable", portable_ns, simd_ns};
  return {simd, simd == TokenChainSse41 ? "sse4.1" : "simd", simd_ns, portable_ns};
}

// The best backend with the one-chain kernel that was faster on this CPU, and that choice.
// Made once, on first use.
struct AutoSelection {
  Blake3Backend backend;
  OneChainChoice choice;
};
const AutoSelection& Auto() {
  static const AutoSelection selection = [] {
    AutoSelection a{*BackendFor(BestImpl()), {}};
    a.choice = TimeOneChainKernels(a.backend.token_chain);
    a.backend.token_chain = a.choice.kernel;
    return a;
  }();
  return selection;
}

}  // namespace

const OneChainChoice& AutoOneChainChoice() { return Auto().choice; }

const Blake3Backend* ActiveBackend() {
  const Blake3Impl forced = g_forced_impl.load(std::memory_order_relaxed);
  return forced == Blake3Impl::kAuto ? &Auto().backend : BackendFor(forced);
}

}  // namespace internal

using internal::kBlockLen;
using internal::kChunkEnd;
using internal::kChunkStart;
using internal::kIv;
using internal::kParent;
using internal::kRoot;

bool Blake3ImplSupported(Blake3Impl impl) { return internal::CpuHas(impl); }

Blake3Impl Blake3ActiveImpl() {
  static const Blake3Impl best = internal::BestImpl();
  Blake3Impl forced = internal::g_forced_impl.load(std::memory_order_relaxed);
  return forced == Blake3Impl::kAuto ? best : forced;
}

const char* Blake3ImplName(Blake3Impl impl) {
  switch (impl) {
    case Blake3Impl::kAuto:
      return "auto";
    case Blake3Impl::kPortable:
      return "portable";
    case Blake3Impl::kSse41:
      return "sse4.1";
    case Blake3Impl::kAvx2:
      return "avx2";
  }
  return "unknown";
}

bool SetBlake3ImplForTesting(Blake3Impl impl) {
  if (!internal::CpuHas(impl)) return false;
  internal::g_forced_impl.store(impl, std::memory_order_relaxed);
  return true;
}

namespace {

// Largest number of chunks hashed as one subtree by Update(); a power of two.
constexpr size_t kMaxSubtreeChunks = 64;

// The inputs of the last compression of a node, kept so that it can be run either
// as an ordinary (chaining value) compression or as root output blocks.
struct NodeOutput {
  uint32_t cv[8];
  alignas(16) uint8_t block[kBlockLen];
  uint8_t block_len;
  uint64_t counter;
  uint8_t flags;
};

void ChainingValue(const internal::Blake3Backend* backend, const NodeOutput& o, uint8_t out[32]) {
  uint32_t cv[8];
  std::memcpy(cv, o.cv, sizeof(cv));
  backend->compress_in_place(cv, o.block, o.block_len, o.counter, o.flags);
  for (int i = 0; i < 8; ++i) internal::StoreLe32(out + 4 * i, cv[i]);
}

void ParentOutput(const uint32_t key[8], uint8_t flags, const uint8_t left[32], const uint8_t right[32],
                  NodeOutput* o) {
  std::memcpy(o->cv, key, sizeof(o->cv));
  std::memcpy(o->block, left, 32);
  std::memcpy(o->block + 32, right, 32);
  o->block_len = kBlockLen;
  o->counter = 0;
  o->flags = flags | kParent;
}

}  // namespace

Blake3Hasher::Blake3Hasher() : Blake3Hasher(kIv, 0) {}

Blake3Hasher::Blake3Hasher(const uint32_t key_words[8], uint8_t flags)
    : flags_(flags), backend_(internal::ActiveBackend()) {
  std::memcpy(key_, key_words, sizeof(key_));
}

Blake3Hasher Blake3Hasher::Keyed(const uint8_t key[kBlake3KeyLen]) {
  uint32_t words[8];
  for (int i = 0; i < 8; ++i) words[i] = internal::LoadLe32(key + 4 * i);
  return Blake3Hasher(words, internal::kKeyedHash);
}

Blake3Hasher Blake3Hasher::DeriveKey(std::string_view context) {
  Blake3Hasher context_hasher(kIv, internal::kDeriveKeyContext);
  context_hasher.Update(context.data(), context.size());
  Hash32 context_key = context_hasher.Finalize();
  uint32_t words[8];
  for (int i = 0; i < 8; ++i) words[i] = internal::LoadLe32(context_key.data() + 4 * i);
  return Blake3Hasher(words, internal::kDeriveKeyMaterial);
}

void Blake3Hasher::Reset() {
  backend_ = internal::ActiveBackend();
  chunk_counter_ = 0;
  cv_stack_len_ = 0;
  buf_len_ = 0;
}

void Blake3Hasher::MergeStack(uint64_t chunks) {
  const size_t want = static_cast<size_t>(std::popcount(chunks));
  while (cv_stack_len_ > want) {
    NodeOutput parent;
    ParentOutput(key_, flags_, cv_stack_[cv_stack_len_ - 2], cv_stack_[cv_stack_len_ - 1], &parent);
    cv_stack_len_ -= 2;
    ChainingValue(backend_, parent, cv_stack_[cv_stack_len_++]);
  }
}

void Blake3Hasher::PushCv(const uint8_t cv[32], unsigned level) {
  // More input follows everything already on the stack, so it can be merged.
  MergeStack(chunk_counter_);
  std::memcpy(cv_stack_[cv_stack_len_++], cv, 32);
  chunk_counter_ += uint64_t{1} << level;
}

void Blake3Hasher::FlushBufferedChunk() {
  uint8_t cv[32];
  backend_->hash_many(buf_, kChunkLen, 1, internal::kBlocksPerChunk, key_, chunk_counter_, false, flags_,
                      kChunkStart, kChunkEnd, cv);
  buf_len_ = 0;
  PushCv(cv, 0);
}

void Blake3Hasher::Update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (len == 0) return;

  // Top up a partly filled chunk; flush it once it is full and more input follows
  // or once it is not the first chunk (its CV then never is the root output).
  if (buf_len_ > 0) {
    size_t take = std::min(kChunkLen - buf_len_, len);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    len -= take;
    if (buf_len_ == kChunkLen && (len > 0 || chunk_counter_ > 0)) FlushBufferedChunk();
  }

  // Whole chunks straight from the caller's buffer, as power-of-two subtrees
  // aligned to their size in the chunk sequence.
  alignas(32) uint8_t cvs_a[kMaxSubtreeChunks * 32];
  alignas(32) uint8_t cvs_b[kMaxSubtreeChunks / 2 * 32];
  while (buf_len_ == 0 && len >= kChunkLen) {
    if (chunk_counter_ == 0 && len == kChunkLen) break;  // may be the only chunk: buffer it
    size_t n = std::bit_floor(std::min(len / kChunkLen, kMaxSubtreeChunks));
    while ((chunk_counter_ & (n - 1)) != 0) n >>= 1;
    backend_->hash_many(p, kChunkLen, n, internal::kBlocksPerChunk, key_, chunk_counter_, true, flags_,
                        kChunkStart, kChunkEnd, cvs_a);
    p += n * kChunkLen;
    len -= n * kChunkLen;
    if (n == 1) {
      PushCv(cvs_a, 0);
      continue;
    }
    // Reduce level by level down to the subtree's two halves, alternating
    // buffers: `cur` holds `count` CVs. Outputs only shrink, so both buffers fit.
    uint8_t* cur = cvs_a;
    uint8_t* next = cvs_b;
    for (size_t count = n; count > 2; count /= 2) {
      backend_->hash_many(cur, 2 * 32, count / 2, 1, key_, 0, false, flags_ | kParent, 0, 0, next);
      std::swap(cur, next);
    }
    // Pushed unmerged: if the input ends here, their parent is the root.
    const unsigned half_level = static_cast<unsigned>(std::countr_zero(n)) - 1;
    PushCv(cur, half_level);
    PushCv(cur + 32, half_level);
  }

  if (len > 0) {
    std::memcpy(buf_ + buf_len_, p, len);
    buf_len_ += len;
  }
  // A buffered chunk follows everything on the stack: merge now so Finalize()
  // can roll the stack up from the right.
  if (buf_len_ > 0) MergeStack(chunk_counter_);
}

void Blake3Hasher::Finalize(uint8_t* out, size_t out_len) const {
  NodeOutput o;
  size_t remaining = cv_stack_len_;  // stack entries still to roll up
  if (buf_len_ > 0 || chunk_counter_ == 0) {
    // The rightmost node is the buffered chunk (or the empty input's only chunk).
    std::memcpy(o.cv, key_, sizeof(o.cv));
    size_t blocks = buf_len_ == 0 ? 1 : (buf_len_ + kBlockLen - 1) / kBlockLen;
    for (size_t b = 0; b + 1 < blocks; ++b) {
      backend_->compress_in_place(o.cv, buf_ + b * kBlockLen, kBlockLen, chunk_counter_,
                                  flags_ | (b == 0 ? kChunkStart : 0));
    }
    size_t last_len = buf_len_ - (blocks - 1) * kBlockLen;
    std::memset(o.block, 0, sizeof(o.block));
    std::memcpy(o.block, buf_ + (blocks - 1) * kBlockLen, last_len);
    o.block_len = static_cast<uint8_t>(last_len);
    o.counter = chunk_counter_;
    o.flags = flags_ | kChunkEnd | (blocks == 1 ? kChunkStart : 0);
  } else {
    // Input ended on a chunk boundary: the top two stack entries (there are at
    // least two) form the rightmost node.
    remaining -= 2;
    ParentOutput(key_, flags_, cv_stack_[remaining], cv_stack_[remaining + 1], &o);
  }

  // Roll up the rest of the stack from the right.
  while (remaining > 0) {
    uint8_t right[32];
    ChainingValue(backend_, o, right);
    ParentOutput(key_, flags_, cv_stack_[--remaining], right, &o);
  }

  // Root: output block t is the root compression with counter t.
  uint64_t t = 0;
  while (out_len > 0) {
    uint8_t block[64];
    backend_->compress_xof(o.cv, o.block, o.block_len, t++, o.flags | kRoot, block);
    size_t n = std::min(out_len, sizeof(block));
    std::memcpy(out, block, n);
    out += n;
    out_len -= n;
  }
}

Hash32 Blake3Hasher::Finalize() const {
  Hash32 h;
  Finalize(h.data(), h.size());
  return h;
}

Hash32 Blake3(const void* data, size_t len) {
  Blake3Hasher hasher;
  hasher.Update(data, len);
  return hasher.Finalize();
}

}  // namespace kvd::keys
