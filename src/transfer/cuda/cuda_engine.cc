// CudaCopyEngine: the CopyEngine for one registered vLLM worker whose KV cache lives in GPU
// memory of another process (CUDA IPC). Built only when kvd is compiled with CUDA.
//
// Per instance it owns two non-blocking streams on the worker's device — `main` (ordered
// with the client: waits on the client's event, runs the kernels, records the exported
// event) and `copy` (PCIe transfers) — a device copy of the DevicePlan, and a ring of
// kSlots staging objects, so chunk i+1 is gathered while chunk i is copied to L1:
//
//   STORE  main: wait client event │ for each chunk, slot s:
//            main: wait free[s] → gather kernel → staging[s] → record filled[s]
//            copy: wait filled[s] → D2H staging[s] → L1 object → record free[s]
//          main: wait copy (join) → record exported event → marker → host wakeup
//          (with a timing event `started` after the client's wait when the caller wants the
//          copy's device time: started → marker)
//   RETRIEVE (same ring, roles swapped)
//            copy: wait free[s] → H2D L1 object → staging[s] → record filled[s]
//            main: wait filled[s] → scatter kernel (skip_tokens) → record free[s]
//
//   DEVICE WORK (SubmitDeviceWork: CacheBlend's scatter + re-RoPE, built by the caller)
//            main: alloc scratch │ params: alloc, H2D params → record ready
//            main: wait ready → wait client event → H2D uploads → scratch → the caller's
//                  launch → record exported event → marker → free scratch, params
//
// Everything a Submit enqueues is serialised by the engine mutex, so the streams see each
// instance's requests in order; engines of different instances run concurrently. The copy's
// completion (on_complete: L1 commit or unpin) runs on the runtime's completion thread once
// the marker has fired, never earlier.
//
// Cancel (a copy outlived its TTL: the client's event never fired) refuses later Submits and
// releases what the engine can release from its side: the waits on a client's timeline
// semaphore are satisfied by writing the awaited value into the semaphore slot, so the
// streams drain and the completions (with the cancellation as their status) run normally. A
// wait on a client's CUDA IPC event cannot be released from kvd's side: that copy's memory
// stays held (never reused) until the event fires or the engine's teardown gives up on it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/mutex.h"
#include "transfer/copy_engine.h"
#include "transfer/cuda/copy_kernels.h"
#include "transfer/cuda/cuda_runtime.h"
#include "transfer/cuda/device_plan.h"
#include "transfer/cuda/ipc_handles.h"

