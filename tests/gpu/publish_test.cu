// GPU tests of step 1 of a forward (cuda/publish.h, label `gpu`): the rows below each rank's
// token count are copied, nothing past them; the count is copied as given, also when it is out
// of range (then no row is); an x that is not 16-byte aligned is copied whole by the fallback;
// several ranks of one launch each get their own rows.
#include <cstring>
#include <memory>
#include <string>

#include "cuda/publish.h"
#include "gpu_test_util.h"

namespace comet::cuda {
namespace {

using testing::DeviceBuffer;

constexpr int kTMax = 64, kHidden = 24, kTopk = 3;

// One rank's inputs (distinct values per rank) and its poisoned regions.
struct RankIo {
  std::vector<uint16_t> x_host;  // [kTMax + 8][kHidden]: room for a misaligned view
  std::vector<int32_t> ids_host;
  std::vector<float> weights_host;
  DeviceBuffer<uint16_t> x, x_dst;
  DeviceBuffer<int32_t> ids, ids_dst, count, count_dst;
  DeviceBuffer<float> weights, weights_dst;
  RankIo(int rank, int given_count)
      : x_host(size_t(kTMax + 8) * kHidden), ids_host(size_t(kTMax) * kTopk), weights_host(ids_host.size()) {
    for (size_t i = 0; i < x_host.size(); ++i) x_host[i] = uint16_t(rank * 10000 + i % 9973);
    for (size_t i = 0; i < ids_host.size(); ++i) ids_host[i] = int32_t(rank * 1000 + i);
    for (size_t i = 0; i < weights_host.size(); ++i) weights_host[i] = float(rank) + float(i) / 1024.f;
    x = DeviceBuffer<uint16_t>(x_host);
    ids = DeviceBuffer<int32_t>(ids_host);
    weights = DeviceBuffer<float>(weights_host);
    count = DeviceBuffer<int32_t>(std::vector<int32_t>{given_count});
    x_dst = DeviceBuffer<uint16_t>(size_t(kTMax) * kHidden);
    ids_dst = DeviceBuffer<int32_t>(ids_host.size());
    weights_dst = DeviceBuffer<float>(weights_host.size());
    count_dst = DeviceBuffer<int32_t>(1);
    for (auto* b : {&ids_dst, &count_dst}) b->poison();
    x_dst.poison();
    weights_dst.poison();
  }
  // `x_offset` elements into x: 2 bytes past a 16-byte boundary when odd.
  PublishCopy copy(int x_offset = 0) const {
    return {x.get() + x_offset, x_dst.get(), ids.get(), ids_dst.get(), weights.get(), weights_dst.get(), count.get(),
            count_dst.get()};
  }
};

// The region holds the input's first `rows` rows (x from element `x_offset`) and poison after.
void expect_rows(const RankIo& io, int rows, int x_offset = 0) {
  const auto x = io.x_dst.download();
  for (size_t i = 0; i < x.size(); ++i) {
    const bool copied = int(i / kHidden) < rows;
    ASSERT_EQ(x[i], copied ? io.x_host[i + x_offset] : uint16_t(0xffff)) << "x element " << i << ", rows " << rows;
  }
  const auto ids = io.ids_dst.download();
  const auto w = io.weights_dst.download();
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool copied = int(i / kTopk) < rows;
    ASSERT_EQ(ids[i], copied ? io.ids_host[i] : int32_t(-1)) << "id " << i << ", rows " << rows;
    uint32_t bits = 0;
    std::memcpy(&bits, &w[i], 4);
    if (copied) ASSERT_EQ(w[i], io.weights_host[i]) << "weight " << i;
    else ASSERT_EQ(bits, 0xffffffffu) << "weight " << i << " past the count was written";
  }
}

TEST(Publish, CopiesTheRowsBelowEachRanksCountAndTheCountAsGiven) {
  COMET_REQUIRE_GPU();
  // Rank 0 in range, rank 1 empty, rank 2 above T_max (no rows; the plan reports it), rank 3
  // full, in one launch.
  const int counts[] = {37, 0, kTMax + 5, kTMax};
  std::vector<std::unique_ptr<RankIo>> io;
  std::vector<PublishCopy> copies;
  for (int r = 0; r < 4; ++r) {
    io.push_back(std::make_unique<RankIo>(r, counts[r]));
    copies.push_back(io.back()->copy());
  }
  publish_inputs({kTMax, kHidden, kTopk}, copies.data(), 4, 132, nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ", count " + std::to_string(counts[r]));
    EXPECT_EQ(io[r]->count_dst.download()[0], counts[r]);
    expect_rows(*io[r], counts[r] >= 0 && counts[r] <= kTMax ? counts[r] : 0);
  }
}

TEST(Publish, AnUnalignedXIsCopiedWhole) {
  COMET_REQUIRE_GPU();
  RankIo io(5, 10);
  const PublishCopy c = io.copy(1);  // 2 bytes past the allocation's (256-byte aligned) start
  publish_inputs({kTMax, kHidden, kTopk}, &c, 1, 132, nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  const auto x = io.x_dst.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], io.x_host[i + 1]) << "x element " << i;  // all T_max rows
  EXPECT_EQ(io.count_dst.download()[0], 10);
  const auto ids = io.ids_dst.download();
  EXPECT_EQ(ids[10 * kTopk - 1], io.ids_host[10 * kTopk - 1]);
  EXPECT_EQ(ids[10 * kTopk], -1) << "routing past the count was written";
}

// Host-side checks (run without a GPU): bad arguments are refused by name before any launch.
TEST(Publish, RefusesNullAndMisalignedRouting) {
  PublishCopy c;
  try {
    publish_inputs({kTMax, kHidden, kTopk}, &c, 1, 132, nullptr);
    FAIL() << "null pointers were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("null pointer"), std::string::npos) << e.what();
  }
  alignas(16) static int32_t words[8] = {};
  alignas(16) static uint16_t rows[8] = {};
  c = {rows, rows, reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(words) + 2), words,
       reinterpret_cast<const float*>(words), reinterpret_cast<float*>(words), words, words};
  try {
    publish_inputs({kTMax, kHidden, kTopk}, &c, 1, 132, nullptr);
    FAIL() << "misaligned routing was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not 4-byte aligned"), std::string::npos) << e.what();
  }
  try {
    publish_inputs({kTMax, 12, kTopk}, &c, 1, 132, nullptr);
    FAIL() << "hidden 12 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comet::cuda
