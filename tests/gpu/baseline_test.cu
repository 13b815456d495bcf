// GPU tests of the baselines (label `gpu`, comet/baseline.h): W virtual ranks on one GPU (Loopback
// fabric), the layer cases of layer_cases.h (every preset scaled down, EP, TP and EP+TP, W in
// {1,2,4,8}, uniform / Zipf with masked slots / imbalance routing, an empty rank) against the
// fp64 oracle; every activation; bad input; the same random weights as MoeLayer.
//
// Tolerance: ref::tolerance_for(bf16) = 1e-2 relative L2, the argument of ref/oracle.h (a few bf16
// roundings of the output norm, each ~2e-3), and every row within 10x that of the RMS row norm
// (ref::kRowErrorPerTolerance; at these sizes, a few hundred rows, a wrong row already fails the
// global bound, the row bound catches it from about 10^4 rows on). The baselines round once more
// than MoeLayer (the GEMM0 output before the activation).
// What is guaranteed and tested bitwise: repeated calls; the pipelined schedule with chunks = 1
// against the sequential one (the same kernels and cuBLAS calls). With more chunks cuBLAS sees
// fewer rows per call and may choose other kernels, so chunks > 1 is held to the tolerance
// (against the oracle and against the sequential output); whether it was bitwise equal anyway
// is printed.
//
// Local fabric (the ranks over the visible GPUs, several per GPU where fewer GPUs than ranks are
// visible; needs 2 GPUs, else skipped with a message): the output equals the Loopback output
// bitwise, for every schedule. Each rank runs the same kernels
// and cuBLAS calls with the same shapes in the same order on the same GPU model; only the
// inter-rank copies (exact byte moves) and the streams differ, and no step depends on timing.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <iostream>
#include <memory>

#include "comet/baseline.h"
#include "comet/layer.h"
#include "comet/problem.h"
#include "cuda/device_problem.h"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"
#include "checkpoint_weights.h"
#include "gpu_test_util.h"
#include "layer_cases.h"
#include "ref/oracle.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::LayerCase;
using testing::as_double;
using testing::close_to;

// One forward with poisoned outputs first, so that every checked row comes from this call.
std::vector<std::vector<float>> run(BaselineMoe& layer, cuda::DeviceProblem& d, cudaStream_t stream = nullptr) {
  d.poison_y();
  layer.forward(d.tensors(), stream);
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d.download_y();
}

// A case's problem (with `activation`), a baseline layer holding its weights, its inputs on the GPU.
struct BaselineCase {
  LayerConfig config;
  MoeProblem problem;
  std::unique_ptr<fabric::Fabric> fabric;
  std::unique_ptr<BaselineMoe> layer;
  std::unique_ptr<cuda::DeviceProblem> device;
  BaselineCase(const LayerCase& lc, const BaselineOptions& options, Activation activation = Activation::kSwiGlu) {
    config = lc.config();
    config.model.activation = activation;
    problem = make_problem(config, lc.tokens, lc.spec, lc.seed);
    fabric = fabric::make_loopback_fabric(config.layout.world);
    layer = std::make_unique<BaselineMoe>(config, *fabric, options);
    layer->set_weights(problem.weights);
    device = std::make_unique<cuda::DeviceProblem>(config, problem);
  }
  std::vector<std::vector<float>> run() { return comet::run(*layer, *device); }
};

class BaselineTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(BaselineTest, SequentialAndChunkedMatchTheOracle) {
  COMET_REQUIRE_GPU();
  SCOPED_TRACE(GetParam().describe());
  BaselineCase s(GetParam(), sequential_baseline());
  BaselineMoe& layer = *s.layer;
  cuda::DeviceProblem& d = *s.device;
  const auto want = ref::oracle_forward(s.problem);
  const int H = s.config.model.hidden;

  const auto sequential = run(layer, d);
  EXPECT_TRUE(close_to(sequential, want, H)) << "sequential";
  EXPECT_EQ(run(layer, d), sequential) << "a second sequential call differs";