namespace kvd::transfer {
namespace cuda {
namespace {

constexpr int kSlots = 2;
constexpr uint64_t kStagingAlign = 256;
constexpr auto kDrainTimeout = std::chrono::seconds(30);

#define KVD_CUDA_TRY(call)                                              \
  do {                                                                  \
    cudaError_t _e = (call);                                            \
    if (_e != cudaSuccess) return Status::Internal(CudaErrorText(#call, _e)); \
  } while (0)

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(CudaRuntime* rt, const layout::KvLayout& layout, int64_t instance_id)
      : rt_(rt), layout_(layout), instance_id_(instance_id), book_(std::make_shared<TicketBook>()) {
    caps_.name = "cuda";
    caps_.asynchronous = true;
    caps_.device_memory = true;
    caps_.exports_events = true;
    caps_.max_block_ids_per_chunk = kMaxIdsPerChunk;
  }

  ~CudaCopyEngine() override;

  Status Open(const std::vector<layout::TensorDescriptor>& tensors, const HostPool& pool);

  const EngineCaps& caps() const override { return caps_; }
  Result<Submitted> Submit(CopyPlan plan) override KVD_EXCLUDES(mu_);
  Result<bool> Poll(Ticket t) override { return book_->Poll(t); }
  Status Wait(Ticket t, std::chrono::milliseconds timeout) override { return book_->Wait(t, timeout); }
  std::string Describe() const override { return describe_; }
  void Cancel() override KVD_EXCLUDES(mu_);
  std::span<uint8_t* const> device_tensor_bases() const override { return tensor_bases_; }
  std::span<const uint64_t> device_tensor_sizes() const override { return tensor_sizes_; }
  Result<Submitted> SubmitDeviceWork(DeviceWork work) override KVD_EXCLUDES(mu_);
  Result<std::vector<uint8_t>> ReadDeviceTensor(const layout::TensorDescriptor& desc,
                                                uint64_t offset, uint64_t length) override;

 private:
  // A timeline-semaphore wait on a client (what Cancel writes to release it).
  struct TimelineWait {
    std::shared_ptr<IpcAllocation> semaphore;
    uint64_t slot_offset = 0;
    uint64_t sequence = 0;
  };
  struct ClientWait {
    std::unique_ptr<PendingCopy> pending;
    EventKind reply = EventKind::kNone;
    cudaEvent_t exported = nullptr;
    TimelineWait timeline_wait;
  };

  // Enqueues the per-chunk work; returns the first CUDA error (later chunks not enqueued).
  Status EnqueueChunks(const CopyPlan& plan) KVD_REQUIRES(mu_);
  // Device work's params into fresh device memory (*device), on `params_`; `main` waits for
  // them. Error: nothing allocated.
  Status UploadParams(const std::vector<uint8_t>& params, void** device) KVD_REQUIRES(mu_);
  // Every submission, in two halves around its own work: WaitForClient makes `main` wait for
  // the client's event (errors: nothing enqueued; the caller still owns its completion);
  // the caller enqueues its work after it; FinishAfterWork records the event the client
  // gets back and the marker whose completion runs `done` (`work` is the status of the
  // caller's enqueueing: not OK cuts the submission short, reported as Submitted::status).
  Result<ClientWait> WaitForClient(std::string_view wait_event, std::function<void(double)> timed,
                                   std::vector<std::shared_ptr<void>> keep) KVD_REQUIRES(mu_);
  Submitted FinishAfterWork(ClientWait w, Status work, std::function<void(const Status&)> done)
      KVD_REQUIRES(mu_);

  CudaRuntime* const rt_;
  const layout::KvLayout layout_;
  const int64_t instance_id_;
  std::shared_ptr<TicketBook> book_;
  EngineCaps caps_;
  std::string describe_;
  int device_ = -1;
  EventKind default_event_ = EventKind::kCudaIpc;

  DevicePlan plan_;
  std::vector<uint8_t*> tensor_bases_;  // by registration index (null: unused by the layout)
  std::vector<uint64_t> tensor_sizes_;
  std::vector<std::shared_ptr<IpcAllocation>> allocations_;
  std::shared_ptr<HostRegistration> host_;
  void* plan_dev_ = nullptr;
  const DevGroup* d_groups_ = nullptr;
  const DevLayer* d_layers_ = nullptr;
  const DevRun* d_runs_ = nullptr;
  cudaStream_t main_ = nullptr, copy_ = nullptr;
  uint8_t* staging_ = nullptr;
  uint64_t slot_bytes_ = 0;
  cudaEvent_t filled_[kSlots] = {}, free_[kSlots] = {}, join_ = nullptr;
  uint64_t timeline_slot_ = UINT64_MAX;

  Mutex mu_;  // serialises Submit (stream order = request order) and Cancel
  unsigned next_slot_ KVD_GUARDED_BY(mu_) = 0;
  ChunkKernelArgs args_ KVD_GUARDED_BY(mu_);  // scratch; too large for the stack habitually
  std::map<IpcHandle, std::shared_ptr<IpcAllocation>> client_semaphores_ KVD_GUARDED_BY(mu_);
  // Timeline-semaphore waits of copies not yet known to be complete: what Cancel writes.
  std::map<Ticket, TimelineWait> timeline_waits_ KVD_GUARDED_BY(mu_);
  bool cancelled_ KVD_GUARDED_BY(mu_) = false;
  // Device work's params upload (created by the first SubmitDeviceWork).
  cudaStream_t params_ KVD_GUARDED_BY(mu_) = nullptr;
  cudaEvent_t params_ready_ KVD_GUARDED_BY(mu_) = nullptr;
  // Read by completions (on the runtime's thread): once set, every completion reports the
  // cancellation instead of success, so nothing gathered after a released wait is committed.
  std::shared_ptr<std::atomic<bool>> cancel_flag_ = std::make_shared<std::atomic<bool>>(false);
};

void CudaCopyEngine::Cancel() {
  MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  cancel_flag_->store(true);
  size_t released = 0;
  if (device_ >= 0) cudaSetDevice(device_);
  for (const auto& [ticket, w] : timeline_waits_) {
    auto done = book_->Poll(ticket);
    if (!done.ok() || *done) continue;  // completed (or failed) already
    const uint64_t value = w.sequence;
    cudaError_t err = cudaMemcpy(w.semaphore->base + w.slot_offset, &value, sizeof(value),
                                 cudaMemcpyHostToDevice);
    if (err == cudaSuccess) {
      ++released;
    } else {
      (void)cudaGetLastError();
      spdlog::error("instance {}: could not release a timeline wait: {}", instance_id_,
                    CudaErrorText("cudaMemcpy", err));
    }
  }
  timeline_waits_.clear();
  spdlog::warn("instance {}: copy engine cancelled; {} timeline wait(s) released, {} copy(ies) "
               "outstanding (their memory stays held until they complete)",
               instance_id_, released, book_->outstanding());
}

Status CudaCopyEngine::Open(const std::vector<layout::TensorDescriptor>& tensors,
                            const HostPool& pool) {
  // 1. Which tensors the plan touches, and where their memory is.
  std::vector<bool> used(tensors.size(), false);
  for (const auto& g : layout_.groups) {
    for (const auto& acc : g.layers) used.at(acc.tensor_index) = true;
  }
  std::vector<TensorMemory> mem;
  std::vector<size_t> index;  // mem[k] describes tensors[index[k]]
  bool any_raw = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!used[i]) continue;
    auto m = DescribeTensorMemory(tensors[i], i);
    if (!m.ok()) return m.status();
    if (!mem.empty() && m->device != mem.front().device) {
      return Status::InvalidArgument("kv_cache[" + std::to_string(i) + "] is on " +
                                     FormatDeviceUuid(m->device) + " but kv_cache[" +
                                     std::to_string(index.front()) + "] on " +
                                     FormatDeviceUuid(mem.front().device) +
                                     "; one worker's KV cache must live on one GPU");
    }
    any_raw = any_raw || tensors[i].memory == layout::TensorMemory::kCudaRaw;
    mem.push_back(*m);
    index.push_back(i);
  }
  if (mem.empty()) return Status::InvalidArgument("no GPU tensor to copy");
  auto ordinal = FindDeviceOrdinal(mem.front().device, rt_->device_uuids());
  if (!ordinal) {
    std::string seen;
    for (int d = 0; d < rt_->device_count(); ++d) {
      seen += (d ? ", " : "") + FormatDeviceUuid(rt_->device_uuids()[d]);
    }
    return Status::FailedPrecondition("the worker's GPU " + FormatDeviceUuid(mem.front().device) +
                                      " is not visible to kvd (it sees " + seen +
                                      "); start kvd with every worker GPU visible "
                                      "(CUDA_VISIBLE_DEVICES)");
  }
  device_ = *ordinal;
  caps_.device_index = device_;
  default_event_ = any_raw ? EventKind::kTimeline : EventKind::kCudaIpc;
  KVD_CUDA_TRY(cudaSetDevice(device_));

