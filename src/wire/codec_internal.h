// Pieces shared by the decoders of wire/ (codec.cc: msgpack-cxx object trees for the rare,
// structured registrations; request_decoders.cc: the streaming reader for the request
// path), and one writer piece shared by a reply encoder and a client-side encoder.
// Internal to wire/. Stateless; safe from any thread.
#pragma once

#include <span>
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

class MsgpackWriter;
// [CBMatchResult map, ...] as msgspec writes the dataclass: {old_st, old_ed, cur_st, cur_ed,
// hash: bin} (the reply encoder of cb_unified_lookup and the client-side encoder share it).
void WriteCbMatchResults(MsgpackWriter& w, std::span<const CbMatchResult> matches);

#define KVD_ASSIGN(lhs, expr)              \
  do {                                     \
    auto _r = (expr);                      \
    if (!_r.ok()) return _r.status();      \
    lhs = std::move(_r).value();           \
  } while (0)

}  // namespace kvd::wire::internal
