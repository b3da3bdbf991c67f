// FleetDirectory against a real redis-server (l2::testing::RedisProcess): nodes publish,
// withdraw, heartbeat, restart and leave, and other nodes' lookups answer exactly the live
// owners; stale entries are removed by the lookup that meets them; invalid input writes
// nothing; a server that goes away answers Unavailable and is reconnected when it is back.
// A fake server (HostileServer below) answers the lookup script with malformed replies and
// Cluster redirects, which must be refused without a crash.
#include "p2p/fleet_directory.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../l2/redis_process.h"
#include "l2/cluster_slots.h"

namespace kvd::p2p {
namespace {

using l2::testing::RedisProcess;
using Owner = FleetDirectory::Owner;
using Owners = std::vector<std::vector<Owner>>;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kIncA = 1700000000000000001ull;
constexpr uint64_t kIncB = 1700000000000000002ull;

FleetDirectory::Options Opts(int port, double node_ttl_s = 10) {
  FleetDirectory::Options o;
  o.endpoint = {"127.0.0.1", port};
  o.connect.connect_timeout_s = 1;
  o.connect.request_timeout_s = 1;
  o.node_ttl_s = node_ttl_s;
  o.entry_ttl_s = 60;
  return o;
}

std::string Url(const std::string& node) { return "ucx://" + node + ".local:7000"; }

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == sep) {
      if (i > start) out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

std::unique_ptr<FleetDirectory> Dir(const RedisProcess& r, const std::string& node, uint64_t inc,
                                    FleetDirectory::Options o = {}) {
  if (o.endpoint.port == 0) o = Opts(r.port());
  auto d = FleetDirectory::Connect(o, {node, inc, Url(node)});
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(*d) : nullptr;
}

std::string Cli(const RedisProcess& r, const std::vector<std::string>& args) {
  auto t = r.Cli(args);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : "";
}

std::string ChunkKey(const std::string& k) { return "{kvd-p2p}:chunk:" + k; }

class FleetDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!l2::testing::RedisInstalled()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(redis_.Start().ok());
  }
  RedisProcess redis_;
};

TEST_F(FleetDirectoryTest, PublishedChunksAreAnsweredWithTheirOwnerButNotToItself) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1", "k2"}).ok());
  auto got = b->Lookup({"k1", "k2", "k3"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const Owner owner_a{"node-a", kIncA, Url("node-a")};
  EXPECT_EQ(*got, (Owners{{owner_a}, {owner_a}, {}}));
  auto own = a->Lookup({"k1", "k2"});
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, (Owners{{}, {}}));
  EXPECT_EQ(Cli(redis_, {"HGET", ChunkKey("k1"), "node-a"}), std::to_string(kIncA));
  EXPECT_EQ(b->stats().lookups, 1u);
  EXPECT_EQ(a->stats().publishes, 1u);
  EXPECT_EQ(b->stats().stale_entries_removed, 0u);
}

TEST_F(FleetDirectoryTest, WithdrawnChunkIsNoLongerAnswered) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1", "k2"}).ok());
  ASSERT_TRUE(a->Withdraw({"k1"}).ok());
  auto got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (Owners{{}, {{"node-a", kIncA, Url("node-a")}}}));
  EXPECT_EQ(a->stats().withdraws, 1u);
}

TEST_F(FleetDirectoryTest, ExpiredHeartbeatIsNotAnsweredAndItsEntriesAreRemoved) {
  auto a = Dir(redis_, "node-a", kIncA, Opts(redis_.port(), 0.2));
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(b->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1", "k2"}).ok());
  ASSERT_TRUE(b->Publish({"k2"}).ok());
  auto live = b->Lookup({"k1"});
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(live->at(0).size(), 1u);  // alive before the TTL
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(Cli(redis_, {"EXISTS", "{kvd-p2p}:node:node-a"}), "0");
  auto got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (Owners{{}, {}}));
  EXPECT_EQ(b->stats().stale_entries_removed, 2u);
  EXPECT_EQ(Cli(redis_, {"HLEN", ChunkKey("k1")}), "0");
  EXPECT_EQ(Cli(redis_, {"HKEYS", ChunkKey("k2")}), "node-b");  // B's own live entry stays
}

