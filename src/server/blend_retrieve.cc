// BlendOps: cb_retrieve_pre_computed (blend_ops.h): the lookup's matches checked against the
// client's, pinned, and scattered re-rotated into the worker's registered KV. The rest of
// BlendOps is in blend_ops.cc.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "blend/cuda/blend_device_plan.h"
#include "blend/scatter.h"
#include "server/blend_ops.h"
#include "server/chunk_keys.h"
#include "server/kvd_copy_transfers.h"
#include "transfer/bus_error_guard.h"

#if KVD_WITH_CUDA
#include "blend/cuda/blend_kernels.h"
#endif

namespace kvd::server {
namespace {

// Runs a device plan where its engine says: on its stream (the CUDA kernel), or, for an
// engine whose "device memory" is host memory (null stream), on the host (the kernel's own
// code, emulated).
Status RunBlendPlan(const blend::cuda::BlendDevicePlan& plan, void* stream, uint64_t params_address) {
  if (stream == nullptr) {
    blend::cuda::EmulateBlendScatter(plan);
    return Status::Ok();
  }
#if KVD_WITH_CUDA
  const cudaError_t e = blend::cuda::LaunchBlendScatter(
      blend::cuda::BlendArgsAt(plan, params_address), static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    return Status::Internal(std::string("CacheBlend scatter kernel launch: ") + cudaGetErrorString(e));
  }
  return Status::Ok();
#else
  (void)params_address;
  return Status::FailedPrecondition("this kvd was built without CUDA");
#endif
}

}  // namespace

Result<bool> BlendOps::RetrievePreComputed(const wire::CbRetrievePreComputedRequest& req,
                                           std::string* event_handle) {
  if (event_handle) event_handle->clear();
  m_.retrieve_requests.Add();
  auto fail = [&](Status st) -> Result<bool> {
    m_.retrieve_failures.Add();
    return st;
  };
  auto inst = registry_->Find(req.instance_id);
  if (!inst || inst->engine_driven()) {
    return fail(Status::NotFound("cb_retrieve_pre_computed: instance " +
                                 std::to_string(req.instance_id) + " has no registered KV cache"));
  }
  std::shared_ptr<const RopeState> rope;
  {
    MutexLock lock(&rope_mu_);
    auto it = rope_.find(req.instance_id);
    if (it != rope_.end()) rope = it->second;
  }
  if (!rope) {
    return fail(Status::FailedPrecondition("cb_retrieve_pre_computed: instance " +
                                           std::to_string(req.instance_id) +
                                           " has no rope registered; send CB_REGISTER_ROPE first"));
  }
  if (rope->instance.lock() != inst) {
    return fail(Status::FailedPrecondition(
        "cb_retrieve_pre_computed: instance " + std::to_string(req.instance_id) +
        " re-registered its KV cache since its rope registration; send CB_REGISTER_ROPE again"));
  }
  if (Status st = KeyMatchesInstance("cb_retrieve_pre_computed", req.key, *inst); !st.ok()) {
    return fail(st);
  }
  const int64_t worker = req.key.worker_id.value_or(0);
  if (worker < 0 || worker >= inst->world_size) {
    return fail(Status::InvalidArgument("cb_retrieve_pre_computed: worker_id " +
                                        std::to_string(worker) + " outside the world size"));
  }
  const uint32_t slot = static_cast<uint32_t>(worker);
  const std::string& rid = req.key.request_id;
  // The namespace the key names (the instance's own, checked above): the lookup's matches are
  // used only if they were found in it.
  std::optional<l1::NamespaceId> key_ns;
  {
    std::string model;
    KeyModelNameInto(&model, inst->model_name, inst->key_namespace);
    key_ns = l1_->namespaces().Find(model, static_cast<int32_t>(inst->world_size), req.key.cache_salt);
  }
  const std::string owner = LockOwner(rid);
  if (req.match_results.empty()) {
    m_.retrieve_noops.Add();
    return true;
  }
  // The client's matches must be the lookup's (never trusted): same ranges and hash, in
  // this request's namespace; each maps to its lock index.
  std::vector<l1::ChunkKey> keys;
  std::vector<size_t> lock_index;
  {
    MutexLock lock(&req_mu_);
    auto it = requests_.find(rid);
    if (it == requests_.end()) {
      spdlog::warn("cb_retrieve_pre_computed: request '{}' has no blend lookup held (ended, "
                   "expired or already retrieved by every worker); nothing scattered", rid);
      m_.retrieve_failures.Add();
      return false;
    }
    auto& st = it->second;
    if (!st.finished && (!key_ns || *key_ns != st.ns)) {
      spdlog::warn("cb_retrieve_pre_computed: request '{}': its key names another model, world "
                   "size or cache salt than its lookup; nothing scattered", rid);
      m_.retrieve_failures.Add();
      return false;
    }
    if (st.finished || std::find(st.done.begin(), st.done.end(), worker) != st.done.end()) {
      m_.retrieve_noops.Add();
      return true;  // a repeat: already scattered
    }
    for (const auto& m : req.match_results) {
      size_t j = 0;
      for (; j < st.found.size(); ++j) {
        const auto& f = st.found[j].match;
        if (f.old_st == m.old_st && f.old_ed == m.old_ed && f.cur_st == m.cur_st &&
            f.cur_ed == m.cur_ed && f.hash == m.hash) {
          break;
        }
      }
      if (j == st.found.size()) {
        spdlog::warn("cb_retrieve_pre_computed: request '{}': a match [{}, {}) -> [{}, {}) is not "
                     "one its lookup found; nothing scattered", rid, m.old_st, m.old_ed, m.cur_st,
                     m.cur_ed);
        m_.retrieve_failures.Add();
        return false;
      }
      keys.push_back(st.found[j].key);
      lock_index.push_back(j);
    }
  }
  transfer::CopyEngine& engine = *inst->kvd().engine;
  const bool on_device = inst->kvd().cpu_tensor_bases.empty();
  if (on_device && !engine.caps().device_memory) {
    spdlog::warn("cb_retrieve_pre_computed: instance {} keeps its KV on {} and its engine ({}) "
                 "runs no device work; answering scatter_ran=false", req.instance_id,
                 inst->kvd().device, engine.caps().name);
    m_.retrieve_failures.Add();
    return false;
  }
  // Pin this worker's objects.
  std::vector<l1::ReadPin> pins;
  std::vector<blend::BlendMatch> matches;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto pin = l1_->PinForRead(keys[i], slot);
    if (!pin.ok() || pin->size() != inst->object_bytes) {
      spdlog::warn("cb_retrieve_pre_computed: request '{}': a matched chunk is gone or has "
                   "another size; nothing scattered", rid);
      m_.retrieve_failures.Add();
      return false;
    }
    const auto& m = req.match_results[i];
    blend::BlendMatch bm;
    bm.old_st = m.old_st;
    bm.cur_st = m.cur_st;
    bm.n_tokens = m.cur_ed - m.cur_st;
    bm.object = pin->data();
    bm.object_bytes = pin->size();
    matches.push_back(bm);
    pins.push_back(std::move(pin).value());
  }
  // On a GPU instance the destinations are device addresses: planning checks them against
  // the mapped sizes and dereferences nothing.
  blend::ScatterRequest sr;
  sr.layout = &inst->kvd().layout;
  sr.tensor_bases = on_device ? engine.device_tensor_bases() : inst->kvd().cpu_tensor_bases;
  sr.tensor_sizes = on_device ? engine.device_tensor_sizes() : inst->kvd().cpu_tensor_sizes;
  sr.block_ids = req.block_ids;
  sr.matches = matches;
  sr.rope = rope->groups;
  sr.null_block_id = config_.null_block_id;
  auto plan = blend::PlanScatter(sr);
  // This worker's part of the lookup is over: its locks go (the pins keep its objects) and it
  // is marked done.
  auto finish_worker = [&] {
    MutexLock lock(&req_mu_);
    auto it = requests_.find(rid);
    if (it == requests_.end()) return;
    for (size_t j : lock_index) l1_->ReleaseLocks(owner, j, 1, slot);
    it->second.done.push_back(worker);
    if (it->second.done.size() >= std::max<size_t>(it->second.world, it->second.readers)) {
      // Every worker retrieved: no lock is left; the state stays (without its matches) so that
      // a repeated call answers true, until END_SESSION, a new lookup or the TTL.
      l1_->ReleaseAllLocks(owner);
      it->second.found.clear();
      it->second.finished = true;
    }
  };
  auto release = [&] {
    l1::ReleaseInReverse(pins);
    finish_worker();
  };
  if (!plan.ok()) {
    spdlog::warn("cb_retrieve_pre_computed: request '{}': {}", rid, plan.status().ToString());
    release();
    m_.retrieve_failures.Add();
    return false;
  }
  switch (plan->reason()) {
    case blend::RetrieveReason::kMatchesBeyondAlloc:
      // Deferred: nothing is allocated yet; the engine asks again later (locks kept).
      m_.retrieve_noops.Add();
      return true;
    case blend::RetrieveReason::kMatchesStraddleAlloc:
      release();
      m_.retrieve_failures.Add();
      return false;
    case blend::RetrieveReason::kOk:
      break;
  }
  uint64_t tokens = 0;
  for (const auto& m : matches) tokens += static_cast<uint64_t>(m.n_tokens);
  if (on_device) {
    const bool ran = ScatterOnDevice(inst, rid, sr, std::move(pins), req.event_handle, event_handle);
    finish_worker();
    if (!ran) {
      m_.retrieve_failures.Add();
      return false;
    }
  } else {
    auto run = [&] { blend::ExecuteScatter(*plan); };
    if (!transfer::RunCatchingBusErrors(run)) {
      spdlog::warn("cb_retrieve_pre_computed: instance {}: its shared memory faulted under the "
                   "scatter (truncated?); the request must recompute", req.instance_id);
      release();
      m_.retrieve_failures.Add();
      return false;
    }
    release();
  }
  m_.retrieve_chunks.Add(matches.size());
  m_.scatter_tokens.Add(tokens);
  m_.scatter_shifted_chunks.Add(plan->num_rotated_matches());
  return true;
}