  // 2. Open each allocation once; check every tensor against its allocation's size.
  std::vector<uint64_t> base(tensors.size(), 0), bytes(tensors.size(), 0);
  for (const auto& use : GroupByAllocation(mem)) {
    auto a = rt_->OpenAllocation(device_, use.handle);
    if (!a.ok()) {
      return Status(a.status().code() == StatusCode::kInvalidArgument
                        ? Status::InvalidArgument("kv_cache[" + std::to_string(index[use.tensors[0]]) +
                                                  "]: " + a.status().message())
                        : a.status());
    }
    for (size_t k : use.tensors) {
      KVD_RETURN_IF_ERROR(CheckInAllocation(mem[k], (*a)->bytes, index[k]));
      base[index[k]] = reinterpret_cast<uint64_t>((*a)->base) + mem[k].offset;
      bytes[index[k]] = mem[k].bytes;
    }
    allocations_.push_back(*a);
  }

  for (size_t i = 0; i < tensors.size(); ++i) {
    tensor_bases_.push_back(reinterpret_cast<uint8_t*>(base[i]));
    tensor_sizes_.push_back(bytes[i]);
  }

  // 3. The plan, on the device.
  auto plan = BuildDevicePlan(layout_, base, bytes);
  if (!plan.ok()) return plan.status();
  plan_ = std::move(plan).value();
  const size_t gbytes = plan_.groups.size() * sizeof(DevGroup);
  const size_t lbytes = plan_.layers.size() * sizeof(DevLayer);
  const size_t rbytes = plan_.runs.size() * sizeof(DevRun);
  KVD_CUDA_TRY(cudaMalloc(&plan_dev_, gbytes + lbytes + rbytes));
  auto* p = static_cast<uint8_t*>(plan_dev_);
  KVD_CUDA_TRY(cudaMemcpy(p, plan_.groups.data(), gbytes, cudaMemcpyHostToDevice));
  KVD_CUDA_TRY(cudaMemcpy(p + gbytes, plan_.layers.data(), lbytes, cudaMemcpyHostToDevice));
  KVD_CUDA_TRY(cudaMemcpy(p + gbytes + lbytes, plan_.runs.data(), rbytes, cudaMemcpyHostToDevice));
  d_groups_ = reinterpret_cast<const DevGroup*>(p);
  d_layers_ = reinterpret_cast<const DevLayer*>(p + gbytes);
  d_runs_ = reinterpret_cast<const DevRun*>(p + gbytes + lbytes);

