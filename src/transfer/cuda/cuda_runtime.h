// CudaRuntime: process-wide CUDA state shared by every CUDA engine. Created lazily by the
// first GPU registration (CudaRuntime::Get), so kvd starts and serves CPU workers on
// machines without a GPU driver; a missing driver or device fails that registration only.
// Never destroyed (deliberately leaked: it must outlive every engine, and tearing CUDA down
// from static destructors is unsafe).
//
// It owns:
//   * the local devices and their UUIDs (device_uuid → ordinal);
//   * imported IPC allocations, opened once per (device, handle bytes) and refcounted:
//     OpenAllocation returns a shared handle whose last release calls cudaIpcCloseMemHandle
//     (the driver maps an allocation once per process, and one close unmaps it for all);
//   * page-locked registrations of host memory (kvd's L1 pool), refcounted the same way;
//   * exported interprocess events: a pool whose events are recycled only after they have
//     completed (cudaEventQuery) AND kRetainedExports newer ones were exported or
//     kRetainSeconds passed, so a slow client can still import a handle it was sent;
//   * kvd's timeline-semaphore buffer per device (lmcache's isolated-IPC event format);
//   * the completion thread: every submitted copy ends with a marker event and a host
//     function (cudaLaunchHostFunc) that wakes this thread; the thread confirms the marker
//     with cudaEventQuery and then runs the copy's completion (L1 commit / unpin) and frees
//     its per-copy CUDA resources. Host functions themselves never call CUDA.
//
// Threads: every method is thread-safe. Methods that make CUDA calls set the device they
// need themselves. Locks: mu_ (the maps, pools and timelines below; a CUDA call may run under
// it) and done_mu_ (the completion queue; never held across a CUDA call); neither is held
// while the other is taken. Each field names its lock (KVD_GUARDED_BY).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "transfer/copy_engine.h"
#include "transfer/cuda/background_pin.h"
#include "transfer/cuda/ipc_handles.h"

namespace kvd::transfer::cuda {

// "cudaIpcOpenMemHandle: invalid argument (cudaErrorInvalidValue)".
std::string CudaErrorText(const char* what, cudaError_t err);

// An imported CUDA IPC allocation. Closed when the last holder releases it.
struct IpcAllocation {
  int device = 0;
  IpcHandle handle{};
  uint8_t* base = nullptr;  // device address in kvd's address space
  uint64_t bytes = 0;       // allocation size from the driver (0: not known)
  ~IpcAllocation();
};

// A host range page-locked for DMA in the background (BackgroundPin): copies work before,
// and without, the pin, slower. Unregistered when the last holder releases it (after the pin
// returned).
struct HostRegistration {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  std::unique_ptr<BackgroundPin> pin;
  // "pinning in the background", "pinned" or "pageable" (cudaHostRegister failed).
  const char* state() const { return BackgroundPinStateName(pin->state()); }
  ~HostRegistration();
};

// Completion tracking of one engine's tickets.
class TicketBook {
 public:
  Ticket Issue();
  void Complete(Ticket t, const Status& st);
  Result<bool> Poll(Ticket t) const;
  Status Wait(Ticket t, std::chrono::milliseconds timeout) const;
  // Waits until no ticket is outstanding; false on timeout.
  bool Drain(std::chrono::milliseconds timeout) const;
  size_t outstanding() const;

 private:
  static constexpr size_t kMaxFailures = 256;
  mutable Mutex mu_;
  mutable CondVar cv_;  // signalled (under no lock) when a ticket completes
  Ticket last_ KVD_GUARDED_BY(mu_) = 0;
  std::set<Ticket> outstanding_ KVD_GUARDED_BY(mu_);
  std::map<Ticket, Status> failures_ KVD_GUARDED_BY(mu_);  // the newest kMaxFailures
};

// One submitted copy as the completion thread sees it.
struct PendingCopy {
  std::shared_ptr<TicketBook> book;
  Ticket ticket = 0;
  int device = 0;
  cudaEvent_t marker = nullptr;    // recorded after the copy; owned, returned to the pool
  cudaEvent_t started = nullptr;   // recorded when the copy starts (after the client's event),
                                   // only when on_copy_timed is set; owned like marker
  std::function<void(double)> on_copy_timed;  // started → marker, seconds, when the copy succeeded
  cudaEvent_t imported = nullptr;  // the client's event, destroyed after the copy
  Status forced;                   // non-OK: report this failure (the copy was cut short)
  std::function<void(const Status&)> on_complete;
  std::vector<std::shared_ptr<void>> keep_alive;  // released after on_complete
};

class CudaRuntime {
 public:
  static constexpr size_t kRetainedExports = 2048;
  static constexpr double kRetainSeconds = 60.0;

