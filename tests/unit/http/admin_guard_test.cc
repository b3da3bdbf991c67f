// The rules for requests that change state (issue 27, finding 8: any web page the operator
// opened, or DNS rebinding, could clear the cache).
#include "http/admin_guard.h"

#include <gtest/gtest.h>

namespace kvd::http {
namespace {

AdminRequest Req(std::optional<std::string_view> host, std::optional<std::string_view> origin = std::nullopt) {
  AdminRequest r;
  r.host = host;
  r.origin = origin;
  return r;
}

int StatusOf(const AdminPolicy& p, const AdminRequest& r) {
  auto refusal = CheckAdminRequest(p, r);
  return refusal ? refusal->status : 0;
}

TEST(AdminGuard, HostOfAuthority) {
  EXPECT_EQ(HostOfAuthority("127.0.0.1:8080"), "127.0.0.1");
  EXPECT_EQ(HostOfAuthority("[::1]:8080"), "::1");
  EXPECT_EQ(HostOfAuthority("[::1]"), "::1");
  EXPECT_EQ(HostOfAuthority("LocalHost."), "localhost");
  EXPECT_EQ(HostOfAuthority(" kvd-node-3:80 "), "kvd-node-3");
}

TEST(AdminGuard, Finding8HostMustNameThisServer) {
  AdminPolicy p;
  p.host_names = {"kvd-node-3", "127.0.0.1"};
  for (const char* ok : {"127.0.0.1:8080", "127.0.0.1", "10.1.2.3:8080", "[::1]:8080", "localhost:8080",
                         "LOCALHOST", "app.localhost:1", "kvd-node-3:8080", "KVD-NODE-3"}) {
    EXPECT_EQ(StatusOf(p, Req(ok)), 0) << ok;
  }
  // Names a page's DNS could point at kvd (rebinding), and malformed Host values.
  for (const char* bad : {"evil.example:8080", "evil.example", "127.0.0.1.evil.example", "localhost.evil.example",
                          "kvd-node-3.evil.example", "", ":8080", "127.0.0.1:80x", "[::1", "0x7f.1"}) {
    EXPECT_EQ(StatusOf(p, Req(bad)), 403) << bad;
  }
  // No Host at all: not a browser (an HTTP/1.0 client on the host).
  EXPECT_EQ(StatusOf(p, Req(std::nullopt)), 0);
}

TEST(AdminGuard, Finding8OriginMustBeThisServersOwn) {
  AdminPolicy p;
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "http://127.0.0.1:8080")), 0);
  EXPECT_EQ(StatusOf(p, Req("localhost:8080", "HTTP://LOCALHOST:8080")), 0);
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1", "http://127.0.0.1:80")), 0) << "default port";
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "http://127.0.0.1:8081")), 403);
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "http://evil.example")), 403);
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "https://127.0.0.1:8080")), 403);
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "null")), 403);
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "http://127.0.0.1:8080/path")), 403);
  EXPECT_EQ(StatusOf(p, Req("127.0.0.1:8080", "http://user@127.0.0.1:8080")), 403);
  EXPECT_EQ(StatusOf(p, Req(std::nullopt, "http://127.0.0.1:8080")), 403) << "an Origin needs a Host";
  // DNS rebinding: the page's origin and Host agree, but the name is not this server's.
  EXPECT_EQ(StatusOf(p, Req("evil.example:8080", "http://evil.example:8080")), 403);
}

TEST(AdminGuard, Finding8BodiesMustBeJson) {
  AdminPolicy p;
  AdminRequest r = Req("127.0.0.1:8080");
  r.has_body = true;
  for (const char* ok : {"application/json", "Application/JSON; charset=utf-8", " application/json ",
                         "application/merge-patch+json"}) {
    r.content_type = ok;
    EXPECT_EQ(StatusOf(p, r), 0) << ok;
  }
  for (const char* bad : {"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                          "multipart/form-data; boundary=x", "application/jsonp", "text/json",
                          "application/+json", "application/a b+json"}) {
    r.content_type = bad;
    EXPECT_EQ(StatusOf(p, r), 415) << bad;
  }
  // Without a body the type does not matter (curl -X POST, urllib's empty POST).
  r.has_body = false;
  r.content_type = "application/x-www-form-urlencoded";
  EXPECT_EQ(StatusOf(p, r), 0);
}

TEST(AdminGuard, Finding8TheTokenIsRequiredAndEnough) {
  AdminPolicy p;
  p.token = "s3cret";
  AdminRequest r = Req("evil.example:8080", "http://evil.example:8080");
  EXPECT_EQ(StatusOf(p, r), 401);
  auto refusal = CheckAdminRequest(p, r);
  ASSERT_TRUE(refusal);
  EXPECT_TRUE(refusal->bearer_challenge);
  for (const char* bad : {"s3cret", "Bearer", "Bearer ", "Bearer s3cre", "Bearer s3cret2", "Basic czNjcmV0",
                          "Bearer  x"}) {
    r.authorization = bad;
    EXPECT_EQ(StatusOf(p, r), 401) << bad;
  }
  for (const char* ok : {"Bearer s3cret", "bearer s3cret", "BEARER   s3cret "}) {
    r.authorization = ok;
    EXPECT_EQ(StatusOf(p, r), 0) << ok;
  }
  // The body rule still holds.
  r.has_body = true;
  r.content_type = "text/plain";
  EXPECT_EQ(StatusOf(p, r), 415);
}

TEST(AdminGuard, RefusalsRepeatAtMostABoundedPartOfTheRequest) {
  AdminPolicy p;
  const std::string host(10000, 'h');
  auto refusal = CheckAdminRequest(p, Req(host));
  ASSERT_TRUE(refusal);
  EXPECT_LT(refusal->detail.size(), 1000u);
}

}  // namespace
}  // namespace kvd::http
