// docs/openapi.json against the server: the embedded document is the file byte for byte and
// is what GET /openapi.json serves; the routes HttpServer registers and the document's
// operations are the same set (so neither can change without the other); a known path
// asked with another method answers 405 with Allow, OPTIONS 204 with Allow.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "fake_source.h"
#include "http/http_server.h"
#include "http/httplib_wrap.h"
#include "http/openapi.h"
#include "http/routes.h"
#include "kvd_version.h"

namespace kvd::http {
namespace {

std::string DocsFile() {
  std::ifstream in(std::string(KVD_SOURCE_DIR) + "/docs/openapi.json", std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Sends `request` as is on one connection and returns everything the server sends back until
// it closes the connection or `wait_s` passes without a byte.
std::string Raw(int port, const std::string& request, int wait_s = 3) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "<connect failed>";
  }
  timeval tv{wait_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

class OpenApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.sample_interval_seconds = 0.05;
    server_ = std::make_unique<HttpServer>(o, &source_, &source_);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(5);
  }
  FakeSource source_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(OpenApiTest, TheServedDocumentIsDocsOpenapiJsonByteForByte) {
  const std::string file = DocsFile();
  ASSERT_FALSE(file.empty()) << "docs/openapi.json not found under " << KVD_SOURCE_DIR;
  EXPECT_EQ(std::string(OpenApiDocument()), file) << "rebuild: the embedded copy is stale";
  auto r = client_->Get("/openapi.json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, file);
  const auto doc = nlohmann::json::parse(r->body);
  EXPECT_EQ(doc["openapi"], "3.1.0");
  EXPECT_EQ(doc["info"]["version"], KVD_VERSION) << "docs/openapi.json's info.version is kvd's";
}

TEST_F(OpenApiTest, EveryRegisteredRouteIsDocumentedAndEveryDocumentedOneIsRegistered) {
  std::set<std::pair<std::string, std::string>> registered, documented;
  for (const Route& route : server_->routes()) {
    EXPECT_TRUE(registered.emplace(route.method, route.path).second)
        << "registered twice: " << route.method << " " << route.path;
  }
  const auto doc = nlohmann::json::parse(OpenApiDocument());
  for (const auto& [path, item] : doc["paths"].items()) {
    for (const auto& [key, operation] : item.items()) {
      if (key == "parameters" || key == "summary" || key == "description") continue;
      std::string method = key;
      for (char& c : method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      documented.emplace(method, path);
      EXPECT_TRUE(operation.contains("responses")) << method << " " << path;
    }
  }
  for (const auto& [method, path] : registered) {
    EXPECT_TRUE(documented.count({method, path})) << "not in docs/openapi.json: " << method << " " << path;
  }
  for (const auto& [method, path] : documented) {
    EXPECT_TRUE(registered.count({method, path})) << "documented, not served: " << method << " " << path;
  }
  EXPECT_GE(registered.size(), 26u);
}

TEST_F(OpenApiTest, EveryDocumentedPathAnswersSomethingOtherThan404ForItsMethods) {
  const auto doc = nlohmann::json::parse(OpenApiDocument());
  for (const auto& [path, item] : doc["paths"].items()) {
    std::string concrete = path;
    for (size_t open; (open = concrete.find('{')) != std::string::npos;) {
      concrete.replace(open, concrete.find('}', open) - open + 1, "x");
    }
    if (!item.contains("get")) continue;
    auto r = client_->Get(concrete.c_str());
    ASSERT_TRUE(r) << concrete;
    if (path == "/cache/prefetches/{request_id}") {
      EXPECT_EQ(r->body.find("no such endpoint"), std::string::npos) << concrete;
    } else {
      EXPECT_NE(r->status, 404) << concrete << ": " << r->body;
    }
  }
}

TEST(RouterTest, PathTemplatesBecomeOneSegmentGroups) {
  EXPECT_EQ(Router::PathRegex("/quota/{cache_salt}"), "/quota/([^/]+)");
  EXPECT_EQ(Router::PathRegex("/cache/prefetches/{request_id}"), "/cache/prefetches/([^/]+)");
  EXPECT_EQ(Router::PathRegex("/openapi.json"), "/openapi\\.json");
}

TEST_F(OpenApiTest, AKnownPathAskedWithAnotherMethodAnswers405WithAllow) {
  auto r = client_->Post("/status", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
  EXPECT_EQ(nlohmann::json::parse(r->body), nlohmann::json({{"detail", "Method Not Allowed"}}));
  r = client_->Put("/cache/objects", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD, DELETE");
  r = client_->Patch("/quota/team-a", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD, PUT, DELETE");
  r = client_->Options("/quota/team-a");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD, PUT, DELETE, OPTIONS");
  // An unknown path stays 404, whatever the method.
  r = client_->Post("/no/such/thing", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  // The next request on the client still answers (a 405 closes the connection: its body
  // was not read).
  r = client_->Get("/api/version");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Found by schemathesis (`curl -X POST …/cache/prefetches`): a POST or PUT without
// Content-Length has no body (RFC 9112 6.3), but the HTTP library waited for one until its
// read timeout and then answered an empty 400.
TEST_F(OpenApiTest, ABodyMethodWithoutContentLengthIsAnsweredAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string r = Raw(server_->port(), "POST /cache/prefetches HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 422", 0), 0u) << r;
  EXPECT_NE(r.find(R"("loc":["body"])"), std::string::npos) << r;
  r = Raw(server_->port(), "PUT /quota/team-a HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
  EXPECT_NE(r.find(R"({"error":)"), std::string::npos) << r;
  r = Raw(server_->port(), "POST /cache/clear HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// Found by schemathesis (its malformed-Content-Type probe): a multipart/form-data body
// without a boundary got an empty 400 from the HTTP library, the body left on the
// connection, so the client's next request there failed to parse.
TEST_F(OpenApiTest, AMultipartBodyIs415AndTheConnectionIsClosed) {
  for (const std::string path : {"/cache/prefetches", "/cache/clear", "/quota/team-a"}) {
    const std::string method = path == "/quota/team-a" ? "PUT" : "POST";
    const std::string r = Raw(server_->port(), method + " " + path +
                                                   " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data\r\n"
                                                   "Content-Length: 2\r\n\r\n{}");
    EXPECT_EQ(r.rfind("HTTP/1.1 415", 0), 0u) << path << ":\n" << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << path << ":\n" << r;
    EXPECT_NE(r.find(R"({"detail":"Unsupported Media Type)"), std::string::npos) << path << ":\n" << r;
  }
  // A path that does not take the method still answers 405 first.
  const std::string r = Raw(server_->port(),
                            "POST /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data\r\n"
                            "Content-Length: 2\r\n\r\n{}");
  EXPECT_EQ(r.rfind("HTTP/1.1 405", 0), 0u) << r;
  EXPECT_EQ(source_.clears.load(), 0) << "nothing was cleared";
}

// Found by schemathesis (an OPTIONS probe with a JSON body): httplib reads no body for
// OPTIONS, so the body stayed on the kept-alive connection and the client's next request
// there was refused as malformed. Such a response now tells the client to close.
TEST_F(OpenApiTest, ABodyTheServerDoesNotReadClosesTheConnection) {
  for (const std::string method : {"OPTIONS", "TRACE"}) {
    const std::string r = Raw(server_->port(), method +
                                                   " /cache/prefetches HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                   "Content-Length: 2\r\n\r\n{}");
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << method << ":\n" << r;
  }
  // Without a body the connection is kept.
  const std::string r = Raw(server_->port(), "OPTIONS /cache/prefetches HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 1);
  EXPECT_EQ(r.rfind("HTTP/1.1 204", 0), 0u) << r;
  EXPECT_EQ(r.find("Connection: close"), std::string::npos) << r;
}

}  // namespace
}  // namespace kvd::http
