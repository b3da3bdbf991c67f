// FsTier: the `fs` and `fs_native` adapters — one flat local directory, one file per object,
// named and filled exactly as lmcache 0.5.6 does (see object_key.h): raw object bytes, no
// header. A store writes a temporary file (kvd's own unique name, in relative_tmp_dir when
// set, else beside the final file, ending in ".tmp") and renames it into place; an existing
// final file is never rewritten (first writer wins). A load checks the file's length against
// the expected object size before reading and reads exactly that many bytes: a truncated or
// longer file is Internal (a counted miss), never data.
//
// I/O: a pool of num_workers threads doing pread/pwrite (measured against io_uring-free raw
// sequential I/O in docs/benchmarks.md). use_odirect opens files with O_DIRECT where the
// filesystem accepts it (aligned buffer and length; an unaligned tail is written buffered);
// where it does not (tmpfs), kvd logs once and uses buffered I/O. read_ahead_size issues a
// readahead hint for that many leading bytes before the read.
//
// Files kvd does not trust (issue 27, finding 4): an object is opened without following
// links and without blocking (a FIFO in its place), and read only when it is a regular file.
// Beside every object it writes kvd keeps "<file>.kvdsum" (size and CRC-32C, one text line);
// a load whose bytes do not match it is a counted corrupt miss, so an object overwritten in
// place (same size) is not served. Objects without a checksum file (written by lmcache or
// before this) are read as before. The checksum guards against corruption and overwrites by
// processes that do not know of it, not against one that rewrites both files.
//
// Temporary files kvd left behind (a crash mid-write) are removed at startup once older than
// ten minutes; lmcache's ".tmp" files are left alone.
//
// Threads: see tier.h.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "l2/tier.h"
#include "l2/worker_pool.h"

namespace kvd::l2 {

struct FsTierOptions {
  std::string type = "fs";           // "fs" or "fs_native": only reported
  std::string base_path;
  std::string relative_tmp_dir;      // "" : temporaries beside the final files
  bool use_odirect = false;
  int64_t read_ahead_size = 0;
  int num_workers = 4;
};

class FsTier final : public Tier {
 public:
  // Creates base_path (and the tmp dir) if missing. InvalidArgument / Internal when the
  // directory cannot be created or written.
  static Result<std::unique_ptr<FsTier>> Create(const FsTierOptions& options);
  ~FsTier() override;

  std::string_view type() const override { return options_.type; }
  std::string Describe() const override;
  void Store(std::vector<StoreItem> items, Done done) override;
  void Exists(std::vector<ObjectKey> keys, Done done) override;
  void Load(std::vector<LoadItem> items, Done done) override;
  void Delete(std::vector<ObjectKey> keys, Done done) override;
  void Scan(ScanDone done) override;
  TierHealth Health() const override;
  void Close() override;

  // The path an object has (tests and tools).
  std::string PathOf(const ObjectKey& key) const;

 private:
  explicit FsTier(const FsTierOptions& options);
  ItemResult StoreOne(const StoreItem& item);
  ItemResult LoadOne(const LoadItem& item);
  ItemResult ExistsOne(const ObjectKey& key);
  ItemResult DeleteOne(const ObjectKey& key);
  // The checksum kvd keeps beside each object it writes (<file>.kvdsum; the object file
  // stays lmcache's bytes). Written after the object is in place; best effort.
  void WriteChecksum(const std::string& final_path, const uint8_t* data, uint64_t size);
  // Ok when there is no checksum file (an object another server wrote) or it matches
  // `data`; Internal (a counted corrupt miss) when it does not, or cannot be read.
  Status VerifyChecksum(const std::string& path, const uint8_t* data, uint64_t size) const;
  void RemoveStaleTemporaries();
  void NoteError(const std::string& what) KVD_EXCLUDES(health_mu_);

  const FsTierOptions options_;
  const std::string tmp_dir_;
  std::unique_ptr<WorkerPool> pool_;
  std::atomic<uint64_t> tmp_seq_{0};
  std::atomic<bool> odirect_ok_{true};   // false once the filesystem refused O_DIRECT
  std::atomic<bool> closed_{false};
  mutable Mutex health_mu_;
  std::string last_error_ KVD_GUARDED_BY(health_mu_);
  int64_t last_error_ns_ KVD_GUARDED_BY(health_mu_) = 0;
};

}  // namespace kvd::l2
