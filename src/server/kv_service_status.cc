// KvService's read-only status accessors (/status, /metrics, the dashboard). Kept apart
// from the request paths: nothing here changes state, and every lock is held only long
// enough to copy plain data out.
#include <sstream>

#include "server/kv_service.h"

namespace kvd::server {
namespace {

std::string EngineDrivenLayout(const Instance& inst) {
  std::ostringstream os;
  os << "engine-driven object [";
  for (size_t i = 0; i < inst.object_shape.size(); ++i) {
    os << (i ? ", " : "") << inst.object_shape[i];
  }
  os << "] " << inst.dtype;
  return os.str();
}

}  // namespace

ServiceStatus KvService::StatusSnapshot() {
  ServiceStatus st;
  std::vector<std::shared_ptr<const Instance>> insts;
  std::vector<int64_t> seen;
  std::vector<bool> pinged;
  const int64_t now = clock_->NowNanos();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, inst] : instances_) {
      insts.push_back(inst);
      auto it = last_seen_ns_.find(id);
      seen.push_back(it == last_seen_ns_.end() ? now : it->second);
      pinged.push_back(pinged_.count(id) > 0);
    }
  }
  // Describe() formats strings: done outside the lock, on the shared, immutable instance.
  for (size_t i = 0; i < insts.size(); ++i) {
    const Instance& inst = *insts[i];
    InstanceStatus s;
    s.instance_id = inst.id;
    s.engine_driven = inst.engine_driven;
    s.model_name = inst.model_name;
    s.world_size = inst.world_size;
    s.layout = inst.engine_driven ? EngineDrivenLayout(inst) : inst.layout.Describe();
    s.object_bytes = inst.object_bytes;
    s.num_mappings = inst.mappings.size();
    s.idle_seconds = static_cast<double>(std::max<int64_t>(0, now - seen[i])) * 1e-9;
    s.pinged = pinged[i];
    st.instances.push_back(std::move(s));
  }
  st.sessions = sessions_.size();
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    st.pending_engine_stores = pending_stores_.size();
    st.pending_engine_retrieves = pending_retrieves_.size();
  }
  return st;
}

}  // namespace kvd::server
