#include "transfer/cuda/cuda_runtime.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

namespace kvd::transfer::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double NowSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

using GetRangeFn = PFN_cuMemGetAddressRange_v3020;
using WaitValueFn = PFN_cuStreamWaitValue64_v11070;
using WriteValueFn = PFN_cuStreamWriteValue64_v11070;

void* DriverEntry(const char* symbol, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

}  // namespace

std::string CudaErrorText(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")";
}

IpcAllocation::~IpcAllocation() = default;
HostRegistration::~HostRegistration() = default;

// ---- TicketBook ------------------------------------------------------------------------

Ticket TicketBook::Issue() {
  MutexLock lock(&mu_);
  outstanding_.insert(++last_);
  return last_;
}

void TicketBook::Complete(Ticket t, const Status& st) {
  {
    MutexLock lock(&mu_);
    outstanding_.erase(t);
    if (!st.ok()) {
      failures_[t] = st;
      while (failures_.size() > kMaxFailures) failures_.erase(failures_.begin());
    }
  }
  cv_.NotifyAll();
}

Result<bool> TicketBook::Poll(Ticket t) const {
  MutexLock lock(&mu_);
  if (t == 0 || t > last_) return Status::InvalidArgument("unknown ticket " + std::to_string(t));
  if (outstanding_.count(t)) return false;
  auto it = failures_.find(t);
  if (it != failures_.end()) return it->second;
  return true;
}

Status TicketBook::Wait(Ticket t, std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&mu_);
  if (t == 0 || t > last_) return Status::InvalidArgument("unknown ticket " + std::to_string(t));
  while (outstanding_.count(t) != 0) {
    if (!cv_.WaitUntil(&mu_, deadline)) {
      return Status::Unavailable("copy " + std::to_string(t) + " still running");
    }
  }
  auto it = failures_.find(t);
  return it == failures_.end() ? Status::Ok() : it->second;
}

bool TicketBook::Drain(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!outstanding_.empty()) {
    if (!cv_.WaitUntil(&mu_, deadline)) return false;
  }
  return true;
}

size_t TicketBook::outstanding() const {
  MutexLock lock(&mu_);
  return outstanding_.size();
}

// ---- CudaRuntime -------------------------------------------------------------------------

Result<CudaRuntime*> CudaRuntime::Get() {
  // init_mu guards `instance` (a function's static cannot be KVD_GUARDED_BY; it is read and
  // written only here, under the lock).
  static Mutex init_mu;
  static CudaRuntime* instance = nullptr;
  MutexLock lock(&init_mu);
  if (instance) return instance;
  auto* rt = new CudaRuntime();
  Status st = rt->Init();
  if (!st.ok()) {
    delete rt;
    return st;
  }
  instance = rt;  // never destroyed
  return instance;
}

Status CudaRuntime::Init() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    std::string why = CudaErrorText("cudaGetDeviceCount", err);
    if (err == cudaErrorInsufficientDriver) {
      why = "no usable NVIDIA driver: libcuda.so.1 is missing, or older than the CUDA " +
            std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) +
            " runtime kvd was built with (" + why + ")";
    }
    return Status::FailedPrecondition("CUDA is not usable on this machine: " + why +
                                      "; GPU KV caches cannot be registered, CPU shared-memory "
                                      "ones still can");
  }
  if (n == 0) {
    return Status::FailedPrecondition("CUDA found no GPU on this machine; GPU KV caches cannot be "
                                      "registered (check CUDA_VISIBLE_DEVICES)");
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    err = cudaGetDeviceProperties(&p, i);
    if (err != cudaSuccess) {
      return Status::FailedPrecondition(CudaErrorText("cudaGetDeviceProperties", err));
    }
    DeviceUuid u{};
    std::memcpy(u.data(), p.uuid.bytes, u.size());
    uuids_.push_back(u);
    names_.emplace_back(p.name);
  }
  get_range_ = DriverEntry("cuMemGetAddressRange", 12000);
  wait_value64_ = DriverEntry("cuStreamWaitValue64", 12000);
  write_value64_ = DriverEntry("cuStreamWriteValue64", 12000);
  {
    MutexLock lock(&mu_);  // no other thread sees the runtime yet; the lock is for the analysis
    retained_.resize(n);
    free_export_.resize(n);
    free_marker_.resize(n);
    timelines_.resize(n);
  }
  completion_ = std::thread([this] { CompletionLoop(); });
  completion_.detach();  // the runtime lives for the whole process
  std::string devices;
  for (int i = 0; i < n; ++i) {
    devices += (i ? ", " : "") + std::to_string(i) + ": " + names_[i] + " " + FormatDeviceUuid(uuids_[i]);
  }
  spdlog::info("CUDA initialised: {} device(s) [{}]; allocation bounds check {}, stream memory ops {}",
               n, devices, get_range_ ? "on" : "unavailable",
               has_stream_memops() ? "available" : "unavailable");
  return Status::Ok();
}

