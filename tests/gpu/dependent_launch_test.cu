// GPU tests of the layer's kernel launches (cuda/dependent_launch.h, label `gpu`): a kernel
// launched after a slow writer reads every value the writer stored, ten times over, with the
// reader's block 0 timestamping its start before its wait. The overlap itself is counted and
// printed, not asserted: the runtime overlaps launches opportunistically (on one H200 the reader
// started before the writer's last write in 0 of 5 runs of one process and 4 of 5 of others),
// and where it does, the reader's wait is what keeps the values right. ctest also runs the
// test with COMET_DEPENDENT_LAUNCH=0 (tests/gpu/CMakeLists.txt), where it must never overlap.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/dependent_launch.h"
#include "cuda/signal.cuh"
#include "gpu_test_util.h"

namespace comet::cuda {
namespace {

using comet::testing::DeviceBuffer;

// Block 0 spins for `spin_ns` first, so that the writes land well after the next kernel could
// have started; every thread then writes its value. started[0] gets the writer's start time,
// finished[0] the time of its last write (block 0 writes last).
__global__ void slow_writer(int* values, int n, int generation, uint64_t spin_ns, uint64_t* started,
                            uint64_t* finished) {
  begin_dependent_kernel();
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (blockIdx.x == 0) {
    const uint64_t t0 = globaltimer_ns();
    if (threadIdx.x == 0) *started = t0;
    while (globaltimer_ns() - t0 < spin_ns) __nanosleep(1000);
  }
  if (i < n) values[i] = generation * n + i;
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    __threadfence();
    *finished = globaltimer_ns();
  }
}

// Records when its block 0 started, then copies the writer's values. The timestamp is the one
// store before begin_dependent_kernel(), against the contract on purpose: it is what shows
// whether the launch overlapped, and the writer never touches it.
__global__ void reader(const int* values, int* copy, int n, uint64_t* started) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *started = globaltimer_ns();
  begin_dependent_kernel();
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) copy[i] = values[i];
}

struct OwnedStream {
  cudaStream_t s = nullptr;
  OwnedStream() { COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(s); }
};

TEST(DependentLaunch, NextKernelSeesEveryWriteOfTheSlowOne) {
  COMET_REQUIRE_GPU();
  constexpr int n = 1 << 20, threads = 256, runs = 10;
  constexpr uint64_t spin_ns = 200'000;  // 0.2 ms: far longer than a launch
  DeviceBuffer<int> values(n), copy(n);
  DeviceBuffer<uint64_t> times(3);  // writer started, writer finished, reader started
  const OwnedStream stream;
  const auto run = [&](int generation) {
    launch_kernel(slow_writer, dim3(n / threads), dim3(threads), 0, stream.s, LaunchAttributes(), values.get(), n,
                  generation, spin_ns, times.get(), times.get() + 1);
    launch_kernel(reader, dim3(n / threads), dim3(threads), 0, stream.s, LaunchAttributes(), values.get(), copy.get(),
                  n, times.get() + 2);
  };
  run(0);  // loads both kernels' modules, which would otherwise keep the first run from overlapping
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  int overlapped = 0;
  for (int generation = 1; generation <= runs; ++generation) {
    // On the test's stream: the fill is ordered before the writer like the layer's own steps.
    COMET_CUDA_CHECK(cudaMemsetAsync(copy.get(), 0xff, n * sizeof(int), stream.s));
    run(generation);
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    const std::vector<int> got = copy.download();
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += got[i] != generation * n + i;
    EXPECT_EQ(wrong, 0) << "generation " << generation << ": the reader saw values the writer had not yet stored";
    const std::vector<uint64_t> t = times.download();
    overlapped += t[2] < t[1];
  }
  // In plain stream order the reader can never start before the writer completed.
  if (!dependent_launches()) EXPECT_EQ(overlapped, 0);
  RecordProperty("reader_started_before_writer_finished", overlapped);
  std::printf("dependent launches %s: the reader started before the writer's last write in %d of %d runs%s\n",
              dependent_launches() ? "on" : "off", overlapped, runs,
              dependent_launches() && overlapped == 0 ? " (no run overlapped: this run did not test the wait)" : "");
}

}  // namespace
}  // namespace comet::cuda
