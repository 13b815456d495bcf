// tests/gpu/layer_rig.h: one MoeLayer case on a fabric (by default its Loopback fabric, W
// virtual ranks on one GPU), with the case's weights installed and its inputs on the device of
// each rank: the setup the layer suites share.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "comet/layer.h"
#include "comet/problem.h"
#include "cuda/device_problem.h"
#include "fabric/fabric.h"
#include "layer_cases.h"

namespace comet::testing {

// A layer of a model no preset gives: EP = `world` (TP 1) or EP x TP, T_max tokens per rank, the
// CUDA backend's tiles.
inline LayerConfig model_layer_config(const ModelShape& model, int world, int tp, int max_tokens_per_rank) {
  LayerConfig c;
  c.model = model;
  c.layout = {world, world / tp, tp};
  c.max_tokens_per_rank = max_tokens_per_rank;
  c.tiles = {128, 128, 256};
  return c;
}

struct LayerRig {
  LayerConfig config;
  MoeProblem problem;
  std::unique_ptr<fabric::Fabric> fabric;
  MoeLayer layer;
  cuda::DeviceProblem device;

  // `on`: the fabric the ranks run on (e.g. fabric::make_local_fabric(W)); null: Loopback.
  explicit LayerRig(const test::LayerCase& lc, std::unique_ptr<fabric::Fabric> on = nullptr)
      : LayerRig(lc.config(), lc.tokens, lc.spec, lc.seed, std::move(on)) {}

  // A configuration no preset case gives (a model of its own, an unusual topk or hidden size).
  LayerRig(const LayerConfig& c, const std::vector<int>& tokens, const RoutingSpec& spec, uint64_t seed,
           std::unique_ptr<fabric::Fabric> on = nullptr)
      : config(c),
        problem(make_problem(config, tokens, spec, seed)),
        fabric(on ? std::move(on) : fabric::make_loopback_fabric(config.layout.world)),
        layer(config, *fabric),
        device(config, problem, fabric.get()) {
    layer.set_weights(problem.weights);
  }

  // A forward with `options` into poisoned outputs, checked; returns them.
  std::vector<std::vector<float>> forward(const LayerOptions& options, cudaStream_t stream = nullptr) {
    layer.set_options(options);
    device.poison_y();
    layer.forward(device.tensors(), stream);
    layer.check(stream);
    return device.download_y();
  }
};

}  // namespace comet::testing