Result<std::shared_ptr<IpcAllocation>> CudaRuntime::OpenAllocation(int device,
                                                                   const IpcHandle& handle) {
  MutexLock lock(&mu_);
  auto key = std::make_pair(device, handle);
  if (auto it = allocations_.find(key); it != allocations_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return Status::Internal(CudaErrorText("cudaSetDevice", err));
  cudaIpcMemHandle_t h;
  static_assert(sizeof(h) == kIpcHandleBytes);
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::InvalidArgument(
        CudaErrorText("cudaIpcOpenMemHandle", err) +
        " (the worker's memory could not be opened: is kvd on the same machine, with the "
        "worker's GPU visible, and the worker still alive?)");
  }
  uint64_t bytes = 0;
  if (get_range_) {
    CUdeviceptr base = 0;
    size_t size = 0;
    if (reinterpret_cast<GetRangeFn>(get_range_)(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) ==
            CUDA_SUCCESS &&
        base == reinterpret_cast<CUdeviceptr>(ptr)) {
      bytes = size;
    }
  }
  // The deleter closes under mu_, so a concurrent open of the same handle either finds the
  // live mapping or runs after the close.
  std::shared_ptr<IpcAllocation> a(new IpcAllocation{device, handle, static_cast<uint8_t*>(ptr), bytes},
                                   [this](IpcAllocation* p) {
                                     MutexLock l(&mu_);
                                     auto it = allocations_.find({p->device, p->handle});
                                     if (it != allocations_.end() && it->second.expired()) allocations_.erase(it);
                                     cudaSetDevice(p->device);
                                     cudaError_t e = cudaIpcCloseMemHandle(p->base);
                                     if (e != cudaSuccess) {
                                       spdlog::warn("{}", CudaErrorText("cudaIpcCloseMemHandle", e));
                                     }
                                     delete p;
                                   });
  allocations_[key] = a;
  return a;
}

