// Typed requests of the lmcache 0.5.6 multiprocess protocol, as kvd sees them after
// decoding. Plain values that own their data; no msgpack or ZMQ types leak out.
// Field names follow the client's dataclasses/structs so the mapping stays obvious.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "layout/tensor_spec.h"

namespace kvd::wire {

// A request's token ids as the chunk hash reads them: native-order uint32 values in one
// flat buffer, filled by the decoder in one pass (no zero fill, no int64 copy). The client
// may send any int64; values outside [0, 2^32) are kept truncated in the buffer and the
// first of them is remembered (index and value), so that hashing a range that contains it
// fails with the value the client sent, while tokens beyond the hashed range stay
// harmless, as before. Plain value: copyable, movable; not thread-safe to mutate.
class TokenIds {
 public:
  struct OutOfRange {
    size_t index = 0;
    int64_t value = 0;
  };

  TokenIds() = default;
  TokenIds(std::initializer_list<int64_t> values) {
    for (int64_t v : values) push_back(v);
  }
  TokenIds(const TokenIds& other) { *this = other; }
  TokenIds(TokenIds&& other) noexcept { *this = std::move(other); }
  TokenIds& operator=(const TokenIds& other) {
    if (this != &other) {
      uint32_t* dst = ResizeUninitialized(other.size_);
      if (other.size_) std::memcpy(dst, other.data_.get(), other.size_ * sizeof(uint32_t));
      out_of_range_ = other.out_of_range_;
    }
    return *this;
  }
  TokenIds& operator=(TokenIds&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    out_of_range_ = std::exchange(other.out_of_range_, std::nullopt);
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const uint32_t* data() const { return data_.get(); }
  std::span<const uint32_t> span() const { return {data_.get(), size_}; }
  uint32_t operator[](size_t i) const { return data_[i]; }
  uint32_t& operator[](size_t i) { return data_[i]; }
  const std::optional<OutOfRange>& first_out_of_range() const { return out_of_range_; }

  void push_back(int64_t v) {
    if (size_ == capacity_) Grow(size_ == 0 ? 16 : 2 * size_);
    if ((v < 0 || v > int64_t{0xFFFFFFFF}) && !out_of_range_) out_of_range_ = OutOfRange{size_, v};
    data_[size_++] = static_cast<uint32_t>(v);
  }
  // For decoders: makes the buffer n tokens long with unspecified contents (no zero
  // fill; the caller writes all n) and forgets any out-of-range note.
  uint32_t* ResizeUninitialized(size_t n) {
    if (n > capacity_) {
      data_.reset(new uint32_t[n]);  // default-initialised: not zeroed
      capacity_ = n;
    }
    size_ = n;
    out_of_range_.reset();
    return data_.get();
  }
  // For decoders: token `index` was `value`, outside [0, 2^32); the first one is kept.
  void NoteOutOfRange(size_t index, int64_t value) {
    if (!out_of_range_ || index < out_of_range_->index) out_of_range_ = OutOfRange{index, value};
  }

 private:
  void Grow(size_t capacity) {
    std::unique_ptr<uint32_t[]> bigger(new uint32_t[capacity]);
    if (size_) std::memcpy(bigger.get(), data_.get(), size_ * sizeof(uint32_t));
    data_ = std::move(bigger);
    capacity_ = capacity;
  }

  std::unique_ptr<uint32_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
  std::optional<OutOfRange> out_of_range_;
};

// IPCCacheServerKey: a token range of one request. request_id, request_configs and
// num_kv_readers are not part of the cache identity.
struct CacheKey {
  std::string model_name;
  int64_t world_size = 0;
  std::optional<int64_t> worker_id;  // nullopt for scheduler lookups
  TokenIds token_ids;                // from position 0 up to at least `end`
  int64_t start = 0;
  int64_t end = 0;
  std::string request_id;
  std::string cache_salt;
  int64_t num_kv_readers = 0;        // 0: not sent by the client
};

// Layout's types (layout/tensor_spec.h): the decoders fill them, converted at the edge.
using TensorMemory = layout::TensorMemory;
using TensorDescriptor = layout::TensorDescriptor;
using LayoutHints = layout::LayoutHints;
using EngineGroupInfo = layout::EngineGroupInfo;

struct RegisterKvCacheRequest {
  int64_t instance_id = 0;
  std::vector<TensorDescriptor> tensors;
  std::string model_name;
  int64_t world_size = 0;
  std::string engine_type;           // EngineType value, e.g. "vllm"
  LayoutHints layout_hints;
  std::vector<EngineGroupInfo> group_infos;  // empty: one non-hybrid group
};

// STORE and RETRIEVE (lmcache-driven): the server copies between the registered
// tensors and L1. block_ids has one inner list per KV group.
struct TransferRequest {
  CacheKey key;
  int64_t instance_id = 0;
  std::vector<std::vector<int64_t>> block_ids;
  std::string event_handle;
  int64_t skip_first_n_tokens = 0;   // RETRIEVE only
};

struct LookupRequest {
  CacheKey key;
  int64_t tp_size = 1;
};

struct RegisterEngineDrivenRequest {
  int64_t instance_id = 0;
  std::string model_name;
  int64_t world_size = 0;
  int64_t block_size = 0;
  int64_t num_layers = 0;
  int64_t hidden_dim_size = 0;
  std::string dtype_str;
  bool use_mla = false;
  std::optional<int64_t> num_physical_slots;
};

// PREPARE_STORE / COMMIT_STORE / PREPARE_RETRIEVE / COMMIT_RETRIEVE.
struct EngineDrivenRequest {
  CacheKey key;
  int64_t instance_id = 0;
  std::string data;                  // COMMIT_STORE only: empty unless pickle fallback
};

struct BlockAllocationRecord {
  std::string req_id;
  std::vector<int64_t> new_block_ids;
  std::vector<int64_t> new_token_ids;
};

struct ReportBlockAllocationRequest {
  int64_t instance_id = 0;
  std::string model_name;
  std::vector<BlockAllocationRecord> records;
};

// One slot of the L1 pool handed to an engine-driven worker.
struct ShmSlot {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<int64_t> shape;
  std::string dtype;
};

// subscribe_kv_events(instance_id, model_name, cursor, max_events): a worker's
// subscription to the server's cache-event log (lmcache 0.5.6 KVEventModule).
struct SubscribeKvEventsRequest {
  int64_t instance_id = 0;
  std::string model_name;
  int64_t cursor = 0;
  int64_t max_events = 0;
};

// KVEventRecord: one sequenced change of the CPU cache. "stored" records carry one chunk's
// 32-byte hash, its parent's hash (none for a sequence's first chunk) and its tokens;
// "removed" records the hashes of chunks that left the cache.
struct KvEventRecord {
  int64_t seq = 0;
  std::string kind;                  // "stored" | "removed" | "loaded" (kvd: medium "P2P")
  std::string medium = "CPU";
  std::string model_name;
  std::vector<std::array<uint8_t, 32>> block_hashes;
  std::optional<std::array<uint8_t, 32>> parent_block_hash;
  std::vector<uint32_t> token_ids;   // kvd's tokens are < 2^32 (keys/chunk_hasher.h)
};

// KVEventBatch: what one stream message carries. enabled=false ends the stream; a changed
// incarnation or lost=true tells the subscriber to withdraw what it announced earlier.
struct KvEventBatch {
  bool enabled = false;
  int64_t incarnation = 0;
  int64_t next_cursor = 0;
  bool lost = false;
  std::vector<KvEventRecord> events;
};

// ---- CacheBlend (lmcache 0.5.6 `lmcache server --engine-type blend`) ----
// What the blend ops carry once decoded (wire/codec.h: DecodeCb*). The decoders check only
// what needs no server state; the handler checks the rest against the registration.

// One group_rot entry: the slice of a head row that RoPE rotated, in elements.
struct RopeWindow {
  int64_t offset = 0;                // >= 0
  int64_t width = 0;                 // > 0
};

// cb_register_rope: how an lmcache-driven instance applied RoPE, so that cached K can be
// rotated from the positions it was stored at to new ones.
struct CbRegisterRopeRequest {
  int64_t instance_id = 0;
  // The engine's cos/sin caches (ext-1 descriptors), one per distinct rope; empty for a
  // model without RoPE (the state then only carries scatter geometry).
  std::vector<TensorDescriptor> cos_sin_caches;
  int64_t head_size = 0;             // rotary head dimension
  bool is_neox_style = false;        // true: NeoX (halves); false: GPT-J (adjacent pairs)
  // Per engine group: index into cos_sin_caches, or -1 (no re-RoPE for that group).
  // Empty: every group uses cache 0.
  std::vector<int64_t> group_to_cache;
  // Per engine group: the rotated window, or nullopt (sent as [] or nil) to skip the group.
  // Empty: rotate head_size elements at offset 0 in every group.
  std::vector<std::optional<RopeWindow>> group_rot;
  // Per engine group: the head size the scatter uses. Empty: head_size for every group.
  std::vector<int64_t> group_head_size;
  // fp8 flavour of the paged KV: "fp8_e4m3" or "fp8_e5m2"; "" for unquantised KV (and
  // when a client older than the field sent 7 payloads).
  std::string kv_quant;
};

// CBMatchResult: a token range of a stored sequence found again in the current prompt,
// possibly at another position. The ranges are [st, ed) token positions.
struct CbMatchResult {
  int64_t old_st = 0;                // where it was stored
  int64_t old_ed = 0;
  int64_t cur_st = 0;                // where it is in the current prompt
  int64_t cur_ed = 0;
  std::string hash;                  // the stored chunk's key, opaque bytes (1..64)
};

// cb_retrieve_pre_computed: scatter the matched ranges into the engine's paged cache.
// block_ids has one table per engine group. The key's worker_id may be nil.
struct CbRetrievePreComputedRequest {
  CacheKey key;
  std::vector<CbMatchResult> match_results;
  std::vector<std::vector<int64_t>> block_ids;
  int64_t instance_id = 0;
  std::string event_handle;
};

// CBUnifiedLookupResult: the reply of cb_unified_lookup once both legs are in L1 (while
// they load the reply is nil and the client asks again).
struct CbUnifiedLookupResult {
  int64_t prefix_coverage_tokens = 0;
  std::vector<CbMatchResult> non_prefix_segments;        // ascending cur_st
  std::vector<CbMatchResult> segmented_prefix_segments;  // old_st == cur_st; empty unless on
};

// cb_reorder_plan (sent by name): reorder key.token_ids so the prompt starts with a cached
// prompt, keeping the first keep_prefix tokens in place, within budget_ms.
struct CbReorderPlanRequest {
  CacheKey key;
  int64_t keep_prefix = 0;           // >= 0
  int64_t budget_ms = 0;             // >= 0
};

}  // namespace kvd::wire
