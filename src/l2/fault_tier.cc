#include "l2/fault_tier.h"

#include <chrono>

namespace kvd::l2 {
namespace {
int Index(TierOp op) {
  switch (op) {
    case TierOp::kStore: return 0;
    case TierOp::kExists: return 1;
    case TierOp::kLoad: return 2;
    case TierOp::kDelete: return 3;
    case TierOp::kScan: return 4;
  }
  return 0;
}
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
Status Injected(StatusCode code) {
  switch (code) {
    case StatusCode::kResourceExhausted: return Status::ResourceExhausted("injected: no space");
    case StatusCode::kInternal: return Status::Internal("injected: corrupted object");
    case StatusCode::kNotFound: return Status::NotFound("injected: absent");
    default: return Status::Unavailable("injected: tier unreachable");
  }
}
}  // namespace

FaultTier::FaultTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {
  thread_ = std::thread([this] { RunQueue(); });
}

FaultTier::~FaultTier() { Close(); }

void FaultTier::FailOps(uint8_t ops, StatusCode code) {
  fail_code_.store(code);
  failing_.store(ops);
}

void FaultTier::Stall() {
  MutexLock lock(&mu_);
  stalled_ = true;
}

void FaultTier::Resume() {
  {
    MutexLock lock(&mu_);
    stalled_ = false;
  }
  cv_.NotifyAll();
}

uint64_t FaultTier::calls(TierOp op) const { return calls_[Index(op)].load(); }

TierHealth FaultTier::Health() const {
  if (failing_.load() != 0) return {false, "fault injected"};
  return inner_->Health();
}

void FaultTier::Close() {
  {
    MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
    stalled_ = false;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  inner_->Close();
}

void FaultTier::Dispatch(TierOp op, std::function<void()> forward, std::function<void(Status)> fail) {
  calls_[Index(op)]++;
  std::function<void()> run;
  if (failing_.load() & static_cast<uint8_t>(op)) {
    const StatusCode code = fail_code_.load();
    run = [fail, code] { fail(Injected(code)); };
  } else {
    run = std::move(forward);
  }
  const int64_t delay = delay_ms_.load();
  bool queued = false;
  {
    MutexLock lock(&mu_);
    if (!closing_ && (stalled_ || delay > 0 || !queue_.empty())) {
      queue_.push_back({NowNs() + delay * 1'000'000, std::move(run)});
      queued = true;
    }
  }
  if (queued) {
    cv_.NotifyAll();
    return;
  }
  // Injected failures answer on the decorator's thread too (never inside the call).
  if (!inner_ || (failing_.load() & static_cast<uint8_t>(op))) {
    MutexLock lock(&mu_);
    queue_.push_back({0, std::move(run)});
    cv_.NotifyAll();
    return;
  }
  run();
}

void FaultTier::RunQueue() {
  while (true) {
    std::function<void()> run;
    {
      MutexLock lock(&mu_);
      while (true) {
        if (queue_.empty()) {
          if (closing_) return;
          cv_.Wait(&mu_);
          continue;
        }
        if (stalled_) {
          cv_.Wait(&mu_);
          continue;
        }
        const int64_t now = NowNs();
        if (queue_.front().due_ns > now) {
          cv_.WaitFor(&mu_, std::chrono::nanoseconds(queue_.front().due_ns - now));
          continue;
        }
        run = std::move(queue_.front().run);
        queue_.pop_front();
        break;
      }
    }
    run();
  }
}

void FaultTier::Store(std::vector<StoreItem> items, Done done) {
  const size_t n = items.size();
  auto shared = std::make_shared<std::vector<StoreItem>>(std::move(items));
  Dispatch(
      TierOp::kStore, [this, shared, done] { inner_->Store(std::move(*shared), done); },
      [n, done](Status s) { done(std::vector<ItemResult>(n, ItemResult{s, 0})); });
}

void FaultTier::Exists(std::vector<ObjectKey> keys, Done done) {
  const size_t n = keys.size();
  auto shared = std::make_shared<std::vector<ObjectKey>>(std::move(keys));
  Dispatch(
      TierOp::kExists, [this, shared, done] { inner_->Exists(std::move(*shared), done); },
      [n, done](Status s) { done(std::vector<ItemResult>(n, ItemResult{s, 0})); });
}

void FaultTier::Load(std::vector<LoadItem> items, Done done) {
  const size_t n = items.size();
  auto shared = std::make_shared<std::vector<LoadItem>>(std::move(items));
  Dispatch(
      TierOp::kLoad, [this, shared, done] { inner_->Load(std::move(*shared), done); },
      [n, done](Status s) { done(std::vector<ItemResult>(n, ItemResult{s, 0})); });
}

void FaultTier::Delete(std::vector<ObjectKey> keys, Done done) {
  const size_t n = keys.size();
  auto shared = std::make_shared<std::vector<ObjectKey>>(std::move(keys));
  Dispatch(
      TierOp::kDelete, [this, shared, done] { inner_->Delete(std::move(*shared), done); },
      [n, done](Status s) { done(std::vector<ItemResult>(n, ItemResult{s, 0})); });
}

void FaultTier::Scan(ScanDone done) {
  Dispatch(
      TierOp::kScan, [this, done] { inner_->Scan(done); }, [done](Status s) { done(s); });
}

}  // namespace kvd::l2