std::shared_ptr<HostRegistration> CudaRuntime::RegisterHost(int device, uint8_t* base, uint64_t bytes) {
  MutexLock lock(&mu_);
  if (auto it = host_.find(base); it != host_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  // Released under mu_ (as the maps are): a registration of the same range waits until this
  // one is unpinned, and the pin thread never takes mu_.
  std::shared_ptr<HostRegistration> r(new HostRegistration{base, bytes, nullptr},
                                      [this](HostRegistration* p) {
                                        MutexLock l(&mu_);
                                        auto it = host_.find(p->base);
                                        if (it != host_.end() && it->second.expired()) host_.erase(it);
                                        delete p;  // waits for the pin, then unpins
                                      });
  r->pin = std::make_unique<BackgroundPin>(
      [device, base, bytes] {
        const auto t0 = Clock::now();
        cudaError_t err = cudaSetDevice(device);
        if (err == cudaSuccess) err = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
        if (err != cudaSuccess) {
          (void)cudaGetLastError();
          spdlog::warn("{}: L1 ({} bytes) stays pageable, GPU copies will be slower",
                       CudaErrorText("cudaHostRegister", err), bytes);
          return false;
        }
        spdlog::info("pinned L1 for GPU copies in the background: {:.1f} GiB in {:.2f} s",
                     bytes / double(1ull << 30),
                     std::chrono::duration<double>(Clock::now() - t0).count());
        return true;
      },
      [base] {
        cudaError_t e = cudaHostUnregister(base);
        if (e != cudaSuccess) spdlog::warn("{}", CudaErrorText("cudaHostUnregister", e));
      });
  host_[base] = r;
  spdlog::info("pinning L1 for GPU copies ({:.1f} GiB) in the background; copies use it as "
               "pageable memory until then", bytes / double(1ull << 30));
  return r;
}

Result<cudaEvent_t> CudaRuntime::AcquireExportEvent(int device) {
  MutexLock lock(&mu_);
  auto& ring = retained_[device];
  const double now = NowSeconds();
  // Recycle the oldest retained event once it completed and is old enough.
  while (!ring.empty() && (export_serial_ - ring.front().serial >= kRetainedExports ||
                           now - ring.front().exported_at >= kRetainSeconds)) {
    cudaError_t q = cudaEventQuery(ring.front().event);
    if (q == cudaErrorNotReady) break;
    cudaEvent_t ev = ring.front().event;
    ring.pop_front();
    if (q == cudaSuccess) return ev;
    (void)cudaGetLastError();
    cudaEventDestroy(ev);
  }
  auto& pool = free_export_[device];
  if (!pool.empty()) {
    cudaEvent_t ev = pool.back();
    pool.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming);
  if (err != cudaSuccess) return Status::Internal(CudaErrorText("cudaEventCreateWithFlags(interprocess)", err));
  return ev;
}

Result<std::string> CudaRuntime::ExportEvent(int device, cudaEvent_t event) {
  cudaIpcEventHandle_t h;
  cudaError_t err = cudaIpcGetEventHandle(&h, event);
  MutexLock lock(&mu_);
  if (err != cudaSuccess) {
    free_export_[device].push_back(event);
    return Status::Internal(CudaErrorText("cudaIpcGetEventHandle", err));
  }
  retained_[device].push_back({event, ++export_serial_, NowSeconds()});
  static_assert(sizeof(h) == kIpcHandleBytes);
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

Result<cudaEvent_t> CudaRuntime::AcquireMarker(int device) {
  {
    MutexLock lock(&mu_);
    auto& pool = free_marker_[device];
    if (!pool.empty()) {
      cudaEvent_t ev = pool.back();
      pool.pop_back();
      return ev;
    }
  }
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDefault);
  if (err != cudaSuccess) return Status::Internal(CudaErrorText("cudaEventCreateWithFlags", err));
  return ev;
}

Status CudaRuntime::WaitTimeline(int device, cudaStream_t stream, const EventHandle& h,
                                 std::vector<std::shared_ptr<void>>* keep_alive) {
  if (h.sequence == 0) return Status::Ok();  // never recorded: already complete
  if (!wait_value64_) {
    return Status::FailedPrecondition(
        "the client sent a timeline-semaphore event (lmcache isolated IPC), but this CUDA "
        "driver does not provide cuStreamWaitValue64");
  }
  auto alloc = OpenAllocation(device, h.handle);
  if (!alloc.ok()) return alloc.status();
  if ((*alloc)->bytes != 0 && h.slot_offset + kTimelineSlotBytes > (*alloc)->bytes) {
    return Status::InvalidArgument("timeline event slot " + std::to_string(h.slot_offset) +
                                   " lies outside its " + std::to_string((*alloc)->bytes) +
                                   "-byte semaphore buffer");
  }
  auto addr = reinterpret_cast<CUdeviceptr>((*alloc)->base + h.slot_offset);
  CUresult r = reinterpret_cast<WaitValueFn>(wait_value64_)(stream, addr, h.sequence,
                                                             CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) {
    return Status::Internal("cuStreamWaitValue64 failed with CUresult " + std::to_string(r));
  }
  keep_alive->push_back(*alloc);
  return Status::Ok();
}

Result<uint64_t> CudaRuntime::AllocateTimelineSlot(int device) {
  if (!write_value64_) {
    return Status::FailedPrecondition(
        "timeline-semaphore events (lmcache isolated IPC) need cuStreamWriteValue64, which this "
        "CUDA driver does not provide");
  }
  MutexLock lock(&mu_);
  Timeline& t = timelines_[device];
  constexpr uint64_t kSlots = 4096;
  if (t.base == nullptr) {
    cudaError_t err = cudaSetDevice(device);
    void* p = nullptr;
    if (err == cudaSuccess) err = cudaMalloc(&p, kSlots * kTimelineSlotBytes);
    if (err == cudaSuccess) err = cudaMemset(p, 0, kSlots * kTimelineSlotBytes);
    cudaIpcMemHandle_t h;
    if (err == cudaSuccess) err = cudaIpcGetMemHandle(&h, p);
    if (err != cudaSuccess) {
      if (p) cudaFree(p);
      return Status::Internal(CudaErrorText("timeline semaphore buffer", err));
    }
    t.base = static_cast<uint8_t*>(p);
    std::memcpy(t.handle.data(), &h, kIpcHandleBytes);
  }
  if (!t.free_slots.empty()) {
    uint64_t off = t.free_slots.back();
    t.free_slots.pop_back();
    return off;
  }
  if (t.next_slot >= kSlots) return Status::ResourceExhausted("no free timeline-semaphore slot");
  return (t.next_slot++) * kTimelineSlotBytes;
}

void CudaRuntime::ReleaseTimelineSlot(int device, uint64_t slot_offset) {
  MutexLock lock(&mu_);
  timelines_[device].free_slots.push_back(slot_offset);  // its sequence keeps counting up
}

Result<std::string> CudaRuntime::RecordTimeline(int device, cudaStream_t stream,
                                                uint64_t slot_offset) {
  MutexLock lock(&mu_);
  Timeline& t = timelines_[device];
  const uint64_t seq = ++t.sequence[slot_offset];
  auto addr = reinterpret_cast<CUdeviceptr>(t.base + slot_offset);
  CUresult r = reinterpret_cast<WriteValueFn>(write_value64_)(stream, addr, seq,
                                                               CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) {
    --t.sequence[slot_offset];
    return Status::Internal("cuStreamWriteValue64 failed with CUresult " + std::to_string(r));
  }
  EventHandle e;
  e.kind = EventKind::kTimeline;
  e.handle = t.handle;
  e.slot_offset = slot_offset;
  e.sequence = seq;
  return EncodeEventHandle(e);
}

// ---- completion ------------------------------------------------------------------------

void CUDART_CB CudaRuntime::HostWakeup(void* p) {
  // Runs on a CUDA driver thread: no CUDA calls here.
  auto* rt = static_cast<CudaRuntime*>(p);
  {
    MutexLock lock(&rt->done_mu_);
    ++rt->wakeups_;
  }
  rt->done_cv_.NotifyOne();
}

cudaError_t CudaRuntime::LaunchWakeup(cudaStream_t stream) {
  return cudaLaunchHostFunc(stream, &CudaRuntime::HostWakeup, this);
}

void CudaRuntime::Track(std::unique_ptr<PendingCopy> copy) {
  {
    MutexLock lock(&done_mu_);
    pending_.push_back(std::move(copy));
  }
  done_cv_.NotifyOne();
}

void CudaRuntime::Finish(PendingCopy& c, const Status& st) {
  const Status& report = st.ok() ? c.forced : st;
  if (!report.ok()) spdlog::warn("GPU copy {} failed: {}", c.ticket, report.ToString());
  cudaSetDevice(c.device);
  if (report.ok() && c.on_copy_timed && c.started && c.marker) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, c.started, c.marker) == cudaSuccess) {
      c.on_copy_timed(static_cast<double>(ms) / 1e3);
    } else {
      (void)cudaGetLastError();  // no sample; the copy itself succeeded
    }
  }
  c.on_copy_timed = nullptr;
  if (c.on_complete) c.on_complete(report);
  c.on_complete = nullptr;
  if (c.imported) cudaEventDestroy(c.imported);
  for (cudaEvent_t ev : {c.marker, c.started}) {
    if (!ev) continue;
    if (st.ok()) {
      MutexLock lock(&mu_);
      free_marker_[c.device].push_back(ev);
    } else {
      cudaEventDestroy(ev);
    }
  }
  c.keep_alive.clear();
  c.book->Complete(c.ticket, report);
}