  for (int chunks : {1, 2, 3, 4}) {
    SCOPED_TRACE("chunks " + std::to_string(chunks));
    layer.set_options(chunked_baseline(chunks));
    const auto chunked = run(layer, d);
    if (chunks == 1) EXPECT_EQ(chunked, sequential) << "one pipelined chunk differs from sequential";
    EXPECT_TRUE(close_to(chunked, want, H)) << "against the oracle";
    EXPECT_TRUE(close_to(chunked, as_double(sequential), H)) << "against sequential";
    EXPECT_EQ(run(layer, d), chunked) << "a second chunked call differs";
    if (chunks > 1)
      std::cout << "[   info   ] chunks " << chunks << (chunked == sequential ? " bitwise equal" : " not bitwise equal")
                << " to sequential\n";
  }
  // The chunks one after another on one stream, and the grouped cuBLAS call.
  layer.set_options({3, false, BaselineGemm::kPerExpertLoop});
  EXPECT_TRUE(close_to(run(layer, d), want, H)) << "3 chunks on one stream";
  layer.set_options(chunked_baseline(2, BaselineGemm::kGroupedBatched));
  EXPECT_TRUE(close_to(run(layer, d), want, H)) << "2 chunks, grouped GEMM";
  layer.set_options(sequential_baseline(BaselineGemm::kGroupedBatched));
  EXPECT_TRUE(close_to(run(layer, d), want, H)) << "sequential, grouped GEMM";
}

INSTANTIATE_TEST_SUITE_P(Cases, BaselineTest, ::testing::ValuesIn(test::layer_cases()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

// Plain activations (no gate) on EP, TP and EP+TP layouts.
TEST(Baseline, PlainActivationsMatchTheOracle) {
  COMET_REQUIRE_GPU();
  for (Activation act : {Activation::kGelu, Activation::kRelu, Activation::kSilu})
    for (auto [world, tp] : {std::pair{4, 1}, {4, 2}, {2, 2}}) {
      LayerCase lc{"qwen3-30b-a3b", 16, world, tp, 64, {}, {RoutingKind::kZipf, 1.1, 0.1}, 31};
      for (int r = 0; r < world; ++r) lc.tokens.push_back(r == 2 ? 0 : 64 - 9 * r);
      SCOPED_TRACE(lc.describe() + " activation " + activation_name(act));
      BaselineCase s(lc, chunked_baseline(2), act);
      EXPECT_TRUE(close_to(s.run(), ref::oracle_forward(s.problem), s.problem.config.model.hidden));
    }
}

// Token counts and routing change between calls on one object (no reallocation, no stale rows);
// a non-blocking stream; more chunks than a rank has tokens.
TEST(Baseline, NewRoutingAndTokenCountsBetweenCalls) {
  COMET_REQUIRE_GPU();
  const LayerCase lc{"deepseek-v3", 16, 4, 2, 128, {128, 0, 77, 5}, {RoutingKind::kZipf, 1.5, 0.2}, 42};
  const LayerConfig c = lc.config();
  auto fabric = fabric::make_loopback_fabric(4);
  BaselineMoe layer(c, *fabric, chunked_baseline(8));
  const ExpertWeights weights = make_problem(c, lc.tokens, lc.spec, lc.seed).weights;
  layer.set_weights(weights);
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const std::vector<int> tokens = call % 2 ? std::vector<int>{3, 128, 0, 64} : lc.tokens;
    MoeProblem p = make_problem(c, tokens, lc.spec, lc.seed + call);
    p.weights = weights;
    cuda::DeviceProblem d(c, p);
    if (call == 3) layer.set_options(sequential_baseline());
    EXPECT_TRUE(close_to(run(layer, d, stream), ref::oracle_forward(p), p.config.model.hidden));
  }
  cudaStreamDestroy(stream);
}

// Every slot masked on every rank: tokens exist, no rank holds any, y is zero; no tokens at all.
TEST(Baseline, NothingRoutedGivesZeros) {
  COMET_REQUIRE_GPU();
  const LayerCase lc{"mixtral-8x7b", 16, 4, 2, 32, {32, 7, 0, 1}, {RoutingKind::kUniform, 0, 1.0}, 3};
  BaselineCase s(lc, chunked_baseline(3));
  const auto got = s.run();
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r].size(), size_t(lc.tokens[r]) * s.config.model.hidden);
    for (float v : got[r]) ASSERT_EQ(v, 0.f) << "rank " << r;
  }
  const MoeProblem none = make_problem(s.config, {0, 0, 0, 0}, lc.spec, lc.seed);
  cuda::DeviceProblem empty(s.config, none);
  s.layer->forward(empty.tensors(), nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(s.layer->last_traffic().dispatch_bytes, 0);
}

