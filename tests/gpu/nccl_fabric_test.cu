// GPU tests of the Nccl fabric with one rank in this process (label `gpu`; built when NCCL is
// found): bootstrap through a file, the version check, the zeroed symmetric heap reached
// through NCCL's LSA peer table, barrier, all_to_all_v as a self exchange, and the errors for
// bad bootstrap paths, a missing rank 0 and unsupported layouts. Several ranks need several
// GPUs and processes: tests/multi_gpu/nccl_fabric_multi_gpu_test.cu.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "core/process_env.h"
#include "fabric/fabric.h"
#include "fabric/nccl_fabric.h"
#include "fabric_test_kernels.cuh"
#include "gpu_test_util.h"
#include "support/test_support.h"

namespace comet::fabric {
namespace {

using comet::test::throws_with;
using comet::testing::DeviceBuffer;
using comet::testing::read_through_table;
using comet::testing::write_through_table;

namespace fs = std::filesystem;

// A private directory per test: ctest may run the tests of this binary concurrently.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("comet-nccl-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const char* name) const { return (path_ / name).string(); }
  int entries() const { return int(std::distance(fs::directory_iterator(path_), fs::directory_iterator())); }

 private:
  fs::path path_;
};

ProcessEnv one_rank_env(const std::string& bootstrap_file) {
  ProcessEnv env;
  env.rank = 0;
  env.world = 1;
  env.local_rank = 0;
  env.local_world = 1;
  env.bootstrap_file = bootstrap_file;
  env.source = "test";
  env.timeout_s = 30;
  return env;
}

std::vector<uint8_t> download_bytes(const void* device, size_t n) {
  std::vector<uint8_t> out(n);
  COMET_CUDA_CHECK(cudaMemcpy(out.data(), device, n, cudaMemcpyDeviceToHost));
  return out;
}

std::vector<uint8_t> pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t((i * 13 + seed * 101 + 7) & 0xff);
  return v;
}

// ---- version (no GPU needed) ----

TEST(NcclVersion, LoadedLibraryMatchesTheHeaders) {
  EXPECT_TRUE(nccl_fabric_available());
  EXPECT_GE(nccl_compiled_version(), 22800);  // symmetric windows and the LSA API
  EXPECT_EQ(nccl_runtime_version(), nccl_compiled_version())
      << "headers " << nccl_version_name(nccl_compiled_version()) << ", library "
      << nccl_version_name(nccl_runtime_version());
  EXPECT_NO_THROW(check_nccl_version(nccl_compiled_version(), nccl_runtime_version()));
}

TEST(NcclVersion, MismatchNamesBothVersions) {
  EXPECT_EQ(nccl_version_name(22809), "2.28.9");
  EXPECT_EQ(nccl_version_name(21903), "2.19.3");
  EXPECT_EQ(nccl_version_name(2804), "2.8.4");
  EXPECT_TRUE(throws_with<Error>([] { check_nccl_version(22809, 22703); },
                                 {"2.28.9", "22809", "2.27.3", "22703", "LD_LIBRARY_PATH"}));
}

TEST(NcclFabric, SeveralNodesAreRefused) {
  TempDir dir;
  ProcessEnv env = one_rank_env(dir.file("bootstrap.id"));
  env.world = 16;
  env.local_world = 8;
  EXPECT_TRUE(throws_with<Error>([&] { make_nccl_fabric(env); }, {"one node", "WORLD_SIZE=16", "LOCAL_WORLD_SIZE=8"}));
}

// ---- one rank on GPU 0 ----

TEST(NcclFabric, OneRankIsItsOwnLocalRank) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  auto f = make_nccl_fabric(one_rank_env(dir.file("bootstrap.id")));
  EXPECT_EQ(f->name(), "nccl");
  EXPECT_EQ(f->world(), 1);
  EXPECT_EQ(f->first_local_rank(), 0);
  EXPECT_EQ(f->num_local_ranks(), 1);
  EXPECT_EQ(f->device_of(0), 0);
  int device = -1;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  EXPECT_EQ(device, 0);
  EXPECT_TRUE(throws_with<Error>([&] { f->base(1); }, {"base(1)", "not driven by this process"}));
  EXPECT_TRUE(throws_with<Error>([&] { f->peer_table(-1); }, {"peer_table(-1)"}));
  // Rank 0 removed its bootstrap file once every rank (itself) had joined.
  EXPECT_EQ(dir.entries(), 0);
}

