// cuBLAS expert GEMMs: a per-expert loop and the grouped batched call.
#include <cublas_v2.h>

#include <sstream>

#include "cuda/check.h"
#include "cuda/cublas_experts.h"

#define COMET_CUBLAS_CHECK(call)                                                          \
  do {                                                                                    \
    const cublasStatus_t comet_cublas_st_ = (call);                                       \
    if (comet_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                      \
      std::ostringstream os;                                                              \
      os << "cuBLAS error " << cublasGetStatusName(comet_cublas_st_) << " in `" #call "` at " \
         << __FILE__ << ":" << __LINE__;                                                  \
      throw ::comet::Error(os.str());                                                     \
    }                                                                                     \
  } while (0)

namespace comet::cuda {

namespace {
constexpr size_t kWorkspaceBytes = 64u << 20;
cublasHandle_t h(void* p) { return static_cast<cublasHandle_t>(p); }
}  // namespace

CublasExperts::CublasExperts() {
  cublasHandle_t handle;
  COMET_CUBLAS_CHECK(cublasCreate(&handle));
  handle_ = handle;
  // A constructor that throws runs no destructor: what was made so far is released here.
  try {
    COMET_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    COMET_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace_, kWorkspaceBytes));
  } catch (...) {
    release();
    throw;
  }
}

CublasExperts::~CublasExperts() { release(); }

void CublasExperts::release() noexcept {
  if (device_ptrs_) cudaFree(device_ptrs_);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasDestroy(h(handle_));
  device_ptrs_ = nullptr;
  workspace_ = nullptr;
  handle_ = nullptr;
}

// Row-major C[rows][n] = A[rows][k] * B[n][k]^T is column-major C^T = op_T(B) * A^T:
// cuBLAS sees m = n, n = rows, with B transposed (the "TN" GEMM).
void CublasExperts::per_expert_loop(const ExpertGemmShapes& s, const void* a, const void* b, void* c,
                                    CUstream_st* stream) {
  COMET_CUBLAS_CHECK(cublasSetStream(h(handle_), stream));
  const float alpha = 1.f, beta = 0.f;
  for (size_t e = 0; e < s.rows.size(); ++e) {
    if (s.rows[e] == 0) continue;
    const auto* ae = static_cast<const uint16_t*>(a) + size_t(s.offsets[e]) * s.k;
    const auto* be = static_cast<const uint16_t*>(b) + e * size_t(s.n) * s.k;
    auto* ce = static_cast<uint16_t*>(c) + size_t(s.offsets[e]) * s.n;
    COMET_CUBLAS_CHECK(cublasGemmEx(h(handle_), CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.rows[e], s.k, &alpha, be,
                                    CUDA_R_16BF, s.k, ae, CUDA_R_16BF, s.k, &beta, ce, CUDA_R_16BF, s.n,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

int CublasExperts::grouped_groups(const ExpertGemmShapes& s) {
  int groups = 0;
  for (int rows : s.rows) groups += rows > 0;
  return groups;
}

void CublasExperts::grouped_pointers(const ExpertGemmShapes& s, const void* a, const void* b, void* c, void** out) {
  const int groups = grouped_groups(s);
  int g = 0;
  for (size_t e = 0; e < s.rows.size(); ++e) {
    if (s.rows[e] == 0) continue;
    out[g] = const_cast<uint16_t*>(static_cast<const uint16_t*>(b) + e * size_t(s.n) * s.k);
    out[groups + g] = const_cast<uint16_t*>(static_cast<const uint16_t*>(a) + size_t(s.offsets[e]) * s.k);
    out[2 * groups + g] = static_cast<uint16_t*>(c) + size_t(s.offsets[e]) * s.n;
    ++g;
  }
}

void CublasExperts::grouped(const ExpertGemmShapes& s, void* const* device_pointers, CUstream_st* stream) {
  m_.clear(); n_.clear(); k_.clear(); lda_.clear(); ldb_.clear(); ldc_.clear(); group_size_.clear();
  transa_.clear(); transb_.clear(); alpha_.clear(); beta_.clear();
  for (int rows : s.rows) {
    if (rows == 0) continue;
    m_.push_back(s.n); n_.push_back(rows); k_.push_back(s.k);
    lda_.push_back(s.k); ldb_.push_back(s.k); ldc_.push_back(s.n);
    group_size_.push_back(1);
    transa_.push_back(CUBLAS_OP_T); transb_.push_back(CUBLAS_OP_N);
    alpha_.push_back(1.f); beta_.push_back(0.f);
  }
  const int groups = int(m_.size());
  if (groups == 0) return;
  COMET_CUBLAS_CHECK(cublasSetStream(h(handle_), stream));
  void** ptrs = const_cast<void**>(device_pointers);
  COMET_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      h(handle_), reinterpret_cast<const cublasOperation_t*>(transa_.data()),
      reinterpret_cast<const cublasOperation_t*>(transb_.data()), m_.data(), n_.data(), k_.data(), alpha_.data(),
      ptrs, CUDA_R_16BF, lda_.data(), ptrs + groups, CUDA_R_16BF, ldb_.data(), beta_.data(), ptrs + 2 * groups,
      CUDA_R_16BF, ldc_.data(), groups, group_size_.data(), CUBLAS_COMPUTE_32F));
}

void CublasExperts::prepare_grouped(const ExpertGemmShapes& s, const void* a, const void* b, void* c) {
  prepared_ = s;
  if (device_ptrs_) cudaFree(device_ptrs_);
  device_ptrs_ = nullptr;
  const int groups = grouped_groups(s);
  if (groups == 0) return;
  std::vector<void*> host(3 * size_t(groups));
  grouped_pointers(s, a, b, c, host.data());
  COMET_CUDA_CHECK(cudaMalloc(&device_ptrs_, host.size() * sizeof(void*)));
  COMET_CUDA_CHECK(cudaMemcpy(device_ptrs_, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
  // The pageable copy may still be in flight on the legacy stream, which a non-blocking stream
  // running grouped() does not wait for.
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
}

void CublasExperts::grouped(CUstream_st* stream) {
  if (device_ptrs_) grouped(prepared_, device_ptrs_, stream);
}

}  // namespace comet::cuda
