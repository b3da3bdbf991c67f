// Codec for the lmcache 0.5.6 multiprocess wire protocol.
//
// Decoders take the payload frames of one request (each frame one msgpack document),
// bound every size before allocating (see DecodeLimits), read maps by field name
// (unknown keys ignored, defaulted fields filled) and return a typed request or an
// InvalidArgument Status that says which field was wrong. They never throw. The request
// path's decoders (op frame, STORE/RETRIEVE/LOOKUP/engine-driven keys, scalar frames) read
// each frame in one streaming pass, token arrays straight into CacheKey::token_ids, and
// allocate nothing but the request's own buffers; views they return (request ids) point
// into the payload frames and live as long as those.
// Encoders produce exactly one reply frame. Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "wire/messages.h"
#include "wire/ops.h"

namespace kvd::wire {

using Frames = std::span<const std::string_view>;

// Upper bounds applied while parsing, before any allocation.
struct DecodeLimits {
  size_t max_array = 16u << 20;       // elements: token lists of very long prompts
  size_t max_map = 4096;
  size_t max_str = 1u << 20;
  size_t max_bin = 1u << 30;
  size_t max_ext = 1u << 20;
  size_t max_depth = 16;
};

// Client strings kvd keeps (issue 27, finding 6): each is bounded where it is decoded, so
// what a request leaves behind (a session, a lookup hold, a parked wait, a stream) costs a
// known amount whatever the client sends.
//   - A request id (a key's request_id, QUERY/WAIT_PREFETCH_STATUS, END_SESSION,
//     report_block_allocation's req_id) is at most kMaxRequestIdBytes: vLLM's ids are ~50
//     bytes ("cmpl-<uuid>-0-<8 hex>", or a client's X-Request-Id in their place). A key with
//     a longer one is refused as any malformed key is (a LOOKUP answers as failed, 0 hits).
//   - Any other string field (names, dtypes, tags, layouts) is at most kMaxStringFieldBytes.
//   - The request uid frame (lmcache's RequestUID, a msgpack int of at most 9 bytes) is at
//     most kMaxRequestUidBytes; a message with a longer one is dropped unanswered by the
//     server (server/zmq_server.h), since any reply would echo it.
inline constexpr size_t kMaxRequestIdBytes = 1024;
inline constexpr size_t kMaxStringFieldBytes = 4096;
inline constexpr size_t kMaxRequestUidBytes = 64;

// The op frame: a msgpack int (frozen id) or str (op name). NotFound for unknown ops.
Result<const OpInfo*> DecodeOp(std::string_view op_frame);

Result<RegisterKvCacheRequest> DecodeRegisterKvCache(Frames payloads);
Result<int64_t> DecodeInstanceId(Frames payloads);                  // unregister ops
Result<TransferRequest> DecodeStore(Frames payloads);
Result<TransferRequest> DecodeRetrieve(Frames payloads);
Result<LookupRequest> DecodeLookup(Frames payloads);                // also free_lookup_locks
// query/end_session: the request id, a view into the payload frame.
Result<std::string_view> DecodeRequestId(Frames payloads);
Result<std::pair<std::string_view, double>> DecodeWaitPrefetch(Frames payloads);
Result<std::optional<int64_t>> DecodePing(Frames payloads);
Result<bool> DecodeClear(Frames payloads);                          // force flag
Result<RegisterEngineDrivenRequest> DecodeRegisterEngineDriven(Frames payloads);
Result<EngineDrivenRequest> DecodeEngineDriven(Frames payloads);    // prepare/commit ops
Result<ReportBlockAllocationRequest> DecodeReportBlockAllocation(Frames payloads);
Result<SubscribeKvEventsRequest> DecodeSubscribeKvEvents(Frames payloads);

// Decodes one ext-1 device IPC descriptor (the data of msgpack ext type 1).
Result<TensorDescriptor> DecodeTensorDescriptor(std::string_view ext_data);

// ---- CacheBlend ops (lmcache 0.5.6, --engine-type blend) ----
// Payloads as the 0.5.6 RequestClient sends them (one frame per parameter, defaults
// included). Besides structure and DecodeLimits, a decoder refuses only what lmcache's
// handler refuses without looking at server state; the handler checks the rest (the
// instance is registered, group_to_cache covers its engine groups), so where a request has
// two faults kvd may name the other one. cb_unregister_rope is DecodeInstanceId.
//
// cb_register_rope(instance_id, cos_sin_caches_ipc, head_size, is_neox_style,
// group_to_cache, group_rot, group_head_size[, kv_quant]): 7 payloads (clients before
// kv_quant) or 8. nil for a list reads as empty, nil for kv_quant as "". Refused as lmcache
// refuses them: a group_to_cache index outside [-1, number of caches), a kv_quant other than
// "", "fp8_e4m3", "fp8_e5m2", a group_rot entry other than [] / nil / [offset >= 0,
// width > 0]; and, as for register_kv_cache, a cache descriptor kvd cannot map.
Result<CbRegisterRopeRequest> DecodeCbRegisterRope(Frames payloads);
// cb_retrieve_pre_computed(key, match_results, block_ids, instance_id, event_ipc_handle).
// Each match: the five CBMatchResult fields, 0 <= st <= ed for both ranges, a hash of
// 1..kMaxCbHashBytes bytes (lmcache's chunk keys are 8 or 32 bytes, kvd's 32).
inline constexpr size_t kMaxCbHashBytes = 64;
Result<CbRetrievePreComputedRequest> DecodeCbRetrievePreComputed(Frames payloads);
// cb_unified_lookup(key, tp_size): both payloads required.
Result<LookupRequest> DecodeCbUnifiedLookup(Frames payloads);
// cb_protocol_handshake(client_version): the client's blend protocol version.
Result<int64_t> DecodeCbProtocolHandshake(Frames payloads);
// cb_reorder_plan(key, keep_prefix, budget_ms): both numbers >= 0.
Result<CbReorderPlanRequest> DecodeCbReorderPlan(Frames payloads);

// Reply encoders: each returns one msgpack document.
std::string EncodeNil();
std::string EncodeBool(bool v);
std::string EncodeInt(int64_t v);
std::string EncodeOptionalInt(std::optional<int64_t> v);
std::string EncodeStr(std::string_view v);
std::string EncodeStrList(std::span<const std::string> v);
std::string EncodeHandleAndOk(std::string_view event_handle, bool ok);   // [bin, bool]
std::string EncodeRegisterEngineDrivenResponse(std::string_view shm_name, uint64_t pool_size);
// {"context": {"slots": [...], "chunk_indices": [...]}}; slots == nullopt → {"context": {}}
std::string EncodePrepareStoreResponse(const std::optional<std::vector<ShmSlot>>& slots,
                                       std::span<const int64_t> chunk_indices);
std::string EncodePrepareRetrieveResponse(bool success, std::span<const ShmSlot> slots);
// One message of a subscribe_kv_events stream: the KVEventBatch dataclass as a map.
std::string EncodeKvEventBatch(const KvEventBatch& batch);

// CacheBlend replies. cb_register_rope / cb_unregister_rope answer nil, and so does
// cb_unified_lookup while its legs load; cb_retrieve_pre_computed answers
// EncodeHandleAndOk(event_handle, scatter_ran).
inline constexpr int64_t kCbProtocolVersion = 1;  // the blend protocol lmcache 0.5.6 speaks
// [kCbProtocolVersion, client_version == kCbProtocolVersion]
std::string EncodeCbProtocolHandshake(int64_t client_version);
// The CBUnifiedLookupResult dataclass as a map (fields in declaration order, each match
// {old_st, old_ed, cur_st, cur_ed, hash: bin}), byte for byte what 0.5.6 sends.
std::string EncodeCbUnifiedLookupResult(const CbUnifiedLookupResult& result);
// cb_reorder_plan: the reordered token ids; empty keeps the prompt's order.
std::string EncodeCbReorderPlan(std::span<const uint32_t> token_ids);

}  // namespace kvd::wire