bool BlendOps::ScatterOnDevice(const std::shared_ptr<const Instance>& inst, const std::string& rid,
                               const blend::ScatterRequest& host_request,
                               std::vector<l1::ReadPin> pins, const std::string& wait_event,
                               std::string* event_handle) {
  // Each object goes to device scratch first (one H2D copy from the pinned L1 object), and
  // the plan reads it there.
  constexpr uint64_t kAlign = 256;
  const uint64_t object_bytes = host_request.layout->object_bytes;
  const uint64_t stride = (object_bytes + kAlign - 1) / kAlign * kAlign;
  const std::span<const blend::BlendMatch> matches = host_request.matches;
  transfer::DeviceWork work;
  work.wait_event = wait_event;
  work.scratch_bytes = stride * matches.size();
  work.prepare = [&](uint8_t* scratch) -> Result<transfer::DeviceSteps> {
    std::vector<blend::BlendMatch> staged(matches.begin(), matches.end());
    for (size_t i = 0; i < staged.size(); ++i) staged[i].object = scratch + i * stride;
    blend::ScatterRequest request = host_request;
    request.matches = staged;
    auto built = blend::cuda::BuildBlendDevicePlan(request);
    if (!built.ok()) return built.status();
    if (built->reason != blend::RetrieveReason::kOk) {
      return Status::Internal("the device plan's outcome differs from the host plan's");
    }
    auto plan = std::make_shared<const blend::cuda::BlendDevicePlan>(std::move(built).value());
    transfer::DeviceSteps steps;
    for (size_t i = 0; i < matches.size(); ++i) {
      steps.uploads.push_back({matches[i].object, i * stride, object_bytes});
    }
    steps.params = plan->blob;
    steps.launch = [plan](void* stream, uint64_t params_address) {
      return RunBlendPlan(*plan, stream, params_address);
    };
    return steps;
  };
  // The objects stay pinned until the device is done with them.
  work.on_complete = [held = std::make_shared<std::vector<l1::ReadPin>>(std::move(pins)),
                      rid](const Status& st) {
    if (!st.ok()) {
      spdlog::warn("cb_retrieve_pre_computed: request '{}': the device scatter failed: {}", rid,
                   st.ToString());
    }
    l1::ReleaseInReverse(*held);
  };
  auto sub = copies_->SubmitDeviceWork(inst, std::move(work));
  if (!sub.ok()) {
    spdlog::warn("cb_retrieve_pre_computed: request '{}': the device scatter was refused: {}", rid,
                 sub.status().ToString());
    return false;
  }
  if (event_handle) *event_handle = sub->event_handle;
  if (!sub->status.ok()) {
    spdlog::warn("cb_retrieve_pre_computed: request '{}': the device scatter was cut short: {}",
                 rid, sub->status.ToString());
    return false;
  }
  return true;
}

}  // namespace kvd::server
