// The exact argmax of a float32 LM head through a bfloat16 screen (built into the same extension as
// cpu_gemm.cpp): best (T,) = argmax_j x_t . w_j for hidden rows x (T, K) and a float32 head
// w (V, K), reading the head's bfloat16 copy (half the bytes) and a few float32 rows.
//
// Why: a greedy decoding or verification step needs only each row's argmax, and in float32 the LM
// head is the step's largest product (SmolLM2-135M: 49,152 x 576, 113 MB of the 538 MB a step
// reads). The screen s_j approximates the exact logit z_j = x . w_j, two ways:
// * `screened_argmax`: s = x . bf16(w) on the small-row kernel (float32 x, FMA chains on the
//   widened bf16 weights, float32 results). bf16 rounding moves each weight by at most u |w|
//   (u = 2^-8) and the K-term float32 sum adds at most g = K 2^-24 / (1 - K 2^-24) of the sum of
//   |terms|, so |s_j - z_j| <= (u + g (1 + u)) sum_k |x_k| |w_jk|.
// * `screened_argmax_held`: s = bf16(x) . bf16(w) through oneDNN's bfloat16 GEMM on a packed copy
//   held in cpu_gemm.cpp's table (AMX or AVX512-BF16 where the CPU has them: many rows at the cost
//   of one), float32 accumulation in any order, the result rounded to bfloat16. Both operands
//   move by at most u of themselves, the sum as above, the output by u of itself, so
//   |s_j - z_j| <= (2u + u^2 + (1 + u)^2 (g + u (1 + g))) sum_k |x_k| |w_jk|.
// * `screened_argmax_dot`: s = bf16(x) . bf16(w) through AVX512-BF16 dot products (`vdpbf16ps`,
//   where the CPU has them: 32 multiply-adds an instruction, twice the float32 FMA's) on a copy of
//   bf16(w) packed in pairs of k, float32 accumulation, a float32 result. Its error is within
//   oneDNN's bound (the same rounded operands, no output rounding), which it uses.
// With Cauchy-Schwarz (sum_k |x_k| |w_jk| <= |x| |w_j|) the bound is b_j = coef |x| |w_j| + a (1 + |w_j|),
// a = 2^-100 (K + 1) (1 + |x|) a margin far above what subnormals flushed to zero can move. With
// L = max_j (s_j - b_j), every j with s_j + b_j < L has z_j < z_k for the k attaining L; the
// candidates (s_j + b_j >= L, a few of 49,152) are recomputed in double precision from the float32
// weights, and the largest wins (the lowest index on a tie). So the result is the argmax of the
// exact logits whichever screen ran, not of the screen.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Optional.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// cpu_gemm.cpp: y (..., N) = x @ w.T against the kernel's packed copy of w (float32 x with a
// bfloat16 copy: float32 y, not rounded); and through oneDNN on the weight held at `slot`
at::Tensor packed_linear(const at::Tensor& x_in, const at::Tensor& p, int64_t N, const c10::optional<at::Tensor>& b);
int64_t gemm_prefetch_bytes(int64_t rows);  // how far ahead cpu_gemm.cpp prefetches for a call of `rows` rows
at::Tensor held_linear(const at::Tensor& x_in, const at::Tensor& slot, int64_t N, const c10::optional<at::Tensor>& b);

namespace {

void check_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wnorm, const char* op) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), op, ": x (T, K) and w (V, K)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && wnorm.scalar_type() == at::kDouble,
              op, ": float32 x and w, float64 row norms");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(wnorm.numel() == w.size(0), op, ": row norms (V,)");
}

// One row's bounds, b_j = c n_j + a: L = max_j (s_j - b_j), and each j with s_j + b_j >= L (NaN
// screens included) in turn. Vectorized where the build has AVX-512 (a 64-row screen has 3.1 M
// entries; scalar loops take longer than oneDNN's product), in double precision either way.
inline double to_double(float v) { return v; }
inline double to_double(c10::BFloat16 v) { return static_cast<float>(v); }

