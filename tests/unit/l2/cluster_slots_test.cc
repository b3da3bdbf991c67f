// Slot routing pieces: CRC16 and hash tags against values Redis documents and computes.
#include <gtest/gtest.h>

#include "l2/cluster_slots.h"

namespace kvd::l2 {
namespace {

TEST(ClusterSlotsTest, Crc16IsXmodem) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);  // the check value of CRC-16/XMODEM
}

TEST(ClusterSlotsTest, KeySlotsMatchRedis) {
  // Values from `redis-cli CLUSTER KEYSLOT <key>`.
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("bar"), 5061);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  EXPECT_EQ(KeySlot("{}x"), Crc16("{}x") & 16383);  // empty tag: the whole key
  EXPECT_EQ(KeySlot("a{b}c{d}"), KeySlot("b"));
}

TEST(ClusterSlotsTest, RedirectsParse) {
  RespEndpoint asked{"127.0.0.1", 7000};
  auto m = ParseRedirect("MOVED 3999 127.0.0.1:6381", asked);
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->ask);
  EXPECT_EQ(m->slot, 3999);
  EXPECT_EQ(m->to, (RespEndpoint{"127.0.0.1", 6381}));
  auto a = ParseRedirect("ASK 12 :7002", asked);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->ask);
  EXPECT_EQ(a->to, (RespEndpoint{"127.0.0.1", 7002}));
  EXPECT_FALSE(ParseRedirect("ERR wrong", asked).has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 99999 h:1", asked).has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 1 h:0", asked).has_value());
}

TEST(ClusterSlotsTest, AssignAddsMasters) {
  SlotMap m;
  EXPECT_EQ(m.uncovered(), kClusterSlots);
  m.Assign(5, {"h", 1});
  m.Assign(6, {"h", 1});
  m.Assign(7, {"g", 2});
  EXPECT_EQ(m.masters.size(), 2u);
  EXPECT_EQ(*m.MasterOf(6), (RespEndpoint{"h", 1}));
  EXPECT_EQ(m.MasterOf(8), nullptr);
}

}  // namespace
}  // namespace kvd::l2
