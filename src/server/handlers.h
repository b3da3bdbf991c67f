// Request handlers: decode → validate → call KvService → encode exactly one reply frame.
// The only place where a Status becomes a wire reply. Safe to call from any thread.
#pragma once

#include <string>
#include <string_view>

#include "server/kv_service.h"
#include "wire/codec.h"
#include "wire/ops.h"

namespace kvd::server {

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
