// Hash-based uniform bf16 fill (splitmix64 of stream and index).
#include <cuda_bf16.h>

#include "cuda/check.h"
#include "cuda/random_fill.h"

namespace comet::cuda {

namespace {
__global__ void fill_kernel(__nv_bfloat16* out, size_t n, uint64_t stream_id, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (stream_id * 0x9e3779b97f4a7c15ull) ^ (i + 0x632be59bd9b4e019ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    out[i] = __float2bfloat16((float(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f) * scale);
  }
}
}  // namespace

void fill_uniform_bf16(void* out, size_t count, uint64_t stream_id, float scale, CUstream_st* stream) {
  if (count == 0) return;
  fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), count, stream_id, scale);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::cuda