TEST(NcclFabric, HeapIsZeroedAndReachableThroughThePeerTable) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  auto f = make_nccl_fabric(one_rank_env(dir.file("bootstrap.id")));
  for (const int64_t request : {int64_t(1000), int64_t(5000)}) {  // the second replaces the first
    SCOPED_TRACE(request);
    f->allocate(request);
    const int64_t n = f->bytes_per_rank();
    EXPECT_EQ(n, (request + 255) / 256 * 256);
    const std::vector<uint8_t> fresh = download_bytes(f->base(0), size_t(n));
    EXPECT_EQ(std::count(fresh.begin(), fresh.end(), 0), n) << "the heap must be zeroed at allocation";

    const std::vector<void*> table = f->peer_table_host(0);
    ASSERT_EQ(table.size(), 1u);
    EXPECT_NE(table[0], nullptr);

    // Written through base(0), read through the peer table (NCCL's own mapping of the window).
    const std::vector<uint8_t> a = pattern(size_t(n), 1);
    COMET_CUDA_CHECK(cudaMemcpy(f->base(0), a.data(), size_t(n), cudaMemcpyHostToDevice));
    DeviceBuffer<uint8_t> out{size_t(n)};
    read_through_table(f->peer_table(0), 0, 0, out.get(), n);
    EXPECT_EQ(out.download(), a);

    // Written through the peer table at an offset, read through base(0).
    const std::vector<uint8_t> b = pattern(256, 2);
    DeviceBuffer<uint8_t> in(b);
    write_through_table(f->peer_table(0), 0, n - 256, in.get(), 256);
    f->barrier(nullptr);
    const std::vector<uint8_t> heap = download_bytes(f->base(0), size_t(n));
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(heap[i], i < n - 256 ? a[i] : b[i - (n - 256)]) << "byte " << i;
  }
}

__global__ void sleep_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

TEST(NcclFabric, BarrierWaitsForTheStream) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  auto f = make_nccl_fabric(one_rank_env(dir.file("bootstrap.id")));
  f->allocate(256);
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  sleep_kernel<<<1, 1, 0, stream>>>(50'000'000);  // 50 ms
  COMET_CUDA_CHECK_LAUNCH();
  const auto start = std::chrono::steady_clock::now();
  f->barrier(stream);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  EXPECT_GE(waited, 0.02);  // it did wait for the kernel (launched just before)
  for (int i = 0; i < 100; ++i) f->barrier(stream);  // repeated barriers stay matched
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A barrier that times out aborts the communicator, which unmaps the heap's peer mappings: the
// heap generation moves (layers on the fabric refuse to run instead of launching kernels at
// unmapped addresses), no heap is reported, and later calls name the abort.
TEST(NcclFabric, ATimeoutAbortsAndInvalidatesTheHeap) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  ProcessEnv env = one_rank_env(dir.file("bootstrap.id"));
  // The one timeout covers joining the communicator and allocate() too: long enough for those.
  env.timeout_s = 3;
  auto f = make_nccl_fabric(env);
  f->allocate(4096);
  const uint64_t generation = f->heap_generation();
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  sleep_kernel<<<1, 1, 0, stream>>>(5'000'000'000);  // 5 s, past the 3 s timeout
  COMET_CUDA_CHECK_LAUNCH();
  EXPECT_TRUE(throws_with<TimeoutError>([&] { f->barrier(stream); }, {"rank 0 of 1", "timed out after 3 s"}));
  EXPECT_NE(f->heap_generation(), generation);
  EXPECT_EQ(f->bytes_per_rank(), 0);
  EXPECT_TRUE(throws_with<Error>([&] { f->allocate(4096); }, {"the communicator was aborted"}));
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(NcclFabric, AllToAllVWithOneRankIsASelfExchange) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  auto f = make_nccl_fabric(one_rank_env(dir.file("bootstrap.id")));
  std::vector<uint8_t> s(100);
  std::iota(s.begin(), s.end(), uint8_t(1));
  DeviceBuffer<uint8_t> send(s), recv(64);
  recv.poison(0);
  const int64_t bytes = 37, send_offset = 5, recv_offset = 11;
  f->all_to_all_v(send.get(), &bytes, &send_offset, recv.get(), &bytes, &recv_offset, nullptr);
  f->barrier(nullptr);
  std::vector<uint8_t> got = recv.download();
  for (int i = 0; i < 64; ++i) {
    const bool inside = i >= recv_offset && i < recv_offset + bytes;
    ASSERT_EQ(got[i], inside ? s[send_offset + i - recv_offset] : 0) << "byte " << i;
  }
  // The array form, and zero bytes (nothing moves, nothing is posted to NCCL).
  recv.poison(0x77);
  const int64_t zero = 0;
  const AllToAllVArgs args{send.get(), &zero, &send_offset, recv.get(), &zero, &recv_offset};
  f->all_to_all_v(&args, nullptr);
  f->barrier(nullptr);
  got = recv.download();
  EXPECT_EQ(std::count(got.begin(), got.end(), 0x77), 64);
  // Malformed arguments are refused before NCCL sees them.
  const int64_t negative = -1;
  EXPECT_TRUE(throws_with<Error>(
      [&] { f->all_to_all_v(send.get(), &negative, &send_offset, recv.get(), &bytes, &recv_offset, nullptr); },
      {"negative"}));
}

