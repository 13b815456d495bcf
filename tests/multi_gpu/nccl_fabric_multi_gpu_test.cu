// multi_gpu/nccl_fabric_multi_gpu_test.cu: the Nccl fabric across processes (label
// `multi_gpu`). Run one copy per GPU under a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE and COMET_BOOTSTRAP_FILE:
//   comet launch -n 4 build/tests/multi_gpu/nccl_fabric_multi_gpu_test
//   tests/multi_gpu/run_ranks.sh 4 build/tests/multi_gpu/nccl_fabric_multi_gpu_test   (stand-in)
// Without those variables, or with fewer GPUs than ranks, every test skips with a message
// containing "multi_gpu test skipped" (ctest reports the test as skipped).
//
// Every rank runs the same tests in the same order, so the fabric's collective calls match
// up. Checks use EXPECT (not ASSERT) wherever a collective call follows, so that a failed
// check on one rank does not leave the others waiting.
#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "core/process_env.h"
#include "fabric/fabric.h"
#include "gpu/fabric_test_kernels.cuh"
#include "gpu/gpu_test_util.h"
#include "multi_gpu/nccl_run.h"
#include "support/test_support.h"

namespace comet::fabric {
namespace {

using comet::test::throws_with;
using comet::testing::DeviceBuffer;
using comet::testing::read_through_table;
using comet::testing::tag_byte;
using comet::testing::write_through_table;

using comet::testing::Run;
using comet::testing::who;

TEST(NcclFabricRun, LocalRanksAndPeerTable) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  const ProcessEnv& env = Run::instance->env();
  EXPECT_EQ(f.world(), env.world);
  EXPECT_EQ(f.first_local_rank(), env.rank);
  EXPECT_EQ(f.num_local_ranks(), 1);
  EXPECT_EQ(f.device_of(env.rank), env.local_rank);
  const int other = (env.rank + 1) % env.world;
  if (other != env.rank) EXPECT_TRUE(throws_with<Error>([&] { f.base(other); }, {"not driven by this process"}));
  f.allocate(1 << 16);
  const std::vector<void*> table = f.peer_table_host(env.rank);
  ASSERT_EQ(int(table.size()), env.world);
  for (int p = 0; p < env.world; ++p) {
    EXPECT_NE(table[p], nullptr) << "peer " << p;
    for (int q = 0; q < p; ++q) EXPECT_NE(table[p], table[q]) << "peers " << q << " and " << p << " share an address";
  }
}

// Each rank writes a block tagged (src, dst) into slot `src` of every rank's heap through its
// peer table; after a barrier each rank checks that all W blocks arrived and that the rest of
// its heap is still zero. Then each reads its successor's heap through the table.
TEST(NcclFabricRun, PeerWritesReachEveryRank) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  const int W = f.world(), r = f.first_local_rank();
  constexpr int64_t kBlock = 1000;  // not a multiple of 16: offsets must be exact
  f.allocate(W * kBlock + 777);
  const int64_t n = f.bytes_per_rank();
  for (int step = 0; step < W; ++step) {
    const int dst = (r + step) % W;  // ranks start on different peers
    std::vector<uint8_t> block(kBlock);
    for (int64_t i = 0; i < kBlock; ++i) block[i] = tag_byte(r, dst, i);
    DeviceBuffer<uint8_t> in(block);
    write_through_table(f.peer_table(r), dst, r * kBlock, in.get(), kBlock);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());  // `in` is freed at the end of this iteration
  }
  f.barrier(nullptr);
  std::vector<uint8_t> heap(n);
  COMET_CUDA_CHECK(cudaMemcpy(heap.data(), f.base(r), n, cudaMemcpyDeviceToHost));
  int64_t wrong = 0, first_wrong = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int src = int(i / kBlock);
    const uint8_t want = src < W ? tag_byte(src, r, i % kBlock) : 0;
    if (heap[i] != want && wrong++ == 0) first_wrong = i;
  }
  EXPECT_EQ(wrong, 0) << "first wrong byte " << first_wrong << " (slot of rank " << first_wrong / kBlock << ")";

  const int next = (r + 1) % W;
  DeviceBuffer<uint8_t> out{size_t(W * kBlock)};
  read_through_table(f.peer_table(r), next, 0, out.get(), W * kBlock);
  const std::vector<uint8_t> got = out.download();
  wrong = 0;
  for (int64_t i = 0; i < W * kBlock; ++i) wrong += got[i] != tag_byte(int(i / kBlock), next, i % kBlock);
  EXPECT_EQ(wrong, 0) << "reading rank " << next << "'s heap through the peer table";
  f.barrier(nullptr);  // nobody overwrites a heap that a peer is still reading
}

