// HoldLedger (issue 27, finding 2): what engine-driven PREPAREs hold of L1 is bounded per
// instance and in total; old holds are shed (own first), young ones never; stores get the
// prefix that fits, retrieves all or nothing.
#include "server/engine_driven_holds.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvd::server {
namespace {

constexpr int64_t kSec = 1'000'000'000;

HoldLedger::Limits Limits(uint64_t total, uint64_t instance, size_t ops = 4096,
                          int64_t shed_age = 5 * kSec) {
  HoldLedger::Limits l;
  l.total_bytes = total;
  l.instance_bytes = instance;
  l.instance_ops = ops;
  l.shed_age_ns = shed_age;
  return l;
}

std::vector<uint64_t> Sizes(size_t n, uint64_t each = 10) { return std::vector<uint64_t>(n, each); }

TEST(HoldLedgerTest, Finding2AnInstanceNeverHoldsMoreThanItsShare) {
  HoldLedger ledger(Limits(100, 30));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(ledger.Admit(1, Sizes(1), 1, 0, 0, "r" + std::to_string(i)).admitted);
  }
  auto a = ledger.Admit(1, Sizes(1), 1, 0, 0, "r3");  // young holds: refused, nothing shed
  EXPECT_FALSE(a.admitted);
  EXPECT_TRUE(a.shed.empty());
  EXPECT_NE(a.refusal.find("instance 1 holds 30 of its 30 bytes"), std::string::npos) << a.refusal;
  EXPECT_EQ(ledger.held_bytes(1), 30u);
  // Another instance is not affected.
  EXPECT_TRUE(ledger.Admit(2, Sizes(3), 3, 0, 0, "b").admitted);
  EXPECT_EQ(ledger.held_bytes(), 60u);
}

TEST(HoldLedgerTest, Finding2OldHoldsOfTheSameInstanceAreShedOldestFirst) {
  HoldLedger ledger(Limits(100, 30));
  ASSERT_TRUE(ledger.Admit(1, Sizes(1), 1, 0, 0, "a").admitted);
  ASSERT_TRUE(ledger.Admit(1, Sizes(1), 1, 1 * kSec, 0, "b").admitted);
  ASSERT_TRUE(ledger.Admit(1, Sizes(1), 1, 2 * kSec, 1, "c").admitted);
  ASSERT_TRUE(ledger.Admit(2, Sizes(1), 1, 0, 0, "other").admitted);
  auto a = ledger.Admit(1, Sizes(2), 2, 6 * kSec + 1, 1, "d");  // a, b are >= 5 s old
  ASSERT_TRUE(a.admitted);
  ASSERT_EQ(a.shed.size(), 2u);
  EXPECT_EQ(a.shed[0].name, "a");
  EXPECT_EQ(a.shed[1].name, "b");
  EXPECT_EQ(a.shed[1].instance, 1);
  EXPECT_EQ(ledger.held_bytes(1), 30u);
  EXPECT_EQ(ledger.held_bytes(2), 10u);  // the other instance's old hold stays
}

TEST(HoldLedgerTest, Finding2TheTotalShedsTheOldestOfAnyone) {
  HoldLedger ledger(Limits(40, 30));
  ASSERT_TRUE(ledger.Admit(1, Sizes(3), 1, 0, 0, "hog").admitted);         // 30, old
  ASSERT_TRUE(ledger.Admit(2, Sizes(1), 1, 9 * kSec, 0, "young").admitted);  // 10, young
  auto a = ledger.Admit(3, Sizes(2), 1, 10 * kSec, 0, "new");
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(a.items, 2u);
  ASSERT_EQ(a.shed.size(), 1u);
  EXPECT_EQ(a.shed[0].name, "hog");
  EXPECT_EQ(ledger.held_bytes(), 30u);
}

TEST(HoldLedgerTest, Finding2StoresGetThePrefixThatFitsRetrievesAllOrNothing) {
  HoldLedger ledger(Limits(100, 30));
  auto store = ledger.Admit(1, Sizes(5), 1, 0, 0, "s");
  ASSERT_TRUE(store.admitted);
  EXPECT_EQ(store.items, 3u);
  EXPECT_EQ(ledger.held_bytes(1), 30u);
  EXPECT_FALSE(ledger.Admit(2, Sizes(4), 4, 0, 1, "r").admitted);  // 40 > 30: never fits
  EXPECT_TRUE(ledger.Admit(2, Sizes(3), 3, 0, 1, "r").admitted);
  // Nothing may be shed (young) and only part fits: the store gets that part.
  HoldLedger l2(Limits(100, 30));
  ASSERT_TRUE(l2.Admit(1, Sizes(2), 1, 0, 0, "a").admitted);
  auto part = l2.Admit(1, Sizes(3), 1, 1, 0, "b");
  ASSERT_TRUE(part.admitted);
  EXPECT_EQ(part.items, 1u);
  EXPECT_TRUE(part.shed.empty());
}

TEST(HoldLedgerTest, Finding2OperationsPerInstanceAreBoundedEvenWithoutBytes) {
  HoldLedger ledger(Limits(100, 30, /*ops=*/2, /*shed_age=*/kSec));
  EXPECT_TRUE(ledger.Admit(1, {}, 0, 0, 1, "a").admitted);
  EXPECT_TRUE(ledger.Admit(1, {}, 0, 0, 1, "b").admitted);
  EXPECT_FALSE(ledger.Admit(1, {}, 0, 0, 1, "c").admitted);
  auto a = ledger.Admit(1, {}, 0, 2 * kSec, 1, "c");
  ASSERT_TRUE(a.admitted);
  ASSERT_EQ(a.shed.size(), 1u);
  EXPECT_EQ(a.shed[0].name, "a");
  EXPECT_EQ(ledger.held_ops(), 2u);
}

TEST(HoldLedgerTest, RemoveAndRemoveInstanceGiveTheBytesBack) {
  HoldLedger ledger(Limits(100, 50));
  auto a = ledger.Admit(1, Sizes(2), 1, 0, 0, "a");
  ASSERT_TRUE(ledger.Admit(1, Sizes(1), 1, 0, 1, "b").admitted);
  ASSERT_TRUE(ledger.Admit(2, Sizes(1), 1, 0, 1, "c").admitted);
  EXPECT_TRUE(ledger.Remove(a.id));
  EXPECT_FALSE(ledger.Remove(a.id));
  EXPECT_EQ(ledger.held_bytes(1), 10u);
  auto gone = ledger.RemoveInstance(1);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].name, "b");
  EXPECT_EQ(ledger.held_bytes(), 10u);
  EXPECT_EQ(ledger.held_ops(), 1u);
}

}  // namespace
}  // namespace kvd::server
