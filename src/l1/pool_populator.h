// PoolPopulator: a background thread that populates the L1 pool's pages
// (MemoryPool::Populate) ahead of the allocator, so that the first stores into a fresh L1
// write into pages already zeroed and mapped instead of taking a page fault per 4 KiB page.
// Startup does not wait for it.
//
// ORDER. The allocator hands out never-used memory from its frontier upwards
// (size_class_allocator.h), so the populator works upwards from the start of the pool:
// [0, populated_bytes()) is populated or was handed out before the populator got there
// (when stores outrun it, it jumps to the frontier instead of populating behind the
// writers). It populates up to `window_bytes` past the frontier; with PopulateMode::kAll it
// then goes on, while there is nothing nearer to do, to the end of the allocator's committed
// region (the whole pool, or what a lazy pool has grown to so far), and its thread ends once
// the whole pool is populated.
//
// LIMITS. It leaves the host memory to spare: every 64 MiB it reads the room left
// (host_memory.h: MemAvailable, and the limit of kvd's memory cgroup) and pauses, with one
// log line, while less than `reserve_bytes` would be left. A shared pool's range is backed
// (fallocate) before it is populated, and one tmpfs cannot back pauses population: no
// SIGBUS. Reserved hugetlb pages are the pool's already: no room check for them.
//
// PRIORITY. The thread runs at nice 19. Each step is one madvise of at most `step_bytes`,
// which holds the process's mmap lock for reading; it takes no lock of the cache or the
// allocator (it reads their frontier and committed size, which are atomics).
//
// PROGRESS. populated_bytes() (kvd_l1_populated_bytes), an info line every 10 s while it
// works, and one when a stretch of work longer than a second ends:
// "l1: populated 12.0 of 100.0 GiB ...".
//
// THREADS. Start once; Stop from any thread but its own, any number of times: it returns
// once the thread has ended, within one step. The destructor stops it. The pool and the
// allocator must outlive the populator.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <thread>

#include "common/mutex.h"
#include "l1/host_memory.h"
#include "l1/memory_pool.h"
#include "l1/size_class_allocator.h"

namespace kvd::l1 {

// --l1-populate.
enum class PopulateMode : uint8_t {
  kOff,    // no population: a page is faulted in by the first store that writes it
  kAhead,  // only a window ahead of the allocator
  kAll,    // the window, then the rest of the committed region while idle
};
std::optional<PopulateMode> ParsePopulateMode(std::string_view name);  // off | ahead | all
const char* PopulateModeName(PopulateMode mode);

struct PopulatorOptions {
  PopulateMode mode = PopulateMode::kAll;
  uint64_t window_bytes = uint64_t{1} << 30;
  uint64_t step_bytes = uint64_t{8} << 20;
  // Memory to leave to the host; 0: max(1 GiB, 1/16 of the machine's or cgroup's memory).
  uint64_t reserve_bytes = 0;
  // Where the room left is read (tests replace it).
  std::function<std::optional<MemoryRoom>()> room = ReadMemoryRoom;
  // How often an idle populator looks at the allocator's frontier again.
  std::chrono::milliseconds idle_poll{20};
  // After a pause (no room, or a range tmpfs could not back), the next try.
  std::chrono::milliseconds retry_after{1000};
};

class PoolPopulator {
 public:
  PoolPopulator(MemoryPool* pool, const SizeClassAllocator* alloc, PopulatorOptions options);
  ~PoolPopulator();
  PoolPopulator(const PoolPopulator&) = delete;
  PoolPopulator& operator=(const PoolPopulator&) = delete;

  // Starts the thread (nothing happens for PopulateMode::kOff).
  void Start();
  void Stop();

  // [0, populated_bytes()) of the pool is populated or was handed out before.
  uint64_t populated_bytes() const { return populated_.load(std::memory_order_relaxed); }
  // The thread ended: the whole pool is populated, or it was stopped, or it gave up.
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // Population is paused (no room, or the pool cannot be backed).
  bool paused() const { return paused_.load(std::memory_order_relaxed); }

 private:
  void Run();
  // Sleeps up to `d`; false when Stop was called.
  bool Sleep(std::chrono::milliseconds d) KVD_EXCLUDES(mu_);
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }

  MemoryPool* const pool_;
  const SizeClassAllocator* const alloc_;
  const PopulatorOptions options_;
  std::atomic<uint64_t> populated_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> paused_{false};
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  CondVar cv_;  // wakes Sleep when Stop is called
  std::thread thread_;
};

}  // namespace kvd::l1
