// The Fabric base class (argument checks of all_to_all_v), the Loopback and Local fabrics, and
// make_nccl_fabric() for builds without NCCL. The Nccl fabric is in nccl_fabric.cu.
#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "core/process_env.h"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"

namespace comet::fabric {

using detail::DeviceGuard;
using detail::kHeapAlign;
using detail::round_up;
using detail::visible_devices;

void Fabric::check_local(int rank, const char* what) const {
  COMET_CHECK(is_local(rank), name() << " fabric: " << what << "(" << rank << "): rank " << rank
                                     << " is not driven by this process (its ranks are " << first_local_rank()
                                     << ".." << first_local_rank() + num_local_ranks() - 1 << " of " << world()
                                     << ")");
}

void Fabric::check_heap_generation(uint64_t generation, const char* who) const {
  // No heap at all: the fabric lost it, not a second layer.
  COMET_CHECK(heap_generation_ == generation || bytes_per_rank() > 0,
              who << ": the fabric has no heap any more (its communicator was aborted after an error or timeout, "
                     "or an allocate() failed); make a new fabric and layer");
  COMET_CHECK(heap_generation_ == generation,
              who << ": the fabric's heap was reallocated after this layer was built (another layer on the same "
                     "fabric?); use one fabric per layer object");
}

void Fabric::all_to_all_v(const AllToAllVArgs* local_ranks, CUstream_st* stream) {
  const int W = world(), n = num_local_ranks(), first = first_local_rank();
  COMET_CHECK(local_ranks != nullptr, "all_to_all_v: null argument array");
  for (int i = 0; i < n; ++i) {
    const AllToAllVArgs& a = local_ranks[i];
    const int r = first + i;
    COMET_CHECK(a.send_bytes && a.send_offsets && a.recv_bytes && a.recv_offsets,
                "all_to_all_v: rank " << r << " passes a null size or offset array");
    int64_t sent = 0, received = 0;
    for (int p = 0; p < W; ++p) {
      COMET_CHECK(a.send_bytes[p] >= 0 && a.send_offsets[p] >= 0 && a.recv_bytes[p] >= 0 && a.recv_offsets[p] >= 0,
                  "all_to_all_v: rank " << r << ", peer " << p << ": negative size or offset (send "
                                        << a.send_bytes[p] << " at " << a.send_offsets[p] << ", receive "
                                        << a.recv_bytes[p] << " at " << a.recv_offsets[p] << ")");
      sent += a.send_bytes[p];
      received += a.recv_bytes[p];
    }
    COMET_CHECK(sent == 0 || a.send, "all_to_all_v: rank " << r << " sends " << sent << " bytes from a null buffer");
    COMET_CHECK(received == 0 || a.recv,
                "all_to_all_v: rank " << r << " receives " << received << " bytes into a null buffer");
  }
  // With every rank here, both sides of each pair are visible: check that they agree.
  if (n == W)
    for (int p = 0; p < W; ++p)
      for (int q = 0; q < W; ++q)
        COMET_CHECK(local_ranks[p].send_bytes[q] == local_ranks[q].recv_bytes[p],
                    "all_to_all_v: rank " << p << " sends " << local_ranks[p].send_bytes[q] << " bytes to rank " << q
                                          << ", which expects " << local_ranks[q].recv_bytes[p]);
  run_all_to_all_v(local_ranks, stream);
}

void Fabric::agree(uint64_t value, const std::string& what, const std::string& shown) {
  const auto [low, high] = run_min_max(value, what);
  COMET_CHECK(low == high, "fabric " << name() << ": the ranks disagree on " << what << " (this rank, "
                                     << first_local_rank() << ": " << shown << "); every rank must build the same one");
}

std::pair<uint64_t, uint64_t> Fabric::min_max(uint64_t value, const std::string& what) {
  return run_min_max(value, what);
}

void Fabric::wait(CUstream_st* stream, const std::string& what) { run_wait(stream, what); }

void Fabric::run_wait(CUstream_st* stream, const std::string& what) {
  (void)what;
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// run_allocate frees the old heap before it allocates: a layer built on the old heap must refuse
// to run even when the new allocation fails after that (bytes_per_rank() is then 0), while a
// failure before it (the Nccl fabric's size agreement) leaves the heap and its layers usable.
void Fabric::allocate(int64_t bytes) {
  try {
    run_allocate(bytes);
  } catch (...) {
    if (bytes_per_rank() == 0) ++heap_generation_;
    throw;
  }
  ++heap_generation_;
}

void Fabric::all_to_all_v(const void* send, const int64_t* send_bytes, const int64_t* send_offsets, void* recv,
                          const int64_t* recv_bytes, const int64_t* recv_offsets, CUstream_st* stream) {
  COMET_CHECK(num_local_ranks() == 1, "all_to_all_v with one rank's buffers needs a fabric with one local rank (Nccl, "
                                      "or W = 1); this "
                                          << name() << " fabric drives " << num_local_ranks()
                                          << ": pass one AllToAllVArgs per local rank");
  const AllToAllVArgs args{send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets};
  all_to_all_v(&args, stream);
}

namespace {

// Loopback and Local: every rank is in this process, so the exchange is W*W slice copies.
// cudaMemcpyDefault lets unified addressing pick the route (same device, or peer-to-peer).
void copy_all_to_all(const AllToAllVArgs* ranks, int world, cudaStream_t stream) {
  for (int p = 0; p < world; ++p)
    for (int q = 0; q < world; ++q) {
      const int64_t bytes = ranks[p].send_bytes[q];
      if (bytes == 0) continue;
      const char* src = static_cast<const char*>(ranks[p].send) + ranks[p].send_offsets[q];
      char* dst = static_cast<char*>(ranks[q].recv) + ranks[q].recv_offsets[p];
      COMET_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    }
}

class LoopbackFabric final : public Fabric {
 public:
  LoopbackFabric(int world, int device) : world_(world), device_(device) {
    COMET_CHECK(world >= 1, "loopback fabric: world must be >= 1, got " << world);
    const int n = visible_devices();
    COMET_CHECK(n > 0, "loopback fabric: no CUDA device is visible");
    COMET_CHECK(device >= 0 && device < n, "loopback fabric: device " << device << " outside [0, " << n << ")");
  }
  ~LoopbackFabric() override { release(); }
  std::string name() const override { return "loopback"; }
  int world() const override { return world_; }
  int first_local_rank() const override { return 0; }
  int num_local_ranks() const override { return world_; }
  int device_of(int rank) const override {
    check_local(rank, "device_of");
    return device_;
  }
  int gpus() const override { return 1; }
  int64_t bytes_per_rank() const override { return bytes_; }
  void run_allocate(int64_t bytes) override {
    detail::check_heap_size(bytes);
    release();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(device_));
    const int64_t want = round_up(bytes, kHeapAlign);
    const int64_t slice = std::max<int64_t>(want, 256);  // what each rank's heap takes
    COMET_CHECK(slice <= std::numeric_limits<int64_t>::max() / world_,
                "loopback fabric: " << world_ << " heaps of " << want << " bytes overflow int64");
    COMET_CUDA_CHECK(cudaMalloc(&heap_, slice * world_));
    COMET_CUDA_CHECK(cudaMemset(heap_, 0, slice * world_));
    bases_.resize(world_);
    for (int r = 0; r < world_; ++r) bases_[r] = static_cast<char*>(heap_) + r * want;
    COMET_CUDA_CHECK(cudaMalloc(&table_, world_ * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMemcpy(table_, bases_.data(), world_ * sizeof(void*), cudaMemcpyHostToDevice));
    bytes_ = want;  // last: a failure above leaves 0 bytes, so Fabric::allocate moves the generation
  }
  void* base(int rank) const override {
    check_local(rank, "base");
    return static_cast<char*>(heap_) + rank * bytes_;
  }
  void* const* peer_table(int rank) const override {
    check_local(rank, "peer_table");
    return table_;
  }
  std::vector<void*> peer_table_host(int rank) const override {
    check_local(rank, "peer_table_host");
    return bases_;
  }
  void barrier(CUstream_st* stream) override { COMET_CUDA_CHECK(cudaStreamSynchronize(stream)); }

 private:
  void run_all_to_all_v(const AllToAllVArgs* ranks, CUstream_st* stream) override {
    copy_all_to_all(ranks, world_, stream);
  }
  void release() {
    if (heap_) cudaFree(heap_);
    if (table_) cudaFree(table_);
    heap_ = nullptr;
    table_ = nullptr;
    bases_.clear();
    bytes_ = 0;
  }
  int world_, device_;
  int64_t bytes_ = 0;
  void* heap_ = nullptr;
  void** table_ = nullptr;
  std::vector<void*> bases_;
};

// Peer access belongs to the process's device contexts, not to one fabric, and several Local
// fabrics may live at once (a layer's and its baselines'). A pair (from, to) is enabled while
// some Local fabric holds it and disabled with the last holder, so that no call meets "peer
// access is already enabled" (an error the CUDA sanitizers report) once the first fabric is
// gone; a pair that was enabled before a fabric first asked (by the application) is left as it is.
// An application that enables a pair itself while a Local fabric holds it gets "already
// enabled", and loses the access when the last fabric goes: enable before making fabrics.
// The bookkeeping lives in leaked heap objects, so it outlives any fabric held by a static.
class PeerAccess {
 public:
  // Counted only once access is on: a throw leaves the count as it was.
  static void acquire(int from, int to) {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mutex);
    int& holders = st.holders[{from, to}];
    if (holders > 0) {
      ++holders;
      return;
    }
    COMET_CUDA_CHECK(cudaSetDevice(from));
    const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      st.not_ours.insert({from, to});
    } else {
      COMET_CUDA_CHECK(err);
    }
    holders = 1;
  }
  // No throw (destructors): a failure to disable leaves access on, which is harmless.
  static void release(int from, int to) {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mutex);
    int& holders = st.holders[{from, to}];
    if (holders == 0 || --holders > 0) return;
    if (st.not_ours.erase({from, to}) > 0) return;
    if (cudaSetDevice(from) == cudaSuccess && cudaDeviceDisablePeerAccess(to) != cudaSuccess) cudaGetLastError();
  }

