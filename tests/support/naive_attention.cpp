#include "support/naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace thdcp::test {

NaiveResult naive_attention(const LayoutView& layout, const Mask& mask, const HostTensor& q, const HostTensor& k,
                            const HostTensor& v, const HostTensor& dout, const HostTensor& out_for_delta,
                            double scale) {
  const int64_t hq = q.heads(), hkv = k.heads(), dim = q.head_dim(), rows = q.tokens();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  NaiveResult r;
  r.out.assign(static_cast<size_t>(rows * hq * dim), 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(static_cast<size_t>(rows * hkv * dim), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  r.lse.assign(static_cast<size_t>(hq * rows), neg_inf);
  r.max_logit.assign(static_cast<size_t>(hq), neg_inf);
  auto at = [dim](int64_t row, int64_t heads, int64_t h, int64_t d) { return (row * heads + h) * dim + d; };
  for (int b = 0; b < layout.num_seqs; ++b) {
    const int64_t start = layout.padded_start(b), len = layout.length(b);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      std::vector<double> p(static_cast<size_t>(len * len), 0.0);
      std::vector<double> lse(static_cast<size_t>(len), neg_inf);
      for (int64_t i = 0; i < len; ++i) {
        double m = neg_inf;
        std::vector<double> s(static_cast<size_t>(len), neg_inf);
        for (int64_t j = 0; j < len; ++j) {
          if (!mask.allows(i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) {
            dot += static_cast<double>(q.get(at(start + i, hq, h, d))) * k.get(at(start + j, hkv, g, d));
          }
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        if (m == neg_inf) continue;
        r.max_logit[h] = std::max(r.max_logit[h], m);
        double sum = 0;
        for (int64_t j = 0; j < len; ++j) sum += s[j] == neg_inf ? 0.0 : std::exp(s[j] - m);
        lse[i] = m + std::log(sum);
        r.lse[h * rows + start + i] = lse[i];
        for (int64_t j = 0; j < len; ++j) p[i * len + j] = s[j] == neg_inf ? 0.0 : std::exp(s[j] - lse[i]);
        for (int64_t d = 0; d < dim; ++d) {
          double o = 0;
          for (int64_t j = 0; j < len; ++j) o += p[i * len + j] * v.get(at(start + j, hkv, g, d));
          r.out[at(start + i, hq, h, d)] = o;
        }
      }
      // Backward: dP = dO V^T, dS = P (dP - delta), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
      for (int64_t i = 0; i < len; ++i) {
        if (lse[i] == neg_inf) continue;
        double delta = 0;
        for (int64_t d = 0; d < dim; ++d) {
          delta += static_cast<double>(dout.get(at(start + i, hq, h, d))) * out_for_delta.get(at(start + i, hq, h, d));
        }
        for (int64_t j = 0; j < len; ++j) {
          const double pij = p[i * len + j];
          if (pij == 0.0 && !mask.allows(i, j)) continue;
          double dp = 0;
          for (int64_t d = 0; d < dim; ++d) {
            dp += static_cast<double>(dout.get(at(start + i, hq, h, d))) * v.get(at(start + j, hkv, g, d));
          }
          const double ds = pij * (dp - delta);
          for (int64_t d = 0; d < dim; ++d) {
            r.dq[at(start + i, hq, h, d)] += scale * ds * k.get(at(start + j, hkv, g, d));
            r.dk[at(start + j, hkv, g, d)] += scale * ds * q.get(at(start + i, hq, h, d));
            r.dv[at(start + j, hkv, g, d)] += pij * dout.get(at(start + i, hq, h, d));
          }
        }
      }
    }
  }
  return r;
}

}  // namespace thdcp::test