// Bad input throws naming the rank before any output is written; the next call works.
TEST(Baseline, BadInputThrowsAndTheLayerStaysUsable) {
  COMET_REQUIRE_GPU();
  BaselineCase s(LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {64, 30}, {}, 7}, chunked_baseline(2));
  BaselineMoe& layer = *s.layer;
  cuda::DeviceProblem& d = *s.device;
  const LayerConfig& c = s.config;
  const MoeProblem& p = s.problem;
  d.set_token_count(1, 65);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(d.tensors(), nullptr); },
                                       {"bad input from rank 1", "num_tokens 65", "T_max = 64"}));
  d.set_token_count(1, 30);

  // An expert id out of range, then a repeated expert, in rank 0's routing on the device.
  const RankTensors& t = d.tensors()[0];
  int32_t* ids = const_cast<int32_t*>(t.expert_ids);
  const int32_t good[2] = {p.routing[0].expert(5, 0), p.routing[0].expert(5, 1)};
  const int32_t bad_id[2] = {good[0], c.model.num_experts};
  COMET_CUDA_CHECK(cudaMemcpy(ids + 5 * c.model.topk, bad_id, sizeof bad_id, cudaMemcpyHostToDevice));
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(d.tensors(), nullptr); },
                                       {"bad input from rank 0", "token 5 slot 1", "expert id 8"}));
  const int32_t repeated[2] = {good[0], good[0]};
  COMET_CUDA_CHECK(cudaMemcpy(ids + 5 * c.model.topk, repeated, sizeof repeated, cudaMemcpyHostToDevice));
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(d.tensors(), nullptr); },
                                       {"bad input from rank 0", "token 5", "twice"}));
  COMET_CUDA_CHECK(cudaMemcpy(ids + 5 * c.model.topk, good, sizeof good, cudaMemcpyHostToDevice));
  // A NaN weight in an unmasked slot.
  float* weights = const_cast<float*>(t.weights);
  const float nan_weight = std::nanf("");
  COMET_CUDA_CHECK(cudaMemcpy(weights + 5 * c.model.topk + 1, &nan_weight, sizeof nan_weight, cudaMemcpyHostToDevice));
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(d.tensors(), nullptr); },
                                       {"bad input from rank 0", "token 5 slot 1", "routing weight nan"}));
  const float good_weight = p.routing[0].weight(5, 1);
  COMET_CUDA_CHECK(cudaMemcpy(weights + 5 * c.model.topk + 1, &good_weight, sizeof good_weight, cudaMemcpyHostToDevice));
  EXPECT_TRUE(close_to(run(layer, d), ref::oracle_forward(p), p.config.model.hidden));
}

// set_random_weights writes MoeLayer's weights: on the same inputs the outputs agree within the
// tolerance (different GEMMs and one more rounding, the same math).
TEST(Baseline, RandomWeightsEqualMoeLayers) {
  COMET_REQUIRE_GPU();
  const LayerCase lc{"deepseek-v3", 16, 4, 2, 64, {64, 50, 0, 64}, {RoutingKind::kZipf, 1.2, 0.1}, 9};
  const LayerConfig c = lc.config();
  const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
  cuda::DeviceProblem d(c, p);
  auto comet_fabric = fabric::make_loopback_fabric(4);
  MoeLayer comet_layer(c, *comet_fabric);
  comet_layer.set_random_weights(5);
  comet_layer.forward(d.tensors(), nullptr);
  comet_layer.check(nullptr);
  const auto want = as_double(d.download_y());
  auto fabric = fabric::make_loopback_fabric(4);
  BaselineMoe layer(c, *fabric, chunked_baseline(2));
  layer.set_random_weights(5);
  EXPECT_TRUE(close_to(run(layer, d), want, c.model.hidden));
  layer.set_random_weights(6);  // other weights must not pass
  EXPECT_FALSE(close_to(run(layer, d), want, c.model.hidden));
}