 private:
  struct State {
    std::mutex mutex;
    std::map<std::pair<int, int>, int> holders;  // Local fabrics holding each pair
    std::set<std::pair<int, int>> not_ours;      // pairs enabled before any fabric asked
  };
  static State& state() {
    static auto* s = new State;
    return *s;
  }
};

// W ranks over G GPUs (G divides W): ranks [g * W/G, (g + 1) * W/G) run on GPU g, each with a
// heap of its own on its GPU; peer access is enabled between every pair of the G GPUs.
class LocalFabric final : public Fabric {
 public:
  LocalFabric(int world, int gpus) : world_(world), per_gpu_(world / gpus) {
    DeviceGuard guard;
    try {
      for (int a = 0; a < gpus; ++a)
        for (int b = 0; b < gpus; ++b) {
          if (a == b) continue;
          int ok = 0;
          COMET_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
          COMET_CHECK(ok, "local fabric: GPU " << a << " cannot access GPU " << b << "'s memory (no P2P)");
          // The signals and barriers are atomic adds into peers' memory: a link without native
          // atomics (some PCIe P2P) may lose concurrent ones, and a lost add is a wait that
          // times out for no reason.
          COMET_CUDA_CHECK(cudaDeviceGetP2PAttribute(&ok, cudaDevP2PAttrNativeAtomicSupported, a, b));
          COMET_CHECK(ok, "local fabric: GPU " << a << " has no native atomics on GPU " << b
                                               << "'s memory over their link (the signals need them; NVLink has them)");
          PeerAccess::acquire(a, b);
          peers_.emplace_back(a, b);
        }
    } catch (...) {
      release_peers();
      throw;
    }
  }
  ~LocalFabric() override {
    release();
    release_peers();
  }
  std::string name() const override { return "local"; }
  int world() const override { return world_; }
  int first_local_rank() const override { return 0; }
  int num_local_ranks() const override { return world_; }
  int device_of(int rank) const override {
    check_local(rank, "device_of");
    return rank / per_gpu_;
  }
  int gpus() const override { return world_ / per_gpu_; }
  int64_t bytes_per_rank() const override { return bytes_; }
  void run_allocate(int64_t bytes) override {
    detail::check_heap_size(bytes);
    release();
    DeviceGuard guard;
    const int64_t want = round_up(bytes, kHeapAlign);
    heaps_.assign(world_, nullptr);
    tables_.assign(world_, nullptr);
    for (int r = 0; r < world_; ++r) {
      COMET_CUDA_CHECK(cudaSetDevice(device_of(r)));
      COMET_CUDA_CHECK(cudaMalloc(&heaps_[r], std::max<int64_t>(want, 256)));
      COMET_CUDA_CHECK(cudaMemset(heaps_[r], 0, std::max<int64_t>(want, 256)));
    }
    for (int r = 0; r < world_; ++r) {  // with unified addressing a pointer is valid on every peer
      COMET_CUDA_CHECK(cudaSetDevice(device_of(r)));
      COMET_CUDA_CHECK(cudaMalloc(&tables_[r], world_ * sizeof(void*)));
      COMET_CUDA_CHECK(cudaMemcpy(tables_[r], heaps_.data(), world_ * sizeof(void*), cudaMemcpyHostToDevice));
    }
    bytes_ = want;  // last: a failure above leaves 0 bytes, so Fabric::allocate moves the generation
  }
  void* base(int rank) const override {
    check_local(rank, "base");
    return heaps_[rank];
  }
  void* const* peer_table(int rank) const override {
    check_local(rank, "peer_table");
    return tables_[rank];
  }
  std::vector<void*> peer_table_host(int rank) const override {
    check_local(rank, "peer_table_host");
    return heaps_;
  }
  void barrier(CUstream_st* stream) override { COMET_CUDA_CHECK(cudaStreamSynchronize(stream)); }

