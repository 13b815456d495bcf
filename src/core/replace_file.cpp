// Files replaced whole (core/replace_file.h).
#include "core/replace_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "comet/error.h"

namespace comet {

bool replaced_by_rename(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  return !std::filesystem::is_character_file(status) && !std::filesystem::is_block_file(status) &&
         !std::filesystem::is_fifo(status) && !std::filesystem::is_socket(status);
}

void replace_file(const std::string& path, const std::string& what, const std::function<void(std::ostream&)>& write,
                  const std::string& temp_suffix) {
  const bool by_rename = replaced_by_rename(path);
  const std::string target = by_rename ? path + temp_suffix : path;
  std::error_code ec;
  std::ofstream out(target, std::ios::binary | std::ios::trunc);
  if (!out.good()) throw Error(what + " " + path + ": cannot be written (cannot create " + target + ": " + std::strerror(errno) + ")");
  write(out);
  out.close();
  if (!out) {
    if (by_rename) {
      std::filesystem::remove(target, ec);
      throw Error(what + " " + path + ": write failed (disk full or a file size limit?); the old file is unchanged");
    }
    throw Error(what + " " + path + ": write failed");
  }
  if (!by_rename) return;
  std::filesystem::rename(target, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(target, ec);
    throw Error(what + " " + path + ": cannot replace it (" + why + ")");
  }
}

}  // namespace comet
