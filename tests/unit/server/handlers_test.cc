// The op table (server/handlers.cc): a request whose payload does not decode gets exactly the
// op's failure reply — what FailureReply answers for a request refused before it runs — for
// every op kvd serves, with blend on and off; ops kvd does not serve answer nil; the socket
// rules name the ops the socket loop treats specially.
#include "server/handlers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/clock.h"
#include "server/kv_service.h"
#include "wire/ops.h"

namespace kvd::server {
namespace {

using wire::Op;

std::unique_ptr<KvService> Service(const std::string& engine_type, FakeClock* clock) {
  ServerConfig cfg;
  cfg.l1_size_gb = 16.0 / 1024;
  cfg.eviction_policy = "LRU";
  cfg.engine_type = engine_type;
  cfg.shm_name = "kvd_test_handlers_" + engine_type + "_" + std::to_string(getpid());
  auto s = KvService::Create(cfg, clock);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// min_payloads frames of 0xc1, a byte msgpack never uses: no decoder accepts it.
std::vector<std::string_view> Garbage(const wire::OpInfo& op) {
  static const std::string kNeverUsed("\xc1", 1);
  return std::vector<std::string_view>(op.min_payloads, kNeverUsed);
}

void ExpectUndecodableGetsFailureReply(KvService& svc, const wire::OpInfo& op) {
  const auto payloads = Garbage(op);
  EXPECT_EQ(HandleRequest(svc, op, payloads, "client"), FailureReply(svc, op)) << op.name;
}

TEST(HandlersTest, AnUndecodableRequestGetsItsOpsFailureReply) {
  for (const std::string engine : {"default", "blend"}) {
    FakeClock clock;
    auto svc = Service(engine, &clock);
    ASSERT_NE(svc, nullptr);
    int checked = 0;
    for (const wire::OpInfo& op : wire::Lmcache056Ops()) {
      if (op.min_payloads == 0 || op.op == Op::kSubscribeKvEvents) continue;  // nothing to garble
      ExpectUndecodableGetsFailureReply(*svc, op);
      ++checked;
    }
    EXPECT_GE(checked, 25) << engine;
  }
}

TEST(HandlersTest, FailureRepliesFollowTheOpAndTheEngine) {
  FakeClock clock;
  auto plain = Service("default", &clock);
  auto blend = Service("blend", &clock);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(blend, nullptr);
  const auto& store = wire::InfoOf(Op::kStore);
  EXPECT_EQ(FailureReply(*plain, store), wire::EncodeHandleAndOk("", false));
  EXPECT_EQ(FailureReply(*plain, wire::InfoOf(Op::kGetChunkSize)), wire::EncodeInt(plain->chunk_size()));
  EXPECT_EQ(FailureReply(*plain, wire::InfoOf(Op::kCommitStore)), wire::EncodeBool(false));
  EXPECT_EQ(FailureReply(*plain, wire::InfoOf(Op::kLookup)), wire::EncodeNil());
  // A blend op's failure reply exists only where blend is served.
  const auto& unified = wire::InfoOf(Op::kCbUnifiedLookup);
  EXPECT_EQ(FailureReply(*plain, unified), wire::EncodeNil());
  EXPECT_EQ(FailureReply(*blend, unified), wire::EncodeCbUnifiedLookupResult({}));
}

TEST(HandlersTest, OpsKvdDoesNotServeAnswerNil) {
  FakeClock clock;
  auto plain = Service("default", &clock);
  ASSERT_NE(plain, nullptr);
  for (Op op : {Op::kRegisterQCache, Op::kP2pLookupAndLock, Op::kServerModuleCall,
                Op::kCbUnifiedLookup, Op::kCbProtocolHandshake}) {
    const auto& info = wire::InfoOf(op);
    const std::vector<std::string_view> none(info.min_payloads, "");
    EXPECT_EQ(HandleRequest(*plain, info, none, "client"), wire::EncodeNil()) << info.name;
  }
}

TEST(HandlersTest, SocketRules) {
  EXPECT_EQ(SocketRuleOf(Op::kSubscribeKvEvents), SocketRule::kStream);
  EXPECT_EQ(SocketRuleOf(Op::kWaitPrefetchStatus), SocketRule::kParkWhilePrefetching);
  EXPECT_EQ(SocketRuleOf(Op::kLookup), SocketRule::kPoolWhileCommitsPending);
  EXPECT_EQ(SocketRuleOf(Op::kCbRegisterRope), SocketRule::kLaneWhenBlend);
  EXPECT_EQ(SocketRuleOf(Op::kCbUnregisterRope), SocketRule::kLaneWhenBlend);
  EXPECT_EQ(SocketRuleOf(Op::kStore), SocketRule::kAsDispatched);
}

}  // namespace
}  // namespace kvd::server
