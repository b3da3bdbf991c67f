#include "http/quota_routes.h"
#include "http/json_body.h"

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace kvd::http {
namespace {

constexpr const char* kDefaultSalt = "_default";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string FromPath(const std::string& salt) { return salt == kDefaultSalt ? "" : salt; }
std::string ToPath(const std::string& salt) { return salt.empty() ? kDefaultSalt : salt; }
double Gb(uint64_t bytes) { return static_cast<double>(bytes) / kGiB; }

void Send(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}
void SendError(httplib::Response& res, int status, const std::string& error) {
  Send(res, status, {{"error", error}});
}

}  // namespace

void AddQuotaRoutes(Router& router, StatsSource* source, AdminPort* admin) {
  router.Put("/quota/{cache_salt}", [admin](const httplib::Request& req, httplib::Response& res,
                                             const std::string& text) {
    const std::string salt = FromPath(req.matches[1]);
    std::string why;
    const nlohmann::json body = ParseJsonBody(text, &why);
    if (body.is_discarded()) return SendError(res, 400, why + " in the body");
    if (!body.is_object() || !body.contains("limit_gb")) {
      return SendError(res, 400, "body must be {\"limit_gb\": <number>}");
    }
    const auto& v = body["limit_gb"];
    if (!v.is_number()) return SendError(res, 400, "limit_gb must be numeric");
    const double gb = v.get<double>();
    if (!std::isfinite(gb)) return SendError(res, 400, "limit_gb must be finite");
    if (gb < 0) return SendError(res, 400, "limit_gb must be non-negative");
    if (gb * kGiB >= std::ldexp(1.0, 64)) return SendError(res, 400, "limit_gb is too large");
    const Status st = admin->SetQuota(salt, static_cast<uint64_t>(gb * kGiB));
    if (!st.ok()) return SendError(res, 400, st.message());
    spdlog::info("http: quota of cache salt '{}' set to {} GiB by {}", ToPath(salt), gb,
                 req.remote_addr);
    Send(res, 200, {{"cache_salt", ToPath(salt)}, {"limit_gb", gb}, {"status", "ok"}});
  });
  router.Get("/quota/{cache_salt}", [source](const httplib::Request& req, httplib::Response& res) {
    const QuotaView q = source->GetQuota(FromPath(req.matches[1]));
    Send(res, 200, {{"cache_salt", ToPath(q.cache_salt)},
                    {"limit_gb", Gb(q.limit_bytes.value_or(0))},
                    {"current_usage_gb", Gb(q.usage_bytes)},
                    {"exists", q.limit_bytes.has_value()}});
  });
  router.Delete("/quota/{cache_salt}", [admin](const httplib::Request& req, httplib::Response& res,
                                                const std::string&) {
    const std::string salt = FromPath(req.matches[1]);
    const bool removed = admin->DeleteQuota(salt);
    if (removed) spdlog::info("http: quota of cache salt '{}' removed by {}", ToPath(salt), req.remote_addr);
    Send(res, 200, {{"cache_salt", ToPath(salt)}, {"status", removed ? "removed" : "not_found"}});
  });
  router.Get("/quota", [source](const httplib::Request&, httplib::Response& res) {
    nlohmann::json users = nlohmann::json::object();
    for (const QuotaView& q : source->ListQuotas()) {
      users[ToPath(q.cache_salt)] = {{"limit_gb", Gb(q.limit_bytes.value_or(0))},
                                     {"current_usage_gb", Gb(q.usage_bytes)}};
    }
    Send(res, 200, {{"users", users}});
  });
}

}  // namespace kvd::http
