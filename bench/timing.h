// bench/timing.h: CUDA-event timing of interleaved variants, reported as medians.
//
// Method (docs/cli.md, `comet bench gemm`): variants of one measurement run interleaved, each launch
// between its own pair of events, after a warm-up long enough to reach sustained clocks (the
// H200 runs at its power cap under GEMM load; a kernel timed right after idle reads high).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comet/error.h"
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

// A non-blocking stream, destroyed with the object (also when a workload throws).
struct OwnedStream {
  cudaStream_t stream = nullptr;
  OwnedStream() { COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(stream); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
};

// `n` CUDA events, destroyed with the object (also when a check throws).
class Events {
 public:
  explicit Events(size_t n) {
    events_.reserve(n);
    try {
      for (size_t i = 0; i < n; ++i) {
        cudaEvent_t e = nullptr;
        COMET_CUDA_CHECK(cudaEventCreate(&e));
        events_.push_back(e);
      }
    } catch (...) {  // a constructor that throws runs no destructor
      destroy();
      throw;
    }
  }
  ~Events() { destroy(); }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  void destroy() noexcept {
    for (auto& e : events_) cudaEventDestroy(e);
    events_.clear();
  }
  std::vector<cudaEvent_t> events_;
};

// A launch's end event and what it ran, for naming a launch that never finishes.
struct LaunchMark {
  cudaEvent_t end;
  size_t variant;
  int round;  // timed round; kWarmUp or kCheck
};
inline constexpr int kWarmUp = -1, kCheck = -2;

// How long a synchronization may go without any launch finishing before the bench calls it a
// hang. The longest single launch of any bench shape is tens of milliseconds.
inline constexpr double kNoProgressSeconds = 60;

// What a hang does. kExit (the tool's): print `comet: error: <what>` and end the process with
// exit code 3 (docs/cli.md) at once. Unwinding is no use there: the kernel keeps running, and
// the first cudaFree on the way out waits for it forever. kThrow: an Error (tests, which then
// release the kernel themselves).
enum class OnHang { kExit, kThrow };

// cudaStreamSynchronize that cannot wait forever: polls `stream` and, when no launch in `marks`
// (in stream order) has finished for `no_progress_s`, names the first one still running and
// acts as `on_hang` says. A kernel stuck in a wait without a time limit (a pipeline barrier)
// would otherwise hang the process silently; ending the process ends the kernel.
inline void sync_or_name_hang(cudaStream_t stream, const std::vector<Variant>& variants,
                              const std::vector<LaunchMark>& marks, double no_progress_s = kNoProgressSeconds,
                              OnHang on_hang = OnHang::kExit) {
  auto last_progress = std::chrono::steady_clock::now();
  size_t finished = 0;  // marks[0, finished) have completed
  while (true) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) COMET_CUDA_CHECK(q);
    while (finished < marks.size()) {
      const cudaError_t e = cudaEventQuery(marks[finished].end);
      if (e == cudaErrorNotReady) break;
      COMET_CUDA_CHECK(e);
      ++finished;
      last_progress = std::chrono::steady_clock::now();
    }
    const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_progress).count();
    if (idle > no_progress_s && finished < marks.size()) {
      const LaunchMark& m = marks[finished];
      const std::string round = m.round == kWarmUp ? std::string("warm-up")
                                : m.round == kCheck ? std::string("check")
                                                    : "timed round " + std::to_string(m.round);
      std::ostringstream what;
      what << "bench: variant '" << variants[m.variant].name << "' (" << round << ") has not finished after "
           << no_progress_s << " s with no launch completing: a kernel that does not return";
      if (on_hang == OnHang::kThrow) throw Error(what.str());
      std::fprintf(stderr, "comet: error: %s\n", what.str().c_str());
      std::fflush(stderr);
      std::_Exit(3);
    }
    // Short polls: the warm-up syncs every round, and a long sleep would idle the GPU between
    // rounds that are meant to hold it at its sustained clocks.
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// The same for whatever `stream` holds now (a check's launches), named `what` on a hang.
inline void sync_or_name_hang(cudaStream_t stream, const std::string& what, double no_progress_s = kNoProgressSeconds,
                              OnHang on_hang = OnHang::kExit) {
  const Events end(1);
  COMET_CUDA_CHECK(cudaEventRecord(end[0], stream));
  sync_or_name_hang(stream, {Variant{what, {}}}, {LaunchMark{end[0], 0, kCheck}}, no_progress_s, on_hang);
}

