// The tier implementations the contract suite runs over, each with what it needs around it
// (a temporary directory, a real redis-server, a real 3-master cluster) and a way to plant a
// truncated object behind the tier's back.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "l2/fs_tier.h"
#include "l2/memory_tier.h"
#include "l2/resp_tier.h"
#include "redis_process.h"

namespace kvd::l2::testing {

class TierBackend {
 public:
  virtual ~TierBackend() = default;
  virtual Result<std::shared_ptr<Tier>> Make() = 0;
  // Replaces the stored object with its first `size` bytes.
  virtual Status Truncate(Tier& tier, const ObjectKey& key, size_t size) = 0;
};

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvd-l2-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class MemoryBackend final : public TierBackend {
 public:
  Result<std::shared_ptr<Tier>> Make() override {
    tier_ = std::make_shared<MemoryTier>();
    return std::shared_ptr<Tier>(tier_);
  }
  Status Truncate(Tier&, const ObjectKey& key, size_t size) override {
    tier_->Put(key, std::vector<uint8_t>(size, 7));
    return Status::Ok();
  }

 private:
  std::shared_ptr<MemoryTier> tier_;
};

class FsBackend final : public TierBackend {
 public:
  explicit FsBackend(bool native_odirect) : native_(native_odirect) {}
  Result<std::shared_ptr<Tier>> Make() override {
    FsTierOptions o;
    o.type = native_ ? "fs_native" : "fs";
    o.base_path = dir_.path() + "/kv";
    o.use_odirect = native_;
    o.relative_tmp_dir = native_ ? "tmp" : "";
    o.num_workers = native_ ? 4 : 2;
    auto t = FsTier::Create(o);
    if (!t.ok()) return t.status();
    return std::shared_ptr<Tier>(std::move(t).value());
  }
  Status Truncate(Tier& tier, const ObjectKey& key, size_t size) override {
    auto* fs = dynamic_cast<FsTier*>(&tier);
    if (!fs || ::truncate(fs->PathOf(key).c_str(), static_cast<off_t>(size)) != 0) {
      return Status::Internal("truncate failed");
    }
    return Status::Ok();
  }

 private:
  bool native_;
  TempDir dir_;
};

class RespBackend final : public TierBackend {
 public:
  explicit RespBackend(bool cluster) : cluster_(cluster) {}
  Result<std::shared_ptr<Tier>> Make() override {
    RespTierOptions o;
    o.num_workers = 4;
    if (cluster_) {
      KVD_RETURN_IF_ERROR(cluster_nodes_.Start());
      o.type = "valkey";
      o.cluster = true;
      o.key_prefix = "kvdtest";
      for (int i = 0; i < 3; ++i) o.seeds.push_back(cluster_nodes_.node(i).endpoint());
    } else {
      KVD_RETURN_IF_ERROR(server_.Start());
      o.type = "resp";
      o.seeds = {server_.endpoint()};
    }
    auto t = RespTier::Create(o);
    if (!t.ok()) return t.status();
    prefix_ = o.key_prefix;
    return std::shared_ptr<Tier>(std::move(t).value());
  }
  Status Truncate(Tier&, const ObjectKey& key, size_t size) override {
    const std::string k = RespKey(key, prefix_);
    const std::string v(size, 'x');
    if (!cluster_) return server_.Cli({"SET", k, v}).status();
    for (int i = 0; i < 3; ++i) {
      auto owner = cluster_nodes_.node(i).Cli({"EXISTS", k});
      if (owner.ok() && *owner == "1") return cluster_nodes_.node(i).Cli({"SET", k, v}).status();
    }
    return Status::NotFound("key on no node");
  }

 private:
  bool cluster_;
  std::string prefix_;
  RedisProcess server_;
  RedisCluster cluster_nodes_;
};

inline std::vector<std::string> BackendNames() {
  return {"memory", "fs", "fs_native_odirect", "resp", "valkey_cluster"};
}

inline std::unique_ptr<TierBackend> MakeBackend(const std::string& name) {
  if (name == "memory") return std::make_unique<MemoryBackend>();
  if (name == "fs") return std::make_unique<FsBackend>(false);
  if (name == "fs_native_odirect") return std::make_unique<FsBackend>(true);
  if (name == "resp") return std::make_unique<RespBackend>(false);
  if (name == "valkey_cluster") return std::make_unique<RespBackend>(true);
  return nullptr;
}

}  // namespace kvd::l2::testing