  // The runtime, initialising CUDA on first use. FailedPrecondition (with the CUDA error)
  // when no driver or no device is usable; retried on the next call.
  static Result<CudaRuntime*> Get();

  int device_count() const { return static_cast<int>(uuids_.size()); }
  const std::vector<DeviceUuid>& device_uuids() const { return uuids_; }
  const std::string& device_name(int ordinal) const { return names_[ordinal]; }

  Result<std::shared_ptr<IpcAllocation>> OpenAllocation(int device, const IpcHandle& handle);
  // Starts pinning [base, base + bytes) on a thread of its own (device `device` current
  // there) and returns at once; an existing registration of `base` is shared.
  std::shared_ptr<HostRegistration> RegisterHost(int device, uint8_t* base, uint64_t bytes);

  // Interprocess event for a copy's completion; ExportEvent hands its handle out and keeps
  // the event retained (see above) until it may be recycled.
  Result<cudaEvent_t> AcquireExportEvent(int device);
  Result<std::string> ExportEvent(int device, cudaEvent_t event);
  // Plain (non-interprocess) marker events, with timing (a copy's device time is the time
  // between two of them).
  Result<cudaEvent_t> AcquireMarker(int device);

  // Timeline semaphores (lmcache isolated-IPC events). Whether the driver offers the stream
  // memory operations they need:
  bool has_stream_memops() const { return wait_value64_ != nullptr && write_value64_ != nullptr; }
  // Makes `stream` wait until the imported slot reaches the handle's sequence.
  Status WaitTimeline(int device, cudaStream_t stream, const EventHandle& handle,
                      std::vector<std::shared_ptr<void>>* keep_alive);
  // A slot of kvd's own semaphore buffer on `device`, for one engine.
  Result<uint64_t> AllocateTimelineSlot(int device);
  // Enqueues "slot = next sequence" on `stream`; returns the handle that names it.
  Result<std::string> RecordTimeline(int device, cudaStream_t stream, uint64_t slot_offset);
  void ReleaseTimelineSlot(int device, uint64_t slot_offset);

  // Registers a copy whose last stream operations were `marker` then a host function
  // made by LaunchWakeup. Takes ownership of the PendingCopy's events.
  void Track(std::unique_ptr<PendingCopy> copy);
  // Enqueues the host function that wakes the completion thread.
  cudaError_t LaunchWakeup(cudaStream_t stream);

 private:
  CudaRuntime() = default;
  Status Init();
  void CompletionLoop() KVD_EXCLUDES(done_mu_);
  void Finish(PendingCopy& copy, const Status& st) KVD_EXCLUDES(mu_, done_mu_);
  static void CUDART_CB HostWakeup(void* runtime);

  std::vector<DeviceUuid> uuids_;
  std::vector<std::string> names_;
  // Driver entry points (cudaGetDriverEntryPointByVersion; kvd links only the runtime):
  // cuMemGetAddressRange, cuStreamWaitValue64, cuStreamWriteValue64. Null if unavailable.
  void* get_range_ = nullptr;
  void* wait_value64_ = nullptr;
  void* write_value64_ = nullptr;

  Mutex mu_;
  std::map<std::pair<int, IpcHandle>, std::weak_ptr<IpcAllocation>> allocations_
      KVD_GUARDED_BY(mu_);
  std::map<uint8_t*, std::weak_ptr<HostRegistration>> host_ KVD_GUARDED_BY(mu_);
  struct Retained {
    cudaEvent_t event;
    uint64_t serial;
    double exported_at;
  };
  std::vector<std::deque<Retained>> retained_ KVD_GUARDED_BY(mu_);         // per device
  std::vector<std::vector<cudaEvent_t>> free_export_ KVD_GUARDED_BY(mu_);  // per device
  std::vector<std::vector<cudaEvent_t>> free_marker_ KVD_GUARDED_BY(mu_);  // per device
  uint64_t export_serial_ KVD_GUARDED_BY(mu_) = 0;
  struct Timeline {
    uint8_t* base = nullptr;
    IpcHandle handle{};
    uint64_t next_slot = 1;                 // slot 0 is lmcache's probe slot
    std::vector<uint64_t> free_slots;       // offsets of released slots
    std::map<uint64_t, uint64_t> sequence;  // slot offset → last sequence written
  };
  std::vector<Timeline> timelines_ KVD_GUARDED_BY(mu_);  // per device

  Mutex done_mu_;
  CondVar done_cv_;  // signalled (under no lock) on a new copy or a host wakeup
  std::deque<std::unique_ptr<PendingCopy>> pending_ KVD_GUARDED_BY(done_mu_);
  uint64_t wakeups_ KVD_GUARDED_BY(done_mu_) = 0;
  std::thread completion_;
};

}  // namespace kvd::transfer::cuda
