// CpuCopyEngine: the synchronous CopyEngine over host memory (a CPU worker's POSIX
// shared-memory segments, which it owns). Submit runs the whole copy (GatherChunks /
// ScatterChunks) on the caller's thread plus helpers, then on_complete, and returns a
// ticket that is already complete (a plan it refuses gets an error and no ticket). Tickets
// are numbered from 1 per engine. Submit calls are serialised by the engine mutex, so one
// engine copies one plan at a time, in submission order.
#include <sys/stat.h>

#include <algorithm>
#include <sstream>

#include "common/mutex.h"
#include "transfer/copy_engine.h"

namespace kvd::transfer {
namespace {

// Threads pay off only for large copies: about one per 4 MiB, at most max_threads.
constexpr uint64_t kBytesPerThread = 4ull << 20;

class CpuCopyEngine final : public CopyEngine {
 public:
  CpuCopyEngine(const layout::KvLayout& layout, std::vector<uint8_t*> bases, int max_threads,
                std::vector<ShmMapping> mappings)
      : layout_(layout),
        mappings_(std::move(mappings)),
        bases_(std::move(bases)),
        max_threads_(max_threads < 1 ? 1 : max_threads) {
    caps_.name = "cpu";
  }

  const EngineCaps& caps() const override { return caps_; }

  Result<Submitted> Submit(CopyPlan plan) override KVD_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (cancelled_) return Status::Unavailable("the copy engine was cancelled");
    int64_t chunks = 0;
    for (const auto& t : plan.tasks) {
      if (t.object == nullptr || t.chunk < 0) {
        return Status::InvalidArgument("copy plan has a task without an object");
      }
      chunks = std::max(chunks, t.chunk + 1);
    }
    Status st = ValidateBlockIds(layout_, plan.block_ids, chunks);
    if (!st.ok()) return st;
    const uint64_t bytes = plan.tasks.size() * layout_.object_bytes;
    const int threads = static_cast<int>(
        std::clamp<uint64_t>(bytes / kBytesPerThread, 1, static_cast<uint64_t>(max_threads_)));
    const bool copied = plan.direction == CopyDirection::kGather
                            ? GatherChunks(layout_, bases_, plan.block_ids, plan.tasks, threads)
                            : ScatterChunks(layout_, bases_, plan.block_ids, plan.tasks, threads);
    Submitted out;
    out.ticket = ++last_;
    if (!copied) out.status = DescribeBusError();
    if (plan.on_complete) plan.on_complete(out.status);
    return out;
  }

  Result<bool> Poll(Ticket ticket) override {
    MutexLock lock(&mu_);
    if (ticket == 0 || ticket > last_) {
      return Status::InvalidArgument("unknown ticket " + std::to_string(ticket));
    }
    return true;
  }

  Status Wait(Ticket ticket, std::chrono::milliseconds) override {
    auto r = Poll(ticket);
    return r.ok() ? Status::Ok() : r.status();
  }

  // Copies run inside Submit, so none is ever outstanding: cancelling only refuses new ones.
  void Cancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
  }

  // A copy hit a page its mapping no longer has a file page for: name the segment that
  // shrank (the client truncated it) if one did, else the pool (tmpfs could not back a page).
  Status DescribeBusError() const {
    for (const auto& m : mappings_) {
      struct stat st {};
      const std::string path = "/dev/shm" + m.name();
      if (stat(path.c_str(), &st) != 0) {
        return Status::FailedPrecondition("shared memory '" + m.name() +
                                          "' is gone; the copy was cut short (bus error)");
      }
      if (static_cast<uint64_t>(st.st_size) < m.size()) {
        return Status::FailedPrecondition(
            "shared memory '" + m.name() + "' was truncated to " + std::to_string(st.st_size) +
            " bytes after registration (" + std::to_string(m.size()) +
            " mapped); the copy was cut short (bus error)");
      }
    }
    return Status::ResourceExhausted(
        "a copy was cut short by a bus error (no memory page could be allocated for the "
        "mapping: is /dev/shm full?)");
  }

  std::string Describe() const override {
    std::ostringstream os;
    os << "cpu engine, up to " << max_threads_ << " thread(s), " << bases_.size()
       << " tensor(s) in " << mappings_.size() << " segment(s)";
    return os.str();
  }

 private:
  const layout::KvLayout layout_;
  const std::vector<ShmMapping> mappings_;  // what bases_ point into (may be empty)
  const std::vector<uint8_t*> bases_;
  const int max_threads_;
  EngineCaps caps_;
  Mutex mu_;
  Ticket last_ KVD_GUARDED_BY(mu_) = 0;
  bool cancelled_ KVD_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<CopyEngine> MakeCpuCopyEngine(const layout::KvLayout& layout,
                                              std::vector<uint8_t*> tensor_bases, int max_threads,
                                              std::vector<ShmMapping> mappings) {
  return std::make_unique<CpuCopyEngine>(layout, std::move(tensor_bases), max_threads,
                                         std::move(mappings));
}

}  // namespace kvd::transfer
