// Upload and download of a MoeProblem's per-rank tensors.
#include "cuda/device_problem.h"

#include <algorithm>
#include <utility>

#include "comet/dtype.h"
#include "cuda/check.h"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"

namespace comet::cuda {

// Allocations on the current device at upload() time, freed each on its own device.
struct DeviceProblem::Buffers {
  std::vector<std::pair<void*, int>> owned;  // pointer, device
  ~Buffers() {
    int saved = 0;
    cudaGetDevice(&saved);
    for (const auto& [p, device] : owned) {
      cudaSetDevice(device);
      cudaFree(p);
    }
    cudaSetDevice(saved);
  }
  template <class T>
  T* upload(const std::vector<T>& host) {
    void* p = nullptr;
    int device = 0;
    COMET_CUDA_CHECK(cudaGetDevice(&device));
    COMET_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(T)));
    owned.emplace_back(p, device);
    if (!host.empty()) COMET_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T*>(p);
  }
};

DeviceProblem::DeviceProblem(const LayerConfig& c, const MoeProblem& p, const fabric::Fabric* fabric)
    : buffers_(std::make_unique<Buffers>()) {
  const int W = c.layout.world, H = c.model.hidden, K = c.model.topk, Tm = c.max_tokens_per_rank;
  COMET_CHECK(int(p.x.size()) == W && int(p.routing.size()) == W,
              "DeviceProblem: the problem has " << p.x.size() << " ranks, the config " << W);
  hidden_ = H;
  topk_ = K;
  t_max_ = Tm;
  const int first = fabric ? fabric->first_local_rank() : 0, count = fabric ? fabric->num_local_ranks() : W;
  COMET_CHECK(!fabric || fabric->world() == W, "DeviceProblem: the fabric has " << fabric->world() << " ranks, the config " << W);
  // Every rank's sizes before any upload. Only the sizes: the routing's values (ids out of
  // range, NaN weights) go up as given, so that tests can see the layer report them.
  for (int r = first; r < first + count; ++r) {
    const Routing& rt = p.routing[r];
    COMET_CHECK(rt.num_tokens >= 0 && rt.num_tokens <= Tm,
                "DeviceProblem: rank " << r << " has " << rt.num_tokens << " tokens, T_max is " << Tm);
    COMET_CHECK(rt.topk == K, "DeviceProblem: rank " << r << "'s routing has topk " << rt.topk << ", the config " << K);
    const size_t slots = size_t(rt.num_tokens) * size_t(K);
    COMET_CHECK(rt.expert_ids.size() == slots && rt.weights.size() == slots,
                "DeviceProblem: rank " << r << "'s routing has " << rt.expert_ids.size() << " expert ids and "
                                       << rt.weights.size() << " weights, " << rt.num_tokens << " tokens x topk " << K
                                       << " are " << slots);
    COMET_CHECK(p.x[r].size() == size_t(rt.num_tokens) * size_t(H),
                "DeviceProblem: rank " << r << "'s x has " << p.x[r].size() << " values, " << rt.num_tokens
                                       << " tokens x hidden " << H << " are " << size_t(rt.num_tokens) * size_t(H));
  }
  fabric::detail::DeviceGuard guard;
  int current = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&current));
  for (int r = first; r < first + count; ++r) {
    devices_.push_back(fabric ? fabric->device_of(r) : current);
    COMET_CUDA_CHECK(cudaSetDevice(devices_.back()));
    const Routing& rt = p.routing[r];
    std::vector<uint16_t> x(size_t(Tm) * H, 0);
    for (size_t i = 0; i < p.x[r].size(); ++i) x[i] = float_to_bf16_bits(p.x[r][i]);
    std::vector<int32_t> ids(size_t(Tm) * K, -1);
    std::vector<float> w(size_t(Tm) * K, 0.f);
    std::copy(rt.expert_ids.begin(), rt.expert_ids.end(), ids.begin());
    std::copy(rt.weights.begin(), rt.weights.end(), w.begin());
    RankTensors t;
    t.x = buffers_->upload(x);
    t.expert_ids = buffers_->upload(ids);
    t.weights = buffers_->upload(w);
    t.num_tokens = buffers_->upload(std::vector<int32_t>{rt.num_tokens});
    t.y = buffers_->upload(std::vector<uint16_t>(size_t(Tm) * H, 0xffff));
    tensors_.push_back(t);
    tokens_.push_back(rt.num_tokens);
    // The uploads above are pageable copies on this device's legacy stream: landed before a
    // forward on any stream reads them.
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

DeviceProblem::~DeviceProblem() = default;

size_t DeviceProblem::rows(size_t rank) const {
  return size_t(std::clamp(tokens_[rank], 0, t_max_));
}

std::vector<std::vector<float>> DeviceProblem::download_y() const {
  std::vector<std::vector<float>> out;
  for (size_t r = 0; r < tensors_.size(); ++r) {
    std::vector<uint16_t> bits(rows(r) * hidden_);
    if (!bits.empty())
      COMET_CUDA_CHECK(cudaMemcpy(bits.data(), tensors_[r].y, bits.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> v(bits.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_bits_to_float(bits[i]);
    out.push_back(std::move(v));
  }
  return out;
}

void DeviceProblem::poison_y() {
  fabric::detail::DeviceGuard guard;
  for (size_t r = 0; r < tensors_.size(); ++r) {
    COMET_CUDA_CHECK(cudaSetDevice(devices_[r]));
    COMET_CUDA_CHECK(cudaMemset(tensors_[r].y, 0xff, rows(r) * hidden_ * 2));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void DeviceProblem::set_token_count(int rank, int32_t count) {
  COMET_CHECK(rank >= 0 && rank < int(tensors_.size()), "DeviceProblem: no rank " << rank);
  // On the rank's device, landed before a forward on any stream reads it: a pageable copy returns
  // before its DMA ends, on the legacy stream, which non-blocking streams (and graph replays on
  // them) do not wait for.
  fabric::detail::DeviceGuard guard;
  COMET_CUDA_CHECK(cudaSetDevice(devices_[rank]));
  COMET_CUDA_CHECK(cudaMemcpy(const_cast<int32_t*>(tensors_[rank].num_tokens), &count, 4, cudaMemcpyHostToDevice));
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  tokens_[rank] = count;
}

}  // namespace comet::cuda

namespace comet::cuda {

void DeviceProblem::assign_inputs(const DeviceProblem& other) {
  COMET_CHECK(other.tensors_.size() == tensors_.size() && other.hidden_ == hidden_ && other.topk_ == topk_ &&
                  other.t_max_ == t_max_,
              "DeviceProblem::assign_inputs: the problems differ in shape");
  const size_t rows = size_t(t_max_);
  fabric::detail::DeviceGuard guard;
  for (size_t r = 0; r < tensors_.size(); ++r) {
    COMET_CUDA_CHECK(cudaSetDevice(devices_[r]));  // the copies on the rank's device, as its sync below
    const RankTensors& to = tensors_[r];
    const RankTensors& from = other.tensors_[r];
    COMET_CUDA_CHECK(cudaMemcpy(const_cast<void*>(to.x), from.x, rows * hidden_ * 2, cudaMemcpyDefault));
    COMET_CUDA_CHECK(
        cudaMemcpy(const_cast<int32_t*>(to.expert_ids), from.expert_ids, rows * topk_ * 4, cudaMemcpyDefault));
    COMET_CUDA_CHECK(cudaMemcpy(const_cast<float*>(to.weights), from.weights, rows * topk_ * 4, cudaMemcpyDefault));
    set_token_count(int(r), other.tokens_[r]);  // (synchronizes the device: the copies above have landed)
  }
}

}  // namespace comet::cuda