TEST(Baseline, PartsRunAfterAForward) {
  COMET_REQUIRE_GPU();
  BaselineCase s(LayerCase{"phi-3.5-moe", 16, 2, 1, 32, {32, 17}, {}, 4}, chunked_baseline(2));
  BaselineMoe& layer = *s.layer;
  const LayerConfig& c = s.config;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.run_part(BaselineMoe::Part::kCompute, nullptr); }, {"forward()"}));
  const auto y = s.run();
  layer.run_part(BaselineMoe::Part::kCompute, nullptr);
  layer.run_part(BaselineMoe::Part::kCommunication, nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  // Phi-3.5/16 on EP=2: 8 experts per rank, topk 2, so a dispatched row carries 2 metadata
  // entries of 8 bytes; the combine moves the rows alone.
  const BaselineTraffic traffic = layer.last_traffic();
  EXPECT_GT(traffic.dispatch_remote_bytes, 0);
  EXPECT_EQ(traffic.combine_remote_bytes * (c.model.hidden * 2 + 16),
            traffic.dispatch_remote_bytes * c.model.hidden * 2);
  EXPECT_GT(traffic.dispatch_bytes, traffic.dispatch_remote_bytes);  // rank 0's tokens for itself
  EXPECT_EQ(s.run(), y) << "parts left state that changed the next forward";
}

// set_rank_weights (checkpoint layout, from device memory) gives the baseline the weights
// set_weights gives it: the outputs are bitwise equal (qwen3 / 16: F/TP = 48, a partial gate/up
// block; a plain activation without gate).
TEST(Baseline, CheckpointWeightsPerRankEqualTheFullWeights) {
  COMET_REQUIRE_GPU();
  for (Activation activation : {Activation::kSwiGlu, Activation::kRelu}) {
    SCOPED_TRACE(activation_name(activation));
    BaselineCase s(LayerCase{"qwen3-30b-a3b", 16, 4, 1, 64, {64, 17, 0, 40}, {RoutingKind::kZipf, 1.2, 0.1}, 9},
                   chunked_baseline(2), activation);
    const auto want = s.run();
    auto fabric = fabric::make_loopback_fabric(s.config.layout.world);
    BaselineMoe layer(s.config, *fabric, chunked_baseline(2));
    std::vector<std::array<testing::DeviceBuffer<uint16_t>, 3>> device;
    for (int r = 0; r < s.config.layout.world; ++r) {
      const testing::CheckpointWeights h = testing::checkpoint_weights(s.config, s.problem.weights, r);
      device.push_back({testing::DeviceBuffer<uint16_t>(h.gate), testing::DeviceBuffer<uint16_t>(h.up),
                        testing::DeviceBuffer<uint16_t>(h.down)});
      if (r == 1) {
        EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(s.device->tensors(), nullptr); },
                                             {"set_rank_weights() for every local rank"}));
      }
      layer.set_rank_weights(r, {h.gate.empty() ? nullptr : device[r][0].get(), device[r][1].get(),
                                 device[r][2].get()});
    }
    EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_rank_weights(4, {}); },
                                         {"BaselineMoe::set_rank_weights", "rank 4 is not driven"}));
    EXPECT_EQ(run(layer, *s.device), want) << "checkpoint weights differ from the full ones";
  }
}

