// The --p2p-* values the server parses itself (server/peers.h): host:port and the directory
// URL. A malformed value is refused with a message that names the flag; nothing is guessed.
#include "server/peers.h"

#include <gtest/gtest.h>

namespace kvd::server {
namespace {

TEST(PeersTest, HostPortParsesNamesAndBracketedAddresses) {
  auto a = ParseHostPort("--p2p-advertise-url", "10.0.0.11:7500");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "10.0.0.11");
  EXPECT_EQ(a->second, 7500);
  auto b = ParseHostPort("--p2p-listen-url", "[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  for (const char* bad : {"", "host", ":7500", "host:", "host:0", "host:65536", "host:12x", "[]:1"}) {
    auto r = ParseHostPort("--p2p-listen-url", bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--p2p-listen-url"), std::string::npos) << bad;
  }
}

TEST(PeersTest, DirectoryUrlStandaloneAndCluster) {
  auto a = ParseDirectoryUrl("redis://10.0.0.5:6379");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 6379);
  EXPECT_FALSE(a->cluster);
  EXPECT_EQ(a->database_id, -1);
  auto b = ParseDirectoryUrl("valkey://kvd:s3cr@t@dir.local:7000/3");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->username, "kvd");
  EXPECT_EQ(b->password, "s3cr@t");  // the last '@' ends the credentials
  EXPECT_EQ(b->host, "dir.local");
  EXPECT_EQ(b->database_id, 3);
  auto c = ParseDirectoryUrl("redis://:only-password@h:1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->username, "");
  EXPECT_EQ(c->password, "only-password");
  auto d = ParseDirectoryUrl("redis-cluster://h:30001");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->cluster);
  EXPECT_TRUE(ParseDirectoryUrl("valkey-cluster://h:30001")->cluster);
  for (const char* bad : {"", "h:6379", "http://h:1", "redis://", "redis://h", "redis://h:1/x",
                          "redis://h:1/-1", "redis-cluster://h:1/0", "redis://h:99999"}) {
    auto r = ParseDirectoryUrl(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--p2p-directory"), std::string::npos) << bad;
  }
}

TEST(PeersTest, P2pOffStartsNothingAndBadSettingsAreRefusedBeforeAnythingStarts) {
  ServerConfig off;
  auto none = StartPeerNode(off);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->get(), nullptr);
  ServerConfig c;
  c.p2p_advertise_url = "127.0.0.1:1";
  c.p2p_directory = "redis://127.0.0.1:1";
  c.p2p_secret_file = "/nonexistent/secret";
  auto r = StartPeerNode(c);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--p2p-secret-file"), std::string::npos);
  c.p2p_transfer_engine = "nixl";
  r = StartPeerNode(c);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("nixl"), std::string::npos);
}

}  // namespace
}  // namespace kvd::server
