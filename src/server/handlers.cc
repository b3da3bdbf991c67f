#include "server/handlers.h"

#include <spdlog/spdlog.h>

#include <array>
#include <optional>

#include "common/hex.h"
#include "server/request_phases.h"

namespace kvd::server {
namespace {

using wire::Op;

// Which kvd serves an op: every one, only one run with --engine-type blend, or none (the op
// exists on the wire; kvd answers nil and logs it).
enum class Served : uint8_t { kAlways, kWithBlend, kNever };

// One request being handled.
struct Call {
  KvService& svc;
  const wire::OpInfo& op;
  wire::Frames payloads;
  std::string_view client;
};

// One op: who serves it, the socket loop's rule, the reply of a refused request (nullptr:
// nil) and decode → call → encode (nullptr: not served here).
struct OpEntry {
  Op op;
  Served served;
  SocketRule rule;
  std::string (*failure)(const KvService&);
  std::string (*handle)(const Call&);
};

// Logs why the request failed; returns `reply`.
std::string FailWith(const Call& c, const Status& st, std::string reply) {
  spdlog::warn("{} from {}: {}", c.op.name, ClientTag(c.client), st.ToString());
  return reply;
}

// Logs why the request failed; returns the op's failure reply.
std::string Fail(const Call& c, const Status& st) { return FailWith(c, st, FailureReply(c.svc, c.op)); }

// Runs a decoder over the request's payloads, counting its time as the decode phase.
template <typename Decoder>
auto Decoded(Decoder decode, const Call& c) {
  ScopedPhase phase(Phase::kDecode);
  return decode(c.payloads);
}

std::string Nil() { return wire::EncodeNil(); }
std::string FalseReply(const KvService&) { return wire::EncodeBool(false); }
std::string ZeroReply(const KvService&) { return wire::EncodeInt(0); }
std::string NoHandleReply(const KvService&) { return wire::EncodeHandleAndOk("", false); }

// An op that takes a request and changes state, answering nil either way.
template <auto Decode, auto Method>
std::string NilAfter(const Call& c) {
  auto req = Decoded(Decode, c);
  if (!req.ok()) return Fail(c, req.status());
  if (Status st = (c.svc.*Method)(*req); !st.ok()) return Fail(c, st);
  return Nil();
}

// An op answered true when the service call succeeds.
template <auto Decode, auto Method>
std::string TrueAfter(const Call& c) {
  auto req = Decoded(Decode, c);
  if (!req.ok()) return Fail(c, req.status());
  if (Status st = (c.svc.*Method)(*req); !st.ok()) return Fail(c, st);
  return wire::EncodeBool(true);
}

// STORE / RETRIEVE: CPU transfers are complete when the reply is sent (an empty event
// handle: no device work to wait for). GPU transfers return the event that fires when the
// copy is done, also on a failure after work was enqueued.
template <auto Decode, auto Method>
std::string Transfer(const Call& c) {
  auto req = Decoded(Decode, c);
  if (!req.ok()) return Fail(c, req.status());
  std::string event;
  Status st = (c.svc.*Method)(*req, &event);
  if (!st.ok()) return FailWith(c, st, wire::EncodeHandleAndOk(event, false));
  return wire::EncodeHandleAndOk(event, true);
}

// QUERY_PREFETCH_STATUS and friends: nil while the lookup's prefetch from the tiers runs;
// then the hit count (unknown: 0).
std::string PrefetchHits(KvService& svc, std::string_view request_id) {
  auto hits = svc.QueryPrefetchStatus(request_id);
  return hits ? wire::EncodeInt(*hits) : Nil();
}

// UNREGISTER_KV_CACHE / its engine-driven twin: an unknown id is a no-op (the worker may
// send it again after a restart).
std::string UnregisterInstance(const Call& c) {
  auto id = Decoded(wire::DecodeInstanceId, c);
  if (!id.ok()) return Fail(c, id.status());
  if (Status st = c.svc.Unregister(*id); !st.ok()) spdlog::debug("{}: {}", c.op.name, st.ToString());
  return Nil();
}

// QUERY_PREFETCH_STATUS / QUERY_PREFETCH_LOOKUP_HITS: the request id, then PrefetchHits.
std::string QueryPrefetchHits(const Call& c) {
  auto id = Decoded(wire::DecodeRequestId, c);
  if (!id.ok()) return Fail(c, id.status());
  return PrefetchHits(c.svc, *id);
}

// Rows in wire::Op order (checked below). A, B, N: served always, with blend, never.
constexpr auto A = Served::kAlways;
constexpr auto B = Served::kWithBlend;
constexpr auto N = Served::kNever;
constexpr auto kPlain = SocketRule::kAsDispatched;

constexpr std::array<OpEntry, 36> kEntries = {{
    {Op::kRegisterKvCache, A, kPlain, nullptr,
     NilAfter<wire::DecodeRegisterKvCache, &KvService::RegisterKvCache>},
    {Op::kUnregisterKvCache, A, kPlain, nullptr,
     UnregisterInstance},
    {Op::kRegisterQCache, N, kPlain, nullptr, nullptr},
    {Op::kUnregisterQCache, N, kPlain, nullptr, nullptr},
    {Op::kStoreQ, N, kPlain, nullptr, nullptr},
    {Op::kStore, A, kPlain, NoHandleReply, Transfer<wire::DecodeStore, &KvService::Store>},
    {Op::kRetrieve, A, kPlain, NoHandleReply, Transfer<wire::DecodeRetrieve, &KvService::Retrieve>},
    {Op::kLookup, A, SocketRule::kPoolWhileCommitsPending, nullptr,
     NilAfter<wire::DecodeLookup, &KvService::Lookup>},
    {Op::kQueryPrefetchStatus, A, kPlain, ZeroReply, QueryPrefetchHits},
    {Op::kWaitPrefetchStatus, A, SocketRule::kParkWhilePrefetching, ZeroReply,
     [](const Call& c) {  // not parked (prefetch_waits.h): the answer is due now
       auto req = Decoded(wire::DecodeWaitPrefetch, c);
       if (!req.ok()) return Fail(c, req.status());
       return PrefetchHits(c.svc, req->first);
     }},
    {Op::kQueryPrefetchLookupHits, A, kPlain, ZeroReply, QueryPrefetchHits},
    {Op::kFreeLookupLocks, A, kPlain, nullptr,
     NilAfter<wire::DecodeLookup, &KvService::FreeLookupLocks>},
    {Op::kEndSession, A, kPlain, nullptr,
     [](const Call& c) {
       auto id = Decoded(wire::DecodeRequestId, c);
       if (!id.ok()) return Fail(c, id.status());
       c.svc.EndSession(*id);
       return Nil();
     }},
    {Op::kRegisterEngineDrivenContext, A, kPlain,
     [](const KvService&) { return wire::EncodeRegisterEngineDrivenResponse("", 0); },
     [](const Call& c) {
       auto req = Decoded(wire::DecodeRegisterEngineDriven, c);
       if (!req.ok()) return Fail(c, req.status());
       auto r = c.svc.RegisterEngineDriven(*req);
       if (!r.ok()) return Fail(c, r.status());
       return wire::EncodeRegisterEngineDrivenResponse(r->first, r->second);
     }},
    {Op::kUnregisterEngineDrivenContext, A, kPlain, nullptr,
     UnregisterInstance},
    {Op::kPrepareStore, A, kPlain,
     [](const KvService&) { return wire::EncodePrepareStoreResponse(std::nullopt, {}); },
     [](const Call& c) {
       auto req = Decoded(wire::DecodeEngineDriven, c);
       if (!req.ok()) return Fail(c, req.status());
       auto r = c.svc.PrepareStore(*req);
       if (!r.ok()) return Fail(c, r.status());
       return wire::EncodePrepareStoreResponse(r->first, r->second);
     }},
    {Op::kCommitStore, A, kPlain, FalseReply,
     TrueAfter<wire::DecodeEngineDriven, &KvService::CommitStore>},
    {Op::kPrepareRetrieve, A, kPlain,
     [](const KvService&) { return wire::EncodePrepareRetrieveResponse(false, {}); },
     [](const Call& c) {
       auto req = Decoded(wire::DecodeEngineDriven, c);
       if (!req.ok()) return Fail(c, req.status());
       auto r = c.svc.PrepareRetrieve(*req);
       if (!r.ok()) return Fail(c, r.status());
       return wire::EncodePrepareRetrieveResponse(true, *r);
     }},
    {Op::kCommitRetrieve, A, kPlain, FalseReply,
     TrueAfter<wire::DecodeEngineDriven, &KvService::CommitRetrieve>},
    {Op::kClear, A, kPlain, nullptr,
     [](const Call& c) {
       auto force = Decoded(wire::DecodeClear, c);
       if (!force.ok()) return Fail(c, force.status());
       c.svc.Clear();
       return Nil();
     }},
    {Op::kGetChunkSize, A, kPlain,
     [](const KvService& s) { return wire::EncodeInt(s.chunk_size()); },
     [](const Call& c) { return wire::EncodeInt(c.svc.chunk_size()); }},
    {Op::kPing, A, kPlain, FalseReply,
     [](const Call& c) {
       auto id = Decoded(wire::DecodePing, c);
       if (!id.ok()) return Fail(c, id.status());
       c.svc.Ping(*id);
       return wire::EncodeBool(true);
     }},
    {Op::kReportBlockAllocation, A, kPlain, nullptr,
     [](const Call& c) {  // observability only: checked, then answered
       auto req = Decoded(wire::DecodeReportBlockAllocation, c);
       if (!req.ok()) return Fail(c, req.status());
       return Nil();
     }},
    {Op::kNoop, A, kPlain, nullptr, [](const Call&) { return wire::EncodeStr("OK"); }},
    {Op::kCbRegisterRope, B, SocketRule::kLaneWhenBlend, nullptr,
     [](const Call& c) {
       auto req = Decoded(wire::DecodeCbRegisterRope, c);
       if (!req.ok()) return Fail(c, req.status());
       if (Status st = c.svc.blend()->RegisterRope(*req); !st.ok()) return Fail(c, st);
       return Nil();
     }},
    {Op::kCbUnregisterRope, B, SocketRule::kLaneWhenBlend, nullptr,
     [](const Call& c) {
       auto id = Decoded(wire::DecodeInstanceId, c);
       if (!id.ok()) return Fail(c, id.status());
       c.svc.blend()->UnregisterRope(*id);
       return Nil();
     }},
    {Op::kCbRetrievePreComputed, B, kPlain, NoHandleReply,
     [](const Call& c) {
       auto req = Decoded(wire::DecodeCbRetrievePreComputed, c);
       if (!req.ok()) return Fail(c, req.status());
       std::string handle;
       auto r = c.svc.blend()->RetrievePreComputed(*req, &handle);
       if (!r.ok()) return Fail(c, r.status());
       // A CPU scatter is complete when the reply is sent: an empty event handle, as a CPU
       // STORE answers. A GPU scatter: the event that fires when it is done.
       return wire::EncodeHandleAndOk(handle, *r);
     }},
    {Op::kCbUnifiedLookup, B, kPlain,
     // Nothing found (never nil, which reads as "still loading": the client would poll).
     [](const KvService&) { return wire::EncodeCbUnifiedLookupResult({}); },
     [](const Call& c) {
       auto req = Decoded(wire::DecodeCbUnifiedLookup, c);
       if (!req.ok()) return Fail(c, req.status());
       auto r = c.svc.blend()->UnifiedLookup(*req);
       if (!r.ok()) return Fail(c, r.status());
       // nil while the prefix leg loads from a tier: the client asks again.
       return *r ? wire::EncodeCbUnifiedLookupResult(**r) : Nil();
     }},
    {Op::kP2pLookupAndLock, N, kPlain, nullptr, nullptr},
    {Op::kP2pQueryLookupResults, N, kPlain, nullptr, nullptr},
    {Op::kP2pUnlockObjects, N, kPlain, nullptr, nullptr},
    {Op::kGetExperimental, A, kPlain, nullptr,
     [](const Call& c) { return wire::EncodeStrList(c.svc.ExperimentalCapabilities()); }},
    {Op::kCbProtocolHandshake, B, kPlain,
     [](const KvService&) { return wire::EncodeCbProtocolHandshake(0); },
     [](const Call& c) {
       auto v = Decoded(wire::DecodeCbProtocolHandshake, c);
       if (!v.ok()) return Fail(c, v.status());
       return wire::EncodeCbProtocolHandshake(*v);
     }},
    {Op::kSubscribeKvEvents, A, SocketRule::kStream, nullptr, nullptr},
    {Op::kServerModuleCall, N, kPlain, nullptr, nullptr},
    {Op::kCbReorderPlan, B, kPlain,
     [](const KvService&) { return wire::EncodeCbReorderPlan({}); },
     [](const Call& c) {
       auto req = Decoded(wire::DecodeCbReorderPlan, c);
       if (!req.ok()) return Fail(c, req.status());
       if (!c.svc.config().enable_blend_reorder) {
         return Fail(c, Status::FailedPrecondition("needs --enable-blend-reorder"));
       }
       return wire::EncodeCbReorderPlan(c.svc.blend()->ReorderPlan(*req));  // empty: keep the order
     }},
}};

constexpr bool RowsFollowOps() {
  for (size_t i = 0; i < kEntries.size(); ++i) {
    if (static_cast<size_t>(kEntries[i].op) != i) return false;
  }
  return kEntries.size() == static_cast<size_t>(Op::kCbReorderPlan) + 1;
}
static_assert(RowsFollowOps(), "one row per wire::Op, in enum order");

const OpEntry& EntryOf(Op op) { return kEntries[static_cast<size_t>(op)]; }

// Whether this kvd serves `entry` (blend ops need --engine-type blend).
bool Serves(const KvService& svc, const OpEntry& entry) {
  return entry.served == Served::kAlways ||
         (entry.served == Served::kWithBlend && svc.config().blend());
}

}  // namespace

std::string ClientTag(std::string_view identity) {
  std::string s = "client-";
  const std::string_view head = identity.substr(0, 8);
  AppendHex(s, head.data(), head.size());
  return s;
}

SocketRule SocketRuleOf(Op op) { return EntryOf(op).rule; }

std::string FailureReply(const KvService& svc, const wire::OpInfo& op) {
  const OpEntry& entry = EntryOf(op.op);
  if (!Serves(svc, entry) || entry.failure == nullptr) return Nil();
  return entry.failure(svc);
}

std::string HandleRequest(KvService& svc, const wire::OpInfo& op, wire::Frames p,
                          std::string_view client) {
  const OpEntry& entry = EntryOf(op.op);
  // Serving with blend means svc.blend() exists (KvService builds it for --engine-type blend).
  if (entry.handle == nullptr || !Serves(svc, entry)) {
    spdlog::warn("{} from {}: operation not supported by kvd; replying nil", op.name,
                 ClientTag(client));
    return Nil();
  }
  return entry.handle(Call{svc, op, p, client});
}

}  // namespace kvd::server
