// support/file_size_limit.h: FileSizeLimit, a full disk for the writers' tests.
#pragma once

#include <sys/resource.h>

#include <csignal>

namespace comet::test {

// While alive, files this process writes are limited to `bytes` and SIGXFSZ is ignored: a write
// past the limit fails (EFBIG), as on a full disk, instead of killing the test.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) : old_handler_(std::signal(SIGXFSZ, SIG_IGN)) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  void (*old_handler_)(int);
  rlimit saved_{};
};

}  // namespace comet::test
