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
std::vector<std::vector<double>> oracle_forward(const MoeProblem& problem);

struct Comparison {
  double rel_l2 = 0;        // ||got - want||_2 / ||want||_2 over all ranks
  double max_abs = 0;       // largest |got - want|
  int64_t non_finite = 0;   // elements of got that are NaN or Inf (never pass)
  int64_t elements = 0;
  bool within(double tolerance) const { return non_finite == 0 && rel_l2 <= tolerance; }
  std::string describe() const;
};

Comparison compare_outputs(const std::vector<std::vector<float>>& got,
                           const std::vector<std::vector<double>>& want);

// Relative-L2 tolerance for a backend that stores in `dtype` and accumulates in fp32.
// bf16 keeps 8 significant bits (unit roundoff 2^-9 = 2e-3); the layer rounds three times
// (intermediate I, expert output O, the pre-reduced partial and y), each adding about that
// much relative error to the norm, so 1e-2 leaves margin without hiding a wrong row (a single
// wrong or missing row among n moves rel_l2 by about 1/sqrt(n), far above it for test sizes).
// fp16 has 11 bits (2^-12); fp32 is only summation order (1e-5 is ample for K <= 1e5).
double tolerance_for(DType dtype);

}  // namespace comet::ref
