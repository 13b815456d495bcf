// The naive fp64 oracle and output comparison.
#include "ref/oracle.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "comet/error.h"
#include "core/activation.h"

namespace comet::ref {

std::vector<std::vector<double>> oracle_forward(const MoeProblem& p, std::vector<std::vector<double>>* term_squares) {
  const ModelShape& m = p.config.model;
  p.weights.check(m);
  const size_t H = m.hidden, F = m.ffn;
  // The oracle is the reference everything is checked against: inputs that would make it read
  // out of bounds are refused here, as the backends refuse them.
  COMET_CHECK(p.routing.size() == p.x.size(), "oracle_forward: routing for " << p.routing.size()
                                                 << " ranks, tokens for " << p.x.size());
  for (size_t r = 0; r < p.x.size(); ++r) {
    const Routing& rt = p.routing[r];
    COMET_CHECK(rt.topk == m.topk, "oracle_forward: rank " << r << "'s routing has topk " << rt.topk
                                                           << ", the model " << m.topk);
    // Bounds only: the oracle sums whatever the routing says, a repeated expert included.
    const size_t slots = size_t(std::max(rt.num_tokens, 0)) * size_t(std::max(rt.topk, 0));
    COMET_CHECK(rt.num_tokens >= 0 && rt.expert_ids.size() == slots && rt.weights.size() == slots,
                "oracle_forward: rank " << r << "'s routing holds " << rt.expert_ids.size() << " ids and "
                                        << rt.weights.size() << " weights for " << rt.num_tokens << " tokens x topk "
                                        << rt.topk);
    for (size_t i = 0; i < slots; ++i)
      COMET_CHECK(rt.expert_ids[i] >= -1 && rt.expert_ids[i] < m.num_experts,
                  "oracle_forward: rank " << r << " token " << i / size_t(rt.topk) << ": expert id "
                                          << rt.expert_ids[i] << " is outside [-1, " << m.num_experts << ")");
    COMET_CHECK(p.x[r].size() == size_t(rt.num_tokens) * H, "oracle_forward: rank " << r << "'s x holds "
                                                               << p.x[r].size() << " values, expected num_tokens*H = "
                                                               << size_t(rt.num_tokens) * H);
  }
  const bool gated = is_gated(m.activation);
  std::vector<std::vector<double>> y(p.x.size());
  if (term_squares) term_squares->assign(p.x.size(), {});
  std::vector<double> inter(F), gate(F), up(F), down(H), down_terms2(H);
  for (size_t r = 0; r < p.x.size(); ++r) {
    const Routing& rt = p.routing[r];
    y[r].assign(size_t(rt.num_tokens) * H, 0.0);
    if (term_squares) (*term_squares)[r].assign(size_t(rt.num_tokens) * H, 0.0);
    for (int t = 0; t < rt.num_tokens; ++t) {
      const float* x = p.x[r].data() + size_t(t) * H;
      double* out = y[r].data() + size_t(t) * H;
      double* out_terms2 = term_squares ? (*term_squares)[r].data() + size_t(t) * H : nullptr;
      for (int k = 0; k < rt.topk; ++k) {
        const int e = rt.expert(t, k);
        if (e < 0) continue;
        const double w = rt.weight(t, k);
        const float* wg = gated ? p.weights.w_gate.data() + size_t(e) * H * F : nullptr;
        const float* wu = p.weights.w_up.data() + size_t(e) * H * F;
        const float* wd = p.weights.w_down.data() + size_t(e) * F * H;
        // Row-major weights: walk h outside so the inner loop is contiguous.
        std::fill(gate.begin(), gate.end(), 0.0);
        std::fill(up.begin(), up.end(), 0.0);
        for (size_t h = 0; h < H; ++h) {
          const double xh = x[h];
          for (size_t f = 0; f < F; ++f) up[f] += xh * wu[h * F + f];
          if (gated)
            for (size_t f = 0; f < F; ++f) gate[f] += xh * wg[h * F + f];
        }
        for (size_t f = 0; f < F; ++f) inter[f] = core::apply_activation(m.activation, gate[f], up[f]);
        std::fill(down.begin(), down.end(), 0.0);
        for (size_t f = 0; f < F; ++f)
          for (size_t h = 0; h < H; ++h) down[h] += inter[f] * wd[f * H + h];
        for (size_t h = 0; h < H; ++h) out[h] += w * down[h];
        if (!out_terms2) continue;
        std::fill(down_terms2.begin(), down_terms2.end(), 0.0);
        for (size_t f = 0; f < F; ++f)
          for (size_t h = 0; h < H; ++h) {
            const double term = inter[f] * wd[f * H + h];
            down_terms2[h] += term * term;
          }
        for (size_t h = 0; h < H; ++h) out_terms2[h] += w * w * down_terms2[h];
      }
    }
  }
  return y;
}

Comparison compare_outputs(const std::vector<std::vector<float>>& got, const std::vector<std::vector<double>>& want,
                           int hidden, const std::vector<std::vector<double>>* term_squares) {
  COMET_CHECK(got.size() == want.size(),
              "output has " << got.size() << " ranks, reference has " << want.size());
  COMET_CHECK(!term_squares || term_squares->size() == want.size(),
              "compare_outputs: the terms' squares have " << term_squares->size() << " ranks, the reference "
                                                          << want.size());
  COMET_CHECK(hidden >= 1, "compare_outputs: hidden must be >= 1, got " << hidden);
  const size_t H = size_t(hidden);
  Comparison c;
  double diff2 = 0, ref2 = 0, terms2 = 0, worst_row_diff2 = 0;
  int64_t rows = 0;  // rows whose reference is not all zero (a token with every slot masked is)
  for (size_t r = 0; r < got.size(); ++r) {
    COMET_CHECK(got[r].size() == want[r].size(), "rank " << r << ": output has " << got[r].size()
                                                          << " values, reference has " << want[r].size());
    COMET_CHECK(got[r].size() % H == 0, "rank " << r << ": " << got[r].size()
                                                << " values are not whole rows of hidden = " << hidden);
    COMET_CHECK(!term_squares || (*term_squares)[r].size() == want[r].size(),
                "rank " << r << ": the terms' squares have " << (*term_squares)[r].size() << " values, the reference "
                        << want[r].size());
    if (term_squares)
      for (const double t2 : (*term_squares)[r]) terms2 += t2;
    for (size_t row = 0; row < got[r].size() / H; ++row) {
      double row_diff2 = 0, row_ref2 = 0;
      bool row_non_finite = false;
      for (size_t i = row * H; i < (row + 1) * H; ++i) {
        ++c.elements;
        if (!std::isfinite(got[r][i])) {
          ++c.non_finite;
          row_non_finite = true;
          continue;
        }
        const double d = double(got[r][i]) - want[r][i];
        row_diff2 += d * d;
        row_ref2 += want[r][i] * want[r][i];
        c.max_abs = std::max(c.max_abs, std::abs(d));
      }
      diff2 += row_diff2;
      ref2 += row_ref2;
      if (row_ref2 > 0) ++rows;
      // A row with a NaN or Inf is as bad as a row can be (an unwritten, poisoned row); a row zero
      // in both (a token whose every slot is masked) is no candidate.
      if (row_non_finite) row_diff2 = INFINITY;
      if ((row_ref2 > 0 || row_diff2 > 0) && (c.worst_row_rank < 0 || row_diff2 > worst_row_diff2)) {
        worst_row_diff2 = row_diff2;
        c.worst_row_rank = int(r);
        c.worst_row_token = int64_t(row);
      }
    }
  }
  // The scale: the reference's squares, or the terms' where the reference cancelled below them.
  // An all-zero reference (no routed token anywhere) has no terms either and must be matched
  // exactly.
  c.scaled_by_terms = terms2 > ref2;
  const double scale2 = std::max(ref2, terms2);
  c.rel_l2 = scale2 > 0 ? std::sqrt(diff2 / scale2) : (diff2 > 0 ? INFINITY : 0.0);
  const double rms_row2 = rows > 0 ? scale2 / double(rows) : 0.0;
  c.worst_row_error = rms_row2 > 0 ? std::sqrt(worst_row_diff2 / rms_row2) : (worst_row_diff2 > 0 ? INFINITY : 0.0);
  return c;
}

bool Comparison::within(double tolerance) const {
  return non_finite == 0 && rel_l2 <= tolerance && worst_row_error <= kRowErrorPerTolerance * tolerance;
}

std::string Comparison::describe() const {
  std::ostringstream os;
  os.precision(3);
  os << std::scientific << "rel_l2 " << rel_l2 << ", max_abs " << max_abs << ", worst row " << worst_row_error;
  if (worst_row_rank >= 0) os << " (rank " << worst_row_rank << " token " << worst_row_token << ")";
  os << ", non-finite " << non_finite << " of " << elements;
  if (scaled_by_terms) os << " (relative to the terms' norm: the reference cancels below it)";
  return os.str();
}

double tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 1e-5;
    case DType::kBF16: return 1e-2;
    case DType::kF16: return 2e-3;
  }
  return 0;
}

}  // namespace comet::ref
