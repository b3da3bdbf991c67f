#include "l2/fs_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "codec/crc32c.h"

namespace kvd::l2 {
namespace {

constexpr uint64_t kDirectAlign = 4096;
constexpr const char* kTmpMarker = ".kvd";  // "<name>.kvd<pid>-<seq>.tmp"

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Errno(int e) { return std::strerror(e); }

Status IoError(const std::string& what, int e) {
  if (e == ENOSPC || e == EDQUOT) return Status::ResourceExhausted(what + ": " + Errno(e));
  if (e == ENOENT) return Status::NotFound(what + ": " + Errno(e));
  return Status::Internal(what + ": " + Errno(e));
}

bool Aligned(const void* p, uint64_t n) {
  return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0 && n % kDirectAlign == 0;
}

// Writes all of [data, data + n) at offset 0.. of fd. Returns 0 or errno.
int WriteAll(int fd, const uint8_t* data, uint64_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, data, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    data += w;
    n -= static_cast<uint64_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return 0;
}

// Reads exactly n bytes; returns bytes read (short on EOF) or -errno.
int64_t ReadAll(int fd, uint8_t* dst, uint64_t n, uint64_t offset) {
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, dst + got, std::min<uint64_t>(n - got, 1ull << 30),
                        static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return static_cast<int64_t>(got);
}

// The checksum kvd keeps beside an object it wrote (<object file>.kvdsum): one line
// "kvdsum1 <size> <crc32c hex>\n". The object file itself stays byte for byte lmcache's.
constexpr const char* kSumSuffix = ".kvdsum";
constexpr const char* kSumMagic = "kvdsum1";

std::string SumLine(uint64_t size, uint32_t crc) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s %llu %08x\n", kSumMagic, static_cast<unsigned long long>(size), crc);
  return buf;
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

}  // namespace

Result<std::unique_ptr<FsTier>> FsTier::Create(const FsTierOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options.base_path, ec);
  if (ec) {
    return Status::InvalidArgument(options.type + ": cannot create base_path '" + options.base_path +
                                   "': " + ec.message());
  }
  if (!fs::is_directory(options.base_path, ec)) {
    return Status::InvalidArgument(options.type + ": base_path '" + options.base_path +
                                   "' is not a directory");
  }
  auto tier = std::unique_ptr<FsTier>(new FsTier(options));
  if (!options.relative_tmp_dir.empty()) {
    fs::create_directories(tier->tmp_dir_, ec);
    if (ec) {
      return Status::InvalidArgument(options.type + ": cannot create relative_tmp_dir '" +
                                     tier->tmp_dir_ + "': " + ec.message());
    }
  }
  if (::access(tier->tmp_dir_.c_str(), W_OK | X_OK) != 0) {
    return Status::InvalidArgument(options.type + ": '" + tier->tmp_dir_ + "' is not writable: " +
                                   Errno(errno));
  }
  tier->RemoveStaleTemporaries();
  return tier;
}

FsTier::FsTier(const FsTierOptions& options)
    : options_(options),
      tmp_dir_(options.relative_tmp_dir.empty() ? options.base_path
                                                : options.base_path + "/" + options.relative_tmp_dir),
      pool_(std::make_unique<WorkerPool>(options.num_workers, "kvd-fs")) {}

FsTier::~FsTier() { Close(); }

void FsTier::Close() {
  closed_.store(true);
  pool_->Close();
}

std::string FsTier::Describe() const {
  return options_.type + " " + options_.base_path + (options_.use_odirect ? " (O_DIRECT)" : "");
}

std::string FsTier::PathOf(const ObjectKey& key) const { return options_.base_path + "/" + FileName(key); }

void FsTier::NoteError(const std::string& what) {
  MutexLock lock(&health_mu_);
  last_error_ = what;
  last_error_ns_ = NowNs();
}

