#include "transfer/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvd::transfer {

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

Result<ShmMapping> ShmMapping::Open(const std::string& name, uint64_t nbytes) {
  auto valid = ValidateShmName(name);
  if (!valid.ok()) return valid.status();
  if (nbytes == 0) return Status::InvalidArgument("shared memory '" + name + "': size 0");
  int fd = shm_open(valid->c_str(), O_RDWR, 0);
  if (fd < 0) {
    return Status::NotFound("cannot open shared memory '" + *valid + "': " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < nbytes) {
    uint64_t have = static_cast<uint64_t>(st.st_size);
    close(fd);
    return Status::InvalidArgument("shared memory '" + *valid + "' is " + std::to_string(have) +
                                   " bytes, the client described " + std::to_string(nbytes));
  }
  void* p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    return Status::Internal("mmap of '" + *valid + "' failed: " + std::strerror(errno));
  }
  ShmMapping m;
  m.data_ = static_cast<uint8_t*>(p);
  m.size_ = nbytes;
  m.name_ = *valid;
  return m;
}

ShmMapping& ShmMapping::operator=(ShmMapping&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    data_ = o.data_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

ShmMapping::~ShmMapping() {
  if (data_) munmap(data_, size_);
}

}  // namespace kvd::transfer
