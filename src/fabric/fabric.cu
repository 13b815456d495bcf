// Loopback and Local fabrics.
#include <vector>

#include "cuda/check.h"
#include "fabric/fabric.h"

namespace comet::fabric {

namespace {

int64_t round_up(int64_t n) { return (n + 255) / 256 * 256; }

int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Restores the caller's current device on scope exit.
struct DeviceGuard {
  int saved = 0;
  DeviceGuard() { COMET_CUDA_CHECK(cudaGetDevice(&saved)); }
  ~DeviceGuard() { cudaSetDevice(saved); }
};

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
  int device_of(int) const override { return device_; }
  int64_t bytes_per_rank() const override { return bytes_; }
  void allocate(int64_t bytes) override {
    COMET_CHECK(bytes >= 0, "fabric: negative allocation " << bytes);
    release();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(device_));
    bytes_ = round_up(bytes);
    COMET_CUDA_CHECK(cudaMalloc(&heap_, std::max<int64_t>(bytes_, 256) * world_));
    COMET_CUDA_CHECK(cudaMemset(heap_, 0, std::max<int64_t>(bytes_, 256) * world_));
    std::vector<void*> bases(world_);
    for (int r = 0; r < world_; ++r) bases[r] = static_cast<char*>(heap_) + r * bytes_;
    COMET_CUDA_CHECK(cudaMalloc(&table_, world_ * sizeof(void*)));
    COMET_CUDA_CHECK(cudaMemcpy(table_, bases.data(), world_ * sizeof(void*), cudaMemcpyHostToDevice));
  }
  void* base(int rank) const override { return static_cast<char*>(heap_) + rank * bytes_; }
  void* const* peer_table(int) const override { return table_; }

 private:
  void release() {
    if (heap_) cudaFree(heap_);
    if (table_) cudaFree(table_);
    heap_ = nullptr;
    table_ = nullptr;
  }
  int world_, device_;
  int64_t bytes_ = 0;
  void* heap_ = nullptr;
  void** table_ = nullptr;
};

class LocalFabric final : public Fabric {
 public:
  explicit LocalFabric(int world) : world_(world) {
    const int n = visible_devices();
    COMET_CHECK(world >= 1 && world <= n, "local fabric: " << world << " ranks need as many GPUs, " << n << " visible");
    DeviceGuard guard;
    for (int a = 0; a < world; ++a)
      for (int b = 0; b < world; ++b) {
        if (a == b) continue;
        int ok = 0;
        COMET_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
        COMET_CHECK(ok, "local fabric: GPU " << a << " cannot access GPU " << b << "'s memory (no P2P)");
        COMET_CUDA_CHECK(cudaSetDevice(a));
        const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else COMET_CUDA_CHECK(err);
      }
  }
  ~LocalFabric() override { release(); }
  std::string name() const override { return "local"; }
  int world() const override { return world_; }
  int device_of(int rank) const override { return rank; }
  int64_t bytes_per_rank() const override { return bytes_; }
  void allocate(int64_t bytes) override {
    COMET_CHECK(bytes >= 0, "fabric: negative allocation " << bytes);
    release();
    DeviceGuard guard;
    bytes_ = round_up(bytes);
    heaps_.assign(world_, nullptr);
    tables_.assign(world_, nullptr);
    for (int r = 0; r < world_; ++r) {
      COMET_CUDA_CHECK(cudaSetDevice(r));
      COMET_CUDA_CHECK(cudaMalloc(&heaps_[r], std::max<int64_t>(bytes_, 256)));
      COMET_CUDA_CHECK(cudaMemset(heaps_[r], 0, std::max<int64_t>(bytes_, 256)));
    }
    for (int r = 0; r < world_; ++r) {  // with unified addressing a pointer is valid on every peer
      COMET_CUDA_CHECK(cudaSetDevice(r));
      COMET_CUDA_CHECK(cudaMalloc(&tables_[r], world_ * sizeof(void*)));
      COMET_CUDA_CHECK(cudaMemcpy(tables_[r], heaps_.data(), world_ * sizeof(void*), cudaMemcpyHostToDevice));
    }
  }
  void* base(int rank) const override { return heaps_[rank]; }
  void* const* peer_table(int rank) const override { return tables_[rank]; }

 private:
  void release() {
    for (void* p : heaps_) if (p) cudaFree(p);
    for (void** p : tables_) if (p) cudaFree(p);
    heaps_.clear();
    tables_.clear();
  }
  int world_;
  int64_t bytes_ = 0;
  std::vector<void*> heaps_;
  std::vector<void**> tables_;
};

}  // namespace

std::unique_ptr<Fabric> make_loopback_fabric(int world, int device) {
  return std::make_unique<LoopbackFabric>(world, device);
}

std::unique_ptr<Fabric> make_local_fabric(int world) {
  if (world == 1) return make_loopback_fabric(1, 0);
  return std::make_unique<LocalFabric>(world);
}

}  // namespace comet::fabric