TierHealth FsTier::Health() const {
  TierHealth h;
  if (::access(options_.base_path.c_str(), W_OK | X_OK) != 0) {
    h.healthy = false;
    h.detail = options_.base_path + ": " + Errno(errno);
    return h;
  }
  MutexLock lock(&health_mu_);
  if (!last_error_.empty() && NowNs() - last_error_ns_ < 60'000'000'000LL) {
    h.detail = "last error: " + last_error_;
  } else {
    h.detail = "ok";
  }
  return h;
}

void FsTier::RemoveStaleTemporaries() {
  DIR* d = ::opendir(tmp_dir_.c_str());
  if (!d) return;
  const int64_t now = NowNs();
  size_t removed = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n.size() < 4 || n.substr(n.size() - 4) != ".tmp" || n.find(kTmpMarker) == std::string_view::npos) {
      continue;
    }
    std::string p = tmp_dir_ + "/" + std::string(n);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000LL + st.st_mtim.tv_nsec;
    if (now - mtime > 600'000'000'000LL && ::unlink(p.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  if (removed) spdlog::info("{}: removed {} temporary file(s) left by an earlier run", Describe(), removed);
}

ItemResult FsTier::StoreOne(const StoreItem& item) {
  if (Status st = ValidateObjectKey(item.key); !st.ok()) return {st, 0};
  const std::string name = FileName(item.key);
  const std::string final_path = options_.base_path + "/" + name;
  struct stat st {};
  if (::lstat(final_path.c_str(), &st) == 0) return {Status::Ok(), 0};  // first writer wins
  const std::string tmp = tmp_dir_ + "/" + name.substr(0, name.size() - 5) + kTmpMarker +
                          std::to_string(::getpid()) + "-" + std::to_string(tmp_seq_.fetch_add(1)) +
                          ".tmp";
  const bool direct = options_.use_odirect && odirect_ok_.load() && Aligned(item.data, kDirectAlign);
  int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && direct && errno == EINVAL) {
    if (odirect_ok_.exchange(false)) {
      spdlog::warn("{}: the filesystem refuses O_DIRECT; using buffered I/O", Describe());
    }
    fd = ::open(tmp.c_str(), flags, 0644);
  }
  if (fd < 0) {
    Status s = IoError("create " + tmp, errno);
    NoteError(s.message());
    return {s, 0};
  }
  Fd guard(fd);
  int err = 0;
  uint64_t head = direct ? item.size / kDirectAlign * kDirectAlign : 0;
  if (head > 0) err = WriteAll(fd, item.data, head, 0);
  if (err == 0 && head < item.size) {
    if (direct) {  // the unaligned tail goes through the page cache
      int fl = ::fcntl(fd, F_GETFL);
      if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_DIRECT);
    }
    err = WriteAll(fd, item.data + head, item.size - head, head);
  }
  if (err == 0 && ::close(guard.fd) != 0) err = errno;
  guard.fd = -1;
  if (err != 0) {
    ::unlink(tmp.c_str());
    Status s = IoError("write " + tmp, err);
    NoteError(s.message());
    return {s, 0};
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    Status s = IoError("rename to " + final_path, e);
    NoteError(s.message());
    return {s, 0};
  }
  WriteChecksum(final_path, item.data, item.size);
  return {Status::Ok(), item.size};
}

void FsTier::WriteChecksum(const std::string& final_path, const uint8_t* data, uint64_t size) {
  const std::string line = SumLine(size, codec::Crc32c(data, size));
  const std::string tmp = tmp_dir_ + "/" + final_path.substr(final_path.rfind('/') + 1) + kTmpMarker +
                          std::to_string(::getpid()) + "-" +
                          std::to_string(tmp_seq_.fetch_add(1)) + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return;  // the object stays readable, unchecked
  const int err = WriteAll(fd, reinterpret_cast<const uint8_t*>(line.data()), line.size(), 0);
  ::close(fd);
  if (err != 0 || ::rename(tmp.c_str(), (final_path + kSumSuffix).c_str()) != 0) ::unlink(tmp.c_str());
}

