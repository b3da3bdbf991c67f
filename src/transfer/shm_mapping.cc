#include "transfer/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvd::transfer {
namespace {

SegmentId IdOf(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

std::string UidList(const std::vector<uint32_t>& uids) {
  std::string s;
  for (uint32_t u : uids) s += (s.empty() ? "" : ", ") + std::to_string(u);
  return s;
}

// The policy's verdict on an opened segment.
Status CheckSegment(const std::string& name, const struct stat& st, uint64_t nbytes,
                    const ShmAccessPolicy& policy) {
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("shared memory '" + name + "' is not a regular segment");
  }
  const std::vector<uint32_t> allowed =
      policy.allowed_uids.empty() ? std::vector<uint32_t>{static_cast<uint32_t>(geteuid())}
                                  : policy.allowed_uids;
  if (std::find(allowed.begin(), allowed.end(), static_cast<uint32_t>(st.st_uid)) ==
      allowed.end()) {
    return Status::FailedPrecondition(
        "shared memory '" + name + "' is owned by uid " + std::to_string(st.st_uid) +
        "; kvd maps only segments of uid " + UidList(allowed) + " (--allowed-shm-uid)");
  }
  if (std::find(policy.refused.begin(), policy.refused.end(), IdOf(st)) != policy.refused.end()) {
    return Status::FailedPrecondition("shared memory '" + name +
                                      "' is kvd's own memory, not a client's KV cache");
  }
  if (static_cast<uint64_t>(st.st_size) < nbytes) {
    return Status::InvalidArgument("shared memory '" + name + "' is " +
                                   std::to_string(st.st_size) + " bytes, the client described " +
                                   std::to_string(nbytes));
  }
  return Status::Ok();
}

}  // namespace

std::string SegmentId::ToString() const {
  return std::to_string(device) + ":" + std::to_string(inode);
}

Result<std::string> ValidateShmName(const std::string& name) {
  std::string n = name;
  if (!n.empty() && n[0] == '/') n = n.substr(1);
  if (n.empty() || n.size() > 255 || n.find('/') != std::string::npos ||
      n.find("..") != std::string::npos || n.find('\0') != std::string::npos) {
    return Status::InvalidArgument("shared-memory name '" + name.substr(0, 80) +
                                   "' is not a plain /dev/shm name");
  }
  return "/" + n;
}

Result<ShmMapping> ShmMapping::Open(const std::string& name, uint64_t nbytes,
                                    const ShmAccessPolicy& policy) {
  auto valid = ValidateShmName(name);
  if (!valid.ok()) return valid.status();
  if (nbytes == 0) return Status::InvalidArgument("shared memory '" + name + "': size 0");
  if (!policy.required_prefix.empty() && valid->compare(1, policy.required_prefix.size(),
                                                        policy.required_prefix) != 0) {
    return Status::FailedPrecondition("shared memory '" + *valid + "' does not start with '" +
                                      policy.required_prefix + "' (--allowed-shm-prefix)");
  }
  // shm_open adds O_NOFOLLOW and O_CLOEXEC: a symlink planted in /dev/shm is not followed.
  int fd = shm_open(valid->c_str(), O_RDWR, 0);
  if (fd < 0) {
    return Status::NotFound("cannot open shared memory '" + *valid + "': " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Status::Internal("fstat of '" + *valid + "' failed: " + std::strerror(err));
  }
  if (Status verdict = CheckSegment(*valid, st, nbytes, policy); !verdict.ok()) {
    close(fd);
    return verdict;
  }
  void* p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return Status::Internal("mmap of '" + *valid + "' failed: " + std::strerror(err));
  }
  ShmMapping m;
  m.data_ = static_cast<uint8_t*>(p);
  m.size_ = nbytes;
  m.name_ = *valid;
  m.id_ = IdOf(st);
  return m;
}

Result<SegmentId> IdentifySegment(const std::string& name) {
  auto valid = ValidateShmName(name);
  if (!valid.ok()) return valid.status();
  int fd = shm_open(valid->c_str(), O_RDONLY, 0);
  if (fd < 0) {
    return Status::NotFound("cannot open shared memory '" + *valid + "': " + std::strerror(errno));
  }
  struct stat st {};
  const int rc = fstat(fd, &st);
  const int err = errno;
  close(fd);
  if (rc != 0) return Status::Internal("fstat of '" + *valid + "' failed: " + std::strerror(err));
  return IdOf(st);
}

ShmMapping& ShmMapping::operator=(ShmMapping&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    data_ = o.data_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    id_ = o.id_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

ShmMapping::~ShmMapping() {
  if (data_) munmap(data_, size_);
}

}  // namespace kvd::transfer