#if defined(__AVX512F__)
inline __m512d load8(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
inline __m512d load8(const c10::BFloat16* p) {  // bfloat16 bits are a float32's upper half: exact
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
}
#endif

// x . w in double precision (each product exact: 24 x 24 bits), the same order for every call, so
// a candidate's value does not depend on which screen found it
inline double exact_dot(const float* x, const float* w, int64_t K) {
  double d = 0.0;
  int64_t k = 0;
#if defined(__AVX512F__)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (; k + 16 <= K; k += 16) {
    a0 = _mm512_fmadd_pd(load8(x + k), load8(w + k), a0);
    a1 = _mm512_fmadd_pd(load8(x + k + 8), load8(w + k + 8), a1);
  }
  d = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#endif
  for (; k < K; ++k) d += static_cast<double>(x[k]) * w[k];
  return d;
}

template <typename S, typename F>
void candidates(const S* sr, const double* n, int64_t V, double c, double a, F&& visit) {
  double L = -std::numeric_limits<double>::infinity();
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512d cv = _mm512_set1_pd(c), av = _mm512_set1_pd(a);
  __m512d lv = _mm512_set1_pd(L);
  for (; j + 8 <= V; j += 8)  // max_pd(l, lv) keeps lv where l is NaN, as std::max(L, NaN) does
    lv = _mm512_max_pd(_mm512_sub_pd(_mm512_fnmadd_pd(cv, _mm512_loadu_pd(n + j), load8(sr + j)), av), lv);
  L = _mm512_reduce_max_pd(lv);
#endif
  for (; j < V; ++j) L = std::max(L, to_double(sr[j]) - c * n[j] - a);
  if (!std::isfinite(L) || !std::isfinite(c)) return;
  j = 0;
#if defined(__AVX512F__)
  const __m512d Lv = _mm512_set1_pd(L);
  for (; j + 8 <= V; j += 8) {
    const __m512d up = _mm512_add_pd(_mm512_fmadd_pd(cv, _mm512_loadu_pd(n + j), load8(sr + j)), av);
    for (__mmask8 m = _mm512_cmp_pd_mask(up, Lv, _CMP_NLT_UQ); m; m &= m - 1) visit(j + __builtin_ctz(m));
  }
#endif
  for (; j < V; ++j)
    if (!(to_double(sr[j]) + c * n[j] + a < L)) visit(j);
}

template <typename S>  // S: float or c10::BFloat16, the screen's type
at::Tensor select(const at::Tensor& x_in, const at::Tensor& s, const at::Tensor& w_in, const at::Tensor& wnorm_in,
                  double coef) {
  // x (T, K), the screen s (T, V), w (V, K), wnorm (V,) -> (T,) int64: the exact argmax per row
  // among the candidates of b_j (see the top); -1 for a row whose screen or norm is not finite
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous(), wnorm = wnorm_in.contiguous();
  const int64_t T_ = x.size(0), K = x.size(1), V = w.size(0);
  at::Tensor best = at::empty({T_}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const S* sp = s.data_ptr<S>();
  const double* np_ = wnorm.data_ptr<double>();
  int64_t* bp = best.data_ptr<int64_t>();
  at::parallel_for(0, T_, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = xp + t * K;
      double xx = 0.0;
      for (int64_t k = 0; k < K; ++k) xx += static_cast<double>(xr[k]) * xr[k];
      const double xn = std::sqrt(xx);
      const double a = std::ldexp(1.0, -100) * (K + 1) * (1.0 + xn);
      int64_t arg = -1;
      double top = -std::numeric_limits<double>::infinity();
      candidates(sp + t * V, np_, V, coef * xn, a, [&](int64_t j) {
        const double d = exact_dot(xr, wp + j * K, K);
        if (arg < 0 || d > top) top = d, arg = j;
      });
      bp[t] = arg;
    }
  });
  return best;
}

double screen_coef(int64_t K, bool held) {
  // coef of the bound b_j = coef |x| |w_j| + a (see the top) for a K-term screen: the kernel's
  // (held = false) or oneDNN's (held = true); 1e-9 more covers the double arithmetic of the test
  const double u = std::ldexp(1.0, -8), e32 = std::ldexp(1.0, -24);  // bfloat16's, float32's unit roundoff
  const double g = K * e32 / (1.0 - K * e32);  // a K-term float32 sum's error, of the sum of |terms|
  const double coef = held ? 2 * u + u * u + (1 + u) * (1 + u) * (g + u * (1 + g)) : u + g * (1 + u);
  return coef * (1.0 + 1e-9);
}

