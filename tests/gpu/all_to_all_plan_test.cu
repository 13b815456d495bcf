// Tests of cuda::AllToAllPlan's staging (cuda/rank_copy.h), the seam between the baselines and
// the fabrics. They need no GPU (nothing is launched or dereferenced on a device), but live with
// the GPU tests because the plan is CUDA code (label `gpu`; they run, not skip, without a GPU).
//
// - Fabric mode: W processes are simulated, each with a fake fabric whose only local rank is its
//   own and which records the all_to_all_v calls it gets. Every process adds the same transfers;
//   then for every call both sides of every pair must agree on the size, and carrying out the
//   recorded sends and receives on host "heaps" must give what the transfers say.
// - Copy mode with several issuers: each issuer's segment list holds exactly the transfers its
//   ranks send, in add order, with unit offsets counted from 0, at its own device copy.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/rank_copy.h"
#include "fabric/fabric.h"
#include "support/test_support.h"

namespace comet::cuda {
namespace {

using test::throws_with;

// Rank `rank` of `world` alone in its process; all_to_all_v records its arguments.
class RecordingFabric final : public fabric::Fabric {
 public:
  struct Call {
    const char* send;
    char* recv;
    std::vector<int64_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
  };
  RecordingFabric(int world, int rank) : world_(world), rank_(rank) {}
  std::string name() const override { return "recording"; }
  int world() const override { return world_; }
  int first_local_rank() const override { return rank_; }
  int num_local_ranks() const override { return 1; }
  int device_of(int) const override { return 0; }
  int gpus() const override { return world_; }
  void run_allocate(int64_t) override {}
  int64_t bytes_per_rank() const override { return 0; }
  void* base(int) const override { return nullptr; }
  void* const* peer_table(int) const override { return nullptr; }
  std::vector<void*> peer_table_host(int) const override { return {}; }
  void barrier(CUstream_st*) override {}
  std::vector<Call> calls;

