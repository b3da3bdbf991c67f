// Fuzz target "http_json": the JSON bodies of kvd's HTTP routes, and the framing and admin
// rules every request passes before them (issue 27: a nested body once crashed kvd, finding
// 1; bodies and heads are bounded, finding 8).
//
// Input: one control byte, then the body. The control byte's low 3 bits choose the route
// that gets the body (POST /cache/clear, DELETE /cache/objects, POST /cache/prefetches,
// PUT /quota/{salt}, POST /clear-cache, POST /metrics/reset, POST /loglevel, or "raw": the
// whole rest of the input is the request, head included); bits 3-4 the Content-Type
// (application/json, with a charset, text/plain, none); bit 5 a foreign Origin; bit 6
// chunked instead of Content-Length; bit 7 whether the body also goes to ParseJsonBody and
// BoundedEcho directly.
//
// The request is framed by RequestFramer (as the connection loop does; in one piece and byte
// by byte, which must agree) and, when complete, served through every route of a real
// HttpServer (HttpServer::ServeForTest: no socket) against a FakeSource. Invariants beyond
// "no crash, no sanitizer report": every framed request gets one HTTP/1.1 response with a
// status; no body makes a route answer 500 (an exception escaping it); a GET or HEAD, and a
// refused request (401/403/415), changed nothing (cache, metrics, log level); an error reply
// stays within a bound of the input's size; ParseJsonBody never accepts a body nested deeper
// than kMaxJsonDepth, and BoundedEcho's result serialises to a bounded size.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "../unit/http/fake_source.h"
#include "http/http_server.h"
#include "http/json_body.h"
#include "http/request_framer.h"

namespace {

using kvd::http::FakeSource;
using kvd::http::FramingLimits;
using kvd::http::HttpOptions;
using kvd::http::HttpServer;
using kvd::http::RequestFramer;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

struct Target {
  FakeSource source;
  std::unique_ptr<HttpServer> server;
  Target() {
    source.Set(kvd::http::SampleSnapshot());
    HttpOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    server = std::make_unique<HttpServer>(o, &source, &source);  // routes only: never started
  }
};

Target& Shared() {
  static Target* t = new Target();  // one per process: building the routes is the slow part
  return *t;
}

FramingLimits Limits() {
  FramingLimits l;
  l.max_body_bytes = 1 << 20;  // the fuzzer's inputs are at most 64 KiB
  return l;
}

struct Route {
  const char* method;
  const char* path;
};
constexpr Route kRoutes[] = {
    {"POST", "/cache/clear"},       {"DELETE", "/cache/objects"}, {"POST", "/cache/prefetches"},
    {"PUT", "/quota/fz"},           {"POST", "/clear-cache"},     {"POST", "/metrics/reset"},
    {"POST", "/loglevel?level=off"},
};

std::string Chunked(std::string_view body) {
  std::string out;
  while (!body.empty()) {
    const size_t n = std::min<size_t>(body.size(), 7);
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", n);
    out += size;
    out.append(body.substr(0, n));
    out += "\r\n";
    body.remove_prefix(n);
  }
  return out + "0\r\n\r\n";
}

int StatusOf(const std::string& response) {
  Check(response.rfind("HTTP/1.1 ", 0) == 0 && response.size() >= 12, "a response starts with HTTP/1.1 and a status");
  return std::atoi(response.c_str() + 9);
}

void CheckJsonBody(std::string_view body) {
  std::string why;
  const nlohmann::json j = kvd::http::ParseJsonBody(body, &why);
  if (kvd::http::JsonNestingDepth(body) > kvd::http::kMaxJsonDepth) {
    Check(j.is_discarded() && !why.empty(), "a body nested too deep is refused");
  }
  if (!j.is_discarded()) {
    const std::string echo = kvd::http::BoundedEcho(j).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    Check(echo.size() <= 6 * kvd::http::kMaxEchoBytes + 16, "an echo is bounded");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  spdlog::set_level(spdlog::level::off);
  const uint8_t control = data[0];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (control & 0x80) CheckJsonBody(body);

  std::string request;
  const unsigned route = control & 7;
  if (route == 7) {
    request.assign(body);
  } else {
    const Route& r = kRoutes[route];
    request = std::string(r.method) + " " + r.path + " HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n";
    static const char* const kTypes[] = {"application/json", "application/json; charset=utf-8", "text/plain", nullptr};
    if (const char* type = kTypes[(control >> 3) & 3]) request += std::string("Content-Type: ") + type + "\r\n";
    if (control & 0x20) request += "Origin: http://evil.example\r\n";
    if (control & 0x40) {
      request += "Transfer-Encoding: chunked\r\n\r\n" + Chunked(body);
    } else {
      request += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
      request.append(body);
    }
  }

  // Framing: in one piece, and in pieces of 1 to 16 bytes, with the same outcome.
  RequestFramer whole(Limits());
  const RequestFramer::State state = whole.Scan(request);
  RequestFramer pieces(Limits());
  RequestFramer::State piecewise = RequestFramer::State::kNeedMore;
  const size_t step = 1 + (size % 16);
  for (size_t end = std::min(step, request.size()); piecewise == RequestFramer::State::kNeedMore; end += step) {
    piecewise = pieces.Scan(std::string_view(request).substr(0, std::min(end, request.size())));
    if (end >= request.size()) break;
  }
  Check(state == piecewise, "framing in pieces agrees with framing in one piece");
  if (state == RequestFramer::State::kError) {
    Check(whole.error_status() == pieces.error_status(), "the same refusal in pieces");
    Check(whole.error_status() >= 400 && whole.error_status() < 600, "a refusal is an error status");
    return 0;
  }
  if (state != RequestFramer::State::kComplete) return 0;
  Check(whole.request_size() == pieces.request_size() && whole.request_size() <= request.size(),
        "the request ends inside the input");

  Target& t = Shared();
  const int clears = t.source.clears.load(), resets = t.source.resets.load();
  const std::string response = t.server->ServeForTest(std::string_view(request).substr(0, whole.request_size()));
  const int status = StatusOf(response);
  Check(status != 500, "no body makes a route fail with 500");
  // The log level is off before every input (above): a request that may not change state
  // leaves it so (regressions/finding8-get-loglevel-sets-nothing: lmcache's GET sets it).
  const bool read_only = request.rfind("GET ", 0) == 0 || request.rfind("HEAD ", 0) == 0;
  if (read_only || status == 401 || status == 403 || status == 415) {
    Check(t.source.clears.load() == clears && t.source.resets.load() == resets &&
              spdlog::get_level() == spdlog::level::off,
          "a GET, HEAD or refused request changes nothing");
  }
  if (status >= 400) Check(response.size() <= 128 * request.size() + 65536, "an error reply is bounded");
  return 0;
}
