#include "wire/ops.h"

#include <array>

namespace kvd::wire {
namespace {

using D = Dispatch;

// Dispatch: registrations run on the connection's lane, not on the socket thread (mapping
// segments, building layouts, pinning L1 for a first GPU registration or tearing an
// engine down can take far longer than the ~1 ms the socket thread may spend on one op).
// Payload counts follow the RequestClient contract of lmcache 0.5.6
// (lmcache/v1/multiprocess/transport/base.py); ids follow its frozen table
// (transport/zmq_impl/wire.py). Id 11 is retired there and is kept here only so an
// older client gets an answer instead of silence.
constexpr std::array kOps = {
    OpInfo{Op::kRegisterKvCache, "register_kv_cache", 1, 7, 7, D::kInstanceLane, true},
    OpInfo{Op::kUnregisterKvCache, "unregister_kv_cache", 2, 1, 1, D::kInstanceLane, true},
    OpInfo{Op::kRegisterQCache, "register_q_cache", 3, 7, 7, D::kInline, false},
    OpInfo{Op::kUnregisterQCache, "unregister_q_cache", 4, 1, 1, D::kInline, false},
    OpInfo{Op::kStoreQ, "store_q", 5, 4, 4, D::kInstanceLane, false},
    OpInfo{Op::kStore, "store", 6, 4, 4, D::kInstanceLane, true},
    OpInfo{Op::kRetrieve, "retrieve", 7, 4, 5, D::kInstanceLane, true},
    OpInfo{Op::kLookup, "lookup", 8, 1, 2, D::kInlineUnlessLong, true},
    OpInfo{Op::kQueryPrefetchStatus, "query_prefetch_status", 9, 1, 1, D::kInline, true},
    OpInfo{Op::kWaitPrefetchStatus, "wait_prefetch_status", 10, 1, 2, D::kInline, true},
    OpInfo{Op::kQueryPrefetchLookupHits, "query_prefetch_lookup_hits", 11, 1, 1, D::kInline, true},
    OpInfo{Op::kFreeLookupLocks, "free_lookup_locks", 12, 1, 2, D::kInlineUnlessLong, true},
    OpInfo{Op::kEndSession, "end_session", 13, 1, 2, D::kInline, true},
    OpInfo{Op::kRegisterEngineDrivenContext, "register_kv_cache_engine_driven_context", 14, 1, 1, D::kInstanceLane, true},
    OpInfo{Op::kUnregisterEngineDrivenContext, "unregister_kv_cache_engine_driven_context", 15, 1, 1, D::kInstanceLane, true},
    OpInfo{Op::kPrepareStore, "prepare_store", 16, 2, 2, D::kInstanceLane, true},
    OpInfo{Op::kCommitStore, "commit_store", 17, 2, 3, D::kInstanceLane, true},
    OpInfo{Op::kPrepareRetrieve, "prepare_retrieve", 18, 2, 2, D::kInstanceLane, true},
    OpInfo{Op::kCommitRetrieve, "commit_retrieve", 19, 2, 2, D::kInstanceLane, true},
    OpInfo{Op::kClear, "clear", 20, 0, 1, D::kPool, true},
    OpInfo{Op::kGetChunkSize, "get_chunk_size", 21, 0, 0, D::kInline, true},
    OpInfo{Op::kPing, "ping", 22, 0, 1, D::kInline, true},
    OpInfo{Op::kReportBlockAllocation, "report_block_allocation", 23, 3, 3, D::kInlineUnlessLong, true},
    OpInfo{Op::kNoop, "noop", 24, 0, 0, D::kInline, true},
    OpInfo{Op::kCbRegisterRope, "cb_register_rope", 25, 7, 8, D::kInline, false},
    OpInfo{Op::kCbUnregisterRope, "cb_unregister_rope", 26, 1, 1, D::kInline, false},
    OpInfo{Op::kCbRetrievePreComputed, "cb_retrieve_pre_computed", 27, 5, 5, D::kInstanceLane, false},
    OpInfo{Op::kCbUnifiedLookup, "cb_unified_lookup", 28, 2, 2, D::kPool, false},
    OpInfo{Op::kP2pLookupAndLock, "p2p_lookup_and_lock", 29, 2, 2, D::kPool, false},
    OpInfo{Op::kP2pQueryLookupResults, "p2p_query_lookup_results", 30, 1, 1, D::kPool, false},
    OpInfo{Op::kP2pUnlockObjects, "p2p_unlock_objects", 31, 1, 1, D::kPool, false},
    OpInfo{Op::kGetExperimental, "get_experimental", 32, 0, 0, D::kInline, true},
    OpInfo{Op::kCbProtocolHandshake, "cb_protocol_handshake", 33, 1, 1, D::kInline, false},
    OpInfo{Op::kSubscribeKvEvents, "subscribe_kv_events", -1, 4, 4, D::kInline, true},
    OpInfo{Op::kServerModuleCall, "server_module_call", -1, 1, 1, D::kInline, false},
    OpInfo{Op::kCbReorderPlan, "cb_reorder_plan", -1, 3, 3, D::kPool, false},
};

}  // namespace

std::span<const OpInfo> Lmcache056Ops() { return kOps; }

const OpInfo* FindOpById(int64_t legacy_id) {
  for (const auto& info : kOps) {
    if (info.legacy_id >= 0 && info.legacy_id == legacy_id) return &info;
  }
  // Ids >= 25 moved between lmcache releases; 40 was get_experimental before the
  // CacheBlend renumbering. Accept it so such a client sees an empty capability list.
  if (legacy_id == 40) return &InfoOf(Op::kGetExperimental);
  return nullptr;
}

const OpInfo* FindOpByName(std::string_view name) {
  for (const auto& info : kOps) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

const OpInfo& InfoOf(Op op) { return kOps[static_cast<size_t>(op)]; }

}  // namespace kvd::wire
