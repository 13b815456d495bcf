// bench/cublas_experts.h: the vendor baseline for expert GEMMs, C_e = A_e B_e^T (all K-major,
// bf16 in, fp32 accumulate, bf16 out), either one cublasGemmEx per expert or one
// cublasGemmGroupedBatchedEx call. The benchmark times both and compares against the faster.
#pragma once

#include <cstdint>
#include <vector>

struct CUstream_st;

namespace comet::bench {

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

  // A [rows][k], B [E][n][k], C [rows][n] (row-major, bf16).
  void per_expert_loop(const ExpertGemmShapes& s, const void* a, const void* b, void* c, CUstream_st* stream);
  // Prepares the device pointer arrays once per shape set (outside any timed region).
  void prepare_grouped(const ExpertGemmShapes& s, const void* a, const void* b, void* c);
  void grouped(CUstream_st* stream);

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  // grouped call state
  std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, group_size_;
  std::vector<int> transa_, transb_;
  std::vector<float> alpha_, beta_;
  void** device_ptrs_ = nullptr;  // [3][groups]
  int groups_ = 0;
};

}  // namespace comet::bench