// A device-to-host copy of what `stream` computes into pageable memory, as a check reads it. Such
// a copy blocks the calling thread until the stream's earlier launches have finished, so behind
// a kernel that never returns it would hang the process before any poll could name it: the
// stream is waited for first, with the no-progress limit, then copied.
inline void copy_to_host_or_name_hang(void* host, const void* device, size_t bytes, cudaStream_t stream,
                                      const std::string& what, double no_progress_s = kNoProgressSeconds,
                                      OnHang on_hang = OnHang::kExit) {
  sync_or_name_hang(stream, what, no_progress_s, on_hang);
  COMET_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
  sync_or_name_hang(stream, what, no_progress_s, on_hang);
}

// Runs every variant round-robin: warm-up for at least `warmup_ms` and at least `warmup_rounds`
// rounds, then `iters` timed rounds. Returns the median microseconds of each variant, in order.
// Processes that must run the same number of rounds (ranks of one run) pass warmup_ms = 0.
// `align`, when set, is enqueued before every variant, outside its events: ranks in different
// processes each time their own stream, and a variant without a cross-rank step of its own (a
// part of the layer) lets them drift apart, which the next variant that waits for the other
// ranks would otherwise count as its own time. A barrier there starts every variant in step.
// Every wait is `sync_or_name_hang`'s, with `no_progress_s` and `on_hang`.
using Align = std::function<void(cudaStream_t)>;
inline std::vector<double> time_interleaved(const std::vector<Variant>& variants, cudaStream_t stream,
                                            int iters, double warmup_ms, int warmup_rounds = 1,
                                            const Align& align = {}, double no_progress_s = kNoProgressSeconds,
                                            OnHang on_hang = OnHang::kExit) {
  const Events events(2 * variants.size() * iters + variants.size());
  // Warm-up: each variant's end marked by an event of its own (re-recorded every round).
  std::vector<LaunchMark> marks;
  for (size_t v = 0; v < variants.size(); ++v) marks.push_back({events[2 * variants.size() * iters + v], v, kWarmUp});
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0;; ++round) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (round >= warmup_rounds && ms >= warmup_ms) break;
    for (size_t v = 0; v < variants.size(); ++v) {
      if (align) align(stream);
      variants[v].launch(stream);
      COMET_CUDA_CHECK(cudaEventRecord(marks[v].end, stream));
      // The first round waits for each variant alone: a variant's first launch may load its
      // kernels (lazy module loading, a library's first call), which blocks the thread until the
      // launches before it have finished, so behind one that never returns it would hang
      // before any poll could name that one. Once every variant has run, rounds are enqueued whole.
      if (round == 0) sync_or_name_hang(stream, variants, {marks[v]}, no_progress_s, on_hang);
    }
    sync_or_name_hang(stream, variants, marks, no_progress_s, on_hang);
  }
  marks.clear();
  for (int it = 0; it < iters; ++it)
    for (size_t v = 0; v < variants.size(); ++v) {
      const size_t i = 2 * (it * variants.size() + v);
      if (align) align(stream);
      COMET_CUDA_CHECK(cudaEventRecord(events[i], stream));
      variants[v].launch(stream);
      COMET_CUDA_CHECK(cudaEventRecord(events[i + 1], stream));
      marks.push_back({events[i + 1], v, it});
    }
  sync_or_name_hang(stream, variants, marks, no_progress_s, on_hang);
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
  return medians;
}

}  // namespace comet::bench
