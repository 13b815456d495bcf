// GPU tests of the bench's synchronization (bench/timing.h, label `gpu`): a launch that does not
// finish is named after the no-progress limit, in an Error or (the tool's way) in one line on
// stderr and exit code 3, instead of hanging the process; launches that keep finishing are
// waited for however long they take together.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "bench/timing.h"
#include "cuda/signal.cuh"
#include "gpu_test_util.h"

namespace comet::bench {
namespace {

// Spins until the host sets *release (mapped pinned memory), so the test decides when it ends.
__global__ void wait_for_host(const volatile int* release) {
  while (*release == 0) __nanosleep(1000);
}

__global__ void sleep_ns(uint64_t ns) {
  const uint64_t t0 = cuda::globaltimer_ns();
  while (cuda::globaltimer_ns() - t0 < ns) __nanosleep(1000);
}

TEST(BenchTiming, NamesALaunchThatDoesNotFinish) {
  COMET_REQUIRE_GPU();
  int* release = nullptr;
  COMET_CUDA_CHECK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
  *release = 0;
  int* release_dev = nullptr;
  COMET_CUDA_CHECK(cudaHostGetDevicePointer(&release_dev, release, 0));
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> ends(2);
  for (auto& e : ends) COMET_CUDA_CHECK(cudaEventCreate(&e));
  const std::vector<Variant> variants{{"quick", {}}, {"stuck", {}}};
  sleep_ns<<<1, 1, 0, stream>>>(1000);
  COMET_CUDA_CHECK(cudaEventRecord(ends[0], stream));
  wait_for_host<<<1, 1, 0, stream>>>(release_dev);
  COMET_CUDA_CHECK(cudaEventRecord(ends[1], stream));
  std::string message;
  try {
    sync_or_name_hang(stream, variants, {{ends[0], 0, 3}, {ends[1], 1, 3}}, 0.5, OnHang::kThrow);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("'stuck' (timed round 3)"), std::string::npos) << message;
  EXPECT_EQ(message.find("'quick'"), std::string::npos) << message;
  // The kernel is still running; released, the stream finishes and the process goes on.
  *release = 1;
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(cudaEventQuery(ends[1]), cudaSuccess);
  for (auto& e : ends) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  cudaFreeHost(release);
}

// The tool's way, in a child process (gtest's threadsafe death test: the child starts the binary
// afresh, so it opens its own CUDA context): the kernel runs for 5 s, far past the 0.5 s limit,
// and the child must exit with code 3 and the named variant on stderr. (The kernel ends on its
// own, so a process exit that waited for it would still end, 5 s later.)
TEST(BenchTiming, ExitsWithCodeThreeNamingALaunchThatDoesNotFinish) {
  COMET_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run_stuck = [] {
    cudaStream_t stream;
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t end;
    COMET_CUDA_CHECK(cudaEventCreate(&end));
    sleep_ns<<<1, 1, 0, stream>>>(5'000'000'000ull);
    COMET_CUDA_CHECK(cudaEventRecord(end, stream));
    sync_or_name_hang(stream, {Variant{"stuck", {}}}, {{end, 0, kWarmUp}}, 0.5);
    std::exit(0);  // not reached: the limit ends the process first
  };
  EXPECT_EXIT(run_stuck(), ::testing::ExitedWithCode(3), "comet: error: bench: variant 'stuck' \\(warm-up\\)");
}

TEST(BenchTiming, WaitsForLaunchesThatKeepFinishing) {
  COMET_REQUIRE_GPU();
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Four launches of 0.3 s each against a 0.5 s no-progress limit: 1.2 s in all, never 0.5 s
  // without one finishing, so no Error.
  const std::vector<Variant> variants{{"slow", {}}};
  std::vector<cudaEvent_t> ends(4);
  std::vector<LaunchMark> marks;
  for (size_t i = 0; i < ends.size(); ++i) {
    COMET_CUDA_CHECK(cudaEventCreate(&ends[i]));
    sleep_ns<<<1, 1, 0, stream>>>(300'000'000ull);
    COMET_CUDA_CHECK(cudaEventRecord(ends[i], stream));
    marks.push_back({ends[i], 0, int(i)});
  }
  EXPECT_NO_THROW(sync_or_name_hang(stream, variants, marks, 0.5, OnHang::kThrow));
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  for (auto& e : ends) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace comet::bench