  // 4. Streams, staging ring, events.
  KVD_CUDA_TRY(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking));
  KVD_CUDA_TRY(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  slot_bytes_ = (plan_.object_bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  void* staging = nullptr;
  KVD_CUDA_TRY(cudaMalloc(&staging, slot_bytes_ * kSlots));
  staging_ = static_cast<uint8_t*>(staging);
  for (int s = 0; s < kSlots; ++s) {
    KVD_CUDA_TRY(cudaEventCreateWithFlags(&filled_[s], cudaEventDisableTiming));
    KVD_CUDA_TRY(cudaEventCreateWithFlags(&free_[s], cudaEventDisableTiming));
  }
  KVD_CUDA_TRY(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));

  // 5. Events PyTorch asks the receiver to wait on once before first use.
  std::set<IpcHandle> synced;
  for (const auto& m : mem) {
    if (!m.sync_event || !synced.insert(m.event).second) continue;
    cudaIpcEventHandle_t h;
    std::memcpy(&h, m.event.data(), sizeof(h));
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaIpcOpenEventHandle(&ev, h);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      spdlog::warn("instance {}: {} (storage event, ignored)", instance_id_,
                   CudaErrorText("cudaIpcOpenEventHandle", err));
      continue;
    }
    cudaStreamWaitEvent(main_, ev, 0);
    cudaEventDestroy(ev);  // the wait already captured it
  }

  // 6. L1 pinned for DMA (shared by every engine on this pool), in the background: the
  // registration does not wait for it (issue 26 item 4).
  if (pool.base != nullptr && pool.bytes > 0) host_ = rt_->RegisterHost(device_, pool.base, pool.bytes);

