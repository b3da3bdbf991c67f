// KvEventLog (records, bindings, lmcache's read semantics) and KvEventStreams (credits,
// acks, cancel, one stream per instance, idle timeout, disabled log), with a fake send.
#include "server/kv_events.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "common/clock.h"
#include "l1/chunk_key.h"
#include "l1/namespaces.h"
#include "server/kv_event_streams.h"
#include "wire/codec.h"

namespace kvd::server {
namespace {

using Hash = KvEventLog::Hash;

Hash H(uint8_t b) {
  Hash h{};
  h.fill(b);
  return h;
}

// The namespace table the keys of these tests are interned in (an L1 cache's, in kvd).
l1::Namespaces& TestNamespaces() {
  static l1::Namespaces namespaces;
  return namespaces;
}

l1::ChunkKey Key(uint8_t b, const std::string& model = "m", const std::string& salt = "") {
  l1::ChunkKey k;
  k.ns = TestNamespaces().Intern(model, 1, salt).value();
  k.chunk_hash = H(b);
  return k;
}


void BindOne(KvEventLog& log, uint8_t b, std::optional<uint8_t> parent, std::vector<uint32_t> toks,
             const std::string& model = "m") {
  KvEventLog::Binding x{H(b), parent ? std::optional<Hash>(H(*parent)) : std::nullopt, toks};
  log.Bind(model, std::span<const KvEventLog::Binding>(&x, 1));
}

// Regression: bindings were keyed by chunk hash alone, so two models storing a chunk with
// the same hash shared one binding: the second model's chunk was announced with the first
// one's tokens, or not at all.
TEST(KvEventLog, BindingsOfTwoModelsWithTheSameChunkHashAreApart) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  BindOne(log, 1, std::nullopt, {10}, "model-a");
  BindOne(log, 1, std::nullopt, {20}, "model-b");
  log.OnEntryComplete(Key(1, "model-b"));
  log.OnEntryComplete(Key(1, "model-a"));
  auto a = log.Read("model-a", 0, 10);
  auto b = log.Read("model-b", 0, 10);
  ASSERT_EQ(a.events.size(), 1u);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(a.events[0].token_ids, std::vector<uint32_t>{10});
  EXPECT_EQ(b.events[0].token_ids, std::vector<uint32_t>{20});
  EXPECT_EQ(log.stats().unbound_stores, 0u);

  // A model that bound nothing does not take another model's binding.
  BindOne(log, 2, std::nullopt, {30}, "model-a");
  log.OnEntryComplete(Key(2, "model-c"));
  EXPECT_TRUE(log.Read("model-c", 0, 10).events.empty());
  EXPECT_EQ(log.stats().unbound_stores, 1u);
  log.OnEntryComplete(Key(2, "model-a"));
  ASSERT_EQ(log.Read("model-a", 2, 10).events.size(), 1u);  // after model a's first record
  EXPECT_EQ(log.Read("model-a", 2, 10).events[0].token_ids, std::vector<uint32_t>{30});

  // A child waits only for its own model's parent.
  BindOne(log, 3, std::nullopt, {40}, "model-a");  // parent 3 of model a, pending
  BindOne(log, 4, 3, {41}, "model-b");             // child of a hash 3 under model b
  log.OnEntryComplete(Key(4, "model-b"));
  EXPECT_EQ(log.stats().held, 0u) << "model b's parent 3 is not being stored";
  ASSERT_EQ(log.Read("model-b", 1, 10).events.size(), 1u);
}

TEST(KvEventLog, CompletedBoundChunkBecomesOneStoredRecord) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  BindOne(log, 1, std::nullopt, {10, 11});
  BindOne(log, 2, 1, {12, 13});
  log.OnEntryComplete(Key(1));
  log.OnEntryComplete(Key(2));
  log.OnEntryComplete(Key(3));  // never bound: counted, not announced
  auto b = log.Read("m", 0, 100);
  ASSERT_TRUE(b.enabled);
  ASSERT_EQ(b.events.size(), 2u);
  EXPECT_EQ(b.events[0].seq, 1);
  EXPECT_EQ(b.events[0].kind, "stored");
  EXPECT_EQ(b.events[0].block_hashes, std::vector<Hash>{H(1)});
  EXPECT_FALSE(b.events[0].parent_block_hash.has_value());
  EXPECT_EQ(b.events[0].token_ids, (std::vector<uint32_t>{10, 11}));
  EXPECT_EQ(b.events[1].parent_block_hash, H(1));
  EXPECT_EQ(b.next_cursor, 2);
  EXPECT_FALSE(b.lost);
  EXPECT_EQ(log.stats().unbound_stores, 1u);
  EXPECT_EQ(log.stats().bindings, 0u) << "a binding is used once";
}

