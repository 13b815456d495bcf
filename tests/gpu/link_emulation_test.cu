// GPU tests of link emulation (label `gpu`, comet/link_emulation.h, docs/link_emulation.md):
// pacing never changes a result (fused == unfused bitwise, each equal to its unpaced self, the
// baselines within the bf16 tolerance), it measurably slows communication to the emulated
// rate and latency (Comet's and the baselines'), it resets itself between calls (also inside a
// CUDA graph). A withheld rank still times out with it on: moe_layer_test.cu.
//
// Timing bounds: on one GPU the W ranks take turns, so the communication-only time of a forward
// is at least (all remote bytes) / B (each rank's dispatch pulls its incoming bytes at B, its
// combine pushes its outgoing ones at B, one rank after another). The tests ask for 0.8x of that
// (room for timer granularity) and, against over-pacing, at most 1.5x plus a fixed allowance for
// launches. Without pacing the same copies run at HBM speed, several times faster than the lower
// limit, so a pacing that does not happen fails.
#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <type_traits>

#include "comet/baseline.h"
#include "comet/cost_model.h"
#include "comet/layer.h"
#include "comet/problem.h"
#include "comet/routing.h"
#include "cuda/device_problem.h"
#include "cuda/random_fill.h"
#include "fabric/fabric.h"
#include "gpu_test_util.h"
#include "layer_cases.h"
#include "ref/oracle.h"