// A token per epoch to the successor; after each barrier the predecessor's token of that
// epoch must be there. A barrier that let a rank through early shows an old epoch.
TEST(NcclFabricRun, BarrierOrdersPeerWrites) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  const int W = f.world(), r = f.first_local_rank();
  f.allocate(W * sizeof(int64_t));
  const int next = (r + 1) % W, prev = (r + W - 1) % W;
  for (int64_t epoch = 1; epoch <= 20; ++epoch) {
    const int64_t token = epoch * 1000 + r;
    DeviceBuffer<uint8_t> in(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&token),
                                                  reinterpret_cast<const uint8_t*>(&token) + sizeof token));
    write_through_table(f.peer_table(r), next, r * int64_t(sizeof token), in.get(), sizeof token);
    f.barrier(nullptr);
    int64_t got = -1;
    COMET_CUDA_CHECK(cudaMemcpy(&got, static_cast<const char*>(f.base(r)) + prev * sizeof got, sizeof got,
                                cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, epoch * 1000 + prev) << "epoch " << epoch;
    f.barrier(nullptr);
  }
}

// Sizes known to every rank: sizes(p, q) bytes from p to q, zeros included, uneven.
int64_t exchange_bytes(int p, int q, int round) { return ((p * 7 + q * 13 + round * 5 + 3) % 6) * 129 + (p == q) * 16; }

TEST(NcclFabricRun, AllToAllVUnevenSizes) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  const int W = f.world(), r = f.first_local_rank();
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    // This rank's row and column of the size matrix, with gaps between slices.
    std::vector<int64_t> send_bytes(W), send_offsets(W), recv_bytes(W), recv_offsets(W);
    int64_t send_total = 0, recv_total = 0;
    for (int p = 0; p < W; ++p) {
      send_bytes[p] = exchange_bytes(r, p, round);
      send_offsets[p] = send_total + 8;
      send_total += send_bytes[p] + 8;
      recv_bytes[p] = exchange_bytes(p, r, round);
      recv_offsets[p] = recv_total + 24;
      recv_total += recv_bytes[p] + 24;
    }
    std::vector<uint8_t> s(send_total, 0xab);
    for (int q = 0; q < W; ++q)
      for (int64_t i = 0; i < send_bytes[q]; ++i) s[send_offsets[q] + i] = tag_byte(r, q, i);
    DeviceBuffer<uint8_t> send(s), recv{size_t(recv_total)};
    recv.poison(0x5c);
    f.all_to_all_v(send.get(), send_bytes.data(), send_offsets.data(), recv.get(), recv_bytes.data(),
                   recv_offsets.data(), stream);
    f.barrier(stream);
    const std::vector<uint8_t> got = recv.download();
    std::vector<uint8_t> want(recv_total, 0x5c);
    for (int p = 0; p < W; ++p)
      for (int64_t i = 0; i < recv_bytes[p]; ++i) want[recv_offsets[p] + i] = tag_byte(p, r, i);
    int64_t wrong = 0, first_wrong = -1;
    for (int64_t i = 0; i < recv_total; ++i)
      if (got[i] != want[i] && wrong++ == 0) first_wrong = i;
    EXPECT_EQ(wrong, 0) << "first wrong received byte " << first_wrong;
  }
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
}

