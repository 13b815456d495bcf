// Publishing and reading the bootstrap file (core/bootstrap_file.h).
#include "core/bootstrap_file.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>

#include "comet/error.h"
#include "core/replace_file.h"

namespace comet {

namespace {

namespace fs = std::filesystem;

constexpr char kHeader[] = "comet-bootstrap 1\n";
constexpr size_t kHeaderBytes = sizeof(kHeader) - 1;

// A unique suffix for the temporary file: concurrent writers (a mistake, but possible) must
// not share one.
std::string temp_suffix() {
  std::random_device rd;
  std::ostringstream os;
  os << ".tmp-" << std::hex << rd() << rd();
  return os.str();
}

// Throws naming the file when the directory it goes in does not exist.
void check_directory(const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  COMET_CHECK(fs::is_directory(dir, ec),
              "bootstrap file " << path << ": directory " << dir.string() << " does not exist");
}

}  // namespace

void publish_bootstrap_file(const std::string& path, const std::string& payload) {
  COMET_CHECK(!path.empty(), "bootstrap file: empty path");
  check_directory(path);
  replace_file(path, "bootstrap file", [&](std::ostream& out) {
    out.write(kHeader, kHeaderBytes);
    out.write(payload.data(), std::streamsize(payload.size()));
  }, temp_suffix());
}

std::string wait_bootstrap_file(const std::string& path, size_t payload_bytes, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  // A directory that does not exist cannot receive rank 0's file: said now, not after the timeout.
  check_directory(path);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in.is_open()) {
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      COMET_CHECK(text.compare(0, kHeaderBytes, kHeader) == 0,
                  "bootstrap file " << path << " exists but is not a comet bootstrap file; remove it or "
                                                  "choose another path");
      COMET_CHECK(text.size() == kHeaderBytes + payload_bytes,
                  "bootstrap file " << path << " holds " << text.size() - kHeaderBytes << " payload bytes, expected "
                                    << payload_bytes << " (a file of another program version?)");
      return text.substr(kHeaderBytes);
    }
    if (Clock::now() >= deadline) {
      std::ostringstream os;
      os << "bootstrap file " << path << " did not appear within " << timeout_s
         << " s: rank 0 writes it once it starts; check that rank 0 is running and that every rank sees "
            "the same path (COMET_FABRIC_TIMEOUT_S sets the limit)";
      throw TimeoutError(os.str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void remove_bootstrap_file(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove(path, ec);
}

}  // namespace comet