void CudaRuntime::CompletionLoop() {
  constexpr auto kPoll = std::chrono::milliseconds(2);
  uint64_t seen = 0;
  std::deque<std::unique_ptr<PendingCopy>> work;
  while (true) {
    {
      MutexLock lock(&done_mu_);
      if (pending_.empty() && work.empty()) {
        while (pending_.empty()) done_cv_.Wait(&done_mu_);
      } else if (wakeups_ == seen) {
        // Woken by a host function or a new copy, or after kPoll at most (a spurious wakeup
        // only costs one more pass over `work`).
        done_cv_.WaitFor(&done_mu_, kPoll);
      }
      seen = wakeups_;
      while (!pending_.empty()) {
        work.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    // Submission order; each copy is checked on its own, so a copy waiting for a slow
    // client does not hold back the completion of other instances' copies.
    for (auto it = work.begin(); it != work.end();) {
      PendingCopy& c = **it;
      cudaSetDevice(c.device);
      cudaError_t q = cudaEventQuery(c.marker);
      if (q == cudaErrorNotReady) {
        ++it;
        continue;
      }
      Status st;
      if (q != cudaSuccess) {
        (void)cudaGetLastError();
        st = Status::Internal(CudaErrorText("GPU copy", q));
      }
      Finish(c, st);
      it = work.erase(it);
    }
  }
}

}  // namespace kvd::transfer::cuda
