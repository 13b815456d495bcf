// ref/oracle.h: the naive single-thread fp64 oracle of DESIGN §2, and output comparison.
//
// The oracle ignores the parallel layout: for every token of every rank it sums
// w * FFN_e(x) over unmasked slots with the full F, in double. Inputs and weights are the
// problem's values (already rounded to the storage dtype); nothing is rounded inside.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/problem.h"

namespace comet::ref {

// y[r] = [T_r][H] in double. Throws comet::Error for inputs it cannot read in bounds: weights of
// another shape, routing and tokens for different numbers of ranks, a routing of another topk,
// an expert id outside [-1, E), x of another size than num_tokens * H. (A repeated expert is
// summed twice: the oracle computes what the routing says.)
//
// With `term_squares`, also each output element's sum of the squares of the terms the second
// GEMM and the weighted sum add up for it (w_k * I_f * W1[f][h] over the token's slots k and
// f), in the same [T_r][H] shape. The rounding of I (and of what follows it) perturbs each term
// by its own relative error, so a correct forward's error scales with the root of that sum,
// not with y, which cancellation between the terms can make arbitrarily small. For random
// weights its expectation is y^2's, so over many elements the two agree.
std::vector<std::vector<double>> oracle_forward(const MoeProblem& problem,
                                                std::vector<std::vector<double>>* term_squares = nullptr);

// One row is one token's H outputs. Besides the relative L2 error of the whole output, every
// row's L2 error is measured against the RMS of the reference rows' L2 norms (over the rows
// that are not all zero: a token whose slots are all masked has none): the global error
// alone hides a wrong row among many (one zeroed row among 16k tokens moves rel_l2 by 8e-3,
// under the bf16 tolerance), while that row's own error is about one RMS row norm.
struct Comparison {
  double rel_l2 = 0;        // ||got - want||_2 / ||want||_2 over all ranks
  double max_abs = 0;       // largest |got - want|
  int64_t non_finite = 0;   // elements of got that are NaN or Inf (never pass)
  int64_t elements = 0;
  // max over rows of ||got_row - want_row||_2 / sqrt(mean over non-zero rows of ||want_row||_2^2),
  // and that row: its rank and token index there (-1 when no row is non-zero in either).
  double worst_row_error = 0;
  int worst_row_rank = -1;
  int64_t worst_row_token = -1;
  // With the terms' squares: true when their sum, not the reference's squares, was the scale of
  // both errors (the reference cancelled below its terms' norm).
  bool scaled_by_terms = false;
  // NaN-free, rel_l2 <= tolerance and worst_row_error <= kRowErrorPerTolerance * tolerance.
  bool within(double tolerance) const;
  std::string describe() const;
};

// The per-row bound, as a multiple of the relative-L2 tolerance (so each dtype gets its own:
// bf16 0.1, fp16 0.02, fp32 1e-4). Measured with `comet run --backend cpu --json` over every
// preset, bf16/f16/f32, 128/4096/16384 tokens per rank (up to 16k rows of H = 64 after CPU
// scaling), uniform/zipf:1.2/imbalance:0.05 routing, EP 8, EP 4 x TP 2 and EP 2, masked
// fraction 0 and 0.3 (270 runs per dtype): the largest worst_row_error / tolerance_for(dtype)
// was 2.4 for bf16, 1.6 for fp16 and 0.3 for fp32 (rel_l2 / tolerance at most 0.34), so 10
// leaves a margin of 4 or more. A zeroed row of average norm has worst_row_error about 1: ten
// times the bf16 bound.
inline constexpr double kRowErrorPerTolerance = 10.0;

// got[r] and want[r] are rank r's [T_r][hidden] outputs, row-major. Throws comet::Error if the
// ranks or sizes differ, or a rank's size is not a multiple of hidden (>= 1).
// With `term_squares` (oracle_forward's, of the same shape), both errors are measured against
// the larger of ||want||^2 and the sum of the terms' squares (the rows' RMS likewise): a few
// elements whose terms cancel (one token of hidden 1) no longer read rounding as a wrong value.
// On a large output the two sums agree to about 1/sqrt(elements), and a wrong or missing row is
// still about one row norm off.
Comparison compare_outputs(const std::vector<std::vector<float>>& got, const std::vector<std::vector<double>>& want,
                           int hidden, const std::vector<std::vector<double>>* term_squares = nullptr);

// Relative-L2 tolerance for a backend that stores in `dtype` and accumulates in fp32.
// bf16 keeps 8 significant bits (unit roundoff 2^-9 = 2e-3); the layer rounds three times
// (intermediate I, expert output O, the pre-reduced partial and y), each adding about that
// much relative error to the norm, so 1e-2 leaves margin. A single wrong or missing row among n
// moves rel_l2 by only about 1/sqrt(n) (under 1e-2 from n = 10^4): the per-row bound catches it.
// fp16 has 11 bits (2^-12); fp32 is only summation order (1e-5 is ample for K <= 1e5).
double tolerance_for(DType dtype);

}  // namespace comet::ref
