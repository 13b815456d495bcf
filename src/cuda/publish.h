// cuda/publish.h: step 1 of a forward, a rank's inputs (x, routing, token count) copied into its
// symmetric regions, where every rank's plan and dispatch read them.
//
// One kernel for up to 8 ranks of a device (virtual ranks on one GPU publish in one launch
// instead of four copies each), and only the rows below each rank's token count, which the
// kernel reads on the device: at T = T_max the bytes are those of the plain copies, below it
// fewer. Nothing reads a row past the count (the plan reads routing of tokens t < count, the
// dispatch moves received tokens only).
#pragma once

#include <cstdint>

struct CUstream_st;

namespace comet::cuda {

// One rank's inputs and where they go. x rows are `hidden` bf16, routing rows `topk` entries.
struct PublishCopy {
  const void* x = nullptr;
  void* x_dst = nullptr;
  const int32_t* ids = nullptr;
  int32_t* ids_dst = nullptr;
  const float* weights = nullptr;
  float* weights_dst = nullptr;
  const int32_t* count = nullptr;  // device memory, as the caller gave it
  int32_t* count_dst = nullptr;
};
struct PublishShape {
  int t_max = 0, hidden = 0, topk = 0;
};

// Copies `n` ranks' inputs, asynchronously on `stream`. The count is copied as given; rows are
// copied up to it, clamped to [0, T_max] (a bad count is the plan's to report: it then reads no
// rows). The routing must be 4-byte aligned (comet::Error otherwise); an x that is not 16-byte
// aligned is copied whole (T_max rows) by cudaMemcpyAsync instead.
void publish_inputs(const PublishShape& shape, const PublishCopy* ranks, int n, int num_sms, CUstream_st* stream);

}  // namespace comet::cuda
