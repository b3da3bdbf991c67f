#include "http/routes.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace kvd::http {
namespace {

// Reads the whole body of `req`. False: it is larger than kMaxBodyBytes.
bool ReadBody(const httplib::Request& req, const httplib::ContentReader& reader, std::string* body) {
  // No length and no chunking: no body (httplib would wait for one until its read timeout).
  if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) return true;
  bool too_big = false;
  reader([&](const char* data, size_t n) {
    if (body->size() + n > kMaxBodyBytes) {
      too_big = true;
      return false;
    }
    body->append(data, n);
    return true;
  });
  return !too_big;
}

// An error answer: `status`, {"detail": detail}, not to be cached.
void SendDetail(httplib::Response& res, int status, const std::string& detail) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(nlohmann::json{{"detail", detail}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

// `fallback`: the handler answers 405/404 whatever the body is.
httplib::Server::HandlerWithContentReader WithBody(Router::BodyHandler h, bool fallback = false) {
  return [h = std::move(h), fallback](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
    if (req.is_multipart_form_data()) {
      // httplib would split the parts itself (and refuse one without a boundary with an empty
      // 400, the body left unread): the body stays unread, so the connection is closed.
      res.set_header("Connection", "close");
      if (fallback) {
        h(req, res, std::string());
        return;
      }
      SendDetail(res, 415, "Unsupported Media Type: the body is JSON, not multipart/form-data");
      return;
    }
    std::string body;
    if (!ReadBody(req, reader, &body)) {
      res.set_header("Connection", "close");
      SendDetail(res, 413, "request body too large");
      return;
    }
    h(req, res, body);
  };
}

// What the admin rules read of `req`.
AdminRequest AdminView(const httplib::Request& req) {
  AdminRequest a;
  auto header = [&](const char* name) -> std::optional<std::string_view> {
    auto it = req.headers.find(name);  // httplib's header map compares names ignoring case
    if (it == req.headers.end()) return std::nullopt;
    return std::string_view(it->second);
  };
  a.host = header("Host");
  a.origin = header("Origin");
  a.authorization = header("Authorization");
  a.content_type = header("Content-Type").value_or("");
  a.has_body = req.has_header("Transfer-Encoding") || req.get_header_value<uint64_t>("Content-Length") > 0;
  return a;
}

}  // namespace

httplib::Server::HandlerWithContentReader Router::Guarded(BodyHandler h) {
  return [this, body = WithBody(std::move(h))](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& reader) {
    const AdminRequest view = AdminView(req);
    if (auto refusal = CheckAdminRequest(admin_, view)) {
      admin_refusals_.fetch_add(1, std::memory_order_relaxed);
      // One line a second at most: a page in a browser can send these in a loop.
      static std::atomic<int64_t> last_log{0};
      const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::steady_clock::now().time_since_epoch()).count();
      if (last_log.exchange(now) != now) {
        spdlog::warn("http: {} {} from {} refused ({}): {}", req.method, req.path, req.remote_addr,
                     refusal->status, refusal->detail);
      }
      if (view.has_body) res.set_header("Connection", "close");  // the body is not read
      if (refusal->bearer_challenge) res.set_header("WWW-Authenticate", "Bearer realm=\"kvd\"");
      SendDetail(res, refusal->status, refusal->detail);
      return;
    }
    body(req, res, reader);
  };
}

std::string Router::PathRegex(const std::string& path_template) {
  std::string out;
  for (size_t i = 0; i < path_template.size(); ++i) {
    const char c = path_template[i];
    if (c == '{') {
      const size_t close = path_template.find('}', i);
      if (close != std::string::npos) {
        out += "([^/]+)";
        i = close;
        continue;
      }
    }
    // Template characters are literal: escape what a regular expression would read.
    if (std::string_view(".^$|()[]*+?\\{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string Router::Add(const char* method, const std::string& path) {
  std::string re = PathRegex(path);
  routes_.push_back({method, path});
  regexes_.emplace_back(re);
  return re;
}

void Router::Get(const std::string& path, httplib::Server::Handler h) {
  server_.Get(Add("GET", path), std::move(h));
}
void Router::Post(const std::string& path, BodyHandler h) {
  server_.Post(Add("POST", path), Guarded(std::move(h)));
}
void Router::Put(const std::string& path, BodyHandler h) {
  server_.Put(Add("PUT", path), Guarded(std::move(h)));
}
void Router::Delete(const std::string& path, BodyHandler h) {
  server_.Delete(Add("DELETE", path), Guarded(std::move(h)));
}

std::vector<std::string> Router::MethodsAt(const std::string& request_path) const {
  static const char* const kOrder[] = {"GET", "HEAD", "POST", "PUT", "DELETE"};
  std::vector<std::string> found;
  for (size_t i = 0; i < routes_.size(); ++i) {
    if (!std::regex_match(request_path, regexes_[i])) continue;
    found.push_back(routes_[i].method);
    if (routes_[i].method == "GET") found.push_back("HEAD");
  }
  std::vector<std::string> out;
  for (const char* m : kOrder) {
    if (std::find(found.begin(), found.end(), m) != found.end()) out.emplace_back(m);
  }
  return out;
}

void Router::NotServed(const httplib::Request& req, httplib::Response& res) const {
  const std::vector<std::string> methods = MethodsAt(req.path);
  if (methods.empty()) {
    res.status = 404;  // the server's error handler writes the body
    return;
  }
  std::string allow;
  for (const std::string& m : methods) allow += (allow.empty() ? "" : ", ") + m;
  res.set_header("Cache-Control", "no-store");
  if (req.method == "OPTIONS") {
    res.status = 204;
    res.set_header("Allow", allow + ", OPTIONS");
    return;
  }
  res.status = 405;  // FastAPI's answer, as lmcache gives it
  res.set_header("Allow", allow);
  res.set_content(R"({"detail":"Method Not Allowed"})", "application/json");
}

void Router::AddFallbacks() {
  const std::string any = ".*";
  auto plain = [this](const httplib::Request& req, httplib::Response& res) { NotServed(req, res); };
  auto with_body = [this](const httplib::Request& req, httplib::Response& res, const std::string&) {
    NotServed(req, res);
  };
  server_.Get(any, plain);
  server_.Options(any, plain);
  server_.Post(any, WithBody(with_body, /*fallback=*/true));
  server_.Put(any, WithBody(with_body, /*fallback=*/true));
  server_.Patch(any, WithBody(with_body, /*fallback=*/true));
  server_.Delete(any, WithBody(with_body, /*fallback=*/true));
  // httplib reads a body only for POST, PUT, PATCH and DELETE: one sent with another method
  // stays on the connection, where it would be read as the next request. Tell the client to
  // close it.
  server_.set_post_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    static const char* const kRead[] = {"POST", "PUT", "PATCH", "DELETE"};
    const bool read = std::find_if(std::begin(kRead), std::end(kRead),
                                   [&](const char* m) { return req.method == m; }) != std::end(kRead);
    const bool body = req.has_header("Transfer-Encoding") ||
                      (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
    if (!read && body) res.set_header("Connection", "close");
  });
  // Methods httplib has no handlers for (TRACE, CONNECT): before routing. A body they carry
  // is not read, so the connection is closed after the answer.
  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    static const char* const kRouted[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
    if (std::find_if(std::begin(kRouted), std::end(kRouted),
                     [&](const char* m) { return req.method == m; }) != std::end(kRouted)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    NotServed(req, res);
    res.set_header("Connection", "close");
    return res.status == 404 ? httplib::Server::HandlerResponse::Unhandled
                             : httplib::Server::HandlerResponse::Handled;
  });
}

}  // namespace kvd::http
