// Operation table of the lmcache multiprocess wire protocol, kept as data.
//
// The op frame of a request is a msgpack int (a frozen legacy id) or a msgpack str (the
// snake_case operation name, used only for ops missing from the frozen table). This
// header maps both to kvd's Op enum and says, per op, how many payload frames the
// lmcache 0.5.6 client sends and how the server dispatches it. A later lmcache release
// becomes a second table, not a rewrite. Immutable after static initialisation;
// safe to read from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kvd::wire {

enum class Op : uint8_t {
  kRegisterKvCache,
  kUnregisterKvCache,
  kRegisterQCache,
  kUnregisterQCache,
  kStoreQ,
  kStore,
  kRetrieve,
  kLookup,
  kQueryPrefetchStatus,
  kWaitPrefetchStatus,
  kQueryPrefetchLookupHits,
  kFreeLookupLocks,
  kEndSession,
  kRegisterEngineDrivenContext,
  kUnregisterEngineDrivenContext,
  kPrepareStore,
  kCommitStore,
  kPrepareRetrieve,
  kCommitRetrieve,
  kClear,
  kGetChunkSize,
  kPing,
  kReportBlockAllocation,
  kNoop,
  kCbRegisterRope,
  kCbUnregisterRope,
  kCbRetrievePreComputed,
  kCbUnifiedLookup,
  kP2pLookupAndLock,
  kP2pQueryLookupResults,
  kP2pUnlockObjects,
  kGetExperimental,
  kCbProtocolHandshake,
  kSubscribeKvEvents,
  kServerModuleCall,
  kCbReorderPlan,
};

// Where a handler runs: inline on the socket thread (cheap, bounded, never blocking), on
// the per-connection lane (keeps one worker's transfers and registrations in order, off
// the socket thread), on the pool, or inline when its payload is short and on the pool
// otherwise (lookups: their cost grows with the token list).
enum class Dispatch : uint8_t { kInline, kInstanceLane, kPool, kInlineUnlessLong };

struct OpInfo {
  Op op;
  std::string_view name;      // snake_case contract name
  int legacy_id;              // frozen numeric id, or -1 when sent by name
  uint8_t min_payloads;       // payload frames a valid request carries at least ...
  uint8_t max_payloads;       // ... and at most (trailing defaulted frames may be absent)
  Dispatch dispatch;
  bool supported;             // false: kvd answers with a clear failure / no-op
};

// The table for the lmcache 0.5.6 client.
std::span<const OpInfo> Lmcache056Ops();

// Looks up an op by its frozen id or by name; nullptr if unknown.
const OpInfo* FindOpById(int64_t legacy_id);
const OpInfo* FindOpByName(std::string_view name);
const OpInfo& InfoOf(Op op);

}  // namespace kvd::wire
