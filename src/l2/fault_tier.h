// FaultTier: a decorator that makes any tier misbehave on command, for tests of what sits
// above tiers (store-behind bounds, prefetch failures, reconnect paths): failing operations
// with a chosen status (Internal is what a real tier answers for a truncated object),
// delaying answers, and stalling every call until Resume (a hung tier).
//
// The fault settings may be changed at any time from any thread; they apply to calls made
// afterwards. Delayed and stalled calls are forwarded to the inner tier by the decorator's
// own thread when they are due. Close() releases stalled calls (they then reach the inner
// tier, which answers them) and closes the inner tier.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "common/mutex.h"
#include "l2/tier.h"

namespace kvd::l2 {

enum class TierOp : uint8_t { kStore = 1, kExists = 2, kLoad = 4, kDelete = 8, kScan = 16 };
constexpr uint8_t kAllTierOps = 31;

class FaultTier final : public Tier {
 public:
  explicit FaultTier(std::shared_ptr<Tier> inner);
  ~FaultTier() override;

  // Calls of the ops in `ops` (a TierOp mask) answer `code` for every item without reaching
  // the inner tier. FailOps(0, …) heals.
  void FailOps(uint8_t ops, StatusCode code = StatusCode::kUnavailable);
  // Every call waits this long before it is forwarded.
  void SetDelayMs(int64_t ms) { delay_ms_.store(ms); }
  // Calls are held (not forwarded, not answered) until Resume.
  void Stall();
  void Resume();
  // Number of calls seen per op (stalled ones included).
  uint64_t calls(TierOp op) const;

  std::string_view type() const override { return inner_->type(); }
  std::string Describe() const override { return inner_->Describe() + " (fault-injecting)"; }
  bool stores() const override { return inner_->stores(); }
  void Store(std::vector<StoreItem> items, Done done) override;
  void Exists(std::vector<ObjectKey> keys, Done done) override;
  void Load(std::vector<LoadItem> items, Done done) override;
  void Delete(std::vector<ObjectKey> keys, Done done) override;
  void Scan(ScanDone done) override;
  TierHealth Health() const override;
  void Close() override;

 private:
  // Runs `forward` now, or queues it for the delay thread. `fail` answers the call instead
  // when the op is failing.
  void Dispatch(TierOp op, std::function<void()> forward, std::function<void(Status)> fail)
      KVD_EXCLUDES(mu_);
  void RunQueue() KVD_EXCLUDES(mu_);

  const std::shared_ptr<Tier> inner_;
  std::atomic<uint8_t> failing_{0};
  std::atomic<StatusCode> fail_code_{StatusCode::kUnavailable};
  std::atomic<int64_t> delay_ms_{0};
  std::atomic<uint64_t> calls_[5] = {};

  struct Pending {
    int64_t due_ns;
    std::function<void()> run;
  };
  Mutex mu_;
  CondVar cv_;
  std::deque<Pending> queue_ KVD_GUARDED_BY(mu_);
  bool stalled_ KVD_GUARDED_BY(mu_) = false;
  bool closing_ KVD_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvd::l2