  std::ostringstream os;
  os << "cuda engine on GPU " << device_ << " (" << rt_->device_name(device_) << ", "
     << FormatDeviceUuid(mem.front().device) << "): " << allocations_.size()
     << " IPC allocation(s) for " << mem.size() << " tensor(s); " << DescribePlan(plan_) << "; "
     << kSlots << " x " << slot_bytes_ << " B staging; L1 "
     << (host_ ? host_->state() : "pageable") << "; events "
     << (default_event_ == EventKind::kTimeline ? "timeline-semaphore" : "cuda-ipc");
  describe_ = os.str();
  return Status::Ok();
}

CudaCopyEngine::~CudaCopyEngine() {
  if (device_ < 0) return;  // Open failed before touching the device
  cudaSetDevice(device_);
  // In-flight copies read and write memory this engine (and L1) owns: let them finish.
  const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
  bool idle = false;
  while (!idle) {
    const cudaError_t a = main_ ? cudaStreamQuery(main_) : cudaSuccess;
    const cudaError_t b = copy_ ? cudaStreamQuery(copy_) : cudaSuccess;
    const cudaError_t c = params_ ? cudaStreamQuery(params_) : cudaSuccess;
    idle = a != cudaErrorNotReady && b != cudaErrorNotReady && c != cudaErrorNotReady;
    if (!idle && std::chrono::steady_clock::now() > deadline) break;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!idle || !book_->Drain(kDrainTimeout)) {
    spdlog::error("instance {}: GPU copies still running {} s after unregistration; leaking the "
                  "engine's CUDA resources rather than freeing memory in use",
                  instance_id_, kDrainTimeout.count());
    for (auto& a : allocations_) new std::shared_ptr<IpcAllocation>(std::move(a));  // leak
    if (host_) new std::shared_ptr<HostRegistration>(std::move(host_));
    return;
  }
  (void)cudaGetLastError();
  for (int s = 0; s < kSlots; ++s) {
    if (filled_[s]) cudaEventDestroy(filled_[s]);
    if (free_[s]) cudaEventDestroy(free_[s]);
  }
  if (join_) cudaEventDestroy(join_);
  if (staging_) cudaFree(staging_);
  if (plan_dev_) cudaFree(plan_dev_);
  if (main_) cudaStreamDestroy(main_);
  if (copy_) cudaStreamDestroy(copy_);
  if (params_ready_) cudaEventDestroy(params_ready_);
  if (params_) cudaStreamDestroy(params_);
  if (timeline_slot_ != UINT64_MAX) rt_->ReleaseTimelineSlot(device_, timeline_slot_);
}

Status CudaCopyEngine::EnqueueChunks(const CopyPlan& plan) {
  const bool gather = plan.direction == CopyDirection::kGather;
  args_.groups = d_groups_;
  args_.layers = d_layers_;
  args_.runs = d_runs_;
  args_.num_groups = static_cast<uint32_t>(plan_.groups.size());
  args_.tiles = plan_.tiles_per_chunk;
  args_.chunk_tokens = plan_.chunk_tokens;
  for (const ChunkTask& task : plan.tasks) {
    if (!gather && task.skip_tokens >= layout_.chunk_tokens) continue;
    const unsigned s = next_slot_++ % kSlots;
    uint8_t* slot = staging_ + s * slot_bytes_;
    args_.object = slot;
    args_.skip_tokens = gather ? 0 : task.skip_tokens;
    PackChunkIds(plan_, plan.block_ids, task.chunk, args_.ids);
    if (gather) {
      KVD_CUDA_TRY(cudaStreamWaitEvent(main_, free_[s], 0));
      KVD_CUDA_TRY(LaunchChunkCopy(args_, true, main_));
      KVD_CUDA_TRY(cudaEventRecord(filled_[s], main_));
      KVD_CUDA_TRY(cudaStreamWaitEvent(copy_, filled_[s], 0));
      KVD_CUDA_TRY(cudaMemcpyAsync(task.object, slot, plan_.object_bytes, cudaMemcpyDeviceToHost, copy_));
      KVD_CUDA_TRY(cudaEventRecord(free_[s], copy_));
    } else {
      KVD_CUDA_TRY(cudaStreamWaitEvent(copy_, free_[s], 0));
      KVD_CUDA_TRY(cudaMemcpyAsync(slot, task.object, plan_.object_bytes, cudaMemcpyHostToDevice, copy_));
      KVD_CUDA_TRY(cudaEventRecord(filled_[s], copy_));
      KVD_CUDA_TRY(cudaStreamWaitEvent(main_, filled_[s], 0));
      KVD_CUDA_TRY(LaunchChunkCopy(args_, false, main_));
      KVD_CUDA_TRY(cudaEventRecord(free_[s], main_));
    }
  }
  return Status::Ok();
}

Result<Submitted> CudaCopyEngine::Submit(CopyPlan plan) {
  MutexLock lock(&mu_);
  if (cancelled_) return Status::Unavailable("the copy engine was cancelled");
  int64_t chunks = 0;
  for (const auto& t : plan.tasks) {
    if (t.object == nullptr || t.chunk < 0) return Status::InvalidArgument("copy plan has a task without an object");
    chunks = std::max(chunks, t.chunk + 1);
  }
  KVD_RETURN_IF_ERROR(ValidateBlockIds(layout_, plan.block_ids, chunks));
  auto w = WaitForClient(plan.wait_event, std::move(plan.on_copy_timed), {});
  if (!w.ok()) return w.status();
  // From here on work is on the streams: whatever happens, the client gets an event that
  // fires after it, and the completion waits for it.
  Status st = EnqueueChunks(plan);
  if (plan.direction == CopyDirection::kGather) {
    cudaError_t e1 = cudaEventRecord(join_, copy_);
    cudaError_t e2 = e1 == cudaSuccess ? cudaStreamWaitEvent(main_, join_, 0) : e1;
    if (e2 != cudaSuccess && st.ok()) st = Status::Internal(CudaErrorText("join copy stream", e2));
  }
  return FinishAfterWork(std::move(w).value(), std::move(st), std::move(plan.on_complete));
}

Result<Submitted> CudaCopyEngine::SubmitDeviceWork(DeviceWork work) {
  MutexLock lock(&mu_);
  if (cancelled_) return Status::Unavailable("the copy engine was cancelled");
  if (!work.prepare) return Status::InvalidArgument("device work without steps");
  KVD_CUDA_TRY(cudaSetDevice(device_));
  // Scratch and params are allocated and freed on `main`: the frees, enqueued after the work
  // (or after nothing, when it is refused), run once the stream is past it.
  void* scratch = nullptr;
  void* params_dev = nullptr;
  auto free_all = [&] {
    if (params_dev) cudaFreeAsync(params_dev, main_);
    if (scratch) cudaFreeAsync(scratch, main_);
  };
  if (work.scratch_bytes > 0) KVD_CUDA_TRY(cudaMallocAsync(&scratch, work.scratch_bytes, main_));
  auto steps = work.prepare(static_cast<uint8_t*>(scratch));
  if (!steps.ok()) {
    free_all();
    return steps.status();
  }
  for (const auto& u : steps->uploads) {
    if (u.host == nullptr || u.scratch_offset > work.scratch_bytes ||
        u.bytes > work.scratch_bytes - u.scratch_offset) {
      free_all();
      return Status::InvalidArgument("device work uploads outside its scratch");
    }
  }
  // The params are pageable host memory, whose copy first waits for its stream to drain: they
  // go up on their own stream (nothing on it waits for a client), and `main` waits for them.
  auto params = std::make_shared<std::vector<uint8_t>>(std::move(steps->params));
  if (!params->empty()) {
    Status up = UploadParams(*params, &params_dev);
    if (!up.ok()) {
      free_all();
      return up;
    }
  }
  auto w = WaitForClient(work.wait_event, nullptr, {params});
  if (!w.ok()) {
    free_all();
    return w.status();
  }
  Status st;
  for (const auto& u : steps->uploads) {
    cudaError_t e = cudaMemcpyAsync(static_cast<uint8_t*>(scratch) + u.scratch_offset, u.host,
                                    u.bytes, cudaMemcpyHostToDevice, main_);
    if (e != cudaSuccess) {
      st = Status::Internal(CudaErrorText("cudaMemcpyAsync (device work upload)", e));
      break;
    }
  }
  if (st.ok() && steps->launch) st = steps->launch(main_, reinterpret_cast<uint64_t>(params_dev));
  Submitted out = FinishAfterWork(std::move(w).value(), std::move(st), std::move(work.on_complete));
  free_all();
  return out;
}

Status CudaCopyEngine::UploadParams(const std::vector<uint8_t>& params, void** device) {
  if (params_ == nullptr) {
    KVD_CUDA_TRY(cudaStreamCreateWithFlags(&params_, cudaStreamNonBlocking));
    KVD_CUDA_TRY(cudaEventCreateWithFlags(&params_ready_, cudaEventDisableTiming));
  }
  KVD_CUDA_TRY(cudaMallocAsync(device, params.size(), params_));
  cudaError_t e = cudaMemcpyAsync(*device, params.data(), params.size(), cudaMemcpyHostToDevice, params_);
  if (e == cudaSuccess) e = cudaEventRecord(params_ready_, params_);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(main_, params_ready_, 0);
  if (e != cudaSuccess) {
    cudaFreeAsync(*device, params_);
    *device = nullptr;
    return Status::Internal(CudaErrorText("device work params upload", e));
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> CudaCopyEngine::ReadDeviceTensor(const layout::TensorDescriptor& desc,
                                                              uint64_t offset, uint64_t length) {
  auto m = DescribeTensorMemory(desc, std::string("the tensor"));
  if (!m.ok()) return m.status();
  if (m->device != rt_->device_uuids()[device_]) {
    return Status::InvalidArgument("the tensor is on GPU " + FormatDeviceUuid(m->device) +
                                   ", not on this instance's GPU " +
                                   FormatDeviceUuid(rt_->device_uuids()[device_]));
  }
  if (offset > m->bytes || length > m->bytes - offset) {
    return Status::InvalidArgument("bytes [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + length) + ") extend past its " +
                                   std::to_string(m->bytes) + "-byte GPU storage");
  }
  KVD_CUDA_TRY(cudaSetDevice(device_));
  auto a = rt_->OpenAllocation(device_, m->handle);
  if (!a.ok()) return a.status();
  KVD_RETURN_IF_ERROR(CheckInAllocation(*m, (*a)->bytes, std::string("the tensor")));
  if (m->sync_event) {  // PyTorch's "written before it was shared" event
    cudaIpcEventHandle_t h;
    std::memcpy(&h, m->event.data(), sizeof(h));
    cudaEvent_t ev = nullptr;
    if (cudaIpcOpenEventHandle(&ev, h) == cudaSuccess) {
      cudaEventSynchronize(ev);
      cudaEventDestroy(ev);
    } else {
      (void)cudaGetLastError();
    }
  }
  std::vector<uint8_t> out(length);
  KVD_CUDA_TRY(cudaMemcpy(out.data(), (*a)->base + m->offset + offset, length, cudaMemcpyDeviceToHost));
  return out;
}

Result<CudaCopyEngine::ClientWait> CudaCopyEngine::WaitForClient(
    std::string_view wait_event, std::function<void(double)> timed,
    std::vector<std::shared_ptr<void>> keep) {
  std::erase_if(timeline_waits_, [&](const auto& kv) {
    auto finished = book_->Poll(kv.first);
    return !finished.ok() || *finished;
  });
  auto wait = ParseEventHandle(wait_event);
  if (!wait.ok()) return wait.status();
  const EventKind reply = wait->kind != EventKind::kNone ? wait->kind : default_event_;
  KVD_CUDA_TRY(cudaSetDevice(device_));
  // Everything that can fail without side effects comes first.
  auto pending = std::make_unique<PendingCopy>();
  pending->book = book_;
  pending->device = device_;
  pending->keep_alive = std::move(keep);
  auto marker = rt_->AcquireMarker(device_);
  if (!marker.ok()) return marker.status();
  pending->marker = *marker;
  cudaEvent_t exported = nullptr;
  if (reply == EventKind::kCudaIpc) {
    auto ev = rt_->AcquireExportEvent(device_);
    if (!ev.ok()) return ev.status();
    exported = *ev;
  } else if (timeline_slot_ == UINT64_MAX) {
    auto slot = rt_->AllocateTimelineSlot(device_);
    if (!slot.ok()) return slot.status();
    timeline_slot_ = *slot;
  }
  TimelineWait timeline_wait;
  auto give_back = [&] {
    // Nothing was enqueued: return the events unrecorded.
    cudaEventDestroy(pending->marker);
    if (exported) cudaEventDestroy(exported);
  };
  if (wait->kind == EventKind::kCudaIpc) {
    cudaIpcEventHandle_t h;
    std::memcpy(&h, wait->handle.data(), sizeof(h));
    cudaError_t err = cudaIpcOpenEventHandle(&pending->imported, h);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      give_back();
      return Status::InvalidArgument(CudaErrorText("cudaIpcOpenEventHandle (client event)", err));
    }
    err = cudaStreamWaitEvent(main_, pending->imported, 0);
    if (err != cudaSuccess) {
      cudaEventDestroy(pending->imported);
      give_back();
      return Status::Internal(CudaErrorText("cudaStreamWaitEvent (client event)", err));
    }
  } else if (wait->kind == EventKind::kTimeline) {
    if (wait->sequence != 0) {
      auto it = client_semaphores_.find(wait->handle);
      if (it == client_semaphores_.end()) {
        auto a = rt_->OpenAllocation(device_, wait->handle);
        if (!a.ok()) {
          give_back();
          return a.status();
        }
        it = client_semaphores_.emplace(wait->handle, *a).first;
      }
      pending->keep_alive.push_back(it->second);
      timeline_wait = {it->second, wait->slot_offset, wait->sequence};
    }
    Status st = rt_->WaitTimeline(device_, main_, *wait, &pending->keep_alive);
    if (!st.ok()) {
      give_back();
      return st;
    }
  }

  // The copy's device time starts here, after the client's event (issue 26 item 6). Without
  // an event to time from, the copy is simply not timed.
  if (timed) {
    auto started = rt_->AcquireMarker(device_);
    if (started.ok() && cudaEventRecord(*started, main_) == cudaSuccess) {
      pending->started = *started;
      pending->on_copy_timed = std::move(timed);
    } else if (started.ok()) {
      (void)cudaGetLastError();
      cudaEventDestroy(*started);
    }
  }

  ClientWait w;
  w.pending = std::move(pending);
  w.reply = reply;
  w.exported = exported;
  w.timeline_wait = std::move(timeline_wait);
  return w;
}

Submitted CudaCopyEngine::FinishAfterWork(ClientWait w, Status work,
                                          std::function<void(const Status&)> done) {
  std::unique_ptr<PendingCopy>& pending = w.pending;
  Submitted out;
  out.status = std::move(work);
  if (w.reply == EventKind::kCudaIpc) {
    cudaError_t err = cudaEventRecord(w.exported, main_);
    auto h = err == cudaSuccess ? rt_->ExportEvent(device_, w.exported)
                                : Result<std::string>(Status::Internal(CudaErrorText("cudaEventRecord", err)));
    if (h.ok()) {
      out.event_handle = *h;
    } else if (out.status.ok()) {
      out.status = h.status();
    }
  } else {
    auto h = rt_->RecordTimeline(device_, main_, timeline_slot_);
    if (h.ok()) {
      out.event_handle = *h;
    } else if (out.status.ok()) {
      out.status = h.status();
    }
  }
  cudaError_t err = cudaEventRecord(pending->marker, main_);
  if (err == cudaSuccess) err = rt_->LaunchWakeup(main_);
  if (err != cudaSuccess) {
    // The marker may never fire: make sure nothing still runs before the completion
    // releases the memory the copy uses.
    if (out.status.ok()) out.status = Status::Internal(CudaErrorText("completion marker", err));
    cudaStreamSynchronize(main_);
    cudaStreamSynchronize(copy_);
  }
  pending->forced = out.status;
  pending->on_complete = [flag = cancel_flag_, done = std::move(done)](const Status& st) {
    if (!done) return;
    done(flag->load() ? Status::Unavailable("the copy engine was cancelled") : st);
  };
  pending->ticket = book_->Issue();
  out.ticket = pending->ticket;
  if (w.timeline_wait.semaphore) timeline_waits_.emplace(out.ticket, std::move(w.timeline_wait));
  rt_->Track(std::move(pending));
  return out;
}

}  // namespace
}  // namespace cuda

Result<std::unique_ptr<CopyEngine>> OpenDeviceEngine(
    const std::vector<layout::TensorDescriptor>& tensors, const layout::KvLayout& layout,
    const HostPool& pool, int64_t instance_id) {
  auto rt = cuda::CudaRuntime::Get();
  if (!rt.ok()) return rt.status();
  auto engine = std::make_unique<cuda::CudaCopyEngine>(*rt, layout, instance_id);
  Status st = engine->Open(tensors, pool);
  if (!st.ok()) return st;
  spdlog::info("instance {}: {}", instance_id, engine->Describe());
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

}  // namespace kvd::transfer
