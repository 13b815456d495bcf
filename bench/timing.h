// bench/timing.h: CUDA-event timing of interleaved variants, reported as medians.
//
// Method (docs/cli.md, `comet bench gemm`): variants of one measurement run interleaved, each launch
// between its own pair of events, after a warm-up long enough to reach sustained clocks (the
// H200 runs at its power cap under GEMM load; a kernel timed right after idle reads high).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "cuda/check.h"

namespace comet::bench {

struct Variant {
  std::string name;
  std::function<void(cudaStream_t)> launch;
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs every variant round-robin: warm-up for at least `warmup_ms` and at least `warmup_rounds`
// rounds, then `iters` timed rounds. Returns the median microseconds of each variant, in order.
// Processes that must run the same number of rounds (ranks of one run) pass warmup_ms = 0.
// `align`, when set, is enqueued before every variant, outside its events: ranks in different
// processes each time their own stream, and a variant without a cross-rank step of its own (a
// part of the layer) lets them drift apart, which the next variant that waits for the other
// ranks would otherwise count as its own time. A barrier there starts every variant in step.
using Align = std::function<void(cudaStream_t)>;
inline std::vector<double> time_interleaved(const std::vector<Variant>& variants, cudaStream_t stream,
                                            int iters, double warmup_ms, int warmup_rounds = 1,
                                            const Align& align = {}) {
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0;; ++round) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (round >= warmup_rounds && ms >= warmup_ms) break;
    for (const auto& v : variants) {
      if (align) align(stream);
      v.launch(stream);
    }
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<cudaEvent_t> events(2 * variants.size() * iters);
  for (auto& e : events) COMET_CUDA_CHECK(cudaEventCreate(&e));
  for (int it = 0; it < iters; ++it)
    for (size_t v = 0; v < variants.size(); ++v) {
      const size_t i = 2 * (it * variants.size() + v);
      if (align) align(stream);
      COMET_CUDA_CHECK(cudaEventRecord(events[i], stream));
      variants[v].launch(stream);
      COMET_CUDA_CHECK(cudaEventRecord(events[i + 1], stream));
    }
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> medians;
  for (size_t v = 0; v < variants.size(); ++v) {
    std::vector<double> us;
    for (int it = 0; it < iters; ++it) {
      const size_t i = 2 * (it * variants.size() + v);
      float ms = 0;
      COMET_CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      us.push_back(ms * 1e3);
    }
    medians.push_back(median(us));
  }
  for (auto& e : events) cudaEventDestroy(e);
  return medians;
}

}  // namespace comet::bench