Status FsTier::VerifyChecksum(const std::string& path, const uint8_t* data, uint64_t size) const {
  const std::string sum_path = path + kSumSuffix;
  int fd = ::open(sum_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();  // written by another server (or before): unchecked
    return Status::Internal(sum_path + ": " + Errno(errno) + " (checksum unreadable: not served)");
  }
  Fd guard(fd);
  struct stat st {};
  char buf[64] = {};
  int64_t got = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < static_cast<off_t>(sizeof(buf))) {
    got = ReadAll(fd, reinterpret_cast<uint8_t*>(buf), sizeof(buf) - 1, 0);
  }
  char magic[16] = {};
  unsigned long long want_size = 0;
  unsigned int want_crc = 0;
  if (got <= 0 || std::sscanf(buf, "%15s %llu %x", magic, &want_size, &want_crc) != 3 ||
      std::strcmp(magic, kSumMagic) != 0) {
    return Status::Internal(sum_path + ": malformed checksum file (object not served)");
  }
  if (want_size != size || codec::Crc32c(data, size) != want_crc) {
    return Status::Internal(path + ": bytes differ from the checksum kvd wrote beside them "
                            "(overwritten or corrupted; not served)");
  }
  return Status::Ok();
}

ItemResult FsTier::LoadOne(const LoadItem& item) {
  if (Status st = ValidateObjectKey(item.key); !st.ok()) return {st, 0};
  const std::string path = PathOf(item.key);
  const bool direct_wanted = options_.use_odirect && odirect_ok_.load();
  // Never follow a link out of the directory, never block on a FIFO or device in the
  // object's place: only a regular file is read (issue 27, finding 4).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return {Status::NotFound("no file " + path), 0};
    if (errno == ELOOP) return {Status::Internal(path + ": a symbolic link, not an object (not read)"), 0};
    Status s = IoError("open " + path, errno);
    NoteError(s.message());
    return {s, 0};
  }
  Fd guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {IoError("stat " + path, errno), 0};
  if (!S_ISREG(st.st_mode)) return {Status::Internal(path + ": not a regular file (not read)"), 0};
  if (int fl = ::fcntl(fd, F_GETFL); fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  uint64_t want = item.size;
  if (item.size_is_capacity) {
    if (file_size > item.size) {
      return {Status::Internal(path + ": " + std::to_string(file_size) + " bytes, more than the " +
                               std::to_string(item.size) + " this object can take"), 0};
    }
    want = file_size;
  } else if (file_size != item.size) {
    // lmcache fs_native with use_odirect pads objects to the 4 KiB alignment: the tail is
    // padding, not data, so such a file is read like an exact one.
    const uint64_t padded = (item.size + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    if (!(options_.use_odirect && file_size == padded)) {
      return {Status::Internal(path + ": " + std::to_string(file_size) + " bytes, expected " +
                               std::to_string(item.size) + " (truncated or not this layout)"), 0};
    }
  }
  if (options_.read_ahead_size > 0) {
    ::posix_fadvise(fd, 0, std::min<int64_t>(options_.read_ahead_size, static_cast<int64_t>(want)),
                    POSIX_FADV_WILLNEED);
  }
  uint64_t head = 0;
  if (direct_wanted && Aligned(item.dst, kDirectAlign)) {
    int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_DIRECT) == 0) {
      const uint64_t h = want / kDirectAlign * kDirectAlign;
      const int64_t got = h ? ReadAll(fd, item.dst, h, 0) : 0;
      ::fcntl(fd, F_SETFL, fl);
      if (got == static_cast<int64_t>(h)) {
        head = h;
      } else if (got < 0 && -got == EINVAL) {  // the filesystem refuses: buffered from the start
        if (odirect_ok_.exchange(false)) {
          spdlog::warn("{}: the filesystem refuses O_DIRECT reads; using buffered I/O", Describe());
        }
      } else {
        return {Status::Internal(path + ": short read (file changed while reading)"), 0};
      }
    }
  }
  int64_t got = ReadAll(fd, item.dst + head, want - head, head);
  if (got < 0) {
    Status s = IoError("read " + path, static_cast<int>(-got));
    NoteError(s.message());
    return {s, 0};
  }
  if (static_cast<uint64_t>(got) != want - head) {
    return {Status::Internal(path + ": short read (file truncated while reading)"), 0};
  }
  if (Status v = VerifyChecksum(path, item.dst, want); !v.ok()) return {v, 0};
  return {Status::Ok(), want};
}

