// tests/gpu/layer_rig.h: one MoeLayer case on its Loopback fabric (W virtual ranks on one GPU),
// with the case's weights installed and its inputs on the device: the setup the layer suites
// share.
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

struct LayerRig {
  LayerConfig config;
  MoeProblem problem;
  std::unique_ptr<fabric::Fabric> fabric;
  MoeLayer layer;
  cuda::DeviceProblem device;

  explicit LayerRig(const test::LayerCase& lc)
      : config(lc.config()),
        problem(make_problem(config, lc.tokens, lc.spec, lc.seed)),
        fabric(fabric::make_loopback_fabric(config.layout.world)),
        layer(config, *fabric),
        device(config, problem) {
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
