#include "http/admin_guard.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "http/json_body.h"

namespace kvd::http {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Client input as a reply may repeat it.
std::string Echo(std::string_view s) {
  if (s.size() <= kMaxEchoBytes) return std::string(s);
  return std::string(s.substr(0, kMaxEchoBytes)) + "\u2026";
}

// The port of an authority ("host:port", "[v6]:port"); `fallback` when none is given;
// -1 when what follows the host is not a port.
int PortOfAuthority(std::string_view a, int fallback) {
  a = Trim(a);
  size_t colon = std::string_view::npos;
  if (!a.empty() && a.front() == '[') {
    const size_t close = a.find(']');
    if (close == std::string_view::npos) return -1;
    if (close + 1 == a.size()) return fallback;
    if (a[close + 1] != ':') return -1;
    colon = close + 1;
  } else {
    colon = a.find(':');
    if (colon == std::string_view::npos) return fallback;
    if (a.find(':', colon + 1) != std::string_view::npos) return -1;
  }
  const std::string_view digits = a.substr(colon + 1);
  if (digits.empty()) return fallback;  // "host:" is the default port (RFC 3986)
  if (digits.size() > 5 || !std::all_of(digits.begin(), digits.end(),
                                        [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  const int port = std::stoi(std::string(digits));
  return port <= 65535 ? port : -1;
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Compares without an early exit on the first differing byte.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool BearerMatches(std::string_view authorization, const std::string& token) {
  authorization = Trim(authorization);
  const size_t sp = authorization.find(' ');
  if (sp == std::string_view::npos || Lower(authorization.substr(0, sp)) != "bearer") return false;
  return ConstantTimeEquals(Trim(authorization.substr(sp + 1)), token);
}

}  // namespace

std::string HostOfAuthority(std::string_view a) {
  a = Trim(a);
  std::string_view host = a;
  if (!a.empty() && a.front() == '[') {
    const size_t close = a.find(']');
    host = close == std::string_view::npos ? a.substr(1) : a.substr(1, close - 1);
  } else if (const size_t colon = a.find(':');
             colon != std::string_view::npos && a.find(':', colon + 1) == std::string_view::npos) {
    host = a.substr(0, colon);
  }
  std::string out = Lower(host);
  if (out.size() > 1 && out.back() == '.') out.pop_back();
  return out;
}

bool HostNamesThisServer(const AdminPolicy& policy, std::string_view host_header) {
  if (PortOfAuthority(host_header, 80) < 0) return false;
  const std::string host = HostOfAuthority(host_header);
  if (host.empty()) return false;
  if (IsIpLiteral(host)) return true;  // a page cannot rebind an address, only a name
  if (host == "localhost" ||
      (host.size() > 10 && host.compare(host.size() - 10, 10, ".localhost") == 0)) {
    return true;  // RFC 6761: browsers resolve these to loopback themselves
  }
  return std::any_of(policy.host_names.begin(), policy.host_names.end(),
                     [&](const std::string& name) { return !name.empty() && Lower(name) == host; });
}

bool SameOrigin(std::string_view origin, std::string_view host_header) {
  origin = Trim(origin);
  constexpr std::string_view kScheme = "http://";
  if (origin.size() <= kScheme.size() || Lower(origin.substr(0, kScheme.size())) != kScheme) {
    return false;  // "null", https://…, or no scheme: not this server's origin
  }
  const std::string_view authority = origin.substr(kScheme.size());
  if (authority.find_first_of("/?#@") != std::string_view::npos) return false;
  const int origin_port = PortOfAuthority(authority, 80);
  if (origin_port < 0 || origin_port != PortOfAuthority(host_header, 80)) return false;
  const std::string host = HostOfAuthority(authority);
  return !host.empty() && host == HostOfAuthority(host_header);
}

bool IsJsonMediaType(std::string_view content_type) {
  const std::string media = Lower(Trim(content_type.substr(0, content_type.find(';'))));
  constexpr std::string_view kApp = "application/";
  if (media == "application/json") return true;
  // application/<type>+json, as FastAPI reads it (also never sent across origins unasked).
  return media.size() > kApp.size() + 5 && media.compare(0, kApp.size(), kApp) == 0 &&
         media.compare(media.size() - 5, 5, "+json") == 0 &&
         media.find_first_of(" \t/", kApp.size()) == std::string::npos;
}

std::optional<AdminRefusal> CheckAdminRequest(const AdminPolicy& policy, const AdminRequest& req) {
  if (!policy.token.empty()) {
    if (!req.authorization || !BearerMatches(*req.authorization, policy.token)) {
      return AdminRefusal{401,
                          "this kvd requires its admin token for requests that change state: "
                          "send 'Authorization: Bearer <token>' (the token of --admin-token)",
                          true};
    }
  } else {
    if (req.host && !HostNamesThisServer(policy, *req.host)) {
      std::string names = "an IP address, localhost";
      for (const std::string& n : policy.host_names) {
        if (!IsIpLiteral(n)) names += ", " + n;
      }
      return AdminRefusal{403,
                          "Host '" + Echo(*req.host) + "' does not name this kvd: a request that "
                          "changes state must address it as " + names +
                          " (a defence against DNS rebinding), or carry the token of "
                          "--admin-token"};
    }
    if (req.origin && !(req.host && SameOrigin(*req.origin, *req.host))) {
      return AdminRefusal{403,
                          "cross-origin request refused: Origin '" + Echo(*req.origin) +
                          "' is not this kvd's origin; requests that change state come from "
                          "the same origin (or from a client that sends no Origin, like curl), "
                          "or carry the token of --admin-token"};
    }
  }
  if (req.has_body && !IsJsonMediaType(req.content_type)) {
    return AdminRefusal{415,
                        "Unsupported Media Type: a request body must be sent as "
                        "'Content-Type: application/json'" +
                            (req.content_type.empty() ? std::string(" (none was given)")
                                                      : " (got '" + Echo(req.content_type) + "')")};
  }
  return std::nullopt;
}

}  // namespace kvd::http
