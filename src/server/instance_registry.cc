#include "server/instance_registry.h"

#include "common/model_name.h"

#include <algorithm>

namespace kvd::server {

Status CheckInstanceIdentity(const std::string& model_name, int64_t world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return Status::InvalidArgument("world_size " + std::to_string(world_size) +
                                   " out of range [1, " + std::to_string(kMaxWorldSize) + "]");
  }
  return CheckModelName(model_name);
}

std::shared_ptr<const Instance> InstanceRegistry::Find(int64_t id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  it->second.last_seen_ns = clock_->NowNanos();
  return it->second.instance;
}

std::shared_ptr<const Instance> InstanceRegistry::Peek(int64_t id) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.instance;
}

void InstanceRegistry::Put(std::shared_ptr<const Instance> inst) {
  const int64_t id = inst->id;
  std::shared_ptr<const Instance> replaced;  // released outside the lock
  MutexLock lock(&mu_);
  Entry& e = entries_[id];
  replaced = std::move(e.instance);
  e.instance = std::move(inst);
  e.last_seen_ns = clock_->NowNanos();
}

Status InstanceRegistry::PutExclusive(std::shared_ptr<const Instance> inst) {
  const int64_t id = inst->id;
  std::shared_ptr<const Instance> replaced;  // released outside the lock
  MutexLock lock(&mu_);
  for (const auto& [other_id, e] : entries_) {
    if (other_id == id) continue;  // re-registering replaces its own mappings
    for (const auto& mine : inst->memory_ids) {
      const auto& theirs = e.instance->memory_ids;
      if (std::find(theirs.begin(), theirs.end(), mine) != theirs.end()) {
        return Status::FailedPrecondition("memory " + mine + " is already registered by instance " +
                                          std::to_string(other_id));
      }
    }
  }
  Entry& e = entries_[id];
  replaced = std::move(e.instance);
  e.instance = std::move(inst);
  e.last_seen_ns = clock_->NowNanos();
  return Status::Ok();
}

bool InstanceRegistry::Touch(int64_t id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  it->second.last_seen_ns = clock_->NowNanos();
  return true;
}

void InstanceRegistry::Ping(int64_t id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  it->second.last_seen_ns = clock_->NowNanos();
  it->second.pinged = true;
}

std::shared_ptr<const Instance> InstanceRegistry::Remove(int64_t id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  auto gone = std::move(it->second.instance);
  entries_.erase(it);
  return gone;
}

bool InstanceRegistry::RemoveIf(int64_t id, const Instance* expected) {
  std::shared_ptr<const Instance> gone;  // released outside the lock
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.instance.get() != expected) return false;
  gone = std::move(it->second.instance);
  entries_.erase(it);
  return true;
}

bool InstanceRegistry::ModelRegistered(const std::string& model, int64_t world_size) const {
  MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (e.instance->model_name == model && e.instance->world_size == world_size) return true;
  }
  return false;
}

InstanceRegistry::Namespace InstanceRegistry::KeyNamespace(const std::string& model,
                                                          int64_t world_size) const {
  Namespace out;
  MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (e.instance->model_name != model || e.instance->world_size != world_size) continue;
    if (!out.registered) {
      out.registered = true;
      out.key_namespace = e.instance->key_namespace;
    } else if (out.key_namespace != e.instance->key_namespace) {
      out.agreed = false;
    }
  }
  return out;
}

size_t InstanceRegistry::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

std::vector<InstanceRegistry::Silent> InstanceRegistry::SilentSince(
    int64_t now, int64_t pinged_limit_ns, int64_t unpinged_limit_ns) const {
  std::vector<Silent> out;
  MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    const int64_t silent = now - e.last_seen_ns;
    if (silent > (e.pinged ? pinged_limit_ns : unpinged_limit_ns)) {
      out.push_back({id, silent, e.pinged});
    }
  }
  return out;
}

std::vector<InstanceRegistry::Entry> InstanceRegistry::Snapshot() const {
  MutexLock lock(&mu_);
  std::vector<Entry> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(e);
  return out;
}

}  // namespace kvd::server
