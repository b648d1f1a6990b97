// The exact argmax of a float32 LM head through a bfloat16 screen (built into the same extension as
// cpu_gemm.cpp): best (T,) = argmax_j x_t . w_j for hidden rows x (T, K) and a float32 head
// w (V, K), reading the head's bfloat16 copy (half the bytes) and a few float32 rows.
//
// Why: a greedy decoding or verification step needs only each row's argmax, and in float32 the LM
// head is the step's largest product (SmolLM2-135M: 49,152 x 576, 113 MB of the 538 MB a step
// reads). The screen s = x . bf16(w) comes from the small-row kernel (float32 x, FMA chains on
// the widened bf16 weights, float32 results). Its error against the exact logit z_j = x . w_j is
// bounded: bf16 rounding moves each weight by at most u |w| (u = 2^-8), and the K-term float32
// sum adds at most g = K 2^-24 / (1 - K 2^-24) of the sum of |terms|, so
//   |s_j - z_j| <= (u + g (1 + u)) sum_k |x_k| |w_jk| <= coef |x| |w_j|   (Cauchy-Schwarz).
// With b_j that bound and L = max_j (s_j - b_j), every j with s_j + b_j < L has z_j < z_k for
// the k attaining L; the candidates (s_j + b_j >= L, 1.9 of 49,152 on average) are recomputed in
// double precision from the float32 weights, and the largest wins (the lowest index on a tie).
// So the result is the argmax of the exact logits, not of the screen.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

// cpu_gemm.cpp: y (..., N) = x @ w.T against the kernel's packed copy of w (float32 x with a
// bfloat16 copy: float32 y, not rounded)
at::Tensor packed_linear(const at::Tensor& x_in, const at::Tensor& p, int64_t N, const c10::optional<at::Tensor>& b);

namespace {

at::Tensor screened_argmax(const at::Tensor& x_in, const at::Tensor& p, const at::Tensor& w_in,
                           const at::Tensor& wnorm_in) {
  // x (T, K) float32, p = pack(bf16(w)), w (V, K) float32, wnorm (V,) float64 row norms of w
  // -> (T,) int64; -1 for a row whose screen is not finite (the caller computes those in full)
  TORCH_CHECK(x_in.dim() == 2 && w_in.dim() == 2 && x_in.size(1) == w_in.size(1),
              "screened_argmax: x (T, K) and w (V, K)");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat &&
              p.scalar_type() == at::kBFloat16 && wnorm_in.scalar_type() == at::kDouble,
              "screened_argmax: float32 x and w, their bfloat16 packed copy, float64 row norms");
  TORCH_CHECK(x_in.device().is_cpu() && w_in.device().is_cpu(), "screened_argmax: CPU tensors only");
  const int64_t T_ = x_in.size(0), K = x_in.size(1), V = w_in.size(0);
  TORCH_CHECK(wnorm_in.numel() == V && p.dim() == 3 && p.size(1) == K, "screened_argmax: norms (V,), p of w");
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous(), wnorm = wnorm_in.contiguous();
  const at::Tensor s = packed_linear(x, p, V, c10::nullopt);  // (T, V) float32, the screen
  at::Tensor best = at::empty({T_}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const double* np_ = wnorm.data_ptr<double>();
  int64_t* bp = best.data_ptr<int64_t>();
  const double u = std::ldexp(1.0, -8), e32 = std::ldexp(1.0, -24);
  const double g = K * e32 / (1.0 - K * e32);
  const double coef = (u + g * (1.0 + u)) * (1.0 + 1e-9);  // the margin covers this double arithmetic
  at::parallel_for(0, T_, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = xp + t * K;
      const float* sr = sp + t * V;
      double xx = 0.0;
      for (int64_t k = 0; k < K; ++k) xx += static_cast<double>(xr[k]) * xr[k];
      const double c = coef * std::sqrt(xx);
      double L = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < V; ++j) L = std::max(L, static_cast<double>(sr[j]) - c * np_[j]);
      int64_t arg = -1;
      if (std::isfinite(L) && std::isfinite(c)) {
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < V; ++j) {
          if (static_cast<double>(sr[j]) + c * np_[j] < L) continue;  // below a candidate for sure
          const float* wr = wp + j * K;
          double d = 0.0;
          for (int64_t k = 0; k < K; ++k) d += static_cast<double>(xr[k]) * wr[k];
          if (arg < 0 || d > top) top = d, arg = j;
        }
      }
      bp[t] = arg;
    }
  });
  return best;
}

}  // namespace

#define EAGLE_ARGMAX_LIBRARY(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)  // expands TORCH_EXTENSION_NAME first
EAGLE_ARGMAX_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("screened_argmax(Tensor x, Tensor p, Tensor w, Tensor wnorm) -> Tensor");
  m.impl("screened_argmax", c10::DispatchKey::CPU, TORCH_FN(screened_argmax));
}
