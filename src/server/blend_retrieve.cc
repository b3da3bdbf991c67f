// BlendOps: cb_retrieve_pre_computed (blend_ops.h): the lookup's matches checked against the
// client's, pinned, and scattered re-rotated into the worker's registered KV. The rest of
// BlendOps is in blend_ops.cc.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "blend/scatter.h"
#include "server/blend_ops.h"
#include "server/chunk_keys.h"
#include "transfer/bus_error_guard.h"

namespace kvd::server {

Result<bool> BlendOps::RetrievePreComputed(const wire::CbRetrievePreComputedRequest& req) {
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
  if (inst->kvd().cpu_tensor_bases.empty()) {
    spdlog::warn("cb_retrieve_pre_computed: instance {} keeps its KV on {}: kvd's blend scatter "
                 "is CPU-only for now; answering scatter_ran=false", req.instance_id, inst->kvd().device);
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
  blend::ScatterRequest sr;
  sr.layout = &inst->kvd().layout;
  sr.tensor_bases = inst->kvd().cpu_tensor_bases;
  sr.tensor_sizes = inst->kvd().cpu_tensor_sizes;
  sr.block_ids = req.block_ids;
  sr.matches = matches;
  sr.rope = rope->groups;
  sr.null_block_id = config_.null_block_id;
  auto plan = blend::PlanScatter(sr);
  auto release = [&] {
    ReleaseInReverse(pins);
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
  auto run = [&] { blend::ExecuteScatter(*plan); };
  if (!transfer::RunCatchingBusErrors(run)) {
    spdlog::warn("cb_retrieve_pre_computed: instance {}: its shared memory faulted under the "
                 "scatter (truncated?); the request must recompute", req.instance_id);
    release();
    m_.retrieve_failures.Add();
    return false;
  }
  uint64_t tokens = 0;
  for (const auto& m : matches) tokens += static_cast<uint64_t>(m.n_tokens);
  m_.retrieve_chunks.Add(matches.size());
  m_.scatter_tokens.Add(tokens);
  m_.scatter_shifted_chunks.Add(plan->num_rotated_matches());
  release();
  return true;
}

}  // namespace kvd::server