ItemResult FsTier::ExistsOne(const ObjectKey& key) {
  if (Status st = ValidateObjectKey(key); !st.ok()) return {st, 0};
  struct stat st {};
  const std::string path = PathOf(key);
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return {Status::NotFound(path + " is not a regular file"), 0};
    return {Status::Ok(), static_cast<uint64_t>(st.st_size)};
  }
  if (errno == ENOENT) return {Status::NotFound(path), 0};
  return {IoError("stat " + path, errno), 0};
}

ItemResult FsTier::DeleteOne(const ObjectKey& key) {
  if (Status st = ValidateObjectKey(key); !st.ok()) return {st, 0};
  const std::string path = PathOf(key);
  struct stat st {};
  ::unlink((path + kSumSuffix).c_str());
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? ItemResult{Status::Ok(), 0} : ItemResult{IoError("stat " + path, errno), 0};
  }
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return {Status::Ok(), 0};
    return {IoError("unlink " + path, errno), 0};
  }
  return {Status::Ok(), static_cast<uint64_t>(st.st_size)};
}

void FsTier::Store(std::vector<StoreItem> items, Done done) {
  auto shared = std::make_shared<std::vector<StoreItem>>(std::move(items));
  RunBatch(*pool_, shared->size(), [this, shared](size_t i) { return StoreOne((*shared)[i]); },
           std::move(done));
}

void FsTier::Load(std::vector<LoadItem> items, Done done) {
  auto shared = std::make_shared<std::vector<LoadItem>>(std::move(items));
  RunBatch(*pool_, shared->size(), [this, shared](size_t i) { return LoadOne((*shared)[i]); },
           std::move(done));
}

void FsTier::Exists(std::vector<ObjectKey> keys, Done done) {
  auto shared = std::make_shared<std::vector<ObjectKey>>(std::move(keys));
  // stat is cheap: one task answers the whole batch.
  if (!pool_->Submit([this, shared, done] {
        std::vector<ItemResult> out;
        out.reserve(shared->size());
        for (const auto& k : *shared) out.push_back(ExistsOne(k));
        done(std::move(out));
      })) {
    done(std::vector<ItemResult>(shared->size(), ItemResult{Status::Unavailable("tier is closed"), 0}));
  }
}

void FsTier::Delete(std::vector<ObjectKey> keys, Done done) {
  auto shared = std::make_shared<std::vector<ObjectKey>>(std::move(keys));
  if (!pool_->Submit([this, shared, done] {
        std::vector<ItemResult> out;
        out.reserve(shared->size());
        for (const auto& k : *shared) out.push_back(DeleteOne(k));
        done(std::move(out));
      })) {
    done(std::vector<ItemResult>(shared->size(), ItemResult{Status::Unavailable("tier is closed"), 0}));
  }
}

void FsTier::Scan(ScanDone done) {
  if (!pool_->Submit([this, done] {
        DIR* d = ::opendir(options_.base_path.c_str());
        if (!d) {
          done(IoError("opendir " + options_.base_path, errno));
          return;
        }
        std::vector<ScannedObject> out;
        while (dirent* e = ::readdir(d)) {
          auto key = ParseFileName(e->d_name);
          if (!key) continue;
          struct stat st {};
          std::string p = options_.base_path + "/" + e->d_name;
          if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
          out.push_back({std::move(*key), static_cast<uint64_t>(st.st_size),
                         static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000LL + st.st_mtim.tv_nsec});
        }
        ::closedir(d);
        done(std::move(out));
      })) {
    done(Status::Unavailable("tier is closed"));
  }
}

}  // namespace kvd::l2
