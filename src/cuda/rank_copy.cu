// The baselines' inter-rank copy kernel and the all-to-all staging around it.
#include <algorithm>
#include <utility>

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

void AllToAllPlan::set_issuers(std::vector<int> issuer_of_rank) {
  issuers_ = 1;
  for (size_t r = 0; r < issuer_of_rank.size(); ++r) {
    COMET_CHECK(issuer_of_rank[r] >= 0, "rank " << r << " has no issuer (" << issuer_of_rank[r] << ")");
    issuers_ = std::max(issuers_, issuer_of_rank[r] + 1);
  }
  issuer_of_ = std::move(issuer_of_rank);
  fabric_ = nullptr;
  staged_.clear();
  calls_.clear();
}

void AllToAllPlan::use_fabric(fabric::Fabric& fabric) {
  set_issuers({});
  fabric_ = &fabric;
}

int AllToAllPlan::issuer_of(int rank) const {
  if (issuer_of_.empty()) return 0;
  COMET_CHECK(rank >= 0 && rank < int(issuer_of_.size()), "rank " << rank << " has no issuer");
  return issuer_of_[rank];
}

void AllToAllPlan::clear() {
  used_ = 0;  // the lists keep their capacity: a warm forward allocates nothing here
  staged_.clear();
  calls_.clear();
}

int AllToAllPlan::add() {
  if (used_ == int(lists_.size())) lists_.emplace_back();
  lists_[used_].clear();
  return used_++;
}

void AllToAllPlan::add_transfer(int id, const Transfer& t) {
  COMET_CHECK(id >= 0 && id < size(), "all-to-all " << id << " was never added");
  if (t.bytes == 0) return;
  COMET_CHECK(t.bytes > 0 && t.bytes % 16 == 0 && aligned(t.src, 16) && aligned(t.dst, 16),
              "inter-rank copy " << t.src_rank << " -> " << t.dst_rank << " of " << t.bytes
                                 << " bytes is not 16-byte aligned");
  std::vector<CopySegment>& list = lists_[id];
  const int64_t begin = list.empty() ? 0 : list.back().unit_begin + list.back().units;
  list.push_back(CopySegment{t.src, t.dst, begin, t.bytes / 16, t.src_rank, t.dst_rank});
}

int64_t AllToAllPlan::staged_bytes() const {
  if (fabric_) return 0;
  int64_t n = 0;
  for (int id = 0; id < used_; ++id) n += int64_t(lists_[id].size()) * sizeof(CopySegment);
  return n;
}

void AllToAllPlan::stage(void* host, void* const* device) {
  staged_.clear();
  calls_.clear();
  if (fabric_) return stage_fabric();
  // Issuer i's segments of each all-to-all, in add order, with unit_begin counted from 0.
  int64_t offset = 0;
  for (int id = 0; id < used_; ++id)
    for (int issuer = 0; issuer < issuers_; ++issuer) {
      CopySegment* out = reinterpret_cast<CopySegment*>(static_cast<char*>(host) + offset);
      CopyList staged;
      staged.segments = reinterpret_cast<const CopySegment*>(static_cast<char*>(device[issuer]) + offset);
      for (const CopySegment& s : lists_[id]) {
        if (issuer_of(s.src_rank) != issuer) continue;
        out[staged.count] = s;
        out[staged.count++].unit_begin = staged.total_units;
        staged.total_units += s.units;
      }
      staged_.push_back(staged);
      offset += int64_t(staged.count) * sizeof(CopySegment);
    }
}

// Call k of an all-to-all carries the k-th transfer (in add order) of every pair; every process
// added the same transfers, so both sides of a pair agree on each call's sizes.
void AllToAllPlan::stage_fabric() {
  const int W = fabric_->world(), first = fabric_->first_local_rank(), n = fabric_->num_local_ranks();
  std::vector<int> seen(size_t(W) * W);
  calls_.resize(used_);
  for (int id = 0; id < used_; ++id) {
    std::vector<FabricCall>& calls = calls_[id];
    std::fill(seen.begin(), seen.end(), 0);
    for (const CopySegment& s : lists_[id]) {
      COMET_CHECK(s.src_rank >= 0 && s.src_rank < W && s.dst_rank >= 0 && s.dst_rank < W,
                  "inter-rank copy " << s.src_rank << " -> " << s.dst_rank << " outside the " << W << " ranks");
      const int k = seen[size_t(s.src_rank) * W + s.dst_rank]++;
      if (k == int(calls.size()))
        calls.push_back({std::vector<fabric::AllToAllVArgs>(n), std::vector<int64_t>(size_t(n) * 4 * W),
                         std::vector<const char*>(size_t(n) * 2 * W)});
      FabricCall& call = calls[k];
      if (fabric_->is_local(s.src_rank)) {
        const size_t i = s.src_rank - first;
        call.sizes[(i * 4 + 0) * W + s.dst_rank] = s.units * 16;
        call.at[(i * 2 + 0) * W + s.dst_rank] = static_cast<const char*>(s.src);
      }
      if (fabric_->is_local(s.dst_rank)) {
        const size_t i = s.dst_rank - first;
        call.sizes[(i * 4 + 2) * W + s.src_rank] = s.units * 16;
        call.at[(i * 2 + 1) * W + s.src_rank] = static_cast<const char*>(s.dst);
      }
    }
    for (FabricCall& call : calls)
      for (int i = 0; i < n; ++i) {
        const char* base[2] = {nullptr, nullptr};  // the lowest send and recv addresses
        for (int dir = 0; dir < 2; ++dir)
          for (int p = 0; p < W; ++p) {
            const char* at = call.at[(size_t(i) * 2 + dir) * W + p];
            if (at && (!base[dir] || at < base[dir])) base[dir] = at;
          }
        for (int dir = 0; dir < 2; ++dir)
          for (int p = 0; p < W; ++p) {
            const char* at = call.at[(size_t(i) * 2 + dir) * W + p];
            call.sizes[(size_t(i) * 4 + 2 * dir + 1) * W + p] = at ? at - base[dir] : 0;
          }
        const int64_t* sizes = call.sizes.data() + size_t(i) * 4 * W;
        call.args[i] = {base[0], sizes, sizes + W, const_cast<char*>(base[1]), sizes + 2 * W, sizes + 3 * W};
      }
  }
}

void AllToAllPlan::run(int id, int issuer, CUstream_st* stream, const LinkPace& pace) const {
  COMET_CHECK(issuer >= 0 && issuer < issuers_, "all-to-all " << id << ": issuer " << issuer << " outside [0, "
                                                              << issuers_ << ")");
  if (fabric_) {
    COMET_CHECK(id >= 0 && id < int(calls_.size()), "all-to-all " << id << " was not staged");
    for (const FabricCall& call : calls_[id]) fabric_->all_to_all_v(call.args.data(), stream);
    return;
  }
  COMET_CHECK(id >= 0 && size_t(id) < staged_.size() / issuers_, "all-to-all " << id << " was not staged");
  copy_between_ranks(staged_[size_t(id) * issuers_ + issuer], stream, pace);
}

int64_t AllToAllPlan::bytes(int id, bool remote_only) const {
  COMET_CHECK(id >= 0 && id < size(), "all-to-all " << id << " was never added");
  int64_t n = 0;
  for (const CopySegment& s : lists_[id])
    if (!remote_only || s.src_rank != s.dst_rank) n += s.units * 16;
  return n;
}

}  // namespace comet::cuda