TEST(Baseline, RefusesWhatItCannotRun) {
  LayerConfig c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  c.model.hidden = 100;
  EXPECT_NE(BaselineMoe::can_implement(c).reason.find("multiples of 8"), std::string::npos);
  c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  c.dtype = DType::kF16;
  EXPECT_NE(BaselineMoe::can_implement(c).reason.find("bf16 only, got f16"), std::string::npos);
  c = LayerCase{"mixtral-8x7b", 16, 2, 1, 64, {}, {}, 1}.config();
  EXPECT_TRUE(BaselineMoe::can_implement(c).ok);
  EXPECT_GT(BaselineMoe::device_bytes(c), 0);
  COMET_REQUIRE_GPU();
  auto fabric = fabric::make_loopback_fabric(2);
  EXPECT_TRUE(test::throws_with<Error>([&] { BaselineMoe refused(c, *fabric, chunked_baseline(0)); },
                                       {"chunks must be within"}));
  BaselineMoe layer(c, *fabric);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.set_options(chunked_baseline(33)); }, {"chunks must be within"}));
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward({}, nullptr); }, {"set_weights"}));
  auto three = fabric::make_loopback_fabric(3);
  EXPECT_TRUE(test::throws_with<Error>([&] { BaselineMoe refused(c, *three); }, {"the fabric has 3 ranks"}));
  // Misaligned and misplaced rows, a capture, and a second layer that reallocated the fabric's
  // heap under this one: each refused by name, before anything is enqueued.
  layer.set_random_weights(1);
  const MoeProblem p = make_problem(c, {40, 7}, {}, 3);
  cuda::DeviceProblem inputs(c, p);
  std::vector<RankTensors> odd = inputs.tensors();
  odd[1].y = static_cast<char*>(odd[1].y) + 2;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(odd, nullptr); }, {"rank 1's y is not 16-byte aligned"}));
  // Host memory, refused by name before anything is enqueued.
  std::vector<uint16_t> host_x(size_t(c.max_tokens_per_rank) * c.model.hidden);
  std::vector<RankTensors> on_host = inputs.tensors();
  on_host[0].x = host_x.data();
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(on_host, nullptr); }, {"rank 0's x is host memory"}));
  layer.forward(inputs.tensors(), nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  const auto want = inputs.download_y();
  // A capture is refused before anything is enqueued into it (the forward syncs the host): the
  // capture ends with an empty graph, and the stream runs the next forward as usual.
  cudaStream_t stream;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  COMET_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(inputs.tensors(), stream); },
                                       {"cannot be captured in a CUDA graph"}));
  cudaGraph_t graph = nullptr;
  COMET_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t nodes = 1;
  COMET_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u);
  COMET_CUDA_CHECK(cudaGraphDestroy(graph));
  inputs.poison_y();
  layer.forward(inputs.tensors(), stream);
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(inputs.download_y(), want) << "after the refused capture";
  BaselineMoe second(c, *fabric);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(inputs.tensors(), nullptr); }, {"reallocated"}));
}

// ---- Local fabric: rank r on GPU fabric.device_of(r) ----

int visible_gpus() { return comet::testing::have_gpu() ? fabric::detail::visible_devices() : 0; }

#define COMET_REQUIRE_GPUS(n)                                                                               \
  do {                                                                                                      \
    const int comet_gpus_ = visible_gpus();                                                                 \
    if (comet_gpus_ < (n))                                                                                  \
      GTEST_SKIP() << "the Local fabric needs " << (n) << " GPUs, " << comet_gpus_                         \
                   << " visible: multi-GPU test skipped";                                                   \
  } while (0)