TEST_F(FleetDirectoryTest, RestartedNodeIsAnsweredOnlyUnderItsNewIncarnation) {
  auto old_a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(old_a && b);
  ASSERT_TRUE(old_a->Heartbeat().ok());
  ASSERT_TRUE(old_a->Publish({"k1", "k2"}).ok());
  const uint64_t new_inc = kIncA + 1000;
  auto new_a = Dir(redis_, "node-a", new_inc);
  ASSERT_TRUE(new_a);
  ASSERT_TRUE(new_a->Heartbeat().ok());
  auto got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (Owners{{}, {}}));  // old entries: a node key of another incarnation
  EXPECT_EQ(b->stats().stale_entries_removed, 2u);
  ASSERT_TRUE(new_a->Publish({"k2"}).ok());
  // The old process leaving must not take the new one's node key with it.
  ASSERT_TRUE(old_a->Leave().ok());
  got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (Owners{{}, {{"node-a", new_inc, Url("node-a")}}}));
}

TEST_F(FleetDirectoryTest, EveryOwnerIsAnsweredUpToMaxOwnersPerKey) {
  std::vector<std::unique_ptr<FleetDirectory>> owners;
  for (const char* n : {"node-a", "node-c", "node-d"}) {
    owners.push_back(Dir(redis_, n, kIncA));
    ASSERT_TRUE(owners.back());
    ASSERT_TRUE(owners.back()->Heartbeat().ok());
    ASSERT_TRUE(owners.back()->Publish({n == std::string("node-d") ? "other" : "k1"}).ok());
  }
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(b);
  auto got = b->Lookup({"k1"});
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(got->at(0), UnorderedElementsAre(Owner{"node-a", kIncA, Url("node-a")},
                                               Owner{"node-c", kIncA, Url("node-c")}));
  ASSERT_TRUE(owners[2]->Publish({"k1"}).ok());
  auto o = Opts(redis_.port());
  o.max_owners_per_key = 2;
  auto bounded = Dir(redis_, "node-e", kIncB, o);
  ASSERT_TRUE(bounded);
  got = bounded->Lookup({"k1"});
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->at(0).size(), 2u);
  for (const Owner& w : got->at(0)) EXPECT_THAT(w.node, ::testing::AnyOf("node-a", "node-c", "node-d"));
  EXPECT_NE(got->at(0)[0].node, got->at(0)[1].node);
  EXPECT_EQ(Cli(redis_, {"HLEN", ChunkKey("k1")}), "3");  // bounded answer, nothing removed
}

// Many owners per key make the worst-case reply large: the batch goes as several scripts
// pipelined in one round trip, and the answers keep the keys' order; after the server's
// script cache is flushed, every script is sent again with EVAL.
TEST_F(FleetDirectoryTest, LargeBatchesSplitAcrossScriptsAndSurviveScriptFlush) {
  auto a = Dir(redis_, "node-a", kIncA);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Heartbeat().ok());
  std::vector<std::string> keys, odd;
  for (int i = 0; i < 40; ++i) {
    keys.push_back("key-" + std::to_string(i));
    if (i % 2) odd.push_back(keys.back());
  }
  ASSERT_TRUE(a->Publish(odd).ok());
  auto o = Opts(redis_.port());
  o.max_owners_per_key = 1024;  // a few keys per script
  auto b = Dir(redis_, "node-b", kIncB, o);
  ASSERT_TRUE(b);
  for (int round = 0; round < 2; ++round) {
    auto got = b->Lookup(keys);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(got->at(i).size(), i % 2) << keys[i];
    EXPECT_EQ(Cli(redis_, {"SCRIPT", "FLUSH"}), "OK");
  }
  // 4 keys per script at 1024 owners: 10 scripts per lookup, the second lookup's all by EVAL.
  const std::string info = Cli(redis_, {"INFO", "commandstats"});
  EXPECT_THAT(info, ::testing::HasSubstr("cmdstat_evalsha:calls=20,"));
  EXPECT_THAT(info, ::testing::HasSubstr("cmdstat_eval:calls=10,"));
}

