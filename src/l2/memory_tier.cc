#include "l2/memory_tier.h"

#include <cstring>

namespace kvd::l2 {
namespace {
std::vector<ItemResult> Closed(size_t n) {
  return std::vector<ItemResult>(n, ItemResult{Status::Unavailable("tier is closed"), 0});
}
}  // namespace

MemoryTier::MemoryTier(uint64_t capacity_bytes, std::string type)
    : capacity_(capacity_bytes), type_(std::move(type)) {}

MemoryTier::~MemoryTier() { Close(); }

void MemoryTier::Close() { pool_.Close(); }

size_t MemoryTier::size() const {
  MutexLock lock(&mu_);
  return objects_.size();
}

uint64_t MemoryTier::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

void MemoryTier::Put(const ObjectKey& key, std::vector<uint8_t> data) {
  MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it != objects_.end()) bytes_ -= it->second.size();
  bytes_ += data.size();
  objects_[key] = std::move(data);
}

void MemoryTier::Store(std::vector<StoreItem> items, Done done) {
  const size_t n = items.size();
  if (!pool_.Submit([this, items = std::move(items), done]() mutable {
        std::vector<ItemResult> out;
        MutexLock lock(&mu_);
        for (const auto& it : items) {
          if (objects_.count(it.key)) {
            out.push_back({Status::Ok(), 0});
          } else if (capacity_ && bytes_ + it.size > capacity_) {
            out.push_back({Status::ResourceExhausted("memory tier is full"), 0});
          } else {
            objects_.emplace(it.key, std::vector<uint8_t>(it.data, it.data + it.size));
            bytes_ += it.size;
            out.push_back({Status::Ok(), it.size});
          }
        }
        done(std::move(out));
      })) {
    done(Closed(n));
  }
}

void MemoryTier::Exists(std::vector<ObjectKey> keys, Done done) {
  const size_t n = keys.size();
  if (!pool_.Submit([this, keys = std::move(keys), done] {
        std::vector<ItemResult> out;
        MutexLock lock(&mu_);
        for (const auto& k : keys) {
          auto it = objects_.find(k);
          out.push_back(it == objects_.end() ? ItemResult{Status::NotFound("absent"), 0}
                                             : ItemResult{Status::Ok(), it->second.size()});
        }
        done(std::move(out));
      })) {
    done(Closed(n));
  }
}

void MemoryTier::Load(std::vector<LoadItem> items, Done done) {
  const size_t n = items.size();
  if (!pool_.Submit([this, items = std::move(items), done] {
        std::vector<ItemResult> out;
        MutexLock lock(&mu_);
        for (const auto& it : items) {
          auto f = objects_.find(it.key);
          if (f == objects_.end()) {
            out.push_back({Status::NotFound("absent"), 0});
          } else if (it.size_is_capacity ? f->second.size() > it.size : f->second.size() != it.size) {
            out.push_back({Status::Internal("stored object has " + std::to_string(f->second.size()) +
                                            " bytes, expected " + std::to_string(it.size)), 0});
          } else {
            std::memcpy(it.dst, f->second.data(), f->second.size());
            out.push_back({Status::Ok(), f->second.size()});
          }
        }
        done(std::move(out));
      })) {
    done(Closed(n));
  }
}

void MemoryTier::Delete(std::vector<ObjectKey> keys, Done done) {
  const size_t n = keys.size();
  if (!pool_.Submit([this, keys = std::move(keys), done] {
        std::vector<ItemResult> out;
        MutexLock lock(&mu_);
        for (const auto& k : keys) {
          auto it = objects_.find(k);
          if (it == objects_.end()) {
            out.push_back({Status::Ok(), 0});
          } else {
            out.push_back({Status::Ok(), it->second.size()});
            bytes_ -= it->second.size();
            objects_.erase(it);
          }
        }
        done(std::move(out));
      })) {
    done(Closed(n));
  }
}

void MemoryTier::Scan(ScanDone done) {
  if (!pool_.Submit([this, done] {
        std::vector<ScannedObject> out;
        MutexLock lock(&mu_);
        for (const auto& [k, v] : objects_) out.push_back({k, v.size(), 0});
        done(std::move(out));
      })) {
    done(Status::Unavailable("tier is closed"));
  }
}

}  // namespace kvd::l2