at::Tensor screened_argmax(const at::Tensor& x, const at::Tensor& p, const at::Tensor& w, const at::Tensor& wnorm) {
  // x (T, K) float32, p = pack(bf16(w)), w (V, K) float32, wnorm (V,) float64 row norms of w
  // -> (T,) int64; -1 for a row whose screen is not finite (the caller computes those in full)
  check_args(x, w, wnorm, "screened_argmax");
  TORCH_CHECK(p.scalar_type() == at::kBFloat16 && p.dim() == 3 && p.size(1) == x.size(1),
              "screened_argmax: p, the packed bfloat16 copy of w");
  const at::Tensor s = packed_linear(x.contiguous(), p, w.size(0), c10::nullopt);  // (T, V) float32
  return select<float>(x, s, w, wnorm, screen_coef(x.size(1), false));
}

at::Tensor screened_argmax_held(const at::Tensor& x, const at::Tensor& slot, const at::Tensor& w,
                                const at::Tensor& wnorm) {
  // as screened_argmax, the screen from oneDNN's packed copy of bf16(w) held at slot[0]
  check_args(x, w, wnorm, "screened_argmax_held");
  const at::Tensor s = held_linear(x.to(at::kBFloat16), slot, w.size(0), c10::nullopt);  // (T, V) bfloat16
  TORCH_CHECK(s.scalar_type() == at::kBFloat16 && s.size(0) == x.size(0), "screened_argmax_held: a bfloat16 screen");
  return select<c10::BFloat16>(x, s.contiguous(), w, wnorm, screen_coef(x.size(1), true));
}

// The screen through AVX512-BF16 dot products. Copy: (blocks, ceil(K/2), 32) bfloat16, line (b, kk)
// holds w[16b + j][2kk + h] at 2j + h (one 64-byte line per pair of k; zeros pad N and an odd K).
// Rows: rounded to bfloat16 (nearest, ties to even), a group of at most 16 rows at a time in a
// panel (ceil(K/2), rows) of 32-bit pairs (x[2kk], x[2kk+1]), broadcast to every lane; lane j of a
// row's accumulator gathers output 16b + j (vdpbf16ps: lane j += w[j][2kk] x[2kk] + w[j][2kk+1] x[2kk+1]).
constexpr int64_t DOT_MT = 16;  // rows per tile: 16 accumulators

bool dot_supported() {
#if defined(__AVX512F__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

#if defined(__AVX512F__) && defined(__GNUC__)
#define EAGLE_DOT_TARGET __attribute__((target("avx512f,avx512bf16")))
template <int MT>
EAGLE_DOT_TARGET void dot_tile(const int32_t* __restrict xp, const uint16_t* __restrict p, int64_t K2,
                               float* __restrict y, int64_t ldy, int64_t n, int64_t N, int64_t pf) {
  // xp: the group's panel (K2, MT) of bf16 pairs; p: one block, K2 lines of 32 bf16; y: MT rows
  // (stride ldy), outputs n .. n + 16 (those < N written); pf: prefetch distance in lines
  __m512 acc[MT];
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < K2; ++kk) {
    _mm_prefetch(reinterpret_cast<const char*>(p + (kk + pf) * 32), _MM_HINT_T1);
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(p + kk * 32);
    const int32_t* xk = xp + kk * MT;
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], wv, (__m512bh)_mm512_set1_epi32(xk[i]));
  }
  const __mmask16 mask = N - n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n)) - 1u);
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) _mm512_mask_storeu_ps(y + i * ldy + n, mask, acc[i]);
}

EAGLE_DOT_TARGET void dot_rows(int64_t rows, const int32_t* xp, const uint16_t* p, int64_t K2, float* y, int64_t ldy,
                               int64_t n, int64_t N, int64_t pf) {
  switch (rows) {
#define CASE(R) case R: dot_tile<R>(xp, p, K2, y, ldy, n, N, pf); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#undef CASE
    default: TORCH_CHECK(false, "screened_argmax_dot: tile rows out of range");
  }
}
#endif

