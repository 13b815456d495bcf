// cuda/cublas_experts.h: the vendor expert GEMMs, C_e = A_e B_e^T (all K-major, bf16 in, fp32
// accumulate, bf16 out), as one cublasGemmEx per expert or one cublasGemmGroupedBatchedEx call.
// `comet bench gemm` times both against the Comet grouped GEMM; the baselines
// (cuda/baseline_moe.cu) run whichever BaselineOptions::gemm names.
//
// Layouts (row-major): A [rows][k] and C [rows][n] with expert e's rows at offsets[e];
// B [E][n][k]. Experts with no rows are skipped.
// Pitfall: the grouped call reads its A/B/C pointers from device memory; grouped() with
// caller-staged pointers needs them on the device before the call runs on `stream`.
#pragma once

#include <cstdint>
#include <vector>

struct CUstream_st;

namespace comet::cuda {

struct ExpertGemmShapes {
  std::vector<int> rows;     // per expert
  std::vector<int> offsets;  // row offset of each expert in A and C
  int n = 0, k = 0;
};

class CublasExperts {
 public:
  CublasExperts();
  ~CublasExperts();
  CublasExperts(const CublasExperts&) = delete;
  CublasExperts& operator=(const CublasExperts&) = delete;

  void per_expert_loop(const ExpertGemmShapes& s, const void* a, const void* b, void* c, CUstream_st* stream);

  // Groups of one grouped call (experts with rows), and its pointer array: 3 * groups entries,
  // B of every group, then A, then C. The caller copies them to device memory.
  static int grouped_groups(const ExpertGemmShapes& s);
  static void grouped_pointers(const ExpertGemmShapes& s, const void* a, const void* b, void* c, void** out);
  // One cublasGemmGroupedBatchedEx over the pointers grouped_pointers() wrote, now on the device.
  void grouped(const ExpertGemmShapes& s, void* const* device_pointers, CUstream_st* stream);

  // Benchmarks: stage the pointer array once per shape set (allocates and copies synchronously,
  // outside any timed region), then grouped(stream) runs it.
  void prepare_grouped(const ExpertGemmShapes& s, const void* a, const void* b, void* c);
  void grouped(CUstream_st* stream);

 private:
  void release() noexcept;  // frees what exists (the destructor, a constructor that throws)
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  // Host arrays of the grouped call, rebuilt per call (capacity kept: no allocation once warm).
  std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, group_size_;
  std::vector<int> transa_, transb_;
  std::vector<float> alpha_, beta_;
  // prepare_grouped() state
  ExpertGemmShapes prepared_;
  void** device_ptrs_ = nullptr;
};

}  // namespace comet::cuda
