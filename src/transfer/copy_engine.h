// CopyEngine: executes one registered worker's copy plan (layout::KvLayout) between its
// paged KV blocks and kvd's canonical chunk objects in L1. One engine per registered
// instance; per-backend state (shared-memory mappings, CUDA streams, staging buffers,
// imported IPC memory) lives inside the engine, never in the caller.
//
// Implementations:
//   CpuCopyEngine   tensors in host (POSIX shared) memory; Submit copies on the caller's
//                   thread (with a few helper threads), runs on_complete and returns a
//                   completed ticket (cpu_copy_engine.cc).
//   CUDA engine     tensors in another process's GPU memory (CUDA IPC); Submit enqueues
//                   the copy on the instance's stream and returns at once, with an
//                   interprocess event handle the client waits on. Built only when kvd is
//                   compiled with CUDA (see OpenDeviceEngine).
//
// Ordering and threads. Submit may be called from any thread; calls on one engine are
// serialised internally and their copies execute in submission order (one stream per
// instance). Different engines copy concurrently. Poll/Wait may be called from any thread.
//
// Completion. A plan's `on_complete(status)` runs exactly once, after every byte of the
// copy landed (status OK) or after the copy failed or was abandoned (status not OK). It runs
// on an engine-owned thread (or, for a synchronous engine, inside Submit), must not call
// back into the engine, and is where the caller commits L1 write reservations or drops
// read pins: objects are committed only after their bytes are complete.
//
// Lifetime. Destroying an engine waits (bounded) for its in-flight copies and their
// on_complete callbacks; the memory named by a plan's tasks must stay valid until then.
//
// Cancellation. A copy may never complete on its own (a GPU copy waits on the client's
// event, which a broken or hostile client never fires). Cancel() abandons the engine: later
// Submits fail, and each outstanding copy reports completion — with a non-OK status — only
// once no byte of its memory can be touched any more (its stream drained or its device work
// torn down). The memory named by its tasks must stay allocated to it until then: the
// caller frees it from on_complete, never from the outside (see l1_cache.h, COPY IN FLIGHT).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "layout/layout.h"
#include "layout/tensor_spec.h"
#include "transfer/cpu_copy.h"
#include "transfer/shm_mapping.h"

namespace kvd::transfer {

enum class CopyDirection : uint8_t {
  kGather,   // STORE: paged blocks → objects
  kScatter,  // RETRIEVE: objects → paged blocks (honouring ChunkTask::skip_tokens)
};

// What an engine can do; callers branch on these, never on the engine's type.
struct EngineCaps {
  const char* name = "";
  bool asynchronous = false;    // Submit returns before the copy completes
  bool device_memory = false;   // the registered tensors live in GPU memory
  int device_index = -1;        // device_memory: the GPU's ordinal in this process (-1: none)
  bool exports_events = false;  // Submitted::event_handle carries an interprocess event
  uint32_t max_block_ids_per_chunk = 0;  // 0: no limit
};

// One STORE or RETRIEVE worth of copying, over the engine's registered layout.
// block_ids must have passed ValidateBlockIds for the chunks the tasks name.
struct CopyPlan {
  CopyDirection direction = CopyDirection::kGather;
  std::vector<std::vector<int64_t>> block_ids;
  std::vector<ChunkTask> tasks;            // objects of layout.object_bytes bytes in L1
  std::string wait_event;                  // client's event handle; empty: nothing to wait for
  std::function<void(const Status&)> on_complete;  // may be empty
  // May be empty. An engine that times its copies on the device (the CUDA engine: from when
  // the client's event has fired to the copy's end, so not the wait for the client) calls it
  // once, before on_complete, with that time in seconds, when the copy succeeded. Others
  // never call it: a synchronous engine's caller times Submit itself.
  std::function<void(double seconds)> on_copy_timed;
};

// Device work other than a copy plan (CacheBlend's scatter + re-RoPE), run by a device
// engine on the instance's stream, ordered with its copies. At submission the engine gets
// `scratch_bytes` of device scratch and calls `prepare` with its address (null for 0 bytes);
// `prepare` returns the steps, built for that address. Then, on the stream: the `params`
// bytes put in device memory (they depend on nothing of the client's), the client's
// `wait_event`, each upload (host bytes -> scratch), and `launch`. The scratch and the
// params' device copy are freed after the work, in stream order. If `prepare` fails, nothing
// is enqueued and its error is returned.
struct DeviceSteps {
  struct Upload {
    const uint8_t* host = nullptr;  // must stay valid until on_complete
    uint64_t scratch_offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<Upload> uploads;
  std::vector<uint8_t> params;  // copied by the engine (may be empty)
  // The work itself, called once by the engine. A CUDA engine calls it inside
  // SubmitDeviceWork with its cudaStream_t (device current) to enqueue the work. An engine
  // whose "device memory" is host memory (a host engine standing in for a GPU in tests)
  // passes a null stream when the work is due, and the work runs on the host then.
  // `params_address` is where `params` lie for the work.
  std::function<Status(void* stream, uint64_t params_address)> launch;
};

struct DeviceWork {
  std::string wait_event;  // client's event handle; empty: nothing to wait for
  uint64_t scratch_bytes = 0;
  std::function<Result<DeviceSteps>(uint8_t* scratch)> prepare;
  std::function<void(const Status&)> on_complete;  // as CopyPlan's
};

using Ticket = uint64_t;

struct Submitted {
  Ticket ticket = 0;
  // Handle of the event that fires when the copy is complete, for the client to wait on.
  // Empty when the engine is synchronous (the copy is done when Submit returns).
  std::string event_handle;
  // Not OK when the copy was cut short after part of it was enqueued (a CUDA error): the
  // event handle is still valid and must be waited on, and on_complete will report the
  // failure. OK otherwise.
  Status status;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const EngineCaps& caps() const = 0;