 private:
  void run_all_to_all_v(const AllToAllVArgs* ranks, CUstream_st* stream) override {
    copy_all_to_all(ranks, world_, stream);
  }
  void release() {
    for (void* p : heaps_) if (p) cudaFree(p);
    for (void** p : tables_) if (p) cudaFree(p);
    heaps_.clear();
    tables_.clear();
    bytes_ = 0;
  }
  void release_peers() {
    int saved = 0;  // restored below; no throwing guard in a destructor
    cudaGetDevice(&saved);
    for (const auto& [a, b] : peers_) PeerAccess::release(a, b);
    peers_.clear();
    cudaSetDevice(saved);
  }
  std::vector<std::pair<int, int>> peers_;  // the pairs this fabric enabled (PeerAccess)
  int world_, per_gpu_;
  int64_t bytes_ = 0;
  std::vector<void*> heaps_;
  std::vector<void**> tables_;
};

}  // namespace

std::unique_ptr<Fabric> make_loopback_fabric(int world, int device) {
  return std::make_unique<LoopbackFabric>(world, device);
}

int local_fabric_gpus(int world, int visible) {
  int gpus = std::max(1, std::min(world, visible));
  while (world % gpus != 0) --gpus;
  return gpus;
}

std::unique_ptr<Fabric> make_local_fabric(int world) {
  COMET_CHECK(world >= 1, "local fabric: world must be >= 1, got " << world);
  if (world == 1) return make_loopback_fabric(1, 0);
  const int visible = visible_devices();
  const int gpus = local_fabric_gpus(world, visible);
  COMET_CHECK(gpus >= 2, "local fabric: " << world << " ranks need at least 2 GPUs that divide them evenly, "
                                          << visible << " visible (on one GPU use the loopback fabric)");
  return std::make_unique<LocalFabric>(world, gpus);
}

