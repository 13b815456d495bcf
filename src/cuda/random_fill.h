// cuda/random_fill.h: deterministic pseudo-random bf16 on the device, uniform in
// [-scale, scale) from a hash of (stream, index), so that large benchmark tensors need no host
// copy and two layouts of one logical tensor can hold the same values.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace comet::cuda {

void fill_uniform_bf16(void* out, size_t count, uint64_t stream_id, float scale, CUstream_st* stream = nullptr);

}  // namespace comet::cuda
