// core/bootstrap_file.h: handing a small blob (the NCCL unique id) from rank 0 to the other
// processes of a run through a file every rank can reach (docs/fabric.md).
//
// Format: the line "comet-bootstrap 1\n", then the payload bytes. Rank 0 writes a temporary
// file next to the target and renames it into place (replace_file), so a reader sees all of it
// or nothing (rename is atomic within one file system; the temporary lives in the same
// directory).
// Readers poll until the file appears, with a timeout: a missing rank 0 never hangs them.
//
// Pitfall: a file left behind by an earlier run with the same path would be read as this
// run's; use a fresh path per run (`comet launch` makes a private directory) and remove the
// file once every rank has read it.
#pragma once

#include <cstddef>
#include <string>

namespace comet {

// Publishes `payload` at `path`. Throws comet::Error naming the path when the directory does
// not exist or the file cannot be written; replaces an older file at `path`.
void publish_bootstrap_file(const std::string& path, const std::string& payload);

// Waits until `path` holds a published payload of exactly `payload_bytes` bytes and returns
// it. Throws comet::TimeoutError naming the path after `timeout_s` seconds, comet::Error when
// the file there is not a bootstrap file or has another payload size.
std::string wait_bootstrap_file(const std::string& path, size_t payload_bytes, double timeout_s);

// Removes the file if present; never throws (a leftover is harmless for a fresh path).
void remove_bootstrap_file(const std::string& path) noexcept;

}  // namespace comet
