// Router: registers HttpServer's handlers on an httplib::Server and keeps the table of its
// routes, each a method and an OpenAPI path template ("/quota/{cache_salt}"; a `{name}`
// segment matches one non-empty path segment). The table
//   - answers a known path asked with a method it does not serve: 405 with an Allow header
//     (OPTIONS: 204 with Allow), where httplib alone would answer 404;
//   - is what http_tests compare with docs/openapi.json (served at GET /openapi.json), so the
//     document and the routes the server registers cannot drift apart.
//
// State changes: every POST, PUT and DELETE route first passes the admin rules
// (admin_guard.h: the admin token, else a Host naming this kvd and no foreign Origin; a body
// only as application/json); a refused request answers 401/403/415 {"detail": ...} and its
// handler does not run. GET routes are read-only by convention of this file: they get no
// AdminPort, and nothing that changes state may be registered with Get.
//
// Request bodies: every POST, PUT and DELETE route (and every 405/404 answer to such a
// method) reads the whole body before its handler runs; a request with neither
// Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3) and is not waited on; a
// body over kMaxBodyBytes answers 413; a multipart/form-data one 415 (the bodies are JSON).
// A body sent with another method (GET, OPTIONS, ...) is not read: the answer says
// `Connection: close`. (The ConnectionLoop has the whole request in memory and frames the
// next one itself, so an unread body never reaches the next request either way.)
//
// Threads: routes are added before the server starts; the table is then read-only and safe
// to read from every worker thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "http/admin_guard.h"
#include "http/httplib_wrap.h"

namespace kvd::http {

struct Route {
  std::string method;  // "GET", "POST", "PUT", "DELETE"
  std::string path;    // OpenAPI path template
};

// The largest request body read (these are small JSON documents).
inline constexpr size_t kMaxBodyBytes = 64 << 20;

class Router {
 public:
  // A handler of a method with a body: the body as read (empty when none was sent).
  using BodyHandler =
      std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;

  // `admin`: the rules for the POST, PUT and DELETE routes (admin_guard.h).
  explicit Router(httplib::Server& server, AdminPolicy admin = {})
      : server_(server), admin_(std::move(admin)) {}

  void Get(const std::string& path, httplib::Server::Handler h);  // and HEAD
  void Post(const std::string& path, BodyHandler h);
  void Put(const std::string& path, BodyHandler h);
  void Delete(const std::string& path, BodyHandler h);

  // Registers the answers for what no route serves (after the last route): 405 with Allow
  // for a known path, 204 with Allow for OPTIONS, 404 (status only) for an unknown path.
  void AddFallbacks();

  const std::vector<Route>& routes() const { return routes_; }
  // Requests refused by the admin rules so far.
  const std::atomic<uint64_t>& admin_refusals() const { return admin_refusals_; }

  // The methods the routes serve at `request_path` (a decoded request path), in the order
  // GET, HEAD (served with GET), POST, PUT, DELETE; empty when no route's path matches.
  std::vector<std::string> MethodsAt(const std::string& request_path) const;

  // The path template as the regular expression httplib matches ("{x}" -> "([^/]+)").
  static std::string PathRegex(const std::string& path_template);

 private:
  // Records the route and returns its regular expression.
  std::string Add(const char* method, const std::string& path);
  // A route that changes state: the admin rules, then the body, then `h`.
  httplib::Server::HandlerWithContentReader Guarded(BodyHandler h);
  // Answers a request that no route serves (see AddFallbacks).
  void NotServed(const httplib::Request& req, httplib::Response& res) const;

  httplib::Server& server_;
  const AdminPolicy admin_;
  std::atomic<uint64_t> admin_refusals_{0};
  std::vector<Route> routes_;
  std::vector<std::regex> regexes_;  // one per route
};

}  // namespace kvd::http
