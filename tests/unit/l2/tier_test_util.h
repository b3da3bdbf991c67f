// Helpers for tier tests: blocking wrappers over the asynchronous Tier calls, keys and
// deterministic object bytes.
#pragma once

#include <chrono>
#include <future>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "l2/tier.h"

namespace kvd::l2::testing {

inline ObjectKey Key(int i, std::string model = "org/Model-1", uint32_t rank = 0,
                     std::string salt = "") {
  ObjectKey k;
  k.model_name = std::move(model);
  k.kv_rank = KvRank(2, rank);
  k.object_group = 0;
  for (int b = 0; b < 32; ++b) k.chunk_hash[b] = static_cast<uint8_t>(b * 7 + 1);
  for (int b = 0; b < 4; ++b) k.chunk_hash[b] = static_cast<uint8_t>(static_cast<uint32_t>(i) >> (8 * b));
  k.cache_salt = std::move(salt);
  return k;
}

inline std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 gen(seed);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

constexpr auto kWait = std::chrono::seconds(20);

inline std::vector<ItemResult> Wait(std::future<std::vector<ItemResult>>& f) {
  if (f.wait_for(kWait) != std::future_status::ready) {
    ADD_FAILURE() << "tier call did not answer in time";
    return {};
  }
  return f.get();
}

inline std::vector<ItemResult> StoreSync(Tier& t, std::vector<StoreItem> items) {
  auto p = std::make_shared<std::promise<std::vector<ItemResult>>>();
  auto f = p->get_future();
  t.Store(std::move(items), [p](std::vector<ItemResult> r) { p->set_value(std::move(r)); });
  return Wait(f);
}
inline ItemResult StoreOne(Tier& t, const ObjectKey& k, const std::vector<uint8_t>& v) {
  auto r = StoreSync(t, {{k, v.data(), v.size()}});
  return r.empty() ? ItemResult{Status::Internal("no answer"), 0} : r[0];
}
inline std::vector<ItemResult> ExistsSync(Tier& t, std::vector<ObjectKey> keys) {
  auto p = std::make_shared<std::promise<std::vector<ItemResult>>>();
  auto f = p->get_future();
  t.Exists(std::move(keys), [p](std::vector<ItemResult> r) { p->set_value(std::move(r)); });
  return Wait(f);
}
inline std::vector<ItemResult> LoadSync(Tier& t, std::vector<LoadItem> items) {
  auto p = std::make_shared<std::promise<std::vector<ItemResult>>>();
  auto f = p->get_future();
  t.Load(std::move(items), [p](std::vector<ItemResult> r) { p->set_value(std::move(r)); });
  return Wait(f);
}
inline ItemResult LoadOne(Tier& t, const ObjectKey& k, std::vector<uint8_t>* out, size_t size) {
  out->assign(size, 0xEE);
  auto r = LoadSync(t, {{k, out->data(), size, false}});
  return r.empty() ? ItemResult{Status::Internal("no answer"), 0} : r[0];
}
inline std::vector<ItemResult> DeleteSync(Tier& t, std::vector<ObjectKey> keys) {
  auto p = std::make_shared<std::promise<std::vector<ItemResult>>>();
  auto f = p->get_future();
  t.Delete(std::move(keys), [p](std::vector<ItemResult> r) { p->set_value(std::move(r)); });
  return Wait(f);
}
inline Result<std::vector<ScannedObject>> ScanSync(Tier& t) {
  auto p = std::make_shared<std::promise<Result<std::vector<ScannedObject>>>>();
  auto f = p->get_future();
  t.Scan([p](Result<std::vector<ScannedObject>> r) { p->set_value(std::move(r)); });
  if (f.wait_for(kWait) != std::future_status::ready) return Status::Internal("scan timed out");
  return f.get();
}

}  // namespace kvd::l2::testing