TEST_F(FleetDirectoryTest, InvalidInputIsRefusedAndWritesNothing) {
  const int port = redis_.port();
  auto refused = [&](FleetDirectory::Options o, FleetDirectory::Self s) {
    auto d = FleetDirectory::Connect(std::move(o), std::move(s));
    return !d.ok() && d.status().code() == StatusCode::kInvalidArgument;
  };
  const FleetDirectory::Self good{"node-a", kIncA, Url("node-a")};
  EXPECT_TRUE(refused(Opts(port), {"", kIncA, "u"}));
  EXPECT_TRUE(refused(Opts(port), {"node a", kIncA, "u"}));
  EXPECT_TRUE(refused(Opts(port), {"node/a", kIncA, "u"}));
  EXPECT_TRUE(refused(Opts(port), {std::string(129, 'n'), kIncA, "u"}));
  EXPECT_TRUE(refused(Opts(port), {"node-a", 0, "u"}));
  EXPECT_TRUE(refused(Opts(port), {"node-a", kIncA, ""}));
  EXPECT_TRUE(refused(Opts(port), {"node-a", kIncA, "ucx://a b"}));
  EXPECT_TRUE(refused(Opts(port), {"node-a", kIncA, std::string(257, 'u')}));
  for (const char* prefix : {"kvd-p2p:", "{}:", "}kvd{", ""}) {
    auto o = Opts(port);
    o.key_prefix = prefix;
    EXPECT_TRUE(refused(o, good)) << prefix;
  }
  auto o = Opts(port, 0);
  EXPECT_TRUE(refused(o, good));
  o = Opts(port, 0.0005);
  EXPECT_TRUE(refused(o, good));
  o = Opts(port);
  o.entry_ttl_s = -1;
  EXPECT_TRUE(refused(o, good));
  o = Opts(port);
  o.max_owners_per_key = 0;
  EXPECT_TRUE(refused(o, good));

  o = Opts(port);
  o.max_batch = 3;
  auto a = Dir(redis_, "node-a", kIncA, o);
  ASSERT_TRUE(a);
  const std::vector<std::vector<std::string>> bad = {
      {""}, {"k1", ""}, {"k1", std::string(1025, 'k')}, {"k1", "k2", "k3", "k4"}};
  for (const auto& keys : bad) {
    EXPECT_EQ(a->Publish(keys).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(a->Withdraw(keys).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(a->Lookup(keys).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Cli(redis_, {"DBSIZE"}), "0");
  EXPECT_TRUE(a->Publish({"k1", std::string(1024, 'k'), "k3"}).ok());  // the limits are inclusive
  EXPECT_EQ(Cli(redis_, {"DBSIZE"}), "3");
  EXPECT_EQ(a->stats().failures, 0u);
}

TEST_F(FleetDirectoryTest, ServerDownAnswersUnavailableThenReconnects) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Heartbeat().ok());
  redis_.Kill();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a->Publish({"k1"}).code(), StatusCode::kUnavailable);
  EXPECT_EQ(a->Heartbeat().code(), StatusCode::kUnavailable);
  EXPECT_EQ(b->Lookup({"k1"}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a->Leave().code(), StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(a->stats().failures, 3u);
  ASSERT_TRUE(redis_.Restart().ok());  // an empty server: the data went with the process
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1"}).ok());
  auto got = b->Lookup({"k1"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, (Owners{{{"node-a", kIncA, Url("node-a")}}}));
  EXPECT_GE(a->stats().reconnects, 1u);
  EXPECT_GE(b->stats().reconnects, 1u);

  // Killed and back between two calls: the call finds its connection broken, dials once
  // and retries, so it succeeds at once.
  redis_.Kill();
  ASSERT_TRUE(redis_.Restart().ok());
  EXPECT_TRUE(a->Heartbeat().ok());
  EXPECT_TRUE(b->Lookup({"k1"}).ok());
}

TEST_F(FleetDirectoryTest, LeaveRemovesTheNodeFromLookups) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1"}).ok());
  ASSERT_EQ(b->Lookup({"k1"})->at(0).size(), 1u);
  ASSERT_TRUE(a->Leave().ok());
  EXPECT_EQ(Cli(redis_, {"EXISTS", "{kvd-p2p}:node:node-a"}), "0");
  auto got = b->Lookup({"k1"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (Owners{{}}));
  EXPECT_EQ(Cli(redis_, {"EXISTS", ChunkKey("k1")}), "0");
}

// One directory shared by threads: each call is one whole request on the one connection.
TEST_F(FleetDirectoryTest, ConcurrentCallsOnOneDirectoryStayInStep) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Heartbeat().ok());
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const std::string k = std::to_string(t * 1000 + i);
        if (!a->Publish({k}).ok() || !a->Heartbeat().ok()) ++errors;
        auto got = b->Lookup({k, "absent"});
        if (!got.ok() || *got != Owners{{{"node-a", kIncA, Url("node-a")}}, {}}) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(a->stats().publishes, 100u);
  EXPECT_EQ(b->stats().lookups, 100u);
  EXPECT_EQ(Cli(redis_, {"DBSIZE"}), "101");  // 100 entries and A's node key
}

// Garbage in the directory's data (written by something else) makes an entry not live: it is
// not answered and is removed, and the lookup succeeds.
TEST_F(FleetDirectoryTest, MalformedDirectoryDataIsNotLiveAndIsRemoved) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto c = Dir(redis_, "node-c", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(c->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1"}).ok());
  ASSERT_TRUE(c->Publish({"k1"}).ok());
  Cli(redis_, {"SET", "{kvd-p2p}:node:node-a", "notanumber url"});
  Cli(redis_, {"HSET", ChunkKey("k1"), "node c", "1", "node-d", "0012", "node-e", "x y"});
  Cli(redis_, {"HSET", ChunkKey("k1"), "node-f", "18446744073709551616"});
  Cli(redis_, {"SET", "{kvd-p2p}:node:node-g", "5 ucx://g\x01"});
  Cli(redis_, {"HSET", ChunkKey("k1"), "node-g", "5"});
  Cli(redis_, {"HSET", "{kvd-p2p}:node:node-h", "x", "y"});  // a node key of the wrong type
  Cli(redis_, {"HSET", ChunkKey("k1"), "node-h", "7"});
  Cli(redis_, {"SET", ChunkKey("k2"), "a string, not a hash"});
  auto got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, (Owners{{{"node-c", kIncA, Url("node-c")}}, {}}));
  EXPECT_EQ(b->stats().stale_entries_removed, 7u);
  EXPECT_EQ(Cli(redis_, {"HKEYS", ChunkKey("k1")}), "node-c");
}

// A fake server on a loopback socket: SCRIPT LOAD is answered with a SHA1, every other
// command with the next of `replies` (raw RESP), in order.
class HostileServer {
 public:
  explicit HostileServer(std::deque<std::string> replies) : replies_(std::move(replies)) {
    fd_ = kvd::l2::testing::ListenLoopback(4, &port_);
    EXPECT_GE(fd_, 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~HostileServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  bool Wait(int fd) {
    pollfd p{fd, POLLIN, 0};
    while (!stop_) {
      if (::poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }
  // Parses one "*N $len arg ..." command at the front of buf_; false if incomplete.
  bool TakeCommand(std::string* first) {
    size_t pos = 0;
    auto line = [&](char kind, long* n) {
      const size_t end = buf_.find("\r\n", pos);
      if (end == std::string::npos || buf_[pos] != kind) return false;
      *n = std::stol(buf_.substr(pos + 1, end - pos - 1));
      pos = end + 2;
      return true;
    };
    long args = 0;
    if (!line('*', &args)) return false;
    for (long i = 0; i < args; ++i) {
      long len = 0;
      if (pos >= buf_.size() || !line('$', &len) || buf_.size() < pos + len + 2) return false;
      if (i == 0) *first = buf_.substr(pos, len);
      pos += len + 2;
    }
    buf_.erase(0, pos);
    return true;
  }
  void Serve() {
    while (Wait(fd_)) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      char chunk[4096];
      while (Wait(c)) {
        const ssize_t n = ::read(c, chunk, sizeof chunk);
        if (n <= 0) break;
        buf_.append(chunk, n);
        std::string cmd, out;
        while (TakeCommand(&cmd)) {
          if (cmd == "SCRIPT") {
            out += "$40\r\n" + std::string(40, 'a') + "\r\n";
          } else if (!replies_.empty()) {
            out += replies_.front();
            replies_.pop_front();
          } else {
            out += "-ERR no more replies\r\n";
          }
        }
        if (!out.empty() && ::write(c, out.data(), out.size()) != static_cast<ssize_t>(out.size())) break;
      }
      ::close(c);
      buf_.clear();
    }
  }

  std::deque<std::string> replies_;
  std::string buf_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string Bulk(const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; }
std::string OneKey(const std::string& owners_array) { return "*2\r\n:0\r\n*1\r\n" + owners_array; }
std::string Triple(const std::string& node, const std::string& inc, const std::string& url) {
  return "*3\r\n" + Bulk(node) + Bulk(inc) + Bulk(url);
}

// The server is not trusted: each malformed answer to the lookup script is refused as
// Internal, the connection stays usable, and a well-formed answer after them is accepted.
TEST(FleetDirectoryHostileTest, MalformedLookupRepliesAreRefused) {
  const std::vector<std::string> malformed = {
      "+OK\r\n",
      ":3\r\n",
      "*1\r\n:0\r\n",
      "*2\r\n:-1\r\n*1\r\n*0\r\n",
      "*2\r\n$1\r\n0\r\n*1\r\n*0\r\n",
      "*2\r\n:0\r\n*2\r\n*0\r\n*0\r\n",  // two answers for one key
      "*2\r\n:0\r\n*0\r\n",
      "*2\r\n:0\r\n*1\r\n:5\r\n",
      OneKey("*2\r\n" + Bulk("node-x") + Bulk("5")),
      OneKey(Triple("node-x", "notanumber", "u")),
      OneKey(Triple("node-x", "0", "u")),
      OneKey(Triple("node-x", "-5", "u")),
      OneKey(Triple("node-x", "007", "u")),
      OneKey(Triple("node-x", "18446744073709551616", "u")),
      OneKey(Triple("node x", "5", "u")),
      OneKey(Triple("", "5", "u")),
      OneKey(Triple("node-b", "5", "u")),  // this node itself
      OneKey(Triple("node-x", "5", "u v")),
      OneKey(Triple("node-x", "5", "")),
      OneKey(Triple("node-x", "5", std::string(257, 'u'))),
      OneKey("*3\r\n" + Bulk("node-x") + ":5\r\n" + Bulk("u")),
      OneKey("*3\r\n" + Bulk("node-x") + Bulk("5") + "*1\r\n" + Bulk("u")),
      OneKey("*9\r\n" + Bulk("x") + Bulk("1") + Bulk("u") + Bulk("y") + Bulk("1") + Bulk("u") +
             Bulk("z") + Bulk("1") + Bulk("u")),  // three owners, max_owners_per_key 2
  };
  std::deque<std::string> replies(malformed.begin(), malformed.end());
  replies.push_back(OneKey(Triple("node-x", "18446744073709551615", "ucx://x:1")));
  HostileServer server(replies);
  auto o = Opts(server.port());
  o.max_owners_per_key = 2;
  auto d = FleetDirectory::Connect(o, {"node-b", kIncB, Url("node-b")});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  for (size_t i = 0; i < malformed.size(); ++i) {
    auto got = (*d)->Lookup({"k1"});
    EXPECT_EQ(got.status().code(), StatusCode::kInternal) << i << ": " << got.status().ToString();
  }
  auto got = (*d)->Lookup({"k1"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, (Owners{{{"node-x", 18446744073709551615ull, "ucx://x:1"}}}));
  EXPECT_EQ((*d)->stats().failures, malformed.size());
  EXPECT_EQ((*d)->stats().reconnects, 0u);  // none of them broke the connection
}

TEST_F(FleetDirectoryTest, ForgetRemovesAnOwnerOnlyUnderTheIncarnationItWasSeenWith) {
  auto a = Dir(redis_, "node-a", kIncA);
  auto b = Dir(redis_, "node-b", kIncB);
  ASSERT_TRUE(a->Heartbeat().ok());
  ASSERT_TRUE(a->Publish({"k1", "k2"}).ok());
  // B saw node-a under another incarnation: nothing is removed.
  EXPECT_TRUE(b->Forget("k1", {"node-a", kIncA + 1, Url("node-a")}).ok());
  auto got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].size(), 1u);
  // Under the incarnation it holds: gone from k1 only.
  EXPECT_TRUE(b->Forget("k1", {"node-a", kIncA, Url("node-a")}).ok());
  got = b->Lookup({"k1", "k2"});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE((*got)[0].empty());
  EXPECT_EQ((*got)[1].size(), 1u);
  EXPECT_EQ(b->stats().forgets, 2u);
  EXPECT_EQ(b->Forget("", {"node-a", kIncA, ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Forget("k1", {"bad node", kIncA, ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Forget("k1", {"node-a", 0, ""}).code(), StatusCode::kInvalidArgument);
}

// A Cluster directory: every node is given the same seed (here, a master that does not own
// the prefix's slot, or one that does); each reaches the slot's master through the slot map,
// where every key of the fleet then lives, and nodes see each other's chunks.
TEST(FleetDirectoryClusterTest, NodesThroughAnySeedShareTheKeysOnTheSlotsMaster) {
  if (!l2::testing::RedisInstalled()) GTEST_SKIP() << "redis-server not installed";
  l2::testing::RedisCluster cluster;
  ASSERT_TRUE(cluster.Start().ok());
  const uint16_t slot = l2::KeySlot("{kvd-p2p}:");
  int owner = -1;
  for (int i = 0; i < 3; ++i) {
    auto mine = cluster.node(i).Cli({"CLUSTER", "NODES"});
    ASSERT_TRUE(mine.ok());
    // The master whose own line ("myself") lists a range holding the slot.
    for (const auto& line : Split(*mine, '\n')) {
      if (line.find("myself") == std::string::npos) continue;
      const auto fields = Split(line, ' ');
      for (size_t f = 8; f < fields.size(); ++f) {
        const size_t dash = fields[f].find('-');
        const int lo = std::stoi(fields[f].substr(0, dash));
        const int hi = dash == std::string::npos ? lo : std::stoi(fields[f].substr(dash + 1));
        if (lo <= slot && slot <= hi) owner = i;
      }
    }
  }
  ASSERT_GE(owner, 0);
  const int other = (owner + 1) % 3;
  auto opts = [&](int seed) {
    auto o = Opts(cluster.node(seed).port());
    o.cluster = true;
    return o;
  };
  auto a = FleetDirectory::Connect(opts(other), {"node-a", kIncA, Url("node-a")});
  auto b = FleetDirectory::Connect(opts(owner), {"node-b", kIncB, Url("node-b")});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE((*a)->Heartbeat().ok());
  ASSERT_TRUE((*b)->Heartbeat().ok());
  ASSERT_TRUE((*a)->Publish({"c1", "c2"}).ok());
  auto got = (*b)->Lookup({"c1", "c2", "c3"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, (Owners{{{"node-a", kIncA, Url("node-a")}}, {{"node-a", kIncA, Url("node-a")}}, {}}));
  // Every key is on the slot's master: its node keys and the chunk entries.
  auto count = cluster.node(owner).Cli({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)});
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(std::stoi(*count), 4) << *count;  // two node keys, two chunk keys
  ASSERT_TRUE((*a)->Withdraw({"c1"}).ok());
  got = (*b)->Lookup({"c1"});
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE((*got)[0].empty());
  // The seed is a standalone server: refused, saying so.
  RedisProcess plain;
  ASSERT_TRUE(plain.Start().ok());
  auto plain_opts = Opts(plain.port());
  plain_opts.cluster = true;
  auto c = FleetDirectory::Connect(plain_opts, {"node-c", 3, Url("node-c")});
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("not a Redis Cluster"));
}

TEST(FleetDirectoryHostileTest, ClusterRedirectIsFailedPreconditionAndErrorsUnavailable) {
  HostileServer server({"-MOVED 3999 127.0.0.1:7001\r\n", "-MOVED 3999 127.0.0.1:7001\r\n",
                        ":1\r\n", "-ASK 3999 127.0.0.1:7001\r\n", "-ERR something broke\r\n",
                        "$2\r\nOK\r\n"});
  auto d = FleetDirectory::Connect(Opts(server.port()), {"node-b", kIncB, Url("node-b")});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Status st = (*d)->Heartbeat();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("answered as a Redis Cluster"));
  EXPECT_THAT(st.message(), ::testing::HasSubstr("redis-cluster://"));
  EXPECT_EQ((*d)->Lookup({"k1"}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*d)->Publish({"k1"}).code(), StatusCode::kFailedPrecondition);  // HSET ok, PEXPIRE ASK
  EXPECT_EQ((*d)->Withdraw({"k1"}).code(), StatusCode::kUnavailable);
  EXPECT_EQ((*d)->Heartbeat().code(), StatusCode::kInternal);  // a bulk "OK", not +OK
}

// A server that accepts connections and never answers holds a call for the request timeout,
// not longer.
TEST(FleetDirectoryHostileTest, SilentServerAnswersUnavailableAfterTheRequestTimeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);  // the kernel completes the handshake; nobody reads
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  auto o = Opts(ntohs(a.sin_port));
  o.connect.request_timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  auto d = FleetDirectory::Connect(o, {"node-b", kIncB, Url("node-b")});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  ::close(fd);
}

}  // namespace
}  // namespace kvd::p2p
