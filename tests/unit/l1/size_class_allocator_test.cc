// SizeClassAllocator: classes, free-list reuse, frontier, bitmap search for mixed sizes, the
// neighbour queries eviction relies on, bad frees, and sparse metadata for huge pools.
#include "l1/size_class_allocator.h"

#include <set>

#include <gtest/gtest.h>

namespace kvd::l1 {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint32_t kOwner = 7;

std::unique_ptr<SizeClassAllocator> Make(uint64_t pages, uint64_t align = kPage) {
  auto a = SizeClassAllocator::Create(pages * kPage, align);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(a).value() : nullptr;
}

TEST(SizeClassAllocatorTest, ClassesAreExactSizesRoundedToUnits) {
  auto a = Make(16);
  auto c1 = a->ClassFor(5000);
  auto c2 = a->ClassFor(4096);
  auto c1b = a->ClassFor(5000);
  ASSERT_TRUE(c1.ok() && c2.ok() && c1b.ok());
  EXPECT_EQ(*c1, *c1b);
  EXPECT_NE(*c1, *c2);
  EXPECT_EQ(a->ClassBytes(*c1), 5000u);
  EXPECT_EQ(a->ClassUnits(*c1), 2u);
  EXPECT_EQ(a->ClassUnits(*c2), 1u);
  EXPECT_EQ(a->ClassFor(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->ClassFor(16 * kPage + 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(a->ClassFor(16 * kPage).ok());
}

TEST(SizeClassAllocatorTest, CreateRejectsBadGeometry) {
  EXPECT_EQ(SizeClassAllocator::Create(16 * kPage, 3000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SizeClassAllocator::Create(100, kPage).status().code(), StatusCode::kInvalidArgument);
  // 2^32 units of 1 byte: too many for 32-bit unit numbers.
  EXPECT_EQ(SizeClassAllocator::Create(uint64_t{1} << 32, 1).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SizeClassAllocatorTest, FrontierThenExactReuseOfFreedRanges) {
  auto a = Make(8);
  const uint16_t c = *a->ClassFor(2 * kPage);
  std::vector<uint32_t> got;
  for (int i = 0; i < 4; ++i) {
    auto u = a->Allocate(c, kOwner);
    ASSERT_TRUE(u);
    got.push_back(*u);
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 2, 4, 6}));
  EXPECT_FALSE(a->Allocate(c, kOwner));
  EXPECT_EQ(a->used_bytes(), 8 * kPage);
  a->Free(4, c);
  EXPECT_EQ(a->used_bytes(), 6 * kPage);
  EXPECT_EQ(a->Allocate(c, kOwner), 4u);  // the freed range, whole
  EXPECT_EQ(a->OwnerAt(4), kOwner);
  EXPECT_EQ(a->live_allocations(), 4u);
}

TEST(SizeClassAllocatorTest, MixedSizesFindAFreeRunInTheBitmap) {
  auto a = Make(8);
  const uint16_t one = *a->ClassFor(kPage);
  const uint16_t three = *a->ClassFor(3 * kPage);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(a->Allocate(one, i));
  for (uint32_t u : {2u, 3u, 4u}) a->Free(u, one);
  EXPECT_EQ(a->Allocate(three, 99), 2u);  // no 3-unit free list yet: the run 2..4 is found
  EXPECT_FALSE(a->Allocate(one, kOwner));
  // A stale free-list entry (unit 3 is inside the new allocation) is never handed out.
  a->Free(0, one);
  EXPECT_EQ(a->Allocate(one, kOwner), 0u);
  EXPECT_FALSE(a->Allocate(one, kOwner));
}

TEST(SizeClassAllocatorTest, SearchNeverRunsPastTheLastUnit) {
  // 48 units: the last bitmap word is partly beyond the pool.
  auto a = Make(48);
  const uint16_t one = *a->ClassFor(kPage);
  const uint16_t four = *a->ClassFor(4 * kPage);
  for (int i = 0; i < 48; ++i) ASSERT_TRUE(a->Allocate(one, i));
  a->Free(46, one);
  a->Free(47, one);
  EXPECT_FALSE(a->Allocate(four, 1));  // two free units at the end are not four
  for (uint32_t u = 40; u < 44; ++u) a->Free(u, one);
  EXPECT_EQ(a->Allocate(four, 1), 40u);
}

TEST(SizeClassAllocatorTest, NeighboursOfAFreeRunNameTheBorderingOwners) {
  auto a = Make(8);
  const uint16_t one = *a->ClassFor(kPage);
  const uint16_t two = *a->ClassFor(2 * kPage);
  ASSERT_EQ(a->Allocate(two, 10), 0u);  // units 0-1
  ASSERT_EQ(a->Allocate(one, 11), 2u);
  ASSERT_EQ(a->Allocate(one, 12), 3u);
  ASSERT_EQ(a->Allocate(two, 13), 4u);  // units 4-5
  a->Free(2, one);
  a->Free(3, one);
  auto nb = a->NeighboursOf(2);
  EXPECT_EQ(nb.run_units, 2u);
  EXPECT_EQ(nb.before.owner, 10u);
  EXPECT_EQ(nb.before.unit, 0u);
  EXPECT_EQ(nb.after.owner, 13u);
  EXPECT_EQ(nb.after.unit, 4u);
  // A 3-unit object does not fit the 2-unit run until a neighbour goes.
  const uint16_t three = *a->ClassFor(3 * kPage);
  EXPECT_FALSE(a->AllocateAround(three, 3, 20));
  a->Free(4, two);
  EXPECT_EQ(a->AllocateAround(three, 3, 20), 2u);
  // At the frontier there is no "after" neighbour; at unit 0 no "before".
  EXPECT_EQ(a->NeighboursOf(7).after.owner, SizeClassAllocator::kNoOwner);
  a->Free(0, two);
  EXPECT_EQ(a->NeighboursOf(0).before.owner, SizeClassAllocator::kNoOwner);
  EXPECT_EQ(a->NeighboursOf(0).after.owner, 20u);
  // Asking about a unit in use answers "no run".
  EXPECT_EQ(a->NeighboursOf(3).run_units, 0u);
}

TEST(SizeClassAllocatorTest, BadFreesAreIgnored) {
  auto a = Make(4);
  const uint16_t two = *a->ClassFor(2 * kPage);
  ASSERT_EQ(a->Allocate(two, kOwner), 0u);
  a->Free(1, two);  // not the start of an allocation
  a->Free(9, two);  // beyond the pool
  EXPECT_EQ(a->used_bytes(), 2 * kPage);
  a->Free(0, two);
  a->Free(0, two);  // double free
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(a->live_allocations(), 0u);
}

TEST(SizeClassAllocatorTest, ResetIfIdleRestartsFromTheFirstUnit) {
  auto a = Make(4);
  const uint16_t one = *a->ClassFor(kPage);
  ASSERT_EQ(a->Allocate(one, 1), 0u);
  ASSERT_EQ(a->Allocate(one, 2), 1u);
  EXPECT_FALSE(a->ResetIfIdle());  // live allocations
  a->Free(0, one);
  a->Free(1, one);
  EXPECT_TRUE(a->ResetIfIdle());
  EXPECT_EQ(a->frontier_bytes(), 0u);
  EXPECT_EQ(a->Allocate(one, 3), 0u);
}

TEST(SizeClassAllocatorTest, SmallAlignmentPacksObjects) {
  auto a = SizeClassAllocator::Create(1 << 20, 256);
  ASSERT_TRUE(a.ok());
  const uint16_t c = *(*a)->ClassFor(300);  // 2 units of 256
  std::set<uint32_t> units;
  for (int i = 0; i < 100; ++i) {
    auto u = (*a)->Allocate(c, kOwner);
    ASSERT_TRUE(u);
    EXPECT_TRUE(units.insert(*u).second);
  }
  EXPECT_EQ((*a)->used_bytes(), 100u * 512);
}

TEST(SizeClassAllocatorTest, HugePoolMetadataIsSparse) {
  // 1 TiB in 4 KiB units: 256M units, whose metadata would be over 1 GiB if touched.
  auto a = SizeClassAllocator::Create(uint64_t{1} << 40, kPage);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const uint16_t c = *(*a)->ClassFor(kPage);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE((*a)->Allocate(c, i));
  EXPECT_EQ((*a)->used_bytes(), 1000 * kPage);
}

std::unique_ptr<SizeClassAllocator> MakeLazy(uint64_t pages, uint64_t initial_pages,
                                             uint64_t step_pages, uint64_t align = kPage) {
  auto a = SizeClassAllocator::Create(pages * kPage, align, initial_pages * kPage,
                                      step_pages * kPage);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(a).value() : nullptr;
}

TEST(SizeClassAllocatorLazyTest, GrowsFromTheInitialSizeByStepsUpToTheTotal) {
  // 16 pages, 4 committed at first, growing 4 at a time.
  auto a = MakeLazy(16, 4, 4);
  EXPECT_EQ(a->committed_bytes(), 4 * kPage);
  EXPECT_EQ(a->capacity_bytes(), 16 * kPage);
  const uint16_t c = *a->ClassFor(kPage);
  for (uint32_t i = 0; i < 16; ++i) {
    auto u = a->Allocate(c, i);
    ASSERT_TRUE(u) << i;
    EXPECT_EQ(*u, i);  // sequential: growth continues the frontier
    // The committed region grows only when an allocation needs it, one step at a time.
    EXPECT_EQ(a->committed_bytes(), (i / 4 + 1) * 4 * kPage) << i;
    EXPECT_LT(*u * kPage, a->committed_bytes());
  }
  EXPECT_FALSE(a->Allocate(c, 99));  // full at the total: the caller evicts
  EXPECT_EQ(a->committed_bytes(), 16 * kPage);
}

TEST(SizeClassAllocatorLazyTest, FreedMemoryInTheCommittedRegionIsReusedBeforeGrowing) {
  auto a = MakeLazy(16, 4, 4);
  const uint16_t c = *a->ClassFor(2 * kPage);
  ASSERT_EQ(a->Allocate(c, 1), 0u);
  ASSERT_EQ(a->Allocate(c, 2), 2u);
  a->Free(0, c);
  EXPECT_EQ(a->Allocate(c, 3), 0u);
  EXPECT_EQ(a->committed_bytes(), 4 * kPage);
  // Mixed sizes: a free run inside the committed region is found before growing.
  const uint16_t one = *a->ClassFor(kPage);
  a->Free(2, c);
  EXPECT_EQ(a->Allocate(one, 4), 2u);
  EXPECT_EQ(a->committed_bytes(), 4 * kPage);
}

TEST(SizeClassAllocatorLazyTest, AnObjectLargerThanAStepGrowsByAsManyStepsAsItNeeds) {
  auto a = MakeLazy(64, 2, 2);
  const uint16_t big = *a->ClassFor(7 * kPage);
  EXPECT_EQ(a->Allocate(big, 1), 0u);
  EXPECT_EQ(a->committed_bytes(), 8 * kPage);  // 2 + 3 steps of 2
  EXPECT_EQ(a->Allocate(big, 2), 7u);
  EXPECT_EQ(a->committed_bytes(), 14 * kPage);
}

TEST(SizeClassAllocatorLazyTest, NoRangeOrFreeRunReachesPastTheCommittedRegion) {
  auto a = MakeLazy(64, 4, 4);
  const uint16_t c = *a->ClassFor(kPage);
  ASSERT_EQ(a->Allocate(c, 1), 0u);
  // The free run after unit 0 ends at the committed end, not at the pool's.
  auto n = a->NeighboursOf(1);
  EXPECT_EQ(n.run_units, 3u);
  EXPECT_FALSE(a->AllocateAround(c, 4, 2));  // outside the committed region
  EXPECT_EQ(a->AllocateAround(c, 3, 2), 1u);
}

TEST(SizeClassAllocatorLazyTest, InitialSizeIsRoundedUpAndCappedAndZeroIsAllowed) {
  auto a = SizeClassAllocator::Create(16 * kPage, kPage, kPage + 1, kPage);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->committed_bytes(), 2 * kPage);
  auto b = SizeClassAllocator::Create(16 * kPage, kPage, 100 * kPage, kPage);
  EXPECT_EQ((*b)->committed_bytes(), 16 * kPage);
  auto z = MakeLazy(16, 0, 4);
  EXPECT_EQ(z->committed_bytes(), 0u);
  EXPECT_EQ(z->Allocate(*z->ClassFor(kPage), 1), 0u);
  EXPECT_EQ(z->committed_bytes(), 4 * kPage);
  EXPECT_EQ(SizeClassAllocator::Create(16 * kPage, kPage, kPage, 0).status().code(),
            StatusCode::kInvalidArgument);
  // Not lazy: everything is committed from the start.
  EXPECT_EQ(Make(16)->committed_bytes(), 16 * kPage);
}

TEST(SizeClassAllocatorLazyTest, EveryRangeIsAlignedForEveryAlignment) {
  for (const uint64_t align : {uint64_t{64}, uint64_t{4096}, uint64_t{65536}, uint64_t{2} << 20}) {
    auto made = SizeClassAllocator::Create(64 * align, align, 8 * align, 8 * align);
    ASSERT_TRUE(made.ok()) << align;
    auto& a = *made;
    // Odd object sizes, mixed, until the pool is full; then free every other and refill.
    const uint16_t c1 = *a->ClassFor(align + 1);
    const uint16_t c2 = *a->ClassFor(align / 2 + 3);
    std::vector<std::pair<uint32_t, uint16_t>> got;
    for (int i = 0;; ++i) {
      const uint16_t c = i % 2 ? c1 : c2;
      auto u = a->Allocate(c, i);
      if (!u) break;
      got.push_back({*u, c});
    }
    EXPECT_EQ(a->committed_bytes(), a->capacity_bytes()) << align;
    for (size_t i = 0; i < got.size(); i += 2) a->Free(got[i].first, got[i].second);
    for (int i = 0; i < 8; ++i) {
      if (auto u = a->Allocate(c2, 1000 + i)) got.push_back({*u, c2});
    }
    ASSERT_GT(got.size(), 40u) << align;
    for (const auto& [u, c] : got) {
      const uint64_t offset = uint64_t{u} * a->align();
      EXPECT_EQ(offset % align, 0u) << align;
      EXPECT_LE(offset + a->ClassBytes(c), a->capacity_bytes()) << align;
    }
  }
}

}  // namespace
}  // namespace kvd::l1
