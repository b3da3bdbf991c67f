// Request handlers: decode → validate → call KvService → encode exactly one reply frame.
// The only place where a Status becomes a wire reply. Safe to call from any thread.
#pragma once

#include <string>
#include <string_view>

#include "server/kv_service.h"
#include "wire/codec.h"
#include "wire/ops.h"

namespace kvd::server {

// `client` names the connection in log lines. Never throws; bad input yields the op's
// failure reply (or nil where the op has none) and one warning line.
std::string HandleRequest(KvService& service, const wire::OpInfo& op, wire::Frames payloads,
                          std::string_view client);

}  // namespace kvd::server
