// Request handlers: one table entry per op says how the server answers it — decode →
// validate → call KvService → encode exactly one reply frame, the reply of a request refused
// before it runs, and how the socket loop must treat it beyond wire::OpInfo::dispatch. The only
// place where a Status becomes a wire reply, and the only place that names ops (the socket
// loop reads the entry's rule). The table is immutable; safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "server/kv_service.h"
#include "wire/codec.h"
#include "wire/ops.h"

namespace kvd::server {

// How the socket loop (zmq_server.cc) treats an op beyond its wire dispatch.
enum class SocketRule : uint8_t {
  kAsDispatched,             // wire::OpInfo::dispatch decides
  kStream,                   // a subscription: the KV-event streams take it; no reply here
  kParkWhilePrefetching,     // answered when the request's prefetch ends (prefetch_waits.h)
  kPoolWhileCommitsPending,  // never inline while GPU commits are in flight: it may wait for
                             // them (lookups.h, Visibility)
  kLaneWhenBlend,            // on the worker's lane when blend is on: ordered with that
                             // worker's registration and retrieves (CacheBlend's rope ops)
};

SocketRule SocketRuleOf(wire::Op op);

// `client` is the connection's ZMQ routing id (named in log lines). Never throws; bad
// input yields the op's failure reply (or nil where the op has none) and one warning line.
// Marks the decode phase (request_phases.h); the service marks the others.
std::string HandleRequest(KvService& service, const wire::OpInfo& op, wire::Frames payloads,
                          std::string_view client);

// The reply a failed request of `op` gets (what HandleRequest answers when its payload does
// not decode): for requests refused before they run.
std::string FailureReply(const KvService& service, const wire::OpInfo& op);

// "client-<hex of the first 8 bytes of the routing id>", for log lines.
std::string ClientTag(std::string_view identity);

}  // namespace kvd::server
