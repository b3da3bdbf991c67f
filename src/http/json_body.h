// ParseJsonBody: the one way kvd's HTTP routes read a JSON request body. Bounded before a
// byte is parsed: at most kMaxJsonDepth nested arrays/objects (a deeper body is refused
// without building anything, so neither parsing, echoing nor destroying it can recurse
// deeply), and the body size is already capped by the server (kMaxBodyBytes). Echoes of
// client input in error replies go through BoundedEcho, never whole.
//
// Pure functions; no state.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace kvd::http {

inline constexpr size_t kMaxJsonDepth = 64;
// Bytes of client input an error reply may repeat.
inline constexpr size_t kMaxEchoBytes = 256;

// The deepest nesting of arrays and objects in `text`, counting brackets outside strings;
// stops counting (returns limit + 1) as soon as `limit` is exceeded.
size_t JsonNestingDepth(std::string_view text, size_t limit = kMaxJsonDepth);

// Parses `text`. On failure returns a discarded value and sets *why ("invalid JSON", or
// "JSON nested deeper than 64 levels").
template <typename Json = nlohmann::json>
Json ParseJsonBody(std::string_view text, std::string* why) {
  if (JsonNestingDepth(text) > kMaxJsonDepth) {
    if (why) *why = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return Json(Json::value_t::discarded);
  }
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() && why) *why = "invalid JSON";
  return j;
}

// `v` as an error reply may repeat it: itself when its serialisation is at most
// kMaxEchoBytes, else the first kMaxEchoBytes bytes of that serialisation followed by "…".
template <typename Json>
Json BoundedEcho(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() <= kMaxEchoBytes) return v;
  s.resize(kMaxEchoBytes);
  return Json(s + "\u2026");
}

}  // namespace kvd::http
