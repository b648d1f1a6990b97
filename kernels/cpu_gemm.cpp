// Small-row float32 linear layer for x86 CPUs with AVX-512: y (M, N) = x (M, K) @ w (N, K)^T + b.
//
// Why: a decoding step multiplies 1-32 rows by every weight. MKL's GEMM streams the weights at
// 11-16 GB/s there (a third of the memory's speed on the 2-core machines this project runs on);
// this loop streams each weight once, row-major, at the memory's speed, and keeps the few x rows
// in L1. Tile: 4 weight rows x up to 4 x rows = 16 zmm accumulators, each a 16-lane partial sum
// over K, reduced at the end; the next tile's weight rows are prefetched while one is multiplied. Every output y[m, n] is computed by the same instruction sequence
// whatever M is, so a row's result does not depend on which other rows share the call.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int NB = 4;  // weight rows per tile
constexpr int MB = 4;  // x rows per tile (at most)

template <int MT, int NT>
inline void tile(const float* __restrict x, const float* __restrict w, float* __restrict y,
                 const float* __restrict bias, int64_t K, int64_t N) {
  // x: MT rows of K (stride K); w: NT rows of K (stride K); y: MT rows (stride N), NT outputs each
  __m512 acc[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) {
      // the next tile's rows, one tile ahead: the hardware prefetcher alone left 4-16-row calls
      // waiting on memory (`python kernels/bench_cpu_gemm.py --prefetch-ab`; prefetches never fault)
#ifndef CPU_GEMM_NO_PREFETCH  // defined only by kernels/bench_cpu_gemm.py --prefetch-ab, for the A/B
      _mm_prefetch(reinterpret_cast<const char*>(w + (j + NT) * K + k), _MM_HINT_T0);
#endif
      wv[j] = _mm512_loadu_ps(w + j * K + k);
    }
    for (int i = 0; i < MT; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * K + k);
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
    }
  }
  if (k < K) {  // the K % 16 tail, with masked loads (zeros beyond K)
    const __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = _mm512_maskz_loadu_ps(mask, w + j * K + k);
    for (int i = 0; i < MT; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * K + k);
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j)
      y[i * N + j] = _mm512_reduce_add_ps(acc[i][j]) + (bias ? bias[j] : 0.0f);
}

template <int NT>
inline void rows_tile(const float* x, const float* w, float* y, const float* bias, int64_t M, int64_t K,
                      int64_t N) {
  for (int64_t m = 0; m < M; m += MB) {
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (std::min<int64_t>(MB, M - m)) {
      case 4: tile<4, NT>(xm, w, ym, bias, K, N); break;
      case 3: tile<3, NT>(xm, w, ym, bias, K, N); break;
      case 2: tile<2, NT>(xm, w, ym, bias, K, N); break;
      default: tile<1, NT>(xm, w, ym, bias, K, N);
    }
  }
}


}  // namespace

torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_linear: x (M, K) and w (N, K)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "small_linear: float32 only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "small_linear: contiguous x and w");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const float* bias = nullptr;
  if (b.has_value() && b->defined()) {
    TORCH_CHECK(b->scalar_type() == at::kFloat && b->is_contiguous() && b->numel() == N, "small_linear: bias (N,)");
    bias = b->data_ptr<float>();
  }
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t tiles = N / NB;
  // ~64 KB of weights per task at least: enough work per thread hand-off
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, NB * K));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t * NB;
      rows_tile<NB>(xp, wp + n * K, yp + n, bias ? bias + n : nullptr, M, K, N);
    }
  });
  for (int64_t n = tiles * NB; n < N; ++n)  // the N % 4 tail, one weight row at a time
    rows_tile<1>(xp, wp + n * K, yp + n, bias ? bias + n : nullptr, M, K, N);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "y = x @ w.T + b for few rows (float32, AVX-512)");
}
