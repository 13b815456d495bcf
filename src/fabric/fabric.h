// fabric/fabric.h: how ranks see each other's memory (DESIGN §3). No CUDA headers here.
//
// A fabric owns one symmetric heap: the same number of bytes on every rank, zeroed at
// allocation, so a region has the same offset everywhere (include/comet/workspace.h). Kernels
// of rank r reach rank p's heap through peer_table(r)[p], a device array of W base pointers
// valid on rank r's device.
//
//   Loopback  W virtual ranks on ONE GPU: one allocation cut in W slices (tests, development,
//             and the single-GPU benchmarks; every "inter-rank" copy is a local copy)
//   Local     one process, W visible GPUs, CUDA peer access enabled between all pairs; with
//             W = 1 it is Loopback with one rank
// Thread safety: none; one fabric per layer object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace comet::fabric {

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual std::string name() const = 0;
  virtual int world() const = 0;
  // CUDA device ordinal that runs rank r.
  virtual int device_of(int rank) const = 0;
  // (Re)allocates the symmetric heap; bytes are rounded up to 256. Previous contents are lost.
  virtual void allocate(int64_t bytes_per_rank) = 0;
  virtual int64_t bytes_per_rank() const = 0;
  // Rank r's heap as seen from its own device.
  virtual void* base(int rank) const = 0;
  // Device array [W]: entry p is rank p's heap as addressed from rank r's device.
  virtual void* const* peer_table(int rank) const = 0;
};

// Throws comet::Error if no GPU is visible or the device ordinal is out of range.
std::unique_ptr<Fabric> make_loopback_fabric(int world, int device = 0);
// Throws comet::Error naming the pair if two GPUs cannot access each other's memory.
std::unique_ptr<Fabric> make_local_fabric(int world);

}  // namespace comet::fabric