// A heap larger than the GPU: ncclMemAlloc fails, the rank meets its (here no) peers in the
// agreement that every heap was allocated, throws its own error, and keeps no heap; the
// communicator stays usable for a heap that fits.
TEST(NcclFabric, AHeapThatDoesNotFitFailsAndTheFabricStaysUsable) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  auto f = make_nccl_fabric(one_rank_env(dir.file("bootstrap.id")));
  f->allocate(4096);
  const uint64_t generation = f->heap_generation();
  size_t free_bytes = 0, total_bytes = 0;
  COMET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t too_big = int64_t(total_bytes) * 2;
  EXPECT_TRUE(throws_with<Error>([&] { f->allocate(too_big); }, {"rank 0 of 1", "ncclMemAlloc failed"}));
  EXPECT_EQ(f->bytes_per_rank(), 0);
  EXPECT_NE(f->heap_generation(), generation) << "layers on the freed heap must refuse to run";
  f->allocate(8192);
  EXPECT_EQ(f->bytes_per_rank(), 8192);
  const std::vector<uint8_t> fresh = download_bytes(f->base(0), 8192);
  EXPECT_EQ(std::count(fresh.begin(), fresh.end(), 0), 8192);
  f->barrier(nullptr);
}

TEST(NcclFabric, EnvironmentVariablesMakeAFabric) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  const std::string file = dir.file("from-env.id");
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COMET_BOOTSTRAP_FILE"};
  const std::string values[] = {"0", "1", "0", "1", file};
  for (int i = 0; i < 5; ++i) ASSERT_EQ(setenv(names[i], values[i].c_str(), 1), 0);
  std::optional<ProcessEnv> env;
  try {
    env = read_process_env();
  } catch (...) {
    for (const char* n : names) unsetenv(n);
    throw;
  }
  for (const char* n : names) unsetenv(n);
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->bootstrap_file, file);
  auto f = make_nccl_fabric(*env);
  f->allocate(4096);
  EXPECT_EQ(f->bytes_per_rank(), 4096);
}

TEST(NcclFabric, BadBootstrapPathNamesTheFile) {
  COMET_REQUIRE_GPU();
  const std::string file = "/nonexistent-comet-dir/sub/bootstrap.id";
  EXPECT_TRUE(throws_with<Error>([&] { make_nccl_fabric(one_rank_env(file)); },
                                 {"rank 0 of 1", "/nonexistent-comet-dir/sub", "does not exist", "from test"}));
  // The fabric after a failed one still works (nothing was left half made).
  TempDir dir;
  EXPECT_NO_THROW(make_nccl_fabric(one_rank_env(dir.file("ok.id")))->allocate(256));
}

TEST(NcclFabric, MissingRankZeroTimesOutNamingTheFile) {
  COMET_REQUIRE_GPU();
  TempDir dir;
  ProcessEnv env = one_rank_env(dir.file("never.id"));
  env.rank = 1;  // rank 0 never starts
  env.world = env.local_world = 2;
  env.local_rank = 0;  // GPU 0 exists
  env.timeout_s = 0.3;
  EXPECT_TRUE(throws_with<TimeoutError>([&] { make_nccl_fabric(env); },
                                        {"rank 1 of 2", dir.file("never.id"), "did not appear within 0.3 s"}));
}

TEST(NcclFabric, LocalRankWithoutAGpuIsRefused) {
  COMET_REQUIRE_GPU();
  int count = 0;
  COMET_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count >= kMaxProcessWorld) GTEST_SKIP() << "every LOCAL_RANK has a GPU here";
  TempDir dir;
  ProcessEnv env = one_rank_env(dir.file("bootstrap.id"));
  env.world = env.local_world = count + 1;
  env.rank = env.local_rank = count;
  EXPECT_TRUE(throws_with<Error>([&] { make_nccl_fabric(env); },
                                 {"LOCAL_RANK=" + std::to_string(count), "GPU(s) are visible"}));
  // Taken from RANK (LOCAL_RANK unset), the message names RANK.
  env.local_rank_source = "RANK";
  EXPECT_TRUE(throws_with<Error>([&] { make_nccl_fabric(env); },
                                 {"RANK=" + std::to_string(count) + " (LOCAL_RANK is unset)", "GPU(s) are visible"}));
}

}  // namespace
}  // namespace comet::fabric
