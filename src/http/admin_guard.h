// Who may change kvd's state over HTTP. Every route that changes state is a POST, PUT or
// DELETE (a GET never does), and Router runs CheckAdminRequest before its handler; a refused
// request changes nothing. The rules keep a web page the operator opens, and DNS rebinding,
// from reaching those routes through the operator's browser, while curl on the host works:
//
//   with --admin-token:  `Authorization: Bearer <token>` is required and is enough (a browser
//                        cannot send it to another origin unless kvd allowed CORS, which it
//                        never does): 401 without it;
//   without a token:     the Host header, when present, must name this kvd as no rebound DNS
//                        name can: an IP literal, `localhost` (or `*.localhost`), or one of
//                        AdminPolicy::host_names (the --http-host name, this machine's
//                        hostname); and an Origin header, when present, must be the same
//                        origin as Host (`Origin: null` is not): 403 otherwise;
//   always:              a request with a body must say `Content-Type: application/json`
//                        (or application/<x>+json): a form or text body, or one without a
//                        Content-Type, is what a page may send without a CORS preflight:
//                        415 otherwise.
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvd::http {

struct AdminPolicy {
  std::string token;                    // empty: no token (the Host/Origin rules apply)
  std::vector<std::string> host_names;  // besides IP literals and localhost (any case)
};

// What the rules read of a request.
struct AdminRequest {
  std::optional<std::string_view> host;           // Host header
  std::optional<std::string_view> origin;         // Origin header
  std::optional<std::string_view> authorization;  // Authorization header
  std::string_view content_type;                  // Content-Type header ("" when absent)
  bool has_body = false;                          // Content-Length > 0 or Transfer-Encoding
};

struct AdminRefusal {
  int status = 403;           // 401, 403 or 415
  std::string detail;         // for the client: what was wrong and what to send instead
  bool bearer_challenge = false;  // 401: answer with `WWW-Authenticate: Bearer`
};

// nullopt: the request may change state.
std::optional<AdminRefusal> CheckAdminRequest(const AdminPolicy& policy, const AdminRequest& req);

// The parts, for tests.
// The host of a Host header value ("[::1]:8080" -> "::1", "Example.COM." -> "example.com").
std::string HostOfAuthority(std::string_view authority);
bool HostNamesThisServer(const AdminPolicy& policy, std::string_view host_header);
bool SameOrigin(std::string_view origin, std::string_view host_header);
bool IsJsonMediaType(std::string_view content_type);

}  // namespace kvd::http
