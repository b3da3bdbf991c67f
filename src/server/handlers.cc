#include "server/handlers.h"

#include <spdlog/spdlog.h>

namespace kvd::server {
namespace {

using wire::Op;

std::string Fail(const wire::OpInfo& op, std::string_view client, const Status& st,
                 std::string reply) {
  spdlog::warn("{} from {}: {}", op.name, client, st.ToString());
  return reply;
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
      return wire::EncodeStrList({});
    case Op::kPing: {
      auto id = wire::DecodePing(p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeBool(false));
      svc.Ping(*id);
      return wire::EncodeBool(true);
    }
    case Op::kClear: {
      auto force = wire::DecodeClear(p);
      if (!force.ok()) return Fail(op, client, force.status(), wire::EncodeNil());
      svc.Clear();
      return wire::EncodeNil();
    }
    case Op::kRegisterKvCache: {
      auto req = wire::DecodeRegisterKvCache(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = svc.RegisterKvCache(*req); !st.ok()) {
        return Fail(op, client, st, wire::EncodeNil());
      }
      return wire::EncodeNil();
    }
    case Op::kUnregisterKvCache:
    case Op::kUnregisterEngineDrivenContext: {
      auto id = wire::DecodeInstanceId(p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeNil());
      if (Status st = svc.Unregister(*id); !st.ok()) spdlog::debug("{}: {}", op.name, st.ToString());
      return wire::EncodeNil();
    }
    case Op::kStore: {
      auto req = wire::DecodeStore(p);
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
      auto req = wire::DecodeRetrieve(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeHandleAndOk("", false));
      std::string event;
      Status st = svc.Retrieve(*req, &event);
      if (!st.ok()) return Fail(op, client, st, wire::EncodeHandleAndOk(event, false));
      return wire::EncodeHandleAndOk(event, true);
    }
    case Op::kLookup: {
      auto req = wire::DecodeLookup(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = svc.Lookup(*req); !st.ok()) return Fail(op, client, st, wire::EncodeNil());
      return wire::EncodeNil();
    }
    case Op::kQueryPrefetchStatus:
    case Op::kQueryPrefetchLookupHits: {
      auto id = wire::DecodeRequestId(p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeInt(0));
      // Lookups complete before their ack, so a result is always final: unknown → 0.
      return wire::EncodeInt(svc.QueryPrefetchStatus(*id).value_or(0));
    }
    case Op::kWaitPrefetchStatus: {
      auto req = wire::DecodeWaitPrefetch(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeInt(0));
      return wire::EncodeInt(svc.QueryPrefetchStatus(req->first).value_or(0));
    }
    case Op::kFreeLookupLocks: {
      auto req = wire::DecodeLookup(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      if (Status st = svc.FreeLookupLocks(*req); !st.ok()) return Fail(op, client, st, wire::EncodeNil());
      return wire::EncodeNil();
    }
    case Op::kEndSession: {
      auto id = wire::DecodeRequestId(p);
      if (!id.ok()) return Fail(op, client, id.status(), wire::EncodeNil());
      svc.EndSession(*id);
      return wire::EncodeNil();
    }
    case Op::kReportBlockAllocation: {
      auto req = wire::DecodeReportBlockAllocation(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeNil());
      return wire::EncodeNil();  // observability only
    }
    case Op::kRegisterEngineDrivenContext: {
      auto req = wire::DecodeRegisterEngineDriven(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeRegisterEngineDrivenResponse("", 0));
      auto r = svc.RegisterEngineDriven(*req);
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodeRegisterEngineDrivenResponse("", 0));
      return wire::EncodeRegisterEngineDrivenResponse(r->first, r->second);
    }
    case Op::kPrepareStore: {
      auto req = wire::DecodeEngineDriven(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodePrepareStoreResponse(std::nullopt, {}));
      auto r = svc.PrepareStore(*req);
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodePrepareStoreResponse(std::nullopt, {}));
      return wire::EncodePrepareStoreResponse(r->first, r->second);
    }
    case Op::kCommitStore: {
      auto req = wire::DecodeEngineDriven(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeBool(false));
      if (Status st = svc.CommitStore(*req); !st.ok()) return Fail(op, client, st, wire::EncodeBool(false));
      return wire::EncodeBool(true);
    }
    case Op::kPrepareRetrieve: {
      auto req = wire::DecodeEngineDriven(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodePrepareRetrieveResponse(false, {}));
      auto r = svc.PrepareRetrieve(*req);
      if (!r.ok()) return Fail(op, client, r.status(), wire::EncodePrepareRetrieveResponse(false, {}));
      return wire::EncodePrepareRetrieveResponse(true, *r);
    }
    case Op::kCommitRetrieve: {
      auto req = wire::DecodeEngineDriven(p);
      if (!req.ok()) return Fail(op, client, req.status(), wire::EncodeBool(false));
      if (Status st = svc.CommitRetrieve(*req); !st.ok()) return Fail(op, client, st, wire::EncodeBool(false));
      return wire::EncodeBool(true);
    }
    default:
      break;
  }
  spdlog::warn("{} from {}: operation not supported by kvd; replying nil", op.name, client);
  return wire::EncodeNil();
}

}  // namespace kvd::server
