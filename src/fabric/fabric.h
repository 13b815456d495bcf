// fabric/fabric.h: how ranks see each other's memory (DESIGN §3, docs/fabric.md). No CUDA
// headers here.
//
// A fabric owns one symmetric heap: the same number of bytes on every rank, zeroed at
// allocation, so a region has the same offset everywhere (include/comet/workspace.h). Kernels
// of rank r reach rank p's heap through peer_table(r)[p], a device array of W base pointers
// valid on rank r's device.
//
//   Loopback  W virtual ranks on ONE GPU: one allocation cut in W slices (tests, development,
//             and the single-GPU benchmarks; every "inter-rank" copy is a local copy)
//   Local     one process, W ranks over G visible GPUs (one rank per GPU when W are visible,
//             W / G per GPU when fewer are), CUDA peer access enabled between all pairs; with
//             W = 1 it is Loopback with one rank
//   Nccl      one process per GPU, started by `comet launch` or torchrun (core/process_env.h):
//             this process is ONE rank; the heap is an NCCL >= 2.28 symmetric window and peers
//             are reached through NCCL's load/store (LSA) mappings over NVLink/P2P; one node
//
// Local ranks: a process drives the ranks [first_local_rank(), first_local_rank() +
// num_local_ranks()): Loopback and Local all W, Nccl its own rank only. device_of(), base(),
// peer_table() and peer_table_host() accept local ranks only and throw comet::Error for any
// other: another process's heap has no address here except through the peer table.
//
// Collective calls: on the Nccl fabric allocate(), barrier() and all_to_all_v() involve every
// rank; all ranks must call them in the same order (allocate() with the same size). Host-side
// waits for other ranks end after ProcessEnv::timeout_s with comet::TimeoutError; the
// communicator is then aborted and the fabric unusable.
// Thread safety: none. One fabric per layer object: a second layer's allocate() replaces the
// heap, and the first layer then refuses to run (heap_generation()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct CUstream_st;  // what cudaStream_t points to, without the CUDA headers

namespace comet {
struct ProcessEnv;
}

namespace comet::fabric {

// One local rank's part of all_to_all_v(): byte ranges of device buffers, described by host
// arrays of W entries each. Rank p's send slice for rank q must have the size rank q expects
// from p (send_bytes[q] on p == recv_bytes[p] on q); zero-byte entries move nothing.
struct AllToAllVArgs {
  const void* send = nullptr;             // device buffer this rank sends from
  const int64_t* send_bytes = nullptr;    // host [W]: bytes for rank q
  const int64_t* send_offsets = nullptr;  // host [W]: where they start in `send`
  void* recv = nullptr;                   // device buffer this rank receives into
  const int64_t* recv_bytes = nullptr;    // host [W]: bytes from rank p
  const int64_t* recv_offsets = nullptr;  // host [W]: where they land in `recv`
};

// The largest heap allocate() takes per rank (256 TiB: far above any GPU's memory, and small
// enough that W heaps and every offset into them stay far inside int64).
inline constexpr int64_t kMaxHeapBytesPerRank = int64_t(1) << 48;

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual std::string name() const = 0;
  virtual int world() const = 0;
  // The ranks this process drives (see the file header).
  virtual int first_local_rank() const = 0;
  virtual int num_local_ranks() const = 0;
  bool is_local(int rank) const { return rank >= first_local_rank() && rank < first_local_rank() + num_local_ranks(); }
  // CUDA device ordinal that runs local rank r.
  virtual int device_of(int rank) const = 0;
  // How many GPUs the W ranks run on, over every process: Loopback 1, Local G, Nccl W.
  virtual int gpus() const = 0;
  // (Re)allocates the symmetric heap; bytes are rounded up to 256. Previous contents are lost.
  // A size outside [0, kMaxHeapBytesPerRank] is refused (on the Nccl fabric by every rank).
  // Nccl: collective, every rank with the same size (checked); the caller's work on the old
  // heap must be finished on every rank (the fabric synchronizes the device and the ranks).
  void allocate(int64_t bytes_per_rank);
  // Collective: throws comet::Error on every rank unless every rank passed the same `value`;
  // the message names `what` and this rank's `shown` (a layer passes a hash of its config and
  // the config in words). Loopback and Local: one process builds every rank, nothing to agree.
  void agree(uint64_t value, const std::string& what, const std::string& shown);
  // Collective: the smallest and the largest `value` over every rank (Nccl: one allreduce);
  // Loopback and Local: one process, {value, value}. For decisions every rank must take alike
  // from what only each rank can see (its free memory, say): take the minimum.
  std::pair<uint64_t, uint64_t> min_max(uint64_t value, const std::string& what);
  // Waits for `stream` after work that involves other ranks (all_to_all_v, barrier kernels).
  // Loopback and Local: cudaStreamSynchronize. Nccl: at most the fabric's timeout, watching the
  // communicator for a peer's failure meanwhile; a timeout or a failure aborts the communicator
  // (the other ranks then fail too instead of waiting) and throws comet::TimeoutError or
  // comet::Error naming `what`. Not for use inside CUDA graph capture.
  void wait(CUstream_st* stream, const std::string& what);
  // How many times allocate() has returned: a layer notes it after its own allocate() and
  // refuses to run once another object reallocated the heap under it (its device tables would
  // point into freed memory).
  uint64_t heap_generation() const { return heap_generation_; }
  // Throws comet::Error, prefixed by `who` (the layer's class), unless the heap is still the one
  // of `generation`: the message says whether the fabric lost its heap (an aborted
  // communicator, a failed allocate) or another object reallocated it.
  void check_heap_generation(uint64_t generation, const char* who) const;
  virtual int64_t bytes_per_rank() const = 0;
  // Local rank r's heap as seen from its own device.
  virtual void* base(int rank) const = 0;
  // Device array [W]: entry p is rank p's heap as addressed from local rank r's device. On the
  // Nccl fabric every entry (r's own too) is NCCL's LSA mapping, so entry r may differ in value
  // from base(r) while reaching the same memory.
  virtual void* const* peer_table(int rank) const = 0;
  // The same W addresses in host memory, for building derived device tables (offsets into
  // peers' regions) on the host. Never dereference them on the host.
  virtual std::vector<void*> peer_table_host(int rank) const = 0;