namespace comet {
namespace {

using test::LayerCase;

// A slow link with a latency, so that pacing reorders as much as it can.
constexpr LinkEmulation kSlowLink{20, 5};

using testing::as_double;
using testing::close_to;

template <class Layer>
std::vector<std::vector<float>> run(Layer& layer, cuda::DeviceProblem& d) {
  d.poison_y();
  layer.forward(d.tensors(), nullptr);
  if constexpr (std::is_same_v<Layer, MoeLayer>) layer.check(nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  return d.download_y();
}

LayerOptions layer_options(bool fused, int n0, int n1, const LinkEmulation& link) {
  LayerOptions o;
  o.path = fused ? ForwardPath::kFused : ForwardPath::kUnfused;
  o.n_comm0 = n0;
  o.n_comm1 = n1;
  o.link = link;
  o.poison_workspace = true;  // a row a paced run failed to move reads as NaN, not as the last run's
  return o;
}

BaselineOptions with_link(BaselineOptions o, const LinkEmulation& link) {
  o.link = link;
  return o;
}

class LinkEmulationTest : public ::testing::TestWithParam<LayerCase> {};

// Every layer case: paced outputs bitwise equal to unpaced ones, fused == unfused, the baselines
// within the bf16 tolerance of Comet (they round once more, docs/baselines.md).
TEST_P(LinkEmulationTest, PacingNeverChangesResults) {
  COMET_REQUIRE_GPU();
  const LayerCase& lc = GetParam();
  SCOPED_TRACE(lc.describe() + ", " + kSlowLink.describe());
  const LayerConfig c = lc.config();
  const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
  cuda::DeviceProblem d(c, p);
  auto fabric = fabric::make_loopback_fabric(c.layout.world);
  MoeLayer layer(c, *fabric);
  layer.set_weights(p.weights);
  layer.set_options(layer_options(false, 0, 0, {}));
  const auto unfused = run(layer, d);
  EXPECT_TRUE(close_to(unfused, ref::oracle_forward(p), p.config.model.hidden)) << "unpaced unfused against the oracle";
  layer.set_options(layer_options(false, 0, 0, kSlowLink));
  EXPECT_EQ(run(layer, d), unfused) << "paced unfused differs from unpaced";
  for (auto [n0, n1] : {std::pair{1, 1}, {16, 8}}) {
    SCOPED_TRACE("fused, n_comm " + std::to_string(n0) + "/" + std::to_string(n1));
    layer.set_options(layer_options(true, n0, n1, kSlowLink));
    for (int call = 0; call < 2; ++call) EXPECT_EQ(run(layer, d), unfused) << "call " << call;
  }

  auto base_fabric = fabric::make_loopback_fabric(c.layout.world);
  BaselineMoe base(c, *base_fabric);
  base.set_weights(p.weights);
  for (const BaselineOptions& o : {sequential_baseline(), chunked_baseline(3)}) {
    SCOPED_TRACE(o.describe());
    base.set_options(o);
    const auto unpaced = run(base, d);
    base.set_options(with_link(o, kSlowLink));
    const auto paced = run(base, d);
    EXPECT_EQ(paced, unpaced) << "paced baseline differs from unpaced";
    EXPECT_EQ(run(base, d), paced) << "a second paced call differs";
    EXPECT_TRUE(close_to(paced, as_double(unfused), c.model.hidden)) << "baseline against Comet's unfused output";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LinkEmulationTest, ::testing::ValuesIn(test::layer_cases()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

// Inputs for the timing tests, generated on the device (mixtral's H at a small F, W = 8, 1024
// tokens per rank: about 200 MB between ranks per forward, 0.45 ms at 450 GB/s), with a
// Loopback fabric and a stream.
struct TimedWorkload {
  LayerConfig config;
  std::vector<Routing> routing;
  std::vector<RankTensors> tensors;
  std::vector<testing::DeviceBuffer<char>> buffers;
  double remote_bytes = 0;  // Comet's dispatch + combine between different ranks
  std::unique_ptr<fabric::Fabric> fabric = fabric::make_loopback_fabric(8);
  cudaStream_t stream = nullptr;

  TimedWorkload(const TimedWorkload&) = delete;
  TimedWorkload& operator=(const TimedWorkload&) = delete;
  ~TimedWorkload() {
    if (stream) cudaStreamDestroy(stream);
  }
  TimedWorkload() {
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    config.model = {"mixtral-h/f28", 4096, 512, 8, 2, Activation::kSwiGlu};
    config.layout = {8, 8, 1};
    config.max_tokens_per_rank = 1024;
    const int W = 8, T = 1024, H = 4096, K = 2;
    buffers.reserve(5 * W);  // references into it stay valid below
    for (int r = 0; r < W; ++r) {
      routing.push_back(generate_routing(RoutingSpec{}, T, 8, K, 7, r));
      auto& x = buffers.emplace_back(size_t(T) * H * 2);
      cuda::fill_uniform_bf16(x.get(), size_t(T) * H, 100 + r, 1.f);
      auto& ids = buffers.emplace_back(std::vector<char>(reinterpret_cast<const char*>(routing[r].expert_ids.data()),
                                                         reinterpret_cast<const char*>(routing[r].expert_ids.data()) +
                                                             routing[r].expert_ids.size() * 4));
      auto& w = buffers.emplace_back(std::vector<char>(reinterpret_cast<const char*>(routing[r].weights.data()),
                                                       reinterpret_cast<const char*>(routing[r].weights.data()) +
                                                           routing[r].weights.size() * 4));
      auto& count = buffers.emplace_back(std::vector<char>(reinterpret_cast<const char*>(&routing[r].num_tokens),
                                                           reinterpret_cast<const char*>(&routing[r].num_tokens) + 4));
      auto& y = buffers.emplace_back(size_t(T) * H * 2);
      tensors.push_back({x.get(), reinterpret_cast<const int32_t*>(ids.get()), reinterpret_cast<const float*>(w.get()),
                         reinterpret_cast<const int32_t*>(count.get()), y.get()});
    }
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    remote_bytes = total_link_bytes(config, DispatchPlan(config, routing));
  }
  std::vector<uint16_t> download_y() const {
    std::vector<uint16_t> out;
    for (const RankTensors& t : tensors) {
      std::vector<uint16_t> y(size_t(config.max_tokens_per_rank) * config.model.hidden);
      COMET_CUDA_CHECK(cudaMemcpy(y.data(), t.y, y.size() * 2, cudaMemcpyDeviceToHost));
      out.insert(out.end(), y.begin(), y.end());
    }
    return out;
  }
};

// Median microseconds of `reps` runs of `launch` on `stream`, after one untimed run.
double median_us(const std::function<void(cudaStream_t)>& launch, cudaStream_t stream, int reps = 5) {
  launch(stream);
  std::vector<double> us;
  cudaEvent_t start, stop;
  COMET_CUDA_CHECK(cudaEventCreate(&start));
  COMET_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < reps; ++i) {
    COMET_CUDA_CHECK(cudaEventRecord(start, stream));
    launch(stream);
    COMET_CUDA_CHECK(cudaEventRecord(stop, stream));
    COMET_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    COMET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// us that `bytes` take at `gbps`.
double link_us(double bytes, double gbps) { return bytes / (gbps * 1e3); }

// The communication-only time under `link` against the bounds of the file header: for a pure
// rate, at least 0.8x and at most 1.5x bytes / rate (plus the unpaced time and 100 us of
// launches); for a pure latency (`turns` phases of one latency each), at least 0.8x and at most
// 3x turns * latency (dispatch pulls pay one latency per round of warps).
void expect_paced(const std::function<double(const LinkEmulation&)>& comm_only_us, double bytes, double unpaced_us,
                  const LinkEmulation& link, int turns = 0) {
  SCOPED_TRACE(link.describe());
  const double got = comm_only_us(link);
  const double rate_us = link_us(bytes, link.gbps), latency_us = turns * link.latency_us;
  std::cout << "[   info   ] " << link.describe() << ": comm-only " << got << " us; unpaced " << unpaced_us
            << " us; bytes / rate " << rate_us << " us; latencies " << latency_us << " us\n";
  const double want = std::max(rate_us, latency_us);
  EXPECT_GE(got, 0.8 * want);
  EXPECT_LE(got, 1.5 * rate_us + 3 * latency_us + unpaced_us + 100);
}

TEST(LinkEmulation, PacesCommunicationToTheEmulatedRate) {
  COMET_REQUIRE_GPU();
  TimedWorkload wl;
  MoeLayer layer(wl.config, *wl.fabric);
  layer.set_random_weights(1);
  const cudaStream_t stream = wl.stream;
  const auto comm_only = [&](const LinkEmulation& link) {
    layer.set_options(layer_options(false, 0, 0, link));
    layer.forward(wl.tensors, stream);
    layer.check(stream);
    return median_us([&](cudaStream_t s) { layer.run_part(MoeLayer::Part::kCommunication, s); }, stream);
  };
  const double unpaced = comm_only({});
  std::cout << "[   info   ] " << wl.remote_bytes / 1e6 << " MB between ranks\n";
  expect_paced(comm_only, wl.remote_bytes, unpaced, {450, 0});
  expect_paced(comm_only, wl.remote_bytes, unpaced, {160, 0});
  // Latency: every rank's dispatch and combine take at least one latency each (2 x W turns).
  expect_paced(comm_only, wl.remote_bytes, unpaced, {1e5, 50}, 2 * 8);
}

TEST(LinkEmulation, PacesTheBaselinesAllToAlls) {
  COMET_REQUIRE_GPU();
  TimedWorkload wl;
  BaselineMoe base(wl.config, *wl.fabric);
  base.set_random_weights(1);
  const cudaStream_t stream = wl.stream;
  const auto comm_only = [&](const BaselineOptions& o) {
    base.set_options(o);
    base.forward(wl.tensors, stream);
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
    return median_us([&](cudaStream_t s) { base.run_part(BaselineMoe::Part::kCommunication, s); }, stream);
  };
  const double unpaced = comm_only(sequential_baseline());
  const BaselineTraffic t = base.last_traffic();
  const double bytes = double(t.dispatch_remote_bytes + t.combine_remote_bytes);
  // The same rows as Comet's, plus the metadata sent with each token.
  EXPECT_GE(bytes, wl.remote_bytes);
  for (int chunks : {1, 4}) {
    const BaselineOptions o = chunks == 1 ? sequential_baseline() : chunked_baseline(chunks);
    SCOPED_TRACE(o.describe());
    const auto paced = [&](const LinkEmulation& link) { return comm_only(with_link(o, link)); };
    expect_paced(paced, bytes, unpaced, {450, 0});
    // Latency: each all-to-all stands for W = 8 turns of one latency, per chunk and direction.
    expect_paced(paced, bytes, unpaced, {1e5, 50}, 2 * 8 * chunks);
  }
}

// The fused forward captured in a CUDA graph with pacing on: every replay is paced again (the
// pacers reset themselves on the device, no host step) and equals the unfused output.
TEST(LinkEmulation, PacesEveryGraphReplay) {
  COMET_REQUIRE_GPU();
  TimedWorkload wl;
  MoeLayer layer(wl.config, *wl.fabric);
  layer.set_random_weights(1);
  const cudaStream_t stream = wl.stream;
  // The fused kernels never split: the reference is the unsplit unfused output (this shape's
  // GEMM0, 64 cooperative tiles at K = 4096, would split by default: LayerOptions::split_gemms).
  LayerOptions unsplit;
  unsplit.split_gemms = false;
  layer.set_options(unsplit);
  layer.forward(wl.tensors, stream);
  layer.check(stream);
  const std::vector<uint16_t> unfused = wl.download_y();
  const LinkEmulation link{160, 2};
  layer.set_options(layer_options(true, 16, 4, link));
  layer.forward(wl.tensors, stream);  // outside the capture first (one-time attributes)
  layer.check(stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  COMET_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layer.forward(wl.tensors, stream);
  COMET_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  COMET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double want = link_us(wl.remote_bytes, link.gbps);
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    for (const RankTensors& t : wl.tensors)
      COMET_CUDA_CHECK(cudaMemsetAsync(t.y, 0xff, size_t(wl.config.max_tokens_per_rank) * wl.config.model.hidden * 2, stream));
    const double us = median_us([&](cudaStream_t s) { COMET_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, stream, 1);
    layer.check(stream);
    std::cout << "[   info   ] replay " << replay << ": " << us << " us, remote bytes / rate " << want << " us\n";
    EXPECT_GE(us, 0.8 * want);
    EXPECT_EQ(wl.download_y(), unfused) << "fused and paced differs from unfused";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(LinkEmulation, InvalidSettingsAreRefusedNamingTheValue) {
  COMET_REQUIRE_GPU();
  const LayerConfig c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  auto fabric = fabric::make_loopback_fabric(2);
  MoeLayer layer(c, *fabric);
  LayerOptions o;
  o.link = {-450, 0};
  try {
    layer.set_options(o);
    ADD_FAILURE() << "a negative rate was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-450"), std::string::npos) << e.what();
  }
  auto base_fabric = fabric::make_loopback_fabric(2);
  BaselineMoe base(c, *base_fabric);
  try {
    base.set_options(with_link(sequential_baseline(), {450, -1}));
    ADD_FAILURE() << "a negative latency was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("latency"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comet