// A problem's inputs with rank r's tensors on its GPU: one DeviceProblem per rank on the rank's
// GPU (each holds every rank's tensors; rank r uses its own copy's).
class ProblemOnGpus {
 public:
  ProblemOnGpus(const LayerConfig& c, const MoeProblem& p, const fabric::Fabric& f) {
    fabric::detail::DeviceGuard guard;
    for (int r = 0; r < c.layout.world; ++r) {
      devices_.push_back(f.device_of(r));
      COMET_CUDA_CHECK(cudaSetDevice(devices_[r]));
      copies_.push_back(std::make_unique<cuda::DeviceProblem>(c, p));
      tensors_.push_back(copies_[r]->tensors()[r]);
    }
  }
  ~ProblemOnGpus() {
    fabric::detail::DeviceGuard guard;
    for (size_t r = 0; r < copies_.size(); ++r) {
      cudaSetDevice(devices_[r]);
      copies_[r].reset();
    }
  }
  const std::vector<RankTensors>& tensors() const { return tensors_; }
  cuda::DeviceProblem& on(int r) { return *copies_[r]; }
  void poison() {
    fabric::detail::DeviceGuard guard;
    for (size_t r = 0; r < copies_.size(); ++r) {
      COMET_CUDA_CHECK(cudaSetDevice(devices_[r]));
      copies_[r]->poison_y();
    }
  }
  // Every rank's y, after its GPU finished.
  std::vector<std::vector<float>> y() {
    fabric::detail::DeviceGuard guard;
    std::vector<std::vector<float>> out;
    for (size_t r = 0; r < copies_.size(); ++r) {
      COMET_CUDA_CHECK(cudaSetDevice(devices_[r]));
      COMET_CUDA_CHECK(cudaDeviceSynchronize());
      out.push_back(copies_[r]->download_y()[r]);
    }
    return out;
  }
  // One forward on the default stream of GPU 0, outputs poisoned first.
  std::vector<std::vector<float>> run(BaselineMoe& layer) {
    poison();
    fabric::detail::DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(0));
    layer.forward(tensors_, nullptr);
    return y();
  }

 private:
  std::vector<int> devices_;  // of each rank
  std::vector<std::unique_ptr<cuda::DeviceProblem>> copies_;
  std::vector<RankTensors> tensors_;
};

bool same_traffic(const BaselineTraffic& a, const BaselineTraffic& b) {
  return a.dispatch_bytes == b.dispatch_bytes && a.dispatch_remote_bytes == b.dispatch_remote_bytes &&
         a.combine_bytes == b.combine_bytes && a.combine_remote_bytes == b.combine_remote_bytes;
}

// The layer cases the Local fabric can spread over at least two of the visible GPUs (W = 4 and 8
// on two GPUs: 2 and 4 ranks per GPU), and a TP case on two.
std::vector<LayerCase> local_cases(int gpus) {
  std::vector<LayerCase> out;
  for (const LayerCase& c : test::layer_cases())
    if (c.world >= 2 && fabric::local_fabric_gpus(c.world, gpus) >= 2) out.push_back(c);
  out.push_back({"mixtral-8x7b", 16, 2, 2, 64, {64, 0}, {RoutingKind::kZipf, 1.2, 0.1}, 77});
  return out;
}

TEST(BaselineLocal, EqualsLoopbackBitwise) {
  COMET_REQUIRE_GPUS(2);
  for (const LayerCase& lc : local_cases(visible_gpus())) {
    SCOPED_TRACE(lc.describe());
    const LayerConfig c = lc.config();
    const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
    auto loopback = fabric::make_loopback_fabric(c.layout.world);
    BaselineMoe want_layer(c, *loopback);
    want_layer.set_weights(p.weights);
    cuda::DeviceProblem want_inputs(c, p);
    auto local = fabric::make_local_fabric(c.layout.world);
    SCOPED_TRACE(std::to_string(local->gpus()) + " GPUs");
    BaselineMoe layer(c, *local);
    layer.set_weights(p.weights);
    ProblemOnGpus inputs(c, p, *local);

    const BaselineOptions schedules[] = {sequential_baseline(),
                                         chunked_baseline(1),
                                         chunked_baseline(2),
                                         chunked_baseline(3),
                                         {3, false, BaselineGemm::kPerExpertLoop},
                                         chunked_baseline(2, BaselineGemm::kGroupedBatched)};
    for (const BaselineOptions& o : schedules) {
      SCOPED_TRACE(o.describe());
      want_layer.set_options(o);
      layer.set_options(o);
      const auto want = run(want_layer, want_inputs);
      const auto got = inputs.run(layer);
      EXPECT_EQ(got, want) << "Local differs from Loopback";
      EXPECT_EQ(inputs.run(layer), got) << "a second call differs";
      EXPECT_TRUE(same_traffic(layer.last_traffic(), want_layer.last_traffic()));
      if (o.chunks == 1 && !o.pipelined) EXPECT_TRUE(close_to(got, ref::oracle_forward(p), p.config.model.hidden)) << "against the oracle";
    }
  }
}

