// P2pAgent with real parts: two agents (UCX over TCP on loopback) and a real redis-server as
// the fleet directory. A publishes the chunks it holds; B finds them in the directory and
// reads them from A, byte-exact; the directory or a peer going away costs reads, never the
// request path.
#include "p2p/p2p_agent.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "../l2/redis_process.h"

namespace kvd::p2p {
namespace {

using namespace std::chrono_literals;

constexpr size_t kChunk = 1 << 20;

uint8_t ByteOf(size_t i) { return static_cast<uint8_t>((i * 31 + 7) & 0xff); }

Deadline In(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

// An agent over `chunks` chunks of its own memory, served by index.
struct Node {
  Node(const l2::testing::RedisProcess& redis, const std::string& name, uint64_t incarnation,
       size_t chunks)
      : memory(chunks * kChunk) {
    for (size_t i = 0; i < memory.size(); ++i) memory[i] = ByteOf(i);
    P2pAgent::Options o;
    o.ucx = {.listen_host = "127.0.0.1", .tls = "tcp",
             .serve = [this](uint64_t, const ServeAsk& ask) -> Result<ServedBytes> {
               ++served;
               if (ask.object >= memory.size() / kChunk || ask.offset > kChunk ||
                   ask.length > kChunk - ask.offset) {
                 return Status::NotFound("no such chunk");
               }
               return ServedBytes{memory.data() + ask.object * kChunk + ask.offset, ask.length, nullptr};
             },
             .secret = "p2p-agent-test fleet",
             .answer_timeout_s = 2};
    o.directory.endpoint = redis.endpoint();
    o.directory.node_ttl_s = 1;
    o.directory.connect.request_timeout_s = 0.5;
    o.directory.connect.connect_timeout_s = 0.5;
    o.self = {name, incarnation, ""};
    o.flush_interval_s = 0.02;
    auto a = P2pAgent::Start(std::move(o));
    status = a.status();
    if (!a.ok()) return;
    agent = std::move(*a);
    status = agent->RegisterMemory(memory.data(), memory.size());
  }
  std::vector<uint8_t> memory;
  std::atomic<size_t> served{0};
  Status status;
  std::unique_ptr<P2pAgent> agent;
};

class P2pAgentTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(redis_.Start().ok()); }
  l2::testing::RedisProcess redis_;
};

// Leave: the node's entries die at once and stay dead, though the agent lives on (no
// heartbeat follows to bring the node key back), and its later updates go nowhere.
TEST_F(P2pAgentTest, LeaveStopsHeartbeatsAndTheNodesEntriesDieAtOnce) {
  Node a(redis_, "node-a", 11, 2);
  Node b(redis_, "node-b", 22, 2);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  a.agent->Publish({"left-0"});
  ASSERT_TRUE(a.agent->Flush().ok());
  auto owners = b.agent->Lookup({"left-0"});
  ASSERT_TRUE(owners.ok());
  ASSERT_EQ((*owners)[0].size(), 1u);
  ASSERT_TRUE(a.agent->Leave().ok());
  // Three heartbeat intervals (node_ttl_s 1: one every 0.33 s) pass with A still alive.
  std::this_thread::sleep_for(1s);
  owners = b.agent->Lookup({"left-0"});
  ASSERT_TRUE(owners.ok());
  EXPECT_TRUE((*owners)[0].empty());
  a.agent->Publish({"left-1"});
  EXPECT_EQ(a.agent->Flush().code(), StatusCode::kUnavailable);
  owners = b.agent->Lookup({"left-1"});
  ASSERT_TRUE(owners.ok());
  EXPECT_TRUE((*owners)[0].empty());
}

TEST_F(P2pAgentTest, AChunkPublishedByOneNodeIsFoundAndReadByAnother) {
  Node a(redis_, "node-a", 11, 4);
  Node b(redis_, "node-b", 22, 4);
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_NE(a.agent->self().url.find("127.0.0.1:"), std::string::npos);

  a.agent->Publish({"chunk-0", "chunk-1", "chunk-2"});
  ASSERT_TRUE(a.agent->Flush().ok());
  auto owners = b.agent->Lookup({"chunk-0", "chunk-1", "chunk-2", "chunk-3"});
  ASSERT_TRUE(owners.ok()) << owners.status().ToString();
  ASSERT_EQ(owners->size(), 4u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ((*owners)[i].size(), 1u) << i;
    EXPECT_EQ((*owners)[i][0].node, "node-a");
    EXPECT_EQ((*owners)[i][0].url, a.agent->self().url);
  }
  EXPECT_TRUE((*owners)[3].empty());

  // B reads A's chunks 1 and 2 into the start of its own (registered) memory.
  std::vector<ReadItem> items = {{1, 0, kChunk, b.memory.data()}, {2, 0, kChunk, b.memory.data() + kChunk}};
  ReadAnswer r = b.agent->Read((*owners)[1][0].url, items, In(10s));
  ASSERT_TRUE(r.first_error.ok()) << r.first_error.ToString();
  EXPECT_EQ(r.completed_prefix, 2u);
  for (size_t i = 0; i < 2 * kChunk; i += 4099) ASSERT_EQ(b.memory[i], ByteOf(kChunk + i)) << i;
  EXPECT_EQ(a.served.load(), 2u);
  EXPECT_EQ(b.agent->stats().bytes_read, 2 * kChunk);

  // Withdrawn: no longer answered.
  a.agent->Withdraw({"chunk-1"});
  ASSERT_TRUE(a.agent->Flush().ok());
  owners = b.agent->Lookup({"chunk-1", "chunk-2"});
  ASSERT_TRUE(owners.ok());
  EXPECT_TRUE((*owners)[0].empty());
  EXPECT_EQ((*owners)[1].size(), 1u);
  EXPECT_EQ(a.agent->stats().updates_sent, 4u);
}

TEST_F(P2pAgentTest, ManyThreadsReadThroughOneAgent) {
  Node a(redis_, "node-a", 1, 4);
  Node b(redis_, "node-b", 2, 8);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        uint64_t object = (t + i) % 4;
        std::vector<ReadItem> items = {{object, 0, kChunk, b.memory.data() + t * kChunk}};
        ReadAnswer r = b.agent->Read(a.agent->self().url, items, In(10s));
        if (r.completed_prefix != 1 || b.memory[t * kChunk + 5] != ByteOf(object * kChunk + 5)) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(b.agent->stats().reads, 40u);
  EXPECT_EQ(b.agent->stats().read_failures, 0u);
}

TEST_F(P2pAgentTest, APeerThatIsGoneCostsOneFailedReadAndNoHang) {
  Node b(redis_, "node-b", 2, 1);
  ASSERT_TRUE(b.status.ok());
  std::string url;
  {
    Node a(redis_, "node-a", 1, 1);
    ASSERT_TRUE(a.status.ok());
    url = a.agent->self().url;
    a.agent->Publish({"k"});
    ASSERT_TRUE(a.agent->Flush().ok());
  }
  std::vector<ReadItem> items = {{0, 0, kChunk, b.memory.data()}};
  auto start = std::chrono::steady_clock::now();
  ReadAnswer r = b.agent->Read(url, items, In(3s));
  EXPECT_EQ(r.completed_prefix, 0u);
  EXPECT_EQ(r.first_error.code(), StatusCode::kUnavailable) << r.first_error.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(b.agent->stats().read_failures, 1u);
  // A's heartbeat expires (1 s TTL): the directory stops answering it, and its entry is removed.
  std::this_thread::sleep_for(1200ms);
  auto owners = b.agent->Lookup({"k"});
  ASSERT_TRUE(owners.ok());
  EXPECT_TRUE((*owners)[0].empty());
  // A malformed address is refused before anything moves.
  EXPECT_EQ(b.agent->Read("no-port", items, In(1s)).first_error.code(), StatusCode::kInvalidArgument);
}

TEST_F(P2pAgentTest, TheDirectoryDownNeverBlocksPublishAndItsUpdatesGoOutWhenItIsBack) {
  Node a(redis_, "node-a", 1, 1);
  Node b(redis_, "node-b", 2, 1);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  redis_.Kill();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) {
    std::string key = "k";
    key += std::to_string(i);
    a.agent->Publish({key});
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);  // only queued
  EXPECT_FALSE(a.agent->Flush().ok());
  EXPECT_GE(a.agent->stats().directory_failures, 1u);
  EXPECT_FALSE(b.agent->Lookup({"k1"}).ok());

  ASSERT_TRUE(redis_.Restart().ok());
  // The next flushes reconnect, heartbeat again (the node key died with the server's data)
  // and send the kept updates in order.
  for (int i = 0; i < 100; ++i) {
    if (a.agent->Flush().ok() && a.agent->stats().updates_sent == 100) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(a.agent->stats().updates_sent, 100u);
  std::this_thread::sleep_for(500ms);  // a heartbeat (every node_ttl / 3)
  auto owners = b.agent->Lookup({"k1", "k99"});
  ASSERT_TRUE(owners.ok()) << owners.status().ToString();
  EXPECT_EQ((*owners)[0].size(), 1u);
  EXPECT_EQ((*owners)[1].size(), 1u);
}

TEST_F(P2pAgentTest, BadOptionsAreRefused) {
  P2pAgent::Options o;
  o.directory.endpoint = redis_.endpoint();
  o.self = {"bad name with spaces", 1, ""};
  o.ucx.tls = "tcp";
  EXPECT_EQ(P2pAgent::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.self = {"ok", 1, ""};
  o.flush_interval_s = 0;
  EXPECT_EQ(P2pAgent::Start(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::p2p
