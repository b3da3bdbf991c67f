// Pieces shared by the decoders of wire/ (codec.cc: msgpack-cxx object trees for the rare,
// structured registrations; request_decoders.cc: the streaming reader for the request
// path). Internal to wire/. Stateless; safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "wire/codec.h"
#include "wire/ops.h"

namespace kvd::wire::internal {

inline const DecodeLimits kLimits{};

// "ctx.field" (or "ctx" for an empty field): where a bad value was found.
inline std::string Where(std::string_view ctx, std::string_view field) {
  std::string s(ctx);
  if (!field.empty()) {
    s += '.';
    s += field;
  }
  return s;
}

inline Status TypeError(std::string_view ctx, std::string_view field, const char* expected) {
  return Status::InvalidArgument(Where(ctx, field) + ": expected " + expected);
}

// The error of a document that is not one well-formed msgpack value within the limits.
inline Status Malformed(std::string_view what, const char* reason) {
  return Status::InvalidArgument(std::string(what) + ": malformed msgpack (" + reason + ")");
}
inline Status TrailingBytes(std::string_view what) {
  return Status::InvalidArgument(std::string(what) + ": trailing bytes after msgpack document");
}

inline Status CheckArity(Frames payloads, Op op) {
  const OpInfo& info = InfoOf(op);
  if (payloads.size() < info.min_payloads || payloads.size() > info.max_payloads) {
    return Status::InvalidArgument(std::string(info.name) + ": expected " +
                                   std::to_string(info.min_payloads) +
                                   (info.min_payloads == info.max_payloads
                                        ? ""
                                        : ".." + std::to_string(info.max_payloads)) +
                                   " payload frames, got " + std::to_string(payloads.size()));
  }
  return Status::Ok();
}

#define KVD_ASSIGN(lhs, expr)              \
  do {                                     \
    auto _r = (expr);                      \
    if (!_r.ok()) return _r.status();      \
    lhs = std::move(_r).value();           \
  } while (0)

}  // namespace kvd::wire::internal