std::unique_ptr<Fabric> make_fabric(const std::string& kind, int world) {
  if (kind == "loopback") {
    int device = 0;
    COMET_CUDA_CHECK(cudaGetDevice(&device));
    return make_loopback_fabric(world, device);
  }
  if (kind == "local") return make_local_fabric(world);
  COMET_CHECK(kind == "nccl", "unknown fabric \"" << kind << "\" (loopback, local or nccl)");
  const std::optional<ProcessEnv> env = read_process_env();
  COMET_CHECK(env, "the nccl fabric runs one process per rank: start " << world << " of them with `comet launch -n "
                                                                        << world << " -- ...`");
  COMET_CHECK(env->world == world, "the layout has " << world << " ranks (EP x TP) but " << env->world
                                                     << " processes were launched (WORLD_SIZE)");
  return make_nccl_fabric(*env);
}

#ifndef COMET_HAVE_NCCL
bool nccl_fabric_available() { return false; }

std::unique_ptr<Fabric> make_nccl_fabric(const ProcessEnv&) {
  throw Error(
      "the Nccl fabric is not built: configure with NCCL >= 2.28 available (COMET_ENABLE_NCCL, COMET_NCCL_ROOT; "
      "docs/fabric.md)");
}
#endif

}  // namespace comet::fabric
