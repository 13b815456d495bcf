// The baselines' inter-rank copy kernel and the all-to-all staging around it.
#include <algorithm>
#include <cstring>

#include "cuda/check.h"
#include "cuda/rank_copy.h"

namespace comet::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 8;  // 16-byte loads in flight per thread
constexpr int64_t kUnitsPerBlockStep = int64_t(kThreads) * kUnitsPerThread;

// Each block copies runs of kUnitsPerBlockStep units; a thread finds the segment of its first
// unit by binary search and walks forward from there (units only grow inside a run).
__global__ void copy_segments_kernel(const CopySegment* segments, int count, int64_t total_units) {
  for (int64_t base = blockIdx.x * kUnitsPerBlockStep; base < total_units; base += gridDim.x * kUnitsPerBlockStep) {
    const int64_t first = base + threadIdx.x;
    if (first >= total_units) continue;
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (segments[mid].unit_begin <= first) lo = mid; else hi = mid - 1;
    }
    uint4 v[kUnitsPerThread];
    uint4* dst[kUnitsPerThread];
    int seg = lo;
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const int64_t u = first + int64_t(j) * kThreads;
      dst[j] = nullptr;
      if (u >= total_units) continue;
      while (segments[seg].unit_begin + segments[seg].units <= u) ++seg;
      const int64_t i = u - segments[seg].unit_begin;
      v[j] = static_cast<const uint4*>(segments[seg].src)[i];
      dst[j] = static_cast<uint4*>(segments[seg].dst) + i;
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j)
      if (dst[j]) *dst[j] = v[j];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void copy_between_ranks(const CopyList& list, CUstream_st* stream) {
  if (list.count == 0 || list.total_units == 0) return;
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t steps = (list.total_units + kUnitsPerBlockStep - 1) / kUnitsPerBlockStep;
  const int grid = int(std::min<int64_t>(steps, int64_t(sms) * 4));
  copy_segments_kernel<<<grid, kThreads, 0, stream>>>(list.segments, list.count, list.total_units);
  COMET_CUDA_CHECK_LAUNCH();
}

void AllToAllPlan::clear() {
  used_ = 0;  // the lists keep their capacity: a warm forward allocates nothing here
  staged_.clear();
}

int AllToAllPlan::add() {
  if (used_ == int(lists_.size())) lists_.emplace_back();
  lists_[used_].clear();
  return used_++;
}

void AllToAllPlan::add_transfer(int id, const Transfer& t) {
  COMET_CHECK(id >= 0 && id < size(), "all-to-all " << id << " was never added");
  if (t.bytes == 0) return;
  COMET_CHECK(t.bytes > 0 && t.bytes % 16 == 0 && aligned16(t.src) && aligned16(t.dst),
              "inter-rank copy " << t.src_rank << " -> " << t.dst_rank << " of " << t.bytes
                                 << " bytes is not 16-byte aligned");
  std::vector<CopySegment>& list = lists_[id];
  const int64_t begin = list.empty() ? 0 : list.back().unit_begin + list.back().units;
  list.push_back(CopySegment{t.src, t.dst, begin, t.bytes / 16, t.src_rank, t.dst_rank});
}

int64_t AllToAllPlan::staged_bytes() const {
  int64_t n = 0;
  for (int id = 0; id < used_; ++id) n += int64_t(lists_[id].size()) * sizeof(CopySegment);
  return n;
}

void AllToAllPlan::stage(void* host, void* device) {
  staged_.clear();
  int64_t offset = 0;
  for (int id = 0; id < used_; ++id) {
    const std::vector<CopySegment>& list = lists_[id];
    const int64_t bytes = int64_t(list.size()) * sizeof(CopySegment);
    if (bytes) std::memcpy(static_cast<char*>(host) + offset, list.data(), bytes);
    CopyList staged;
    staged.segments = reinterpret_cast<const CopySegment*>(static_cast<char*>(device) + offset);
    staged.count = int(list.size());
    staged.total_units = list.empty() ? 0 : list.back().unit_begin + list.back().units;
    staged_.push_back(staged);
    offset += bytes;
  }
}

void AllToAllPlan::run(int id, CUstream_st* stream) const {
  COMET_CHECK(id >= 0 && id < int(staged_.size()), "all-to-all " << id << " was not staged");
  copy_between_ranks(staged_[id], stream);
}

int64_t AllToAllPlan::bytes(int id, bool remote_only) const {
  COMET_CHECK(id >= 0 && id < size(), "all-to-all " << id << " was never added");
  int64_t n = 0;
  for (const CopySegment& s : lists_[id])
    if (!remote_only || s.src_rank != s.dst_rank) n += s.units * 16;
  return n;
}

}  // namespace comet::cuda
