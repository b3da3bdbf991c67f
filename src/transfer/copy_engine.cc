// CpuCopyEngine: the synchronous CopyEngine over host memory. Submit runs the whole copy
// (GatherChunks / ScatterChunks) on the caller's thread plus helpers, then on_complete, and
// returns a ticket that is already complete (a plan it refuses gets an error and no
// ticket). Tickets are numbered from 1 per engine.
#include "transfer/copy_engine.h"

#include <algorithm>
#include <mutex>
#include <sstream>

namespace kvd::transfer {
namespace {

class CpuCopyEngine final : public CopyEngine {
 public:
  CpuCopyEngine(const layout::KvLayout& layout, std::vector<uint8_t*> bases, int threads)
      : layout_(layout), bases_(std::move(bases)), threads_(threads < 1 ? 1 : threads) {
    caps_.name = "cpu";
  }

  const EngineCaps& caps() const override { return caps_; }

  Result<Submitted> Submit(CopyPlan plan) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& t : plan.tasks) {
      if (t.object == nullptr || t.chunk < 0) {
        return Status::InvalidArgument("copy plan has a task without an object");
      }
    }
    int64_t chunks = 0;
    for (const auto& t : plan.tasks) chunks = std::max(chunks, t.chunk + 1);
    Status st = ValidateBlockIds(layout_, plan.block_ids, chunks);
    if (!st.ok()) return st;
    if (plan.direction == CopyDirection::kGather) {
      GatherChunks(layout_, bases_, plan.block_ids, plan.tasks, threads_);
    } else {
      ScatterChunks(layout_, bases_, plan.block_ids, plan.tasks, threads_);
    }
    const Ticket t = ++last_;
    if (plan.on_complete) plan.on_complete(Status::Ok());
    Submitted out;
    out.ticket = t;
    return out;
  }

  Result<bool> Poll(Ticket ticket) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ticket == 0 || ticket > last_) {
      return Status::InvalidArgument("unknown ticket " + std::to_string(ticket));
    }
    return true;
  }

  Status Wait(Ticket ticket, std::chrono::milliseconds) override {
    auto r = Poll(ticket);
    return r.ok() ? Status::Ok() : r.status();
  }

  std::string Describe() const override {
    std::ostringstream os;
    os << "cpu engine, " << threads_ << " thread(s), " << bases_.size() << " tensor(s)";
    return os.str();
  }

 private:
  const layout::KvLayout layout_;
  const std::vector<uint8_t*> bases_;
  const int threads_;
  EngineCaps caps_;
  std::mutex mu_;
  Ticket last_ = 0;  // guarded by mu_
};

DeviceEngineFactory& TestFactory() {
  static DeviceEngineFactory factory;
  return factory;
}

}  // namespace

Result<std::unique_ptr<CopyEngine>> MakeDeviceEngine(
    const std::vector<wire::TensorDescriptor>& tensors, const layout::KvLayout& layout,
    const HostPool& pool, int64_t instance_id) {
  if (TestFactory()) return TestFactory()(tensors, layout, pool, instance_id);
  return OpenDeviceEngine(tensors, layout, pool, instance_id);
}

void SetDeviceEngineFactoryForTesting(DeviceEngineFactory factory) {
  TestFactory() = std::move(factory);
}

std::unique_ptr<CopyEngine> MakeCpuCopyEngine(const layout::KvLayout& layout,
                                              std::vector<uint8_t*> tensor_bases, int threads) {
  return std::make_unique<CpuCopyEngine>(layout, std::move(tensor_bases), threads);
}

}  // namespace kvd::transfer