// The caller's stream on GPU 1 (rank 1's lane runs on it, rank 0's forks from it); the same
// random weights as on Loopback (seeded per rank); bad input names the rank; wrong tensor counts.
TEST(BaselineLocal, StreamsWeightsAndErrors) {
  COMET_REQUIRE_GPUS(2);
  const LayerCase lc{"qwen3-30b-a3b", 16, 2, 1, 64, {64, 41}, {RoutingKind::kZipf, 1.2, 0.1}, 12};
  const LayerConfig c = lc.config();
  const MoeProblem p = make_problem(c, lc.tokens, lc.spec, lc.seed);
  auto loopback = fabric::make_loopback_fabric(2);
  BaselineMoe want_layer(c, *loopback, chunked_baseline(2));
  want_layer.set_random_weights(5);
  cuda::DeviceProblem want_inputs(c, p);
  const auto want = run(want_layer, want_inputs);

  auto local = fabric::make_local_fabric(2);
  BaselineMoe layer(c, *local, chunked_baseline(2));
  layer.set_random_weights(5);
  ProblemOnGpus inputs(c, p, *local);
  EXPECT_EQ(inputs.run(layer), want) << "default stream of GPU 0";
  {
    fabric::detail::DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(1));
    cudaStream_t stream;
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (const BaselineOptions& o : {chunked_baseline(2), sequential_baseline()}) {
      SCOPED_TRACE(o.describe());
      layer.set_options(o);
      want_layer.set_options(o);
      COMET_CUDA_CHECK(cudaSetDevice(0));  // the Loopback reference runs on GPU 0's default stream
      const auto want_o = run(want_layer, want_inputs);
      inputs.poison();
      COMET_CUDA_CHECK(cudaSetDevice(1));
      layer.forward(inputs.tensors(), stream);
      int current = -1;
      COMET_CUDA_CHECK(cudaGetDevice(&current));
      EXPECT_EQ(current, 1) << "forward() changed the current device";
      COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_EQ(inputs.y(), want_o) << "the caller's stream on GPU 1";
    }
    COMET_CUDA_CHECK(cudaStreamDestroy(stream));
  }

  inputs.on(1).set_token_count(1, 65);
  EXPECT_TRUE(test::throws_with<Error>([&] { inputs.run(layer); },
                                       {"bad input from rank 1", "num_tokens 65", "T_max = 64"}));
  inputs.on(1).set_token_count(1, 41);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward({inputs.tensors()[0]}, nullptr); },
                                       {"tensors for 1 ranks", "this process drives 2"}));
  std::vector<RankTensors> null_y = inputs.tensors();
  null_y[1].y = nullptr;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(null_y, nullptr); }, {"rank 1's y is a null pointer"}));
  std::vector<RankTensors> odd_x = inputs.tensors();
  odd_x[0].x = static_cast<const char*>(odd_x[0].x) + 2;
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(odd_x, nullptr); }, {"rank 0's x is not 16-byte aligned"}));
  std::vector<RankTensors> swapped = inputs.tensors();
  std::swap(swapped[0].x, swapped[1].x);
  EXPECT_TRUE(test::throws_with<Error>([&] { layer.forward(swapped, nullptr); },
                                       {"rank 0's x is memory of GPU 1, the rank runs on GPU 0"}));
  layer.set_options(chunked_baseline(2));
  want_layer.set_options(chunked_baseline(2));
  EXPECT_EQ(inputs.run(layer), run(want_layer, want_inputs)) << "after the errors";
  // run_part over both GPUs leaves the next forward unchanged.
  layer.run_part(BaselineMoe::Part::kCompute, nullptr);
  layer.run_part(BaselineMoe::Part::kCommunication, nullptr);
  EXPECT_EQ(inputs.run(layer), want) << "after run_part";
}

}  // namespace
}  // namespace comet
