// GPU tests of the fabric interface on the Loopback fabric (label `gpu`): local ranks, the
// zeroed heap reached through the peer table, barrier, and all_to_all_v with uneven sizes.
// The Nccl fabric has its own file (nccl_fabric_test.cu); multi-process runs are in
// tests/multi_gpu/.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "fabric/fabric.h"
#include "fabric_test_kernels.cuh"
#include "gpu_test_util.h"
#include "support/test_support.h"

namespace comet::fabric {
namespace {

using comet::test::throws_with;
using comet::testing::DeviceBuffer;
using comet::testing::read_through_table;
using comet::testing::tag_byte;
using comet::testing::write_through_table;

TEST(LoopbackFabric, EveryRankIsLocal) {
  COMET_REQUIRE_GPU();
  auto f = make_loopback_fabric(3);
  EXPECT_EQ(f->first_local_rank(), 0);
  EXPECT_EQ(f->num_local_ranks(), 3);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(f->is_local(r));
  EXPECT_FALSE(f->is_local(3));
  EXPECT_FALSE(f->is_local(-1));
  f->allocate(1000);
  EXPECT_EQ(f->bytes_per_rank(), 1024);
  EXPECT_TRUE(throws_with<Error>([&] { f->base(3); }, {"base(3)", "ranks are 0..2 of 3"}));
  EXPECT_TRUE(throws_with<Error>([&] { f->peer_table(-1); }, {"peer_table(-1)"}));
  EXPECT_TRUE(throws_with<Error>([&] { f->device_of(7); }, {"device_of(7)"}));
  const std::vector<void*> table = f->peer_table_host(1);
  ASSERT_EQ(table.size(), 3u);
  for (int p = 0; p < 3; ++p) EXPECT_EQ(table[p], f->base(p)) << "peer " << p;
  // One process builds every rank: min_max is the value itself, agree() always holds, and
  // wait() synchronizes the stream.
  EXPECT_EQ(f->min_max(42, "a value"), std::make_pair(uint64_t(42), uint64_t(42)));
  f->agree(7, "a value", "7");
  f->wait(nullptr, "nothing");
}

// allocate() frees the old heap before it allocates: when the new allocation fails, the heap is
// gone, so the generation (which a layer built on the old heap checks) must have moved anyway,
// and the fabric reports no bytes; a size refused before that leaves both. A later allocation works.
TEST(LoopbackFabric, FailedAllocationStillMovesTheHeapGeneration) {
  COMET_REQUIRE_GPU();
  auto f = make_loopback_fabric(2);
  f->allocate(1000);
  const uint64_t before = f->heap_generation();
  EXPECT_THROW(f->allocate(-1), Error);  // refused before the old heap is freed: it stays usable
  EXPECT_EQ(f->heap_generation(), before);
  EXPECT_EQ(f->bytes_per_rank(), 1024);
  // Sizes past kMaxHeapBytesPerRank are refused by name before the old heap is freed, too: 2^61
  // + 1 bytes made W heaps of 2 KiB once (the product wrapped), with bases far outside them.
  for (const int64_t huge : {int64_t(1) << 50, (int64_t(1) << 61) + 1, std::numeric_limits<int64_t>::max()}) {
    EXPECT_TRUE(throws_with<Error>([&] { f->allocate(huge); }, {std::to_string(huge), "outside [0, "}));
    EXPECT_EQ(f->heap_generation(), before);
    EXPECT_EQ(f->bytes_per_rank(), 1024);
  }
  EXPECT_THROW(f->allocate(int64_t(1) << 47), Error);  // 128 TiB per rank: cudaMalloc fails
  EXPECT_NE(f->heap_generation(), before) << "a layer on the freed heap would still run";
  EXPECT_EQ(f->bytes_per_rank(), 0);
  f->allocate(1000);
  EXPECT_EQ(f->bytes_per_rank(), 1024);
}

// A failed runtime call leaves its error as the thread's "last error"; COMET_CUDA_CHECK clears it
// as it throws, so the next launch check does not report the old failure as its own (a caught
// out-of-memory once made the next random fill throw "out of memory").
TEST(CudaCheck, AFailedCallLeavesNothingForTheNextLaunchCheck) {
  COMET_REQUIRE_GPU();
  void* p = nullptr;
  EXPECT_THROW(COMET_CUDA_CHECK(cudaMalloc(&p, size_t(1) << 50)), Error);  // 1 PiB
  EXPECT_NO_THROW(COMET_CUDA_CHECK_LAUNCH());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Each rank writes a tagged block into every peer's heap through its table; the owner reads
// its heap directly. A wrong table entry or offset changes the tags.
TEST(LoopbackFabric, PeerTableReachesEveryHeapZeroedAtFirst) {
  COMET_REQUIRE_GPU();
  constexpr int W = 4;
  constexpr int64_t kBlock = 300;
  auto f = make_loopback_fabric(W);
  f->allocate(W * kBlock);
  for (int r = 0; r < W; ++r) {
    std::vector<uint8_t> heap(f->bytes_per_rank(), 0xee);
    COMET_CUDA_CHECK(cudaMemcpy(heap.data(), f->base(r), heap.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(heap.begin(), heap.end(), 0), int64_t(heap.size())) << "rank " << r << " not zeroed";
  }
  for (int src = 0; src < W; ++src)
    for (int dst = 0; dst < W; ++dst) {
      std::vector<uint8_t> block(kBlock);
      for (int64_t i = 0; i < kBlock; ++i) block[i] = tag_byte(src, dst, i);
      DeviceBuffer<uint8_t> in(block);
      write_through_table(f->peer_table(src), dst, src * kBlock, in.get(), kBlock);
    }
  f->barrier(nullptr);
  for (int dst = 0; dst < W; ++dst) {
    std::vector<uint8_t> heap(W * kBlock);
    COMET_CUDA_CHECK(cudaMemcpy(heap.data(), f->base(dst), heap.size(), cudaMemcpyDeviceToHost));
    for (int src = 0; src < W; ++src)
      for (int64_t i = 0; i < kBlock; ++i)
        ASSERT_EQ(heap[src * kBlock + i], tag_byte(src, dst, i)) << "src " << src << " dst " << dst << " byte " << i;
  }
  // And back: reading through rank 0's table sees what rank 2 holds.
  DeviceBuffer<uint8_t> out(kBlock);
  read_through_table(f->peer_table(0), 2, 3 * kBlock, out.get(), kBlock);
  const std::vector<uint8_t> got = out.download();
  for (int64_t i = 0; i < kBlock; ++i) ASSERT_EQ(got[i], tag_byte(3, 2, i)) << "byte " << i;
}

// Rank p sends sizes[p][q] bytes to rank q; sizes include zeros and a rank sending nothing.
struct Exchange {
  int world;
  std::vector<std::vector<int64_t>> sizes;  // [src][dst]
  std::vector<std::vector<int64_t>> send_offsets, recv_offsets, recv_bytes;
  std::vector<int64_t> send_total, recv_total;
  explicit Exchange(std::vector<std::vector<int64_t>> s) : world(int(s.size())), sizes(std::move(s)) {
    send_offsets.assign(world, std::vector<int64_t>(world));
    recv_offsets = recv_bytes = send_offsets;
    send_total.assign(world, 0);
    recv_total.assign(world, 0);
    for (int p = 0; p < world; ++p)
      for (int q = 0; q < world; ++q) {
        send_offsets[p][q] = send_total[p] + 3;  // gaps between slices must stay untouched
        send_total[p] += sizes[p][q] + 3;
        recv_bytes[q][p] = sizes[p][q];
        recv_offsets[q][p] = recv_total[q] + 5;
        recv_total[q] += sizes[p][q] + 5;
      }
  }
};

TEST(LoopbackFabric, AllToAllVMovesUnevenSlices) {
  COMET_REQUIRE_GPU();
  const Exchange x({{0, 17, 256, 1}, {40, 3, 0, 1000}, {0, 0, 0, 0}, {7, 64, 9, 33}});
  const int W = x.world;
  auto f = make_loopback_fabric(W);
  std::vector<DeviceBuffer<uint8_t>> send, recv;
  std::vector<AllToAllVArgs> args(W);
  for (int p = 0; p < W; ++p) {
    std::vector<uint8_t> s(x.send_total[p], 0xaa);
    for (int q = 0; q < W; ++q)
      for (int64_t i = 0; i < x.sizes[p][q]; ++i) s[x.send_offsets[p][q] + i] = tag_byte(p, q, i);
    send.emplace_back(s);
    recv.emplace_back(size_t(x.recv_total[p]));
    recv.back().poison(0x5a);
  }
  for (int p = 0; p < W; ++p)
    args[p] = {send[p].get(), x.sizes[p].data(), x.send_offsets[p].data(),
               recv[p].get(), x.recv_bytes[p].data(), x.recv_offsets[p].data()};
  f->all_to_all_v(args.data(), nullptr);
  f->barrier(nullptr);
  for (int q = 0; q < W; ++q) {
    const std::vector<uint8_t> got = recv[q].download();
    std::vector<uint8_t> want(x.recv_total[q], 0x5a);
    for (int p = 0; p < W; ++p)
      for (int64_t i = 0; i < x.sizes[p][q]; ++i) want[x.recv_offsets[q][p] + i] = tag_byte(p, q, i);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "receiver " << q << " byte " << i;
  }
}

TEST(LoopbackFabric, AllToAllVRejectsBadArguments) {
  COMET_REQUIRE_GPU();
  const Exchange x({{1, 2}, {3, 4}});
  auto f = make_loopback_fabric(2);
  DeviceBuffer<uint8_t> buf(64);
  auto args_for = [&](const Exchange& e) {
    std::vector<AllToAllVArgs> a(2);
    for (int p = 0; p < 2; ++p)
      a[p] = {buf.get(), e.sizes[p].data(), e.send_offsets[p].data(),
              buf.get(), e.recv_bytes[p].data(), e.recv_offsets[p].data()};
    return a;
  };
  std::vector<AllToAllVArgs> a = args_for(x);
  std::vector<int64_t> expects_more = {2, 5};  // rank 1 expects 5 bytes from rank 1, rank 1 sends 4
  a[1].recv_bytes = expects_more.data();
  EXPECT_TRUE(throws_with<Error>([&] { f->all_to_all_v(a.data(), nullptr); },
                                 {"rank 1 sends 4 bytes to rank 1, which expects 5"}));
  a = args_for(x);
  std::vector<int64_t> negative = {1, -2};
  a[0].send_bytes = negative.data();
  EXPECT_TRUE(throws_with<Error>([&] { f->all_to_all_v(a.data(), nullptr); }, {"rank 0, peer 1", "negative"}));
  a = args_for(x);
  a[0].send = nullptr;
  EXPECT_TRUE(throws_with<Error>([&] { f->all_to_all_v(a.data(), nullptr); }, {"rank 0 sends 3 bytes from a null"}));
  a = args_for(x);
  a[1].recv_offsets = nullptr;
  EXPECT_TRUE(throws_with<Error>([&] { f->all_to_all_v(a.data(), nullptr); }, {"rank 1 passes a null"}));
  // One rank's buffers are not enough for a fabric that drives two ranks.
  EXPECT_TRUE(throws_with<Error>(
      [&] {
        f->all_to_all_v(buf.get(), x.sizes[0].data(), x.send_offsets[0].data(), buf.get(), x.recv_bytes[0].data(),
                        x.recv_offsets[0].data(), nullptr);
      },
      {"one local rank", "drives 2"}));
}

TEST(LoopbackFabric, SingleRankAllToAllVIsASelfCopy) {
  COMET_REQUIRE_GPU();
  auto f = make_local_fabric(1);  // W = 1: Loopback with one rank
  EXPECT_EQ(f->num_local_ranks(), 1);
  std::vector<uint8_t> s(100);
  std::iota(s.begin(), s.end(), uint8_t(1));
  DeviceBuffer<uint8_t> send(s), recv(64);
  recv.poison(0);
  const int64_t send_bytes = 37, send_offset = 5, recv_offset = 11;
  f->all_to_all_v(send.get(), &send_bytes, &send_offset, recv.get(), &send_bytes, &recv_offset, nullptr);
  f->barrier(nullptr);
  const std::vector<uint8_t> got = recv.download();
  for (int i = 0; i < 64; ++i) {
    const bool inside = i >= recv_offset && i < recv_offset + send_bytes;
    ASSERT_EQ(got[i], inside ? s[send_offset + i - recv_offset] : 0) << "byte " << i;
  }
}

}  // namespace
}  // namespace comet::fabric