// Regression: the store paths commit a request's chunks last first, and the records came out
// child before parent; lmcache writes a parent's record first.
TEST(KvEventLog, ChunksCommittedLastFirstAreRecordedParentFirst) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  BindOne(log, 1, std::nullopt, {1});
  BindOne(log, 2, 1, {2});
  BindOne(log, 3, 2, {3});
  log.OnEntryComplete(Key(3));
  log.OnEntryComplete(Key(2));
  EXPECT_TRUE(log.Read("m", 0, 10).events.empty()) << "held until the parent's record";
  EXPECT_EQ(log.stats().held, 2u);
  log.OnEntryComplete(Key(1));
  auto b = log.Read("m", 0, 10);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].block_hashes, std::vector<Hash>{H(1)});
  EXPECT_EQ(b.events[1].block_hashes, std::vector<Hash>{H(2)});
  EXPECT_EQ(b.events[2].block_hashes, std::vector<Hash>{H(3)});
  EXPECT_EQ(b.events[2].seq, 3);
  EXPECT_EQ(log.stats().held, 0u);
}

TEST(KvEventLog, ChildOfAParentThatNeverCompletesIsWrittenAfterTheHoldTime) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  BindOne(log, 1, std::nullopt, {1});  // its store fails: never completes
  BindOne(log, 2, 1, {2});
  BindOne(log, 3, 2, {3});
  log.OnEntryComplete(Key(3));
  log.OnEntryComplete(Key(2));
  log.FlushHeld();
  EXPECT_TRUE(log.Read("m", 0, 10).events.empty()) << "not yet due";
  log_clock.AdvanceNanos(KvEventLog::kMaxHoldNanos);
  log.FlushHeld();
  auto b = log.Read("m", 0, 10);
  ASSERT_EQ(b.events.size(), 2u);
  EXPECT_EQ(b.events[0].block_hashes, std::vector<Hash>{H(2)});
  EXPECT_EQ(b.events[1].block_hashes, std::vector<Hash>{H(3)});
  EXPECT_EQ(log.stats().held, 0u);
}

TEST(KvEventLog, RemovedRecordsAreGroupedByModelWithoutRepeats) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  std::vector<l1::ChunkKey> keys = {Key(1, "a"), Key(2, "b"), Key(1, "a", "salt"), Key(3, "a@ns")};
  log.OnEntriesRemoved(keys, l1::RemovalCause::kEvicted);
  auto a = log.Read("a", 0, 10);
  ASSERT_EQ(a.events.size(), 1u);
  EXPECT_EQ(a.events[0].kind, "removed");
  EXPECT_EQ(a.events[0].block_hashes, (std::vector<Hash>{H(1), H(3)}));
  auto b = log.Read("b", 0, 10);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].block_hashes, std::vector<Hash>{H(2)});
  EXPECT_EQ(a.next_cursor, 2) << "the cursor moves past other models' records too";
  EXPECT_EQ(a.events[0].model_name, "a") << "a key namespace is not part of the model name";
}

