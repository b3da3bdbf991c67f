#include "l1/pool_populator.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

namespace kvd::l1 {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kRoomCheckBytes = uint64_t{64} << 20;
constexpr auto kProgressEvery = std::chrono::seconds(10);

double GiBf(uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::optional<PopulateMode> ParsePopulateMode(std::string_view name) {
  if (name == "off") return PopulateMode::kOff;
  if (name == "ahead") return PopulateMode::kAhead;
  if (name == "all") return PopulateMode::kAll;
  return std::nullopt;
}

const char* PopulateModeName(PopulateMode mode) {
  switch (mode) {
    case PopulateMode::kOff: return "off";
    case PopulateMode::kAhead: return "ahead";
    case PopulateMode::kAll: return "all";
  }
  return "?";
}

PoolPopulator::PoolPopulator(MemoryPool* pool, const SizeClassAllocator* alloc,
                             PopulatorOptions options)
    : pool_(pool), alloc_(alloc), options_(std::move(options)) {}

PoolPopulator::~PoolPopulator() { Stop(); }

void PoolPopulator::Start() {
  if (options_.mode == PopulateMode::kOff || thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void PoolPopulator::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_.store(true, std::memory_order_relaxed);
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

bool PoolPopulator::Sleep(std::chrono::milliseconds d) {
  MutexLock lock(&mu_);
  if (!stopping()) cv_.WaitFor(&mu_, d);
  return !stopping();
}

void PoolPopulator::Run() {
  // Background work: the lowest priority of the normal class, so that request threads
  // (and the rest of the machine) go first. Linux applies it to this thread only.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  pthread_setname_np(pthread_self(), "kvd-populate");

  const uint64_t cap = pool_->capacity();
  const uint64_t window = options_.window_bytes;
  const uint64_t step = std::max<uint64_t>(options_.step_bytes, 4096);
  const bool check_room = pool_->page_kind() != PageKind::kHugeTlb && options_.room;
  uint64_t pos = 0;
  uint64_t since_room_check = kRoomCheckBytes;  // check before the first step
  bool working = false;
  uint64_t burst_from = 0;
  Clock::time_point burst_start{}, last_progress{};
  const auto end_burst = [&] {
    const double secs = Seconds(Clock::now() - burst_start);
    const uint64_t done = pos - std::min(pos, burst_from);
    const auto level = secs >= 1.0 ? spdlog::level::info : spdlog::level::debug;
    spdlog::log(level, "l1: populated {:.1f} of {:.1f} GiB ({:.2f} GiB in {:.1f} s, {:.2f} GiB/s)",
                GiBf(pos), GiBf(cap), GiBf(done), secs, secs > 0 ? GiBf(done) / secs : 0.0);
    working = false;
  };

  while (!stopping()) {
    const uint64_t frontier = alloc_->frontier_bytes();
    // Stores outran us: what lies below the frontier is theirs.
    if (frontier > pos) pos = std::max(pos, frontier / MemoryPool::kBackingGranule *
                                                MemoryPool::kBackingGranule);
    const uint64_t ahead = std::min(cap, frontier + window);
    const uint64_t goal = options_.mode == PopulateMode::kAll
                              ? std::max(ahead, std::min(cap, alloc_->committed_bytes()))
                              : ahead;
    populated_.store(pos, std::memory_order_relaxed);
    if (pos >= goal) {
      if (working) end_burst();
      if (pos >= cap) break;  // the whole pool: nothing left to do, ever
      Sleep(options_.idle_poll);
      continue;
    }
    if (!working) {
      working = true;
      burst_from = pos;
      burst_start = last_progress = Clock::now();
    }
    if (check_room && since_room_check >= kRoomCheckBytes) {
      if (auto room = options_.room()) {
        const uint64_t reserve = options_.reserve_bytes != 0
                                     ? options_.reserve_bytes
                                     : std::max<uint64_t>(uint64_t{1} << 30, room->limit / 16);
        if (room->available < reserve + step) {
          if (!paused_.exchange(true, std::memory_order_relaxed)) {
            spdlog::info("l1: background population paused at {:.1f} of {:.1f} GiB: {:.1f} GiB "
                         "left in {}, and {:.1f} GiB stay free for the rest of the host",
                         GiBf(pos), GiBf(cap), GiBf(room->available), room->where,
                         GiBf(reserve));
          }
          Sleep(options_.retry_after);
          continue;
        }
      }
      since_room_check = 0;
    }
    const uint64_t len = std::min(step, goal - pos);
    if (Status st = pool_->Populate(pos, len); !st.ok()) {
      if (!paused_.exchange(true, std::memory_order_relaxed)) {
        spdlog::warn("l1: background population paused at {:.1f} of {:.1f} GiB: {}", GiBf(pos),
                     GiBf(cap), st.message());
      }
      if (st.code() == StatusCode::kFailedPrecondition) break;  // retrying cannot help
      since_room_check = kRoomCheckBytes;
      Sleep(options_.retry_after);
      continue;
    }
    if (paused_.exchange(false, std::memory_order_relaxed)) {
      spdlog::info("l1: background population resumed at {:.1f} GiB", GiBf(pos));
    }
    pos += len;
    since_room_check += len;
    populated_.store(pos, std::memory_order_relaxed);
    if (Clock::now() - last_progress >= kProgressEvery) {
      last_progress = Clock::now();
      spdlog::info("l1: populated {:.1f} of {:.1f} GiB", GiBf(pos), GiBf(cap));
    }
  }
  if (working) end_burst();
  finished_.store(true, std::memory_order_release);
}

}  // namespace kvd::l1
