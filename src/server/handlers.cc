#include "server/handlers.h"

#include "common/hex.h"

#include <spdlog/spdlog.h>

#include <optional>

#include "server/request_phases.h"

namespace kvd::server {
namespace {

using wire::Op;

std::string Fail(const wire::OpInfo& op, std::string_view client, const Status& st,
                 std::string reply) {
  spdlog::warn("{} from {}: {}", op.name, ClientTag(client), st.ToString());
  return reply;
}

// Runs a decoder, counting its time as the request's decode phase.
template <typename Decoder>
auto Decoded(Decoder decode, wire::Frames p) {
  ScopedPhase phase(Phase::kDecode);
  return decode(p);
}

}  // namespace

std::string ClientTag(std::string_view identity) {
  std::string s = "client-";
  const std::string_view head = identity.substr(0, 8);
  AppendHex(s, head.data(), head.size());
  return s;
}

std::string FailureReply(const KvService& svc, const wire::OpInfo& op) {
  switch (op.op) {
    case Op::kGetChunkSize:
      return wire::EncodeInt(svc.chunk_size());
    case Op::kPing:
    case Op::kCommitStore:
    case Op::kCommitRetrieve:
      return wire::EncodeBool(false);
    case Op::kStore:
    case Op::kRetrieve:
      return wire::EncodeHandleAndOk("", false);
    case Op::kQueryPrefetchStatus:
    case Op::kQueryPrefetchLookupHits:
    case Op::kWaitPrefetchStatus:
      return wire::EncodeInt(0);
    case Op::kRegisterEngineDrivenContext:
      return wire::EncodeRegisterEngineDrivenResponse("", 0);
    case Op::kPrepareStore:
      return wire::EncodePrepareStoreResponse(std::nullopt, {});
    case Op::kPrepareRetrieve:
      return wire::EncodePrepareRetrieveResponse(false, {});
    default:
      break;
  }
  if (svc.config().blend()) {
    switch (op.op) {
      case Op::kCbRetrievePreComputed:
        return wire::EncodeHandleAndOk("", false);
      case Op::kCbUnifiedLookup:
        // Nothing found (never nil, which reads as "still loading": the client would poll).
        return wire::EncodeCbUnifiedLookupResult({});
      case Op::kCbProtocolHandshake:
        return wire::EncodeCbProtocolHandshake(0);
      case Op::kCbReorderPlan:
        return wire::EncodeCbReorderPlan({});
      default:
        break;
    }
  }
  return wire::EncodeNil();
}

namespace {

// CacheBlend's ops (--engine-type blend; server/blend_ops.h). nullopt: not a blend op.
std::optional<std::string> HandleBlend(KvService& svc, BlendOps& blend, const wire::OpInfo& op,
                                       wire::Frames p, std::string_view client) {
  switch (op.op) {
    case Op::kCbRegisterRope: {
      auto req = Decoded(wire::DecodeCbRegisterRope, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = blend.RegisterRope(*req); !st.ok()) return Fail(op, client, st, wire::EncodeNil());
      return wire::EncodeNil();
    }
    case Op::kCbUnregisterRope: {
      auto id = Decoded(wire::DecodeInstanceId, p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeNil());
      blend.UnregisterRope(*id);
      return wire::EncodeNil();
    }
    case Op::kCbUnifiedLookup: {
      auto req = Decoded(wire::DecodeCbUnifiedLookup, p);
      if (!req.ok()) return Fail(op, client, req.status(), FailureReply(svc, op));
      auto r = blend.UnifiedLookup(*req);
      if (!r.ok()) return Fail(op, client, r.status(), FailureReply(svc, op));
      // nil while the prefix leg loads from a tier: the client asks again.
      return *r ? wire::EncodeCbUnifiedLookupResult(**r) : wire::EncodeNil();
    }
    case Op::kCbRetrievePreComputed: {
      auto req = Decoded(wire::DecodeCbRetrievePreComputed, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeHandleAndOk("", false));
      auto r = blend.RetrievePreComputed(*req);
      // The CPU scatter is complete when the reply is sent: an empty event handle, as a CPU
      // STORE answers (no device work to wait for).
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodeHandleAndOk("", false));
      return wire::EncodeHandleAndOk("", *r);
    }
    case Op::kCbProtocolHandshake: {
      auto v = Decoded(wire::DecodeCbProtocolHandshake, p);
      if (!v.ok()) return Fail(op, client, v.status(), FailureReply(svc, op));
      return wire::EncodeCbProtocolHandshake(*v);
    }
    case Op::kCbReorderPlan: {
      auto req = Decoded(wire::DecodeCbReorderPlan, p);
      if (!req.ok()) return Fail(op, client, req.status(), FailureReply(svc, op));
      if (!svc.config().enable_blend_reorder) {
        return Fail(op, client, Status::FailedPrecondition("needs --enable-blend-reorder"),
                    FailureReply(svc, op));
      }
      return wire::EncodeCbReorderPlan(blend.ReorderPlan(*req));  // empty: keep the order
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

std::string HandleRequest(KvService& svc, const wire::OpInfo& op, wire::Frames p,
                          std::string_view client) {
  switch (op.op) {
    case Op::kGetChunkSize:
      return wire::EncodeInt(svc.chunk_size());
    case Op::kNoop:
      return wire::EncodeStr("OK");
    case Op::kGetExperimental:
      return wire::EncodeStrList(svc.ExperimentalCapabilities());
    case Op::kPing: {
      auto id = Decoded(wire::DecodePing, p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeBool(false));
      svc.Ping(*id);
      return wire::EncodeBool(true);
    }
    case Op::kClear: {
      auto force = Decoded(wire::DecodeClear, p);
      if (!force.ok()) return Fail(op, client, force.status(), wire::EncodeNil());
      svc.Clear();
      return wire::EncodeNil();
    }
    case Op::kRegisterKvCache: {
      auto req = Decoded(wire::DecodeRegisterKvCache, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = svc.RegisterKvCache(*req); !st.ok()) {
        return Fail(op, client, st, wire::EncodeNil());
      }
      return wire::EncodeNil();
    }
    case Op::kUnregisterKvCache:
    case Op::kUnregisterEngineDrivenContext: {
      auto id = Decoded(wire::DecodeInstanceId, p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeNil());
      if (Status st = svc.Unregister(*id); !st.ok()) spdlog::debug("{}: {}", op.name, st.ToString());
      return wire::EncodeNil();
    }
    case Op::kStore: {
      auto req = Decoded(wire::DecodeStore, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeHandleAndOk("", false));
      // CPU transfers are complete when the reply is sent: an empty event handle tells
      // the client there is no device work to wait for. GPU transfers return the event
      // that fires when the copy is done (also on a failure after work was enqueued).
      std::string event;
      Status st = svc.Store(*req, &event);
      if (!st.ok()) return Fail(op, client, st, wire::EncodeHandleAndOk(event, false));
      return wire::EncodeHandleAndOk(event, true);
    }
    case Op::kRetrieve: {
      auto req = Decoded(wire::DecodeRetrieve, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeHandleAndOk("", false));
      std::string event;
      Status st = svc.Retrieve(*req, &event);
      if (!st.ok()) return Fail(op, client, st, wire::EncodeHandleAndOk(event, false));
      return wire::EncodeHandleAndOk(event, true);
    }
    case Op::kLookup: {
      auto req = Decoded(wire::DecodeLookup, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = svc.Lookup(*req); !st.ok()) return Fail(op, client, st, wire::EncodeNil());
      return wire::EncodeNil();
    }
    case Op::kQueryPrefetchStatus:
    case Op::kQueryPrefetchLookupHits: {
      auto id = Decoded(wire::DecodeRequestId, p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeInt(0));
      // nil while the lookup's prefetch from the tiers runs; then the hit count (unknown: 0).
      auto hits = svc.QueryPrefetchStatus(*id);
      return hits ? wire::EncodeInt(*hits) : wire::EncodeNil();
    }
    case Op::kWaitPrefetchStatus: {
      auto req = Decoded(wire::DecodeWaitPrefetch, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeInt(0));
      // The socket loop parks a wait whose prefetch runs (prefetch_waits.h) and answers it
      // when the prefetch ends or the timeout passes; here the answer is due now.
      auto hits = svc.QueryPrefetchStatus(req->first);
      return hits ? wire::EncodeInt(*hits) : wire::EncodeNil();
    }
    case Op::kFreeLookupLocks: {
      auto req = Decoded(wire::DecodeLookup, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = svc.FreeLookupLocks(*req); !st.ok()) return Fail(op, client, st, wire::EncodeNil());
      return wire::EncodeNil();
    }
    case Op::kEndSession: {
      auto id = Decoded(wire::DecodeRequestId, p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeNil());
      svc.EndSession(*id);
      return wire::EncodeNil();
    }
    case Op::kReportBlockAllocation: {
      auto req = Decoded(wire::DecodeReportBlockAllocation, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      return wire::EncodeNil();  // observability only
    }
    case Op::kRegisterEngineDrivenContext: {
      auto req = Decoded(wire::DecodeRegisterEngineDriven, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeRegisterEngineDrivenResponse("", 0));
      auto r = svc.RegisterEngineDriven(*req);
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodeRegisterEngineDrivenResponse("", 0));
      return wire::EncodeRegisterEngineDrivenResponse(r->first, r->second);
    }
    case Op::kPrepareStore: {
      auto req = Decoded(wire::DecodeEngineDriven, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodePrepareStoreResponse(std::nullopt, {}));
      auto r = svc.PrepareStore(*req);
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodePrepareStoreResponse(std::nullopt, {}));
      return wire::EncodePrepareStoreResponse(r->first, r->second);
    }
    case Op::kCommitStore: {
      auto req = Decoded(wire::DecodeEngineDriven, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeBool(false));
      if (Status st = svc.CommitStore(*req); !st.ok()) return Fail(op, client, st, wire::EncodeBool(false));
      return wire::EncodeBool(true);
    }
    case Op::kPrepareRetrieve: {
      auto req = Decoded(wire::DecodeEngineDriven, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodePrepareRetrieveResponse(false, {}));
      auto r = svc.PrepareRetrieve(*req);
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodePrepareRetrieveResponse(false, {}));
      return wire::EncodePrepareRetrieveResponse(true, *r);
    }
    case Op::kCommitRetrieve: {
      auto req = Decoded(wire::DecodeEngineDriven, p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeBool(false));
      if (Status st = svc.CommitRetrieve(*req); !st.ok()) return Fail(op, client, st, wire::EncodeBool(false));
      return wire::EncodeBool(true);
    }
    default:
      break;
  }
  if (BlendOps* blend = svc.blend()) {
    if (auto reply = HandleBlend(svc, *blend, op, p, client)) return std::move(*reply);
  }
  spdlog::warn("{} from {}: operation not supported by kvd; replying nil", op.name, client);
  return wire::EncodeNil();
}

}  // namespace kvd::server