  // Host barrier: returns once every rank has called barrier() and the work that the local
  // ranks enqueued on `stream` before the call has finished. Loopback and Local: all ranks
  // live in this process and share `stream`, so this synchronizes `stream`. Nccl: a
  // one-element ncclAllReduce on `stream`, then a wait for `stream` (at most timeout_s).
  // Not for use inside CUDA graph capture.
  virtual void barrier(CUstream_st* stream) = 0;

  // All-to-all with per-pair sizes on `stream` (the exchange of the Megatron-style baseline,
  // DESIGN §6), asynchronous like a kernel launch. `local_ranks` holds num_local_ranks()
  // entries, entry i for rank first_local_rank() + i. Loopback and Local: cudaMemcpyAsync
  // slice copies between the local ranks' buffers; the pairwise sizes are checked. Nccl:
  // grouped ncclSend/ncclRecv in bytes; the sizes of the other ranks are not visible here, so
  // agreeing sizes are the caller's contract. Throws comet::Error for malformed arguments.
  void all_to_all_v(const AllToAllVArgs* local_ranks, CUstream_st* stream);
  // The same for a fabric with exactly one local rank (Nccl, or Loopback/Local with W = 1).
  void all_to_all_v(const void* send, const int64_t* send_bytes, const int64_t* send_offsets, void* recv,
                    const int64_t* recv_bytes, const int64_t* recv_offsets, CUstream_st* stream);
  // Throws comet::Error unless `rank` is local; `what` names the call for the message ("what(rank):
  // rank r is not driven by this process (its ranks are a..b of W)").
  void check_local(int rank, const char* what) const;

 protected:
  // For a fabric whose heap became unreachable without allocate() (the Nccl fabric aborted its
  // communicator, which unmaps the peers' memory): layers on it then refuse to run, as after
  // a reallocation, instead of launching kernels at unmapped addresses.
  void invalidate_heap() { ++heap_generation_; }

 private:
  // all_to_all_v() after its arguments were checked.
  virtual void run_all_to_all_v(const AllToAllVArgs* local_ranks, CUstream_st* stream) = 0;
  // allocate() itself.
  virtual void run_allocate(int64_t bytes_per_rank) = 0;
  // min_max() across processes (the Nccl fabric's allreduce); one process: {value, value}.
  virtual std::pair<uint64_t, uint64_t> run_min_max(uint64_t value, const std::string& what) {
    (void)what;
    return {value, value};
  }
  // wait() itself; one process: cudaStreamSynchronize.
  virtual void run_wait(CUstream_st* stream, const std::string& what);
  uint64_t heap_generation_ = 0;
};

// Throws comet::Error if no GPU is visible or the device ordinal is out of range.
std::unique_ptr<Fabric> make_loopback_fabric(int world, int device = 0);
// W ranks over G of the visible GPUs, W / G consecutive ranks per GPU (rank r on GPU r / (W/G)),
// G = local_fabric_gpus(W, visible): one rank per GPU where W GPUs are visible, and several
// per GPU where fewer are (W = 8 on two GPUs: four each). W = 1: Loopback with one rank.
// Throws comet::Error when G < 2 for W > 1 (one GPU: use Loopback), or naming the pair if two
// GPUs cannot access each other's memory.
std::unique_ptr<Fabric> make_local_fabric(int world);
// The GPUs the Local fabric spreads `world` ranks over: the most of `visible` that divide
// `world` evenly (at least 1). Host only; no CUDA call.
int local_fabric_gpus(int world, int visible);

// By name, for command-line tools: "loopback" (W virtual ranks on the current GPU), "local" (the
// W ranks over the visible GPUs, make_local_fabric; this process) or "nccl" (this process's rank
// of a `comet launch` run, read from the environment; WORLD_SIZE must equal `world`). Throws
// comet::Error naming the problem.
std::unique_ptr<Fabric> make_fabric(const std::string& kind, int world);

// True when this build has the Nccl fabric (NCCL >= 2.28 found at configure time).
bool nccl_fabric_available();
// This process as rank env.rank of an NCCL communicator of env.world processes, on GPU
// env.local_rank, which becomes the calling thread's current device. Collective: every rank
// of the run constructs its fabric (rank 0 publishes the communicator id in
// env.bootstrap_file; the others wait for it at most env.timeout_s). Throws comet::Error when
// the build has no NCCL, the loaded libnccl's version differs from the headers', LOCAL_RANK
// names no visible GPU, the ranks span more than one node or cannot load/store each other's
// memory, or the bootstrap file cannot be written; comet::TimeoutError when the other ranks
// do not join in time.
std::unique_ptr<Fabric> make_nccl_fabric(const ProcessEnv& env);

}  // namespace comet::fabric