at::Tensor dot_screen(const at::Tensor& x_in, const at::Tensor& pp, int64_t V) {
  // x (T, K) float32, pp the pair-packed bf16 copy (blocks, ceil(K/2), 32) -> s (T, V) float32
  TORCH_CHECK(dot_supported(), "screened_argmax_dot: this CPU has no AVX512-BF16 (or the build no AVX-512)");
  const at::Tensor x = x_in.contiguous();
  const int64_t T_ = x.size(0), K = x.size(1), K2 = (K + 1) / 2, blocks = pp.size(0);
  TORCH_CHECK(pp.scalar_type() == at::kBFloat16 && pp.dim() == 3 && pp.size(1) == K2 && pp.size(2) == 32 &&
              pp.is_contiguous() && V > (blocks - 1) * 16 && V <= blocks * 16,
              "screened_argmax_dot: the pair-packed bfloat16 copy (ceil(V/16), ceil(K/2), 32) of w");
  at::Tensor s = at::empty({T_, V}, x.options());
  if (T_ == 0) return s;
#if defined(__AVX512F__) && defined(__GNUC__)
  const int64_t groups = (T_ + DOT_MT - 1) / DOT_MT;
  std::vector<int64_t> starts(groups + 1);  // group g: rows starts[g] .. starts[g + 1] - 1, sizes within one
  for (int64_t g = 0; g <= groups; ++g) starts[g] = g * (T_ / groups) + std::min(g, T_ % groups);
  std::vector<int32_t> panel(K2 * T_);  // group g's panel (K2, its rows) at starts[g] * K2
  const float* xp = x.data_ptr<float>();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m0 = starts[g], rows = starts[g + 1] - m0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t kk = 0; kk < K2; ++kk) {
        const uint16_t lo = c10::BFloat16(xp[(m0 + i) * K + 2 * kk]).x;  // nearest, ties to even
        const uint16_t hi = 2 * kk + 1 < K ? c10::BFloat16(xp[(m0 + i) * K + 2 * kk + 1]).x : uint16_t{0};
        panel[m0 * K2 + kk * rows + i] = static_cast<int32_t>(static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16));
      }
  }
  const uint16_t* p = reinterpret_cast<const uint16_t*>(pp.data_ptr<at::BFloat16>());
  float* y = s.data_ptr<float>();
  const int64_t pf = gemm_prefetch_bytes(T_) / 64;  // lines of 64 bytes
  at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t g = 0; g < groups; ++g)
        dot_rows(starts[g + 1] - starts[g], panel.data() + starts[g] * K2, p + b * K2 * 32, K2, y + starts[g] * V, V,
                 b * 16, V, pf);
  });
#endif
  return s;
}

at::Tensor screened_argmax_dot(const at::Tensor& x, const at::Tensor& pp, const at::Tensor& w, const at::Tensor& wnorm) {
  // as screened_argmax, the screen from AVX512-BF16 dot products on the pair-packed copy pp of bf16(w)
  check_args(x, w, wnorm, "screened_argmax_dot");
  const at::Tensor s = dot_screen(x, pp, w.size(0));  // (T, V) float32
  return select<float>(x, s, w, wnorm, screen_coef(x.size(1), true));
}

}  // namespace

#define EAGLE_ARGMAX_LIBRARY(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)  // expands TORCH_EXTENSION_NAME first
EAGLE_ARGMAX_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("screened_argmax(Tensor x, Tensor p, Tensor w, Tensor wnorm) -> Tensor");
  m.impl("screened_argmax", c10::DispatchKey::CPU, TORCH_FN(screened_argmax));
  m.def("screened_argmax_held(Tensor x, Tensor slot, Tensor w, Tensor wnorm) -> Tensor");
  m.impl("screened_argmax_held", c10::DispatchKey::CPU, TORCH_FN(screened_argmax_held));
  m.def("screened_argmax_dot(Tensor x, Tensor pp, Tensor w, Tensor wnorm) -> Tensor");
  m.impl("screened_argmax_dot", c10::DispatchKey::CPU, TORCH_FN(screened_argmax_dot));
  m.def("screen_dot(Tensor x, Tensor pp, int V) -> Tensor");  // the dot screen alone (tests of the bound)
  m.impl("screen_dot", c10::DispatchKey::CPU, TORCH_FN(dot_screen));
  m.def("screen_dot_supported() -> bool", dot_supported);
  m.def("screen_coef(int K, bool held) -> float", screen_coef);  // for the tests of the bound
}