// min_max over ranks with different values (2^40 + 3r: past 32 bits), and wait() on a stream
// that carried an all_to_all_v.
TEST(NcclFabricRun, MinMaxAndWait) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  const int W = f.world(), r = f.first_local_rank();
  const uint64_t base = uint64_t(1) << 40;
  const auto [low, high] = f.min_max(base + 3 * uint64_t(r), "a test value");
  EXPECT_EQ(low, base);
  EXPECT_EQ(high, base + 3 * uint64_t(W - 1));
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<int64_t> bytes(W, 64), offsets = [&] {
    std::vector<int64_t> o(W);
    for (int p = 0; p < W; ++p) o[p] = 64 * p;
    return o;
  }();
  DeviceBuffer<uint8_t> send(std::vector<uint8_t>(size_t(64 * W), uint8_t(r))), recv{size_t(64 * W)};
  f.all_to_all_v(send.get(), bytes.data(), offsets.data(), recv.get(), bytes.data(), offsets.data(), stream);
  f.wait(stream, "waiting for a test exchange");
  const std::vector<uint8_t> got = recv.download();
  for (int p = 0; p < W; ++p) EXPECT_EQ(got[size_t(64 * p)], uint8_t(p)) << "from rank " << p;
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(NcclFabricRun, HeapSizeMismatchFailsOnEveryRank) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  if (f.world() == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  const int r = f.first_local_rank();
  EXPECT_TRUE(throws_with<Error>([&] { f.allocate(r == 0 ? 4096 : 8192); },
                                 {"different heap sizes", "smallest 4096", "largest 8192"}));
  // A size only one rank cannot take (negative) is refused by every rank, not by that rank alone
  // while the others wait for it in the collectives.
  EXPECT_TRUE(throws_with<Error>([&] { f.allocate(r == 0 ? -1 : 4096); }, {"outside [0, "}));
  // The communicator is intact: the next agreeing allocation works.
  f.allocate(8192);
  EXPECT_EQ(f.bytes_per_rank(), 8192);
  f.barrier(nullptr);
}

// The last rank's GPU is kept nearly full, so only its ncclMemAlloc fails: every rank throws
// (the others naming that rank) instead of waiting in the collective window registration until
// the timeout, and the next allocation that fits works on every rank.
TEST(NcclFabricRun, AllocationFailureOnOneRankFailsOnEveryRankNamingIt) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  Fabric& f = Run::instance->fabric();
  if (f.world() == 1) GTEST_SKIP() << "needs a rank that fails while others do not";
  const int r = f.first_local_rank(), last = f.world() - 1;
  const int64_t heap = int64_t(1) << 30;
  void* hog = nullptr;
  if (r == last) {
    size_t free_bytes = 0, total_bytes = 0;
    COMET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // All but a quarter of the heap stays free: the heap cannot fit.
    // Not COMET_CUDA_CHECK: a throw here would skip this rank's allocate() while the others
    // enter it, and every later collective would be out of step.
    if (free_bytes > size_t(heap / 4) && cudaMalloc(&hog, free_bytes - size_t(heap / 4)) != cudaSuccess) {
      cudaGetLastError();
      hog = nullptr;
      ADD_FAILURE() << "could not fill the GPU";
    }
  }
  const std::vector<std::string> expected =
      r == last ? std::vector<std::string>{"ncclMemAlloc failed"}
                : std::vector<std::string>{"rank " + std::to_string(last) + " could not allocate"};
  EXPECT_TRUE(throws_with<Error>([&] { f.allocate(heap); }, expected));
  EXPECT_EQ(f.bytes_per_rank(), 0);
  if (hog) COMET_CUDA_CHECK(cudaFree(hog));
  f.allocate(8192);
  EXPECT_EQ(f.bytes_per_rank(), 8192);
  f.barrier(nullptr);
}

// Further fabrics next to the shared one, made and destroyed in turn (each bootstraps
// through its own file, <COMET_BOOTSTRAP_FILE>.<n>).
TEST(NcclFabricRun, MoreFabricsComeAndGo) {
  COMET_REQUIRE_RUN();
  SCOPED_TRACE(who());
  const ProcessEnv& env = Run::instance->env();
  for (int i = 0; i < 3; ++i) {
    auto g = make_nccl_fabric(env);
    g->allocate(4096);
    const int64_t token = 77 + i;
    DeviceBuffer<uint8_t> in(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&token),
                                                  reinterpret_cast<const uint8_t*>(&token) + sizeof token));
    write_through_table(g->peer_table(env.rank), (env.rank + 1) % env.world, 0, in.get(), sizeof token);
    g->barrier(nullptr);
    int64_t got = 0;
    COMET_CUDA_CHECK(cudaMemcpy(&got, g->base(env.rank), sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, token) << "fabric " << i;
  }
}

}  // namespace
}  // namespace comet::fabric