  // Starts the copy. On error nothing was enqueued and on_complete has not run (the
  // caller still owns the decision); with Status OK, on_complete runs exactly once later
  // (or already ran, for a synchronous engine).
  virtual Result<Submitted> Submit(CopyPlan plan) = 0;

  // true: the ticket's copy finished successfully; false: still running; an error: it
  // failed. Tickets complete in submission order. Unknown (future) tickets: InvalidArgument.
  virtual Result<bool> Poll(Ticket ticket) = 0;

  // Blocks until the ticket completed (its status) or `timeout` passed (Unavailable).
  virtual Status Wait(Ticket ticket, std::chrono::milliseconds timeout) = 0;

  // One line for logs and /status.
  virtual std::string Describe() const = 0;

  // Device engines (caps().device_memory) only; the defaults say the engine has none.
  // Where each registered tensor's mapping starts in device memory, by registration index
  // (0 for a tensor the layout does not use); empty for a host engine. Fixed for the
  // engine's life.
  virtual std::span<uint8_t* const> device_tensor_bases() const { return {}; }
  // Mapped bytes of each tensor, as device_tensor_bases.
  virtual std::span<const uint64_t> device_tensor_sizes() const { return {}; }
  // Runs `work` (see DeviceWork); completion and errors as Submit's.
  virtual Result<Submitted> SubmitDeviceWork(DeviceWork work) {
    (void)work;
    return Status::FailedPrecondition(std::string(caps().name) + " engine runs no device work");
  }
  // Copies bytes [offset, offset + length) of the storage a "cuda" or "cuda_raw" descriptor
  // maps (on this engine's GPU) to the host, synchronously: a small table a client registers
  // (CacheBlend's cos/sin cache). InvalidArgument for a descriptor that does not parse, names
  // another GPU, or a range outside its storage.
  virtual Result<std::vector<uint8_t>> ReadDeviceTensor(const layout::TensorDescriptor& desc,
                                                         uint64_t offset, uint64_t length) {
    (void)desc;
    (void)offset;
    (void)length;
    return Status::FailedPrecondition(std::string(caps().name) + " engine reads no device memory");
  }

  // Abandons the engine (see Cancellation above): Submit fails from now on; outstanding
  // copies are cut short where the backend can and complete with a non-OK status once their
  // memory is no longer touched. Does not wait; safe from any thread, idempotent.
  virtual void Cancel() = 0;
};

// CPU engine over host memory: `tensor_bases[i]` is the first byte of tensor i's mapping.
// The engine owns `mappings` (the worker's shared-memory segments the bases point into) and
// unmaps them when it is destroyed; a caller that keeps the memory mapped itself passes
// none. A plan is copied by up to `max_threads` threads (about one per 4 MiB it copies).
std::unique_ptr<CopyEngine> MakeCpuCopyEngine(const layout::KvLayout& layout,
                                              std::vector<uint8_t*> tensor_bases, int max_threads,
                                              std::vector<ShmMapping> mappings = {});

// Host memory that device engines copy to and from (kvd's L1 pool). Device engines may pin
// it (page-lock it for DMA) for as long as any of them is alive.
struct HostPool {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
};

// Opens the GPU tensors of one registration (CUDA IPC descriptors, all on one device) and
// builds a CUDA engine for `layout` (which BuildLayout made from the same descriptors).
// Errors: FailedPrecondition when this kvd was built without CUDA or no usable CUDA
// driver/device is present (kvd keeps serving CPU workers); InvalidArgument for bad
// handles, unknown device UUIDs, or tensors outside their allocation; Internal for CUDA
// failures. Defined by the CUDA engine when kvd is built with CUDA, else by a stub.
Result<std::unique_ptr<CopyEngine>> OpenDeviceEngine(
    const std::vector<layout::TensorDescriptor>& tensors, const layout::KvLayout& layout,
    const HostPool& pool, int64_t instance_id);

// What KvService calls for GPU registrations: OpenDeviceEngine, unless a test installed a
// factory (an asynchronous host engine standing in for the GPU, so the server's device path
// — deferred commits, event handles — is tested on machines without one).
using DeviceEngineFactory = std::function<Result<std::unique_ptr<CopyEngine>>(
    const std::vector<layout::TensorDescriptor>&, const layout::KvLayout&, const HostPool&,
    int64_t)>;
Result<std::unique_ptr<CopyEngine>> MakeDeviceEngine(
    const std::vector<layout::TensorDescriptor>& tensors, const layout::KvLayout& layout,
    const HostPool& pool, int64_t instance_id);
// The device memory `tensors` live in, one id per distinct allocation in registration order:
// "cuda <device uuid> <hex of the IPC handle>". A descriptor that does not parse is skipped
// (an engine opened from these tensors refused or ignored it). Names what a GPU registration
// maps, for /status and for the check that two instances do not share memory.
std::vector<std::string> DeviceMemoryIds(const std::vector<layout::TensorDescriptor>& tensors);

// Installs (or, with an empty function, removes) the test factory. Call it while no
// registration is running.
void SetDeviceEngineFactoryForTesting(DeviceEngineFactory factory);

}  // namespace kvd::transfer