TEST(KvEventLog, ReadFollowsLmcachesCursorAndLossRules) {
  FakeClock log_clock;
  KvEventLog log(3, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  for (uint8_t i = 1; i <= 5; ++i) {
    BindOne(log, i, std::nullopt, {i});
    log.OnEntryComplete(Key(i));
  }  // seqs 1..5, the log keeps 3..5
  auto from0 = log.Read("m", 0, 10);
  EXPECT_TRUE(from0.lost);
  ASSERT_EQ(from0.events.size(), 3u);
  EXPECT_EQ(from0.events[0].seq, 3);
  auto from3 = log.Read("m", 3, 10);
  EXPECT_FALSE(from3.lost);
  ASSERT_EQ(from3.events.size(), 2u);
  EXPECT_EQ(from3.events[0].seq, 4);
  auto paged = log.Read("m", 2, 1);
  ASSERT_EQ(paged.events.size(), 1u);
  EXPECT_EQ(paged.next_cursor, 3);
  auto future = log.Read("m", 9, 10);
  EXPECT_TRUE(future.lost) << "a cursor from another incarnation";
  EXPECT_EQ(future.next_cursor, 5);
  EXPECT_TRUE(future.events.empty());
  auto caught_up = log.Read("m", 5, 10);
  EXPECT_FALSE(caught_up.lost);
  EXPECT_TRUE(caught_up.events.empty());
  EXPECT_EQ(caught_up.next_cursor, 5);
}

// A client's cursor is any int64 >= 0; the largest must not overflow the log's arithmetic
// (signed overflow: UBSan stops this test in make test-asan).
TEST(KvEventLog, CursorAtInt64MaxIsAFutureCursorWithoutOverflow) {
  FakeClock log_clock;
  KvEventLog log(3, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  BindOne(log, 1, std::nullopt, {1});
  log.OnEntryComplete(Key(1));
  auto b = log.Read("m", std::numeric_limits<int64_t>::max(), 10);
  EXPECT_TRUE(b.lost);
  EXPECT_TRUE(b.events.empty());
  EXPECT_EQ(b.next_cursor, 1);
}

TEST(KvEventLog, BindingsAreBounded) {
  FakeClock log_clock;
  KvEventLog log(4, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  for (size_t i = 0; i < KvEventLog::kMaxBindings + 10; ++i) {
    Hash h{};
    std::memcpy(h.data(), &i, sizeof(i));
    std::vector<uint32_t> t = {1};
    KvEventLog::Binding b{h, std::nullopt, t};
    log.Bind("m", std::span<const KvEventLog::Binding>(&b, 1));
  }
  EXPECT_LE(log.stats().bindings, KvEventLog::kMaxBindings);
}

TEST(KvEventLog, WakeupRunsAfterEachAppend) {
  FakeClock log_clock;
  KvEventLog log(4, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  int woken = 0;
  log.SetWakeup([&] { ++woken; });
  BindOne(log, 1, std::nullopt, {1});
  log.OnEntryComplete(Key(1));
  std::vector<l1::ChunkKey> gone = {Key(1)};
  log.OnEntriesRemoved(gone, l1::RemovalCause::kCleared);
  EXPECT_EQ(woken, 2);
}

// Regression: at shutdown the ZMQ loop cleared the wake-up and closed its eventfd while
// another thread (an eviction, a tier, an HTTP clear) was still inside the callback it had
// copied, which then wrote to the closed descriptor. SetWakeup now returns only once the old
// callback has finished.
TEST(KvEventLog, WakeupIsNeverRunningAfterSetWakeupReturns) {
  FakeClock log_clock;
  KvEventLog log(4, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  std::atomic<bool> entered{false}, released{false}, ran_after_release{false};
  log.SetWakeup([&] {
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (released) ran_after_release = true;  // the fd would be closed by now
  });
  BindOne(log, 1, std::nullopt, {1});
  std::thread appender([&] { log.OnEntryComplete(Key(1)); });
  while (!entered) std::this_thread::yield();
  log.SetWakeup(nullptr);
  released = true;  // the owner closes what the callback used
  appender.join();
  EXPECT_FALSE(ran_after_release);
  std::vector<l1::ChunkKey> gone = {Key(1)};
  log.OnEntriesRemoved(gone, l1::RemovalCause::kCleared);  // no callback now: nothing runs
  EXPECT_FALSE(ran_after_release);
}

// ---- streams ------------------------------------------------------------------------

struct Sent {
  std::vector<std::vector<std::string>> frames;
  KvEventStreams::Send fn() {
    return [this](std::vector<std::string> f) { frames.push_back(std::move(f)); };
  }
};

wire::KvEventBatch Decode(const std::string& bytes) {
  auto oh = msgpack::unpack(bytes.data(), bytes.size());
  auto m = oh.get().as<std::map<std::string, msgpack::object>>();
  wire::KvEventBatch b;
  b.enabled = m.at("enabled").as<bool>();
  b.incarnation = m.at("incarnation").as<int64_t>();
  b.next_cursor = m.at("next_cursor").as<int64_t>();
  b.lost = m.at("lost").as<bool>();
  for (const auto& e : m.at("events").as<std::vector<msgpack::object>>()) {
    auto em = e.as<std::map<std::string, msgpack::object>>();
    wire::KvEventRecord r;
    r.seq = em.at("seq").as<int64_t>();
    r.kind = em.at("kind").as<std::string>();
    r.token_ids = em.at("token_ids").as<std::vector<uint32_t>>();
    b.events.push_back(r);
  }
  return b;
}

std::vector<std::string> Sub(int64_t instance, const std::string& model, int64_t cursor,
                             int64_t max_events) {
  return {wire::EncodeInt(instance), wire::EncodeStr(model), wire::EncodeInt(cursor),
          wire::EncodeInt(max_events)};
}

void Subscribe(KvEventStreams& s, const std::string& id, const std::string& uid,
               const std::vector<std::string>& p) {
  std::vector<std::string_view> v(p.begin(), p.end());
  s.Subscribe(id, uid, "op", v);
}

TEST(KvEventStreams, FirstBatchAtOnceThenOnePerAck) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  FakeClock clock;
  Sent sent;
  KvEventStreams streams(&log, &clock, 120, sent.fn());
  Subscribe(streams, "conn", "u1", Sub(1, "m", 0, 10));
  ASSERT_EQ(sent.frames.size(), 1u);
  ASSERT_EQ(sent.frames[0].size(), 4u);
  EXPECT_EQ(sent.frames[0][0], "conn");
  EXPECT_EQ(sent.frames[0][1], "u1");
  EXPECT_EQ(sent.frames[0][2], "op");
  EXPECT_TRUE(Decode(sent.frames[0][3]).enabled);
  BindOne(log, 1, std::nullopt, {5});
  log.OnEntryComplete(Key(1));
  streams.Pump();
  EXPECT_EQ(sent.frames.size(), 1u) << "no credit: nothing sent";
  streams.Control("conn", "u1", "ack");
  ASSERT_EQ(sent.frames.size(), 2u);
  auto b = Decode(sent.frames[1][3]);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].token_ids, std::vector<uint32_t>{5});
  streams.Control("conn", "u1", "ack");
  streams.Pump();
  EXPECT_EQ(sent.frames.size(), 2u) << "credit but nothing new: nothing sent";
  BindOne(log, 2, 1, {6}, "other-model");
  log.OnEntryComplete(Key(2, "other-model"));
  streams.Pump();
  EXPECT_EQ(sent.frames.size(), 2u) << "another model's record is not this stream's";
  BindOne(log, 3, 1, {7});
  log.OnEntryComplete(Key(3));
  streams.Pump();
  ASSERT_EQ(sent.frames.size(), 3u);
  EXPECT_EQ(Decode(sent.frames[2][3]).events[0].seq, 3);
}

TEST(KvEventStreams, CancelNewSubscriptionIdleAndShutdownEndStreams) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  FakeClock clock;
  Sent sent;
  KvEventStreams streams(&log, &clock, 120, sent.fn());
  Subscribe(streams, "c1", "u1", Sub(1, "m", 0, 10));
  streams.Control("c1", "u1", "cancel");
  ASSERT_EQ(sent.frames.back(), (std::vector<std::string>{"c1", "u1", "op"})) << "end frame";
  EXPECT_EQ(streams.size(), 0u);

  Subscribe(streams, "c1", "u2", Sub(1, "m", 0, 10));
  Subscribe(streams, "c1", "u3", Sub(1, "m", 0, 10));  // the same instance, same connection
  EXPECT_EQ(streams.size(), 1u);
  bool ended_old = false;
  for (const auto& f : sent.frames) ended_old |= f == std::vector<std::string>{"c1", "u2", "op"};
  EXPECT_TRUE(ended_old);

  Subscribe(streams, "c3", "u4", Sub(2, "m", 0, 10));
  clock.AdvanceSeconds(100);
  streams.Touch("c3");  // c3 pings; c1 is silent
  clock.AdvanceSeconds(30);
  streams.Pump();
  EXPECT_EQ(streams.size(), 1u) << "the silent connection's stream ends";
  streams.CloseAll();
  EXPECT_EQ(streams.size(), 0u);
  EXPECT_EQ(sent.frames.back(), (std::vector<std::string>{"c3", "u4", "op"}));
}

// Issue 27, finding 9: a subscriber that names another subscriber's instance id must not end
// the victim's stream (streams belong to the connection that opened them).
TEST(KvEventStreams, Finding9AnotherConnectionCannotEndAStream) {
  FakeClock log_clock;
  KvEventLog log(16, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  FakeClock clock;
  Sent sent;
  KvEventStreams streams(&log, &clock, 120, sent.fn());
  Subscribe(streams, "victim", "u1", Sub(7, "m", 0, 10));
  Subscribe(streams, "attacker", "u9", Sub(7, "m", 0, 10));
  EXPECT_EQ(streams.size(), 2u);
  for (const auto& f : sent.frames) {
    EXPECT_NE(f, (std::vector<std::string>{"victim", "u1", "op"})) << "the victim's stream was ended";
  }
  EXPECT_FALSE(streams.Control("attacker", "u1", "cancel")) << "a cancel from another connection";
  EXPECT_EQ(streams.size(), 2u);
  // The victim's stream still delivers.
  streams.Control("victim", "u1", "ack");
  BindOne(log, 1, std::nullopt, {5});
  log.OnEntryComplete(Key(1));
  streams.Pump();
  bool victim_got_record = false;
  for (const auto& f : sent.frames) {
    if (f.size() == 4 && f[0] == "victim" && !Decode(f[3]).events.empty()) victim_got_record = true;
  }
  EXPECT_TRUE(victim_got_record);
}

TEST(KvEventStreams, BadSubscriptionsAndDisabledLogEndTheStream) {
  FakeClock clock;
  Sent sent;
  FakeClock log_clock;
  KvEventLog log(4, &log_clock);
  log.AttachNamespaces(&TestNamespaces());
  KvEventStreams streams(&log, &clock, 0, sent.fn());
  Subscribe(streams, "c", "u", Sub(1, "m", -1, 10));
  Subscribe(streams, "c", "v", Sub(1, "m", 0, 5000));
  std::vector<std::string> garbage = {"\xc1"};
  Subscribe(streams, "c", "w", garbage);
  ASSERT_EQ(sent.frames.size(), 3u);
  for (const auto& f : sent.frames) EXPECT_EQ(f.size(), 3u) << "an end frame, no batch";
  EXPECT_EQ(streams.size(), 0u);

  Sent off_sent;
  KvEventStreams off(nullptr, &clock, 0, off_sent.fn());
  Subscribe(off, "c", "u", Sub(1, "m", 0, 10));
  ASSERT_EQ(off_sent.frames.size(), 1u);
  EXPECT_FALSE(Decode(off_sent.frames[0][3]).enabled);
  off.Control("c", "u", "ack");
  ASSERT_EQ(off_sent.frames.size(), 2u);
  EXPECT_EQ(off_sent.frames[1].size(), 3u) << "then the stream ends";
  EXPECT_EQ(off.size(), 0u);
}

}  // namespace
}  // namespace kvd::server
