// core/replace_file.h: writing a file so that a failed write leaves the old one whole and a
// reader never sees half of it (tuning tables, saved runs, the NCCL bootstrap file).
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace comet {

// True when replace_file writes `path` beside it and renames it over: anything but a device, a
// FIFO or a socket (a link is followed). Those (/dev/null, /dev/stdout, a terminal) are written
// in place: renaming over them would replace the device's node. A directory is not written
// over: its rename fails.
bool replaced_by_rename(const std::string& path);

// Writes the file through `write`: into `path` + `temp_suffix` (the same directory, so the
// rename is atomic), renamed over `path` once the stream has been closed without error (a
// failure to write the last buffered bytes shows only then), or in place where
// replaced_by_rename is false. Throws comet::Error "<what> <path>: ..." when the file cannot be
// created, the write fails (disk full, a file size limit) or the rename fails; the temporary
// file is then removed and the old file is unchanged. Concurrent writers of one path need
// suffixes of their own.
void replace_file(const std::string& path, const std::string& what, const std::function<void(std::ostream&)>& write,
                  const std::string& temp_suffix = ".tmp");

}  // namespace comet