 private:
  void run_all_to_all_v(const fabric::AllToAllVArgs* a, CUstream_st*) override {
    auto copy = [&](const int64_t* v) { return std::vector<int64_t>(v, v + world_); };
    calls.push_back({static_cast<const char*>(a->send), static_cast<char*>(a->recv), copy(a->send_bytes),
                     copy(a->send_offsets), copy(a->recv_bytes), copy(a->recv_offsets)});
  }
  int world_, rank_;
};

// Host "heaps", 16-byte aligned: [0, kHalf) send side, [kHalf, 2 kHalf) receive side.
constexpr int64_t kHalf = 4096;
struct alignas(16) Unit {
  unsigned char b[16];
};
struct Heaps {
  std::vector<std::vector<Unit>> units;
  explicit Heaps(int world) : units(world, std::vector<Unit>(2 * kHalf / 16)) {
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < kHalf; ++i) at(r, i)[0] = static_cast<unsigned char>(r * 31 + i * 7);
  }
  unsigned char* at(int r, int64_t offset) { return units[r][0].b + offset; }
};

// Two all-to-alls: an all-gather (rank r's 32 bytes into slot r of every rank), then one with
// two transfers per pair (uneven sizes, some zero: rows and metadata, as the baselines' dispatch).
void add_transfers(AllToAllPlan& plan, Heaps& h, int W) {
  plan.clear();
  const int gather = plan.add();
  for (int r = 0; r < W; ++r)
    for (int q = 0; q < W; ++q) plan.add_transfer(gather, {r, q, h.at(r, 0), h.at(q, kHalf + r * 32), 32});
  const int dispatch = plan.add();
  for (int s = 0; s < W; ++s)
    for (int d = 0; d < W; ++d) {
      const int64_t rows = (s * 5 + d * 3) % 4;  // 0..3 rows of 64 bytes, metadata 16 per row
      const int64_t slot = 128 + (s * W + d) * 240;
      plan.add_transfer(dispatch, {s, d, h.at(s, 1024 + d * 192), h.at(d, kHalf + slot), rows * 64});
      plan.add_transfer(dispatch, {s, d, h.at(s, 2560 + d * 48), h.at(d, kHalf + slot + 192), rows * 16});
    }
}

TEST(AllToAllPlan, FabricCallsOfAllProcessesMatchTheTransfers) {
  constexpr int W = 4;
  Heaps direct(W), exchanged(W);
  std::vector<RecordingFabric> fabrics;
  for (int r = 0; r < W; ++r) fabrics.emplace_back(W, r);
  AllToAllPlan reference;
  add_transfers(reference, direct, W);
  // What the transfers say, carried out directly.
  for (int id = 0; id < 2; ++id) {
    SCOPED_TRACE("all-to-all " + std::to_string(id));
    for (int r = 0; r < W; ++r) fabrics[r].calls.clear();
    // Each process: the same transfers, addressed into this run's heaps, staged for its fabric.
    for (int r = 0; r < W; ++r) {
      AllToAllPlan plan;
      plan.use_fabric(fabrics[r]);
      add_transfers(plan, exchanged, W);
      EXPECT_EQ(plan.staged_bytes(), 0);
      std::vector<void*> none(1, nullptr);
      plan.stage(nullptr, none.data());
      plan.run(id, 0, nullptr);
      EXPECT_EQ(plan.bytes(id, false), reference.bytes(id, false));
    }
    const size_t calls = fabrics[0].calls.size();
    EXPECT_EQ(calls, id == 0 ? 1u : 2u) << "one call per transfer a pair has";
    for (int r = 1; r < W; ++r) ASSERT_EQ(fabrics[r].calls.size(), calls) << "rank " << r;
    for (size_t k = 0; k < calls; ++k)
      for (int p = 0; p < W; ++p)
        for (int q = 0; q < W; ++q) {
          const RecordingFabric::Call& from = fabrics[p].calls[k];
          const RecordingFabric::Call& to = fabrics[q].calls[k];
          ASSERT_EQ(from.send_bytes[q], to.recv_bytes[p]) << "call " << k << ", " << p << " -> " << q;
          if (from.send_bytes[q])
            std::memcpy(to.recv + to.recv_offsets[p], from.send + from.send_offsets[q], from.send_bytes[q]);
        }
  }
  // The direct result: every transfer of the reference plan, byte for byte.
  for (int s = 0; s < W; ++s)
    for (int q = 0; q < W; ++q) std::memcpy(direct.at(q, kHalf + s * 32), direct.at(s, 0), 32);
  for (int s = 0; s < W; ++s)
    for (int d = 0; d < W; ++d) {
      const int64_t rows = (s * 5 + d * 3) % 4, slot = 128 + (s * W + d) * 240;
      std::memcpy(direct.at(d, kHalf + slot), direct.at(s, 1024 + d * 192), rows * 64);
      std::memcpy(direct.at(d, kHalf + slot + 192), direct.at(s, 2560 + d * 48), rows * 16);
    }
  for (int r = 0; r < W; ++r)
    EXPECT_EQ(std::memcmp(direct.at(r, 0), exchanged.at(r, 0), 2 * kHalf), 0) << "heap of rank " << r;
}

TEST(AllToAllPlan, EachIssuerCopiesWhatItsRanksSend) {
  constexpr int W = 3;
  const int issuer_of[W] = {0, 1, 1};  // rank 0 on one GPU, ranks 1 and 2 on another
  Heaps h(W);
  // One issuer: every all-to-all's segments in add order (the Loopback layout).
  AllToAllPlan single;
  add_transfers(single, h, W);
  std::vector<Unit> all(single.staged_bytes() / 16 + 1);
  single.stage(all.data(), static_cast<void*>(nullptr));
  const CopySegment* in_order = reinterpret_cast<const CopySegment*>(all.data());
  const int64_t per_id[2] = {W * W, single.staged_bytes() / int64_t(sizeof(CopySegment)) - W * W};

  AllToAllPlan plan;
  plan.set_issuers({issuer_of[0], issuer_of[1], issuer_of[2]});
  EXPECT_EQ(plan.issuers(), 2);
  add_transfers(plan, h, W);
  ASSERT_EQ(plan.staged_bytes(), single.staged_bytes());
  std::vector<Unit> host(plan.staged_bytes() / 16 + 1);
  void* device[2] = {nullptr, nullptr};  // never dereferenced here
  plan.stage(host.data(), device);
  // Per all-to-all, issuer 0's segments, then issuer 1's: the transfers of its ranks in add
  // order, unit offsets from 0.
  const CopySegment* got = reinterpret_cast<const CopySegment*>(host.data());
  for (int id = 0, first = 0; id < 2; first += per_id[id++])
    for (int issuer = 0; issuer < 2; ++issuer) {
      SCOPED_TRACE("all-to-all " + std::to_string(id) + ", issuer " + std::to_string(issuer));
      int64_t units = 0;
      for (int i = first; i < first + per_id[id]; ++i) {
        const CopySegment& want = in_order[i];
        if (issuer_of[want.src_rank] != issuer) continue;
        EXPECT_EQ(got->src, want.src);
        EXPECT_EQ(got->dst, want.dst);
        EXPECT_EQ(got->units, want.units);
        EXPECT_EQ(got->src_rank, want.src_rank);
        EXPECT_EQ(got->dst_rank, want.dst_rank);
        EXPECT_EQ(got->unit_begin, units);
        units += want.units;
        ++got;
      }
    }
  EXPECT_EQ(reinterpret_cast<const char*>(got) - reinterpret_cast<const char*>(host.data()), plan.staged_bytes());
  EXPECT_TRUE(throws_with<Error>([&] { plan.run(0, 2, nullptr); }, {"issuer 2 outside [0, 2)"}));
  EXPECT_TRUE(throws_with<Error>([&] { plan.set_issuers({0, -1}); }, {"rank 1 has no issuer"}));
  AllToAllPlan unstaged;
  unstaged.add();
  EXPECT_TRUE(throws_with<Error>([&] { unstaged.run(0, nullptr); }, {"was not staged"}));
}

}  // namespace
}  // namespace comet::cuda
