// cuda/bf16_rows.cuh: fp32 arithmetic on rows of bf16 moved 16 bytes (8 values) at a time, for the
// copy-and-reduce kernels (rows are H-wide with H % 8 == 0). fma_chunk and to_bf16_chunk are
// the combine's arithmetic (cuda/comm_rows.cuh), which GEMM1's epilogue repeats for rows it
// stores into their owner's slot itself (cuda/sm90_grouped_gemm.cuh): one definition, so the
// two agree bit for bit.
#pragma once

#include <cuda_bf16.h>

namespace comet::cuda {

// acc[i] += w * v[i] for the 8 bf16 values in v.
__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const uint4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    acc[2 * q] += w * f.x;
    acc[2 * q + 1] += w * f.y;
  }
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&out)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    out[2 * q] = f.x;
    out[2 * q + 1] = f.y;
  }
}

// acc += w * x for the 8 bf16 values of one chunk (explicit fma: one rounding, one order).
__device__ __forceinline__ void fma_chunk(float* acc, float w, const uint4& x) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 v = __bfloat1622float2(h[q]);
    acc[2 * q] = __fmaf_rn(w, v.x, acc[2 * q]);
    acc[2 * q + 1] = __fmaf_rn(w, v.y, acc[2 * q + 1]);
  }
}

// The 8 values rounded to bf16 (nearest even).
__device__ __forceinline__ uint4 to_bf16_chunk(const float* acc) {
  uint4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int q = 0; q < 4; ++q) o[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  return out;
}

}  // namespace comet::cuda
