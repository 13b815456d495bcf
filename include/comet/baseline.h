// comet/baseline.h: the two baseline MoE layers of DESIGN §6 on GPUs, so that every Comet speedup
// is a ratio measured in one run (docs/baselines.md). No CUDA headers: streams are opaque.
//
//   auto fabric = comet::fabric::make_loopback_fabric(8);
//   comet::BaselineMoe seq(config, *fabric, comet::sequential_baseline());   // Megatron-style
//   seq.set_random_weights(1);               // the same weights as MoeLayer::set_random_weights(1)
//   seq.forward(ranks, stream);              // the same RankTensors as MoeLayer::forward
//   seq.set_options(comet::chunked_baseline(4));                             // FasterMoE/Tutel-style
//
// Both compute DESIGN §2 (the same output as the fp64 oracle within bf16 tolerance): dispatch
// all-to-all (each token once per destination rank, every TP rank of its experts' group),
// permute into expert-sorted rows, cuBLAS GEMM0, activation, cuBLAS GEMM1, un-permute with the
// weighted sum of a token's local experts (fp32), combine all-to-all, and the owner's sum over
// ranks in rank order (fp32) into y (bf16).
//
// Fabrics (docs/baselines.md): the object drives the fabric's local ranks. Loopback: every
// rank on one GPU. Local: the ranks spread over the GPUs (fabric.device_of), each rank's kernels
// on its GPU. Nccl: this process's rank; the all-to-alls are NCCL send/recv groups, and the
// constructor, forward() and run_part() are collective (every rank calls them in the same
// order, with the same options: the first forward after the constructor or set_options checks
// that the ranks' chunks and schedule agree, and names them when they do not).
//
// Contract:
// - Tensors are those of comet/layer.h (bf16 x and y [T_max][H], routing [T_max][topk], the
//   token count as one device int32), one RankTensors per local rank (fabric.num_local_ranks(),
//   entry i for rank fabric.first_local_rank() + i), on that rank's GPU (or reachable from it).
// - forward() synchronizes the host once per call: after the ranks exchange their token counts
//   it copies them to the host (as Megatron does with its all-to-all split sizes), checks them,
//   lays out every buffer and launches the rest asynchronously on `stream`, which must be on the
//   GPU of a local rank. Work of ranks on other GPUs (and the chunked schedule's two streams
//   per GPU) runs on internal streams forked from `stream` and joined back into it. Bad input (a
//   token count outside [0, T_max], an expert id outside [-1, E), an expert repeated within a
//   token) throws comet::Error naming the rank before any output is written (on the Nccl fabric
//   on every process: each reads every rank's counts); the object stays usable.
// - Buffers are allocated at construction for T_max tokens on every local rank (the worst case:
//   every token of every rank routed to one rank); forward() allocates no device memory. The
//   fabric's symmetric heap is (re)allocated by the constructor: one fabric per layer object.
// - Deterministic: repeated calls with the same inputs are bitwise equal. The chunked schedule
//   with chunks = 1 is bitwise equal to the sequential one; with more chunks the GEMMs see fewer
//   rows per call and cuBLAS may pick other kernels, so results agree within bf16 rounding.
// - Every activation of comet/config.h is supported; H and F/TP must be multiples of 8; bf16.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comet/config.h"
#include "comet/layer.h"
#include "comet/link_emulation.h"
#include "comet/problem.h"

struct CUstream_st;

namespace comet {

namespace fabric {
class Fabric;
}

// How the expert GEMMs run: one cublasGemmEx per expert, or one cublasGemmGroupedBatchedEx
// per GEMM, rank and chunk. Which one is faster depends on shapes; `comet bench layer` times
// both and reports the faster.
enum class BaselineGemm { kPerExpertLoop, kGroupedBatched };

const char* baseline_gemm_name(BaselineGemm gemm);  // "cublas-loop", "cublas-grouped"

struct BaselineOptions {
  // Token chunks per rank, 1..32. Chunk c of a rank with T tokens is [c*T/C, (c+1)*T/C).
  int chunks = 1;
  // false: every step of every chunk on the caller's stream, one after another (with chunks = 1
  // the sequential baseline). true: the chunk pipeline on a communication and a compute stream
  // (chunk i's GEMMs overlap chunk i+1's dispatch and chunk i-1's combine).
  bool pipelined = false;
  BaselineGemm gemm = BaselineGemm::kPerExpertLoop;
  // Paces every all-to-all (and the count exchange) to an emulated link, as
  // LayerOptions::link does for MoeLayer (docs/link_emulation.md). Off by default.
  LinkEmulation link;
  std::string describe() const;  // "sequential, cublas-loop", "chunked C=4 (pipelined), ...", ...
};

BaselineOptions sequential_baseline(BaselineGemm gemm = BaselineGemm::kPerExpertLoop);
BaselineOptions chunked_baseline(int chunks, BaselineGemm gemm = BaselineGemm::kPerExpertLoop);

// Bytes the last forward's all-to-alls moved, summed over every rank (the same on every process
// of an Nccl run). dispatch_bytes includes the metadata sent with each token (min(topk, E/EP)
// rounded up to even entries of 8 bytes: A row and weight); the count exchange before the host
// sync is not counted. remote_* leave out a rank's copies to itself, which no link carries.
struct BaselineTraffic {
  int64_t dispatch_bytes = 0, dispatch_remote_bytes = 0;
  int64_t combine_bytes = 0, combine_remote_bytes = 0;
};

class BaselineMoe {
 public:
  // Throws comet::Error when the configuration cannot run (with the reason) or when the
  // options are invalid.
  BaselineMoe(const LayerConfig& config, fabric::Fabric& fabric, const BaselineOptions& options = {});
  ~BaselineMoe();
  BaselineMoe(const BaselineMoe&) = delete;
  BaselineMoe& operator=(const BaselineMoe&) = delete;

  static Status can_implement(const LayerConfig& config);
  // Device memory the layer allocates for `config` with every rank on one GPU (Loopback: heap,
  // weights, staging). With ranks on several GPUs each GPU holds its ranks' heaps and weights,
  // and one staging copy and cuBLAS workspace of its own.
  static int64_t device_bytes(const LayerConfig& config);

  // From the next forward on; no reallocation. Throws comet::Error for invalid values.
  void set_options(const BaselineOptions& options);
  const BaselineOptions& options() const;

  // Full fp32 weights, sliced per rank as MoeLayer::set_weights does (the local ranks' slices).
  void set_weights(const ExpertWeights& weights);
  // One local rank's bf16 weights in a checkpoint's layout, as MoeLayer::set_rank_weights takes
  // them (comet/layer.h, RankExpertWeights). forward() needs every local rank's weights.
  void set_rank_weights(int rank, const RankExpertWeights& weights);
  // Benchmarks: device-side pseudo-random weights, for SwiGLU bitwise the weights that
  // MoeLayer::set_random_weights(seed) writes, so the two layers' outputs can be compared. Rank
  // r's weights depend on (seed, r) only: every fabric gives a rank the same weights.
  void set_random_weights(uint64_t seed);

  void forward(const std::vector<RankTensors>& ranks, CUstream_st* stream);

  // Benchmarks only: one part of the last forward's work, every chunk, on `stream`, with its
  // layout and buffers (call forward() once first; the buffers' contents become meaningless).
  // kCompute: permute, GEMM0, activation, GEMM1, un-permute; kCommunication: the dispatch and
  // combine all-to-alls.
  enum class Part { kCompute, kCommunication };
  void run_part(Part part, CUstream_st* stream);

  BaselineTraffic last_traffic() const;
  const LayerConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace comet
