// The publish kernel (cuda/publish.h): blockIdx.y picks the rank of the batch, the blocks of a
// rank copy its rows grid-stride, 16 bytes per thread and kUnroll loads in flight before their
// stores.
#include "cuda/publish.h"

#include <algorithm>

#include "cuda/check.h"
#include "cuda/dependent_launch.h"

namespace comet::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kBatch = 8;  // ranks per launch
struct PublishBatch {
  PublishCopy ranks[kBatch];
};

template <class T>
__device__ void copy_words(T* dst, const T* src, int64_t n, int64_t first, int64_t stride) {
  for (int64_t i0 = first; i0 < n; i0 += kUnroll * stride) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * stride < n) v[u] = src[i0 + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * stride < n) dst[i0 + u * stride] = v[u];
  }
}

__global__ void __launch_bounds__(kThreads) publish_kernel(PublishShape s, const __grid_constant__ PublishBatch b) {
  begin_dependent_kernel();
  const PublishCopy& c = b.ranks[blockIdx.y];
  const int given = *c.count;
  const int rows = given >= 0 && given <= s.t_max ? given : 0;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  if (first == 0) *c.count_dst = given;
  if (c.x != nullptr)  // null: copied by the host (not 16-byte aligned)
    copy_words(static_cast<uint4*>(c.x_dst), static_cast<const uint4*>(c.x), int64_t(rows) * (s.hidden / 8), first,
               stride);
  copy_words(c.ids_dst, c.ids, int64_t(rows) * s.topk, first, stride);
  copy_words(c.weights_dst, c.weights, int64_t(rows) * s.topk, first, stride);
}

}  // namespace

void publish_inputs(const PublishShape& shape, const PublishCopy* ranks, int n, int num_sms, CUstream_st* stream) {
  COMET_CHECK(shape.hidden % 8 == 0, "publish: hidden " << shape.hidden << " is not a multiple of 8 (16-byte rows)");
  for (int i = 0; i < n; ++i) {
    const PublishCopy& c = ranks[i];
    COMET_CHECK(c.x && c.x_dst && c.ids && c.ids_dst && c.weights && c.weights_dst && c.count && c.count_dst,
                "publish: a null pointer among rank " << i << "'s inputs or regions");
    COMET_CHECK(aligned(c.ids, 4) && aligned(c.weights, 4) && aligned(c.count, 4),
                "publish: the routing or token count of the batch's rank " << i << " is not 4-byte aligned");
  }
  for (int first = 0; first < n; first += kBatch) {
    PublishBatch batch{};
    const int count = std::min(kBatch, n - first);
    std::copy(ranks + first, ranks + first + count, batch.ranks);
    for (PublishCopy& c : batch.ranks)
      if (c.x != nullptr && !(aligned(c.x, 16) && aligned(c.x_dst, 16))) {  // whole T_max rows, as a plain copy
        COMET_CUDA_CHECK(cudaMemcpyAsync(c.x_dst, c.x, size_t(shape.t_max) * shape.hidden * 2, cudaMemcpyDeviceToDevice,
                                         stream));
        c.x = nullptr;
      }
    // About two blocks per SM over the batch (the copies are bound by HBM, not by blocks).
    const dim3 grid(std::max(1, 2 * num_sms / count), count);
    launch_kernel(publish_kernel, grid, dim3(kThreads), 0, stream, LaunchAttributes(), shape, batch);
  }
}

}  // namespace comet::cuda
