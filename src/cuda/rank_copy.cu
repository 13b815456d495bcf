// The baselines' inter-rank copy kernel and the all-to-all staging around it.
#include <algorithm>
#include <cstring>

#include "cuda/check.h"
#include "cuda/link_pace.cuh"
#include "cuda/rank_copy.h"

namespace comet::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 8;  // 16-byte loads in flight per thread
constexpr int64_t kUnitsPerBlockStep = int64_t(kThreads) * kUnitsPerThread;

enum class Pacing { kOff, kOn };

// Each block copies runs of kUnitsPerBlockStep units; a thread finds the segment of its first
// unit by binary search and walks forward from there (units only grow inside a run). Paced
// (cuda/link_pace.h): after the loads, thread 0 reserves the step's remote bytes on the pacer
// and the block waits for the link before storing; the block ends one latency after its last
// step, and the last block to end zeroes the pacer for the next launch.
template <Pacing kPacing>
__global__ void copy_segments_kernel(const CopySegment* segments, int count, int64_t total_units,
                                     const LinkPace pace) {
  uint64_t last_sent = 0;  // thread 0
  for (int64_t base = blockIdx.x * kUnitsPerBlockStep; base < total_units; base += gridDim.x * kUnitsPerBlockStep) {
    const int64_t first = base + threadIdx.x;
    uint4 v[kUnitsPerThread];
    uint4* dst[kUnitsPerThread];
    int remote = 0;
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) dst[j] = nullptr;
    if (first < total_units) {
      int lo = 0, hi = count - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (segments[mid].unit_begin <= first) lo = mid; else hi = mid - 1;
      }
      int seg = lo;
#pragma unroll
      for (int j = 0; j < kUnitsPerThread; ++j) {
        const int64_t u = first + int64_t(j) * kThreads;
        if (u >= total_units) continue;
        while (segments[seg].unit_begin + segments[seg].units <= u) ++seg;
        const int64_t i = u - segments[seg].unit_begin;
        v[j] = static_cast<const uint4*>(segments[seg].src)[i];
        dst[j] = static_cast<uint4*>(segments[seg].dst) + i;
        if constexpr (kPacing == Pacing::kOn) remote += segments[seg].src_rank != segments[seg].dst_rank;
      }
    }
    if constexpr (kPacing == Pacing::kOn) {
      __shared__ int remote_units;
      if (threadIdx.x == 0) remote_units = 0;
      __syncthreads();
      if (remote) atomicAdd(&remote_units, remote);
      __syncthreads();
      if (threadIdx.x == 0) {
        const uint64_t sent = link_reserve(pace, uint64_t(remote_units) * 16);
        link_wait(pace, sent);
        last_sent = max(last_sent, sent);
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j)
      if (dst[j]) *dst[j] = v[j];
  }
  if constexpr (kPacing == Pacing::kOn) {
    if (threadIdx.x == 0) {
      link_drain(pace, last_sent);
      __threadfence();  // this block's reservations before its count
      auto* done = reinterpret_cast<unsigned long long*>(&pace.pacer->blocks_done);
      if (atomicAdd(done, 1ull) == gridDim.x - 1) {
        __threadfence();
        link_zero(pace.pacer);
      }
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void copy_between_ranks(const CopyList& list, CUstream_st* stream, const LinkPace& pace) {
  if (list.count == 0 || list.total_units == 0) return;
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t steps = (list.total_units + kUnitsPerBlockStep - 1) / kUnitsPerBlockStep;
  const int grid = int(std::min<int64_t>(steps, int64_t(sms) * 4));
  if (pace.pacer)
    copy_segments_kernel<Pacing::kOn><<<grid, kThreads, 0, stream>>>(list.segments, list.count, list.total_units, pace);
  else
    copy_segments_kernel<Pacing::kOff><<<grid, kThreads, 0, stream>>>(list.segments, list.count, list.total_units, pace);
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

void AllToAllPlan::run(int id, CUstream_st* stream, const LinkPace& pace) const {
  COMET_CHECK(id >= 0 && id < int(staged_.size()), "all-to-all " << id << " was not staged");
  copy_between_ranks(staged_[id], stream, pace);
}

int64_t AllToAllPlan::bytes(int id, bool remote_only) const {
  COMET_CHECK(id >= 0 && id < size(), "all-to-all " << id << " was never added");
  int64_t n = 0;
  for (const CopySegment& s : lists_[id])
    if (!remote_only || s.src_rank != s.dst_rank) n += s.units * 16;
  return n;
}

}  // namespace comet::cuda
