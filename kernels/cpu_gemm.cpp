// Small-row float32 linear layer for x86 CPUs with AVX-512 or AVX2 + FMA: y (M, N) = x (M, K) @ w (N, K)^T + b,
// against a packed copy of w made once (`pack`). bfloat16 weights and x take the same float32 FMA
// chain on their widened (exact) values, the weights streamed at half the bytes, and y is rounded to
// bfloat16 once at the end.
//
// Why: a decoding step multiplies 1-32 rows by every weight, and MKL's GEMM streams the weights at
// a fraction of the memory's speed at those row counts; this loop streams each weight once at the
// memory's speed and keeps the few x rows in L1/L2 (docs/cpu-backend.md, small-row-gemm).
//
// Layout: the packed weight is (ceil(N/16), K, 16): block b holds outputs 16b..16b+15, and for each
// k their 16 weights side by side (one cache line), so a block is one sequential stream. The rows
// of x are transposed, a group of at most MT rows at a time, to (K, rows) so that step k reads the
// group's values x[m, k] from one line.
// Tile: one block x MT rows; step k loads the block's weight line and multiplies it by every row's
// x[m, k], broadcast. AVX-512 (built with -mavx512f): one zmm accumulator per row, MT <= 16, the
// broadcast embedded in the FMA (wider tiles of several blocks, for more accumulators at few rows:
// `tile_nb`, its width measured per machine; docs/cpu-backend.md, gemm-wide-tiles). AVX2 (built
// with -mavx2 -mfma, for CPUs without AVX-512): the line
// is two ymm halves, two accumulators per row and an explicit broadcast, so 16 registers hold at
// most MT = 6 rows (2 x 6 accumulators + 2 weight halves + 1 broadcast); more rows take several
// passes over the block, the later ones from L1/L2. Nothing is reduced across lanes: lane j of an
// accumulator is output n = 16b + j (+ 8 for the upper ymm half), summed over k in order.
// So every output y[m, n] is the same chain of FMAs whatever M, the tiling and the ISA are: a
// row's result does not depend on which other rows share the call (bitwise), and the AVX2 build
// gives the AVX-512 build's results bit for bit. The weights are prefetched
// PREFETCH_BYTES (4 KB) ahead: with 16 rows of arithmetic per line, the hardware prefetcher
// alone falls behind the memory (docs/cpu-backend.md, gemm-prefetch).
// Only the headers it uses, not <torch/extension.h>: a much shorter build, which runs once per
// machine, on the first `make demo` (docs/cpu-backend.md, build-headers)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace {

constexpr int64_t LANES = 16;  // outputs per block (one cache line of float32)
// How far ahead in a block's stream, and into which cache: by default 4 KB (64 steps of float32
// lines) into L2 (docs/cpu-backend.md, gemm-prefetch). The distance is a setting, one for calls of
// up to 8 rows and one for more (`set_prefetch_bytes`), measured per machine by cpu_gemm.py: with
// 16 rows of arithmetic per line (8 FMA cycles) the distance that keeps up with the memory differs
// by machine (docs/cpu-backend.md, gemm-plan).
// The CPU_GEMM_* switches below exist for `kernels/bench_cpu_gemm.py --variants` only (builds of
// this source with other settings, timed side by side); the library never defines them.
#ifndef CPU_GEMM_PREFETCH_BYTES
#define CPU_GEMM_PREFETCH_BYTES 4096
#endif
int64_t prefetch_few_setting = CPU_GEMM_PREFETCH_BYTES;   // calls of up to 8 rows
int64_t prefetch_many_setting = CPU_GEMM_PREFETCH_BYTES;  // calls of more rows

template <typename W>  // W: float, or uint16_t for bfloat16 weights (half a line per step)
inline void prefetch_line(const W* p, int64_t k, int64_t steps) {
  // steps: how many lines ahead of line k (the call's prefetch distance in lines of W)
#ifndef CPU_GEMM_NO_PREFETCH  // defined only by kernels/bench_cpu_gemm.py --prefetch-ab, for the A/B
#ifdef CPU_GEMM_PREFETCH_EVEN  // every other line only (its neighbour left to the adjacent-line prefetcher)
  if (k & 1) return;
#endif
#ifdef CPU_GEMM_PREFETCH_T0  // into L1 instead of L2
  _mm_prefetch(reinterpret_cast<const char*>(p + (k + steps) * LANES), _MM_HINT_T0);
#else
  _mm_prefetch(reinterpret_cast<const char*>(p + (k + steps) * LANES), _MM_HINT_T1);
#endif
#endif
}

#if defined(__AVX512F__)
constexpr int64_t MAX_MT = 16;  // rows per tile, at most
constexpr const char* ISA = "avx512";

// a step's 16 weights as float32: loaded, or bfloat16 widened (its bits are a float32's upper half,
// so the value is exact and the FMA chain is the float32 one)
inline __m512 load_w(const float* p) { return _mm512_load_ps(p); }
inline __m512 load_w(const uint16_t* p) {
  const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int MT, typename W>
inline void tile(const float* __restrict xt, int64_t ldx, const W* __restrict p, int64_t K,
                 float* __restrict y, int64_t ldy, int64_t n, int64_t N, const float* __restrict bias, int64_t pf) {
  // xt: (K, ldx) transposed rows, this tile's MT rows from column 0; p: one block (K, 16);
  // y: MT rows (stride ldy), outputs n .. n + 16 (those < N written); pf: prefetch distance, lines
  __m512 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    prefetch_line(p, k, pf);
    const __m512 wv = load_w(p + k * LANES);
    const float* xk = xt + k * ldx;
    for (int i = 0; i < MT; ++i) acc[i] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xk[i]), acc[i]);
  }
  const __mmask16 mask = N - n >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n)) - 1u);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
  for (int i = 0; i < MT; ++i) _mm512_mask_storeu_ps(y + i * ldy + n, mask, _mm512_add_ps(acc[i], b));
}

// NB adjacent blocks (outputs n .. n + 16 NB - 1) x MT rows: each broadcast x[m, k] feeds NB FMAs
// and NB weight streams run at once. The blocks but the last are full (the last may be the
// weight's partial last block); the same FMA chain per output as `tile` (more rows:
// `unit_in_turns`). Wider tiles are faster on some machines and slower at 1 row on others, so the
// width for calls of up to 8 rows is measured once per machine (cpu_gemm.py, `_choose_plan`;
// docs/cpu-backend.md, gemm-wide-tiles).
template <int NB, int MT, typename W>
inline void tile_nb(const float* __restrict xt, int64_t ldx, const W* __restrict p, int64_t K,
                    float* __restrict y, int64_t ldy, int64_t n, int64_t N, const float* __restrict bias,
                    int64_t pf) {
  __m512 acc[NB][MT];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) acc[j][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      prefetch_line(p + j * K * LANES, k, pf);
      w[j] = load_w(p + j * K * LANES + k * LANES);
    }
    const float* xk = xt + k * ldx;
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
      const __m512 xb = _mm512_set1_ps(xk[i]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[j][i] = _mm512_fmadd_ps(w[j], xb, acc[j][i]);
    }
  }
  const int64_t last = n + (NB - 1) * LANES;  // the last block's first output
  const __mmask16 mask = N - last >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - last)) - 1u);
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const __mmask16 mj = j == NB - 1 ? mask : (__mmask16)0xFFFF;
    const __m512 bj = bias ? _mm512_maskz_loadu_ps(mj, bias + n + j * LANES) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) _mm512_mask_storeu_ps(y + i * ldy + n + j * LANES, mj, _mm512_add_ps(acc[j][i], bj));
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t MAX_MT = 6;  // rows per tile, at most: 2 x 6 accumulators + 3 of the 16 ymm registers
constexpr const char* ISA = "avx2";

inline __m256i first_lanes(int64_t count) {  // lanes 0 .. count-1 set (count clamped to 0..8)
  const int64_t c = std::min<int64_t>(8, std::max<int64_t>(0, count));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline void load_w(const float* p, __m256& w0, __m256& w1) {
  w0 = _mm256_load_ps(p);
  w1 = _mm256_load_ps(p + 8);
}
inline void load_w(const uint16_t* p, __m256& w0, __m256& w1) {  // bfloat16 widened, as in the AVX-512 form
  const __m128i h0 = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i h1 = _mm_load_si128(reinterpret_cast<const __m128i*>(p + 8));
  w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
  w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
}

template <int MT, typename W>
inline void tile(const float* __restrict xt, int64_t ldx, const W* __restrict p, int64_t K,
                 float* __restrict y, int64_t ldy, int64_t n, int64_t N, const float* __restrict bias, int64_t pf) {
  // as the AVX-512 tile; lo/hi: outputs n .. n + 7 and n + 8 .. n + 15 of each row. The unroll
  // pragmas keep the accumulators in registers: without them GCC also stores every accumulator to
  // the stack on each k step (docs/cpu-backend.md, avx2-unroll).
  __m256 lo[MT], hi[MT];
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) {
    lo[i] = _mm256_setzero_ps();
    hi[i] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    prefetch_line(p, k, pf);
    __m256 w0, w1;
    load_w(p + k * LANES, w0, w1);
    const float* xk = xt + k * ldx;
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
      const __m256 xb = _mm256_broadcast_ss(xk + i);
      lo[i] = _mm256_fmadd_ps(w0, xb, lo[i]);
      hi[i] = _mm256_fmadd_ps(w1, xb, hi[i]);
    }
  }
  const __m256i m0 = first_lanes(N - n), m1 = first_lanes(N - n - 8);
  const __m256 b0 = bias ? _mm256_maskload_ps(bias + n, m0) : _mm256_setzero_ps();
  const __m256 b1 = bias ? _mm256_maskload_ps(bias + n + 8, m1) : _mm256_setzero_ps();
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) {
    _mm256_maskstore_ps(y + i * ldy + n, m0, _mm256_add_ps(lo[i], b0));
    _mm256_maskstore_ps(y + i * ldy + n + 8, m1, _mm256_add_ps(hi[i], b1));
  }
}
#else
#error "cpu_gemm.cpp needs AVX-512F or AVX2 + FMA (build with -mavx512f or -mavx2 -mfma)"
#endif

template <typename W>
void rows_tile(int64_t rows, const float* xt, int64_t ldx, const W* p, int64_t K, float* y, int64_t ldy,
               int64_t n, int64_t N, const float* bias, int64_t pf) {
  switch (rows) {
#define CASE(R) case R: tile<R, W>(xt, ldx, p, K, y, ldy, n, N, bias, pf); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#if defined(__AVX512F__)
    CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#endif
#undef CASE
    default: TORCH_CHECK(false, "cpu_gemm: tile rows out of range");
  }
}

#if defined(__AVX512F__)
constexpr int64_t WIDE_MAX_MT = 8;  // rows per wide tile, at most: 3 x 8 accumulators + 3 weight lines of 32 zmm
template <typename W>
void rows_tile_wide(int64_t nb, int64_t rows, const float* xt, int64_t ldx, const W* p, int64_t K, float* y,
                    int64_t ldy, int64_t n, int64_t N, const float* bias, int64_t pf) {
  switch (nb * 16 + rows) {
#define CASE(NB, R) case NB * 16 + R: tile_nb<NB, R, W>(xt, ldx, p, K, y, ldy, n, N, bias, pf); break;
    CASE(2, 1) CASE(2, 2) CASE(2, 3) CASE(2, 4) CASE(2, 5) CASE(2, 6) CASE(2, 7) CASE(2, 8)
    CASE(3, 1) CASE(3, 2) CASE(3, 3) CASE(3, 4) CASE(3, 5) CASE(3, 6) CASE(3, 7) CASE(3, 8)
#undef CASE
    default: TORCH_CHECK(false, "cpu_gemm: wide tile out of range");
  }
}
constexpr int64_t MAX_TILE_BLOCKS = 3;

// Calls of more than 8 rows: one unit of NB adjacent blocks serves every row group (of at most 8
// rows) in turns of CHUNK_K k-steps: group 0 streams the unit's next CHUNK_K weight lines from
// memory (prefetched), the later groups take the same lines from L1, and each group's NB x MT
// accumulators wait in a buffer between turns. So the weights are read from memory once at any row
// count, with 3 x 8 accumulators per turn (24 FMAs per 3 weight loads and 8 broadcasts), where one
// block x 16 rows made 16 FMAs per 17 loads. Each output is still the same FMA chain over k in
// order (the buffer holds it between turns), so the results are bitwise those of `tile`.
#ifndef CPU_GEMM_CHUNK_K
#define CPU_GEMM_CHUNK_K 16
#endif
constexpr int64_t CHUNK_K = CPU_GEMM_CHUNK_K;

template <int NB, int MT, typename W>
inline void tile_turn(const float* __restrict xt, const W* __restrict p, int64_t K, int64_t k0, int64_t k1,
                      __m512* __restrict acc_io, bool first, bool prefetch, int64_t pf) {
  // xt: the group's panel (K, MT); p: the unit's first block (NB blocks of (K, 16), adjacent);
  // acc_io: NB x MT accumulators, read unless `first`, written back
  __m512 acc[NB][MT];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) acc[j][i] = first ? _mm512_setzero_ps() : acc_io[j * MT + i];
  for (int64_t k = k0; k < k1; ++k) {
    __m512 w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if (prefetch) prefetch_line(p + j * K * LANES, k, pf);
      w[j] = load_w(p + j * K * LANES + k * LANES);
    }
    const float* xk = xt + k * MT;
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
      const __m512 xb = _mm512_set1_ps(xk[i]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[j][i] = _mm512_fmadd_ps(w[j], xb, acc[j][i]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) acc_io[j * MT + i] = acc[j][i];
}

template <typename W>
void rows_turn(int64_t nb, int64_t rows, const float* xt, const W* p, int64_t K, int64_t k0, int64_t k1,
               __m512* acc, bool first, bool prefetch, int64_t pf) {
  switch (nb * 16 + rows) {
#define CASE(NB, R) case NB * 16 + R: tile_turn<NB, R, W>(xt, p, K, k0, k1, acc, first, prefetch, pf); break;
    CASE(1, 1) CASE(1, 2) CASE(1, 3) CASE(1, 4) CASE(1, 5) CASE(1, 6) CASE(1, 7) CASE(1, 8)
    CASE(2, 1) CASE(2, 2) CASE(2, 3) CASE(2, 4) CASE(2, 5) CASE(2, 6) CASE(2, 7) CASE(2, 8)
    CASE(3, 1) CASE(3, 2) CASE(3, 3) CASE(3, 4) CASE(3, 5) CASE(3, 6) CASE(3, 7) CASE(3, 8)
#undef CASE
    default: TORCH_CHECK(false, "cpu_gemm: turn tile out of range");
  }
}

// y rows m .. m + rows - 1, outputs n .. n + 16 nb - 1 (those < N) = acc (nb x rows) + bias
inline void store_turns(const __m512* acc, int64_t nb, int64_t rows, float* y, int64_t ldy, int64_t n, int64_t N,
                        const float* bias) {
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t first = n + j * LANES;
    const __mmask16 mj = N - first >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - first)) - 1u);
    const __m512 bj = bias ? _mm512_maskz_loadu_ps(mj, bias + first) : _mm512_setzero_ps();
    for (int64_t i = 0; i < rows; ++i) _mm512_mask_storeu_ps(y + i * ldy + first, mj, _mm512_add_ps(acc[j * rows + i], bj));
  }
}

template <typename W>
void unit_in_turns(int64_t nb, int64_t groups, const int64_t* starts, const float* xt, const W* p, int64_t K,
                   float* y, int64_t ldy, int64_t n, int64_t N, const float* bias, __m512* acc, int64_t pf) {
  // one unit of nb blocks (first output n) x every row group g (rows starts[g] .. starts[g + 1] - 1,
  // panel xt + starts[g] * K); acc: room for groups x nb x 8 accumulators
  for (int64_t k0 = 0; k0 < K; k0 += CHUNK_K) {
    const int64_t k1 = std::min(K, k0 + CHUNK_K);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rows = starts[g + 1] - starts[g];
#ifdef CPU_GEMM_PREFETCH_EVERY_GROUP  // every group's turn prefetches (the same lines again), not group 0's only
      const bool prefetch = true;
#else
      const bool prefetch = g == 0;
#endif
      rows_turn(nb, rows, xt + starts[g] * K, p, K, k0, k1, acc + g * nb * WIDE_MAX_MT, k0 == 0, prefetch, pf);
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    store_turns(acc + g * nb * WIDE_MAX_MT, nb, starts[g + 1] - starts[g], y + starts[g] * ldy, ldy, n, N, bias);
}
constexpr bool TURNS = true;
using Acc = __m512;  // an accumulator waiting between turns
#else
constexpr int64_t WIDE_MAX_MT = MAX_MT, MAX_TILE_BLOCKS = 1;  // AVX2: no register room for wide tiles
template <typename W>
void rows_tile_wide(int64_t, int64_t, const float*, int64_t, const W*, int64_t, float*, int64_t, int64_t, int64_t,
                    const float*, int64_t) {}
constexpr bool TURNS = false;  // AVX2: more rows take passes over one block (see `tile`)
using Acc = float;  // unused: no turns
template <typename W>
void unit_in_turns(int64_t, int64_t, const int64_t*, const float*, const W*, int64_t, float*, int64_t, int64_t, int64_t,
                   const float*, Acc*, int64_t) {}
#endif
// blocks per tile for calls of at most WIDE_ROWS rows (more rows: units of MAX_TILE_BLOCKS blocks
// in turns, `unit_in_turns`); set by cpu_gemm.py when the extension loads, to the width a
// measurement found fastest on this machine
int64_t tile_blocks_setting = 1;
constexpr int64_t WIDE_ROWS = 8;
// calls of more than 8 rows (AVX-512): units of 3 blocks in turns (true), or one block x at most 16
// rows per tile (false; more rows take passes over the block, the later ones from L1/L2); set by
// cpu_gemm.py to what a measurement found faster on this machine (the same bits either way)
bool turns_setting = true;
}  // namespace

// the prefetch distance, in bytes, of a call of `rows` rows (set per machine by cpu_gemm.py); also
// for cpu_argmax.cpp's dot-product screen
int64_t gemm_prefetch_bytes(int64_t rows) { return rows > WIDE_ROWS ? prefetch_many_setting : prefetch_few_setting; }

at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack: a float32 or bfloat16 weight (N, K)");
  const int64_t N = w.size(0), K = w.size(1), blocks = (N + LANES - 1) / LANES;
  auto padded = at::zeros({blocks * LANES, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({blocks, LANES, K}).transpose(1, 2).contiguous();  // (blocks, K, 16)
}

at::Tensor packed_linear(const at::Tensor& x_in, const at::Tensor& p, int64_t N,
                         const c10::optional<at::Tensor>& b) {
  // x_in (..., K), any strides -> y (..., N); the leading dimensions are flattened here rather than
  // by the caller (each tensor call from Python costs microseconds, and a step makes 211 of these)
  TORCH_CHECK(x_in.dim() >= 1 && p.dim() == 3 && p.size(2) == LANES && x_in.size(-1) == p.size(1),
              "packed_linear: x (..., K) and a packed weight (blocks, K, 16)");
  const bool bf16 = p.scalar_type() == at::kBFloat16;  // bfloat16 weights; float32 arithmetic
  // float32 x with bfloat16 weights: a float32 y, not rounded (the screen of kernels/cpu_argmax.py, whose
  // error bound counts only the weights' rounding)
  const bool mixed = bf16 && x_in.scalar_type() == at::kFloat;
  TORCH_CHECK((x_in.scalar_type() == at::kFloat && p.scalar_type() == at::kFloat) ||
              (x_in.scalar_type() == at::kBFloat16 && bf16) || mixed,
              "packed_linear: float32 or bfloat16 x and weight, alike, or float32 x with bfloat16 weights");
  TORCH_CHECK(x_in.device().is_cpu() && p.device().is_cpu(), "packed_linear: CPU tensors only");
  TORCH_CHECK(p.is_contiguous() && N > (p.size(0) - 1) * LANES && N <= p.size(0) * LANES,
              "packed_linear: N does not match the packed weight");
  const auto x = x_in.reshape({-1, x_in.size(-1)});  // (M, K)
  const int64_t M = x.size(0), K = x.size(1), blocks = p.size(0);
  std::vector<int64_t> out_shape = x_in.sizes().vec();
  out_shape.back() = N;
  const float* bias = nullptr;
  at::Tensor bc;
  if (b.has_value() && b->defined()) {
    TORCH_CHECK(b->scalar_type() == x_in.scalar_type() && b->numel() == N, "packed_linear: bias (N,), as x");
    bc = b->to(at::kFloat).contiguous();  // bfloat16: widened (exact)
    bias = bc.data_ptr<float>();
  }
  auto y = at::empty({M, N}, x.options().dtype(at::kFloat));  // bfloat16: rounded once, at the end
  if (M == 0) return y.to(x_in.scalar_type()).view(out_shape);
  // Rows in groups of at most MAX_MT (or 8 for wide tiles), as even as possible (sizes differ by at
  // most one; a group re-reads the block from L1/L2); each group's rows transposed into a panel of
  // their own, (K, rows in the group), so that a step reads them from one line (docs/cpu-backend.md,
  // gemm-group-panels).
  // More than 8 rows (AVX-512): units of 3 blocks serve all groups in turns of CHUNK_K k-steps
  // (`unit_in_turns`; docs/cpu-backend.md, gemm-turns).
  const bool turns = TURNS && turns_setting && M > WIDE_ROWS;
  const int64_t nb = std::min(turns ? MAX_TILE_BLOCKS : M <= WIDE_ROWS ? tile_blocks_setting : int64_t{1}, blocks);
  const int64_t max_mt = nb > 1 || turns ? WIDE_MAX_MT : MAX_MT;
  const int64_t groups = (M + max_mt - 1) / max_mt;
  std::vector<int64_t> starts(groups + 1);  // group g: rows starts[g] .. starts[g + 1] - 1
  for (int64_t g = 0; g <= groups; ++g) starts[g] = g * (M / groups) + std::min(g, M % groups);
  std::vector<float> xt_buf(K * M);  // group g's panel (K, its rows) at starts[g] * K
  auto fill_panels = [&](auto xa) {  // bfloat16 x widened to float32 (exact)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t m0 = starts[g], rows = starts[g + 1] - m0;
      float* panel = xt_buf.data() + m0 * K;  // (K, rows)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < K; ++k) panel[k * rows + i] = static_cast<float>(xa[m0 + i][k]);
    }
  };
  if (bf16 && !mixed)
    fill_panels(x.accessor<at::BFloat16, 2>());
  else
    fill_panels(x.accessor<float, 2>());
  const float* xt = xt_buf.data();
  float* yp = y.data_ptr<float>();
  // ~64 KB of float32 weights per task at least: enough work per thread hand-off
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, LANES * K));
  // work units of nb adjacent blocks (the last unit may hold fewer)
  const int64_t units = (blocks + nb - 1) / nb;
  // the prefetch distance in lines of this weight type (bfloat16 lines are half as long)
  const int64_t pf_bytes = gemm_prefetch_bytes(M);
  auto run = [&](const auto* pp) {
    const int64_t pf = pf_bytes / (LANES * static_cast<int64_t>(sizeof(*pp)));
    at::parallel_for(0, units, std::max<int64_t>(1, grain / nb), [&](int64_t u0, int64_t u1) {
      std::vector<Acc> acc(turns ? groups * nb * WIDE_MAX_MT : 0);  // accumulators between turns
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t blk = u * nb, width = std::min(nb, blocks - blk);
        if (turns) {
          unit_in_turns(width, groups, starts.data(), xt, pp + blk * K * LANES, K, yp, N, blk * LANES, N, bias, acc.data(), pf);
          continue;
        }
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t m = starts[g], rows = starts[g + 1] - m;
          if (width > 1)
            rows_tile_wide(width, rows, xt + m * K, rows, pp + blk * K * LANES, K, yp + m * N, N, blk * LANES, N, bias, pf);
          else
            rows_tile(rows, xt + m * K, rows, pp + blk * K * LANES, K, yp + m * N, N, blk * LANES, N, bias, pf);
        }
      }
    });
  };
  if (bf16) {
    run(reinterpret_cast<const uint16_t*>(p.data_ptr<at::BFloat16>()));
    if (mixed) return y.view(out_shape);
    return y.to(at::kBFloat16).view(out_shape);  // rounded to nearest, ties to even
  }
  run(p.data_ptr<float>());
  return y.view(out_shape);
}

// Held weights: oneDNN's packed bfloat16 copies (torch.ops.mkldnn._reorder_linear_weight) are
// MKLDNN-layout tensors, which a compiled graph cannot take as inputs. A process-wide table holds
// them instead, and a graph passes the slot number as a one-element int64 tensor (a buffer of the
// layer), so one graph still serves every decoder layer. `held_linear` runs oneDNN's
// mkldnn::_linear_pointwise on the held copy, through the dispatcher (what inductor's own
// weight-prepacking pass emits, with the copy as a graph constant instead).
namespace {
std::mutex held_mutex;
std::vector<at::Tensor> held_weights;  // slot -> packed weight (undefined: free)
}  // namespace

int64_t hold(const at::Tensor& w) {
  std::lock_guard<std::mutex> guard(held_mutex);
  for (size_t i = 0; i < held_weights.size(); ++i)
    if (!held_weights[i].defined()) {
      held_weights[i] = w;
      return static_cast<int64_t>(i);
    }
  held_weights.push_back(w);
  return static_cast<int64_t>(held_weights.size()) - 1;
}

void release(int64_t slot) {
  std::lock_guard<std::mutex> guard(held_mutex);
  if (slot >= 0 && slot < static_cast<int64_t>(held_weights.size())) held_weights[slot] = at::Tensor();
}

int64_t held_count() {
  std::lock_guard<std::mutex> guard(held_mutex);
  return std::count_if(held_weights.begin(), held_weights.end(), [](const at::Tensor& t) { return t.defined(); });
}

at::Tensor held_at(const at::Tensor& slot, const char* op) {
  // the weight held at slot[0] (a one-element int64 CPU tensor); `op` names the caller in errors
  TORCH_CHECK(slot.numel() == 1 && slot.scalar_type() == at::kLong && slot.device().is_cpu(),
              op, ": slot is a one-element int64 CPU tensor");
  const int64_t s = slot.data_ptr<int64_t>()[0];
  std::lock_guard<std::mutex> guard(held_mutex);
  TORCH_CHECK(s >= 0 && s < static_cast<int64_t>(held_weights.size()) && held_weights[s].defined(),
              op, ": no weight is held at slot ", s);
  return held_weights[s];
}

at::Tensor call_on_rows(const c10::OperatorHandle& op, const at::Tensor& x_in, const at::Tensor& w, int64_t N,
                        std::initializer_list<c10::IValue> rest) {
  // op(x, w, *rest) with x_in (..., K) flattened to rows x (M, K); its (M, N) result with x_in's
  // leading dimensions restored (..., N)
  const auto x = x_in.reshape({-1, x_in.size(-1)});  // (M, K)
  torch::jit::Stack stack;
  stack.reserve(2 + rest.size());
  stack.emplace_back(x);
  stack.emplace_back(w);
  for (const auto& v : rest) stack.push_back(v);
  op.callBoxed(&stack);
  std::vector<int64_t> out_shape = x_in.sizes().vec();
  out_shape.back() = N;
  return stack[0].toTensor().view(out_shape);
}

c10::IValue optional_tensor(const c10::optional<at::Tensor>& b) {
  return b.has_value() && b->defined() ? c10::IValue(*b) : c10::IValue();
}

at::Tensor held_linear(const at::Tensor& x_in, const at::Tensor& slot, int64_t N, const c10::optional<at::Tensor>& b) {
  // x_in (..., K) -> (..., N) = x_in @ w.T + b, w the weight held at slot[0]
  const at::Tensor w = held_at(slot, "held_linear");
  TORCH_CHECK(w.size(0) == N && x_in.size(-1) == w.size(1), "held_linear: shapes do not match the held weight");
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  // bias, attr "none", no scalars, algorithm: none
  return call_on_rows(op, x_in, w, N, {optional_tensor(b), std::string("none"),
                                       c10::List<std::optional<at::Scalar>>(), c10::IValue()});
}

at::Tensor held_mkl_linear(const at::Tensor& x_in, const at::Tensor& slot, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& b) {
  // x_in (..., K) -> (..., N) = x_in @ weight.T + b through MKL's packed GEMM, on the copy held at
  // slot[0] (torch.ops.mkl._mkl_reorder_linear_weight(weight, M), packed for M = the rows of x_in)
  const at::Tensor w = held_at(slot, "held_mkl_linear");
  TORCH_CHECK(x_in.size(-1) == weight.size(1), "held_mkl_linear: x and the weight do not match");
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkl::_mkl_linear", "");
  const int64_t M = x_in.numel() / x_in.size(-1);  // the row count the copy was packed for
  return call_on_rows(op, x_in, w, weight.size(0), {c10::IValue(weight), optional_tensor(b), c10::IValue(M)});
}

// The same function as a dispatcher op, torch.ops.<extension name>.packed_linear, for compiled graphs:
// inductor's wrapper calls it through the C++ dispatcher (a Python custom op costs several times as
// much per call, and a step makes 211; docs/cpu-backend.md, gemm-dispatcher-op). One namespace per
// build (the extension's name), so two
// builds loaded by one process (benchmarks) do not collide. Its shape function is in cpu_gemm.py.
#define EAGLE_GEMM_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)  // expands TORCH_EXTENSION_NAME first
EAGLE_GEMM_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("packed_linear(Tensor x, Tensor p, int N, Tensor? b) -> Tensor");
  m.impl("packed_linear", c10::DispatchKey::CPU, TORCH_FN(packed_linear));
  m.def("held_linear(Tensor x, Tensor slot, int N, Tensor? b) -> Tensor");
  m.impl("held_linear", c10::DispatchKey::CPU, TORCH_FN(held_linear));
  m.def("held_mkl_linear(Tensor x, Tensor slot, Tensor weight, Tensor? b) -> Tensor");
  m.impl("held_mkl_linear", c10::DispatchKey::CPU, TORCH_FN(held_mkl_linear));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "the packed copy (ceil(N/16), K, 16) of a float32 or bfloat16 weight (N, K)");
  m.def("packed_linear", &packed_linear, "y = x @ w.T + b for few rows against pack(w) (float32 or bfloat16, AVX-512 or AVX2)");
  m.def("hold", &hold, "keep a (packed, opaque) weight in the table of held weights; returns its slot");
  m.def("release", &release, "free a slot of the table of held weights");
  m.def("held_count", &held_count, "how many weights are held");
  m.def("set_tile_blocks", [](int64_t nb) {
    TORCH_CHECK(nb >= 1 && nb <= MAX_TILE_BLOCKS, "set_tile_blocks: 1 .. ", MAX_TILE_BLOCKS, " blocks, got ", nb);
    tile_blocks_setting = nb;
  }, "blocks of 16 outputs per tile for calls of at most 8 rows (the same results, another speed)");
  m.def("tile_blocks", []() { return tile_blocks_setting; }, "blocks of 16 outputs per tile (calls of <= 8 rows)");
  m.def("set_prefetch_bytes", [](int64_t few, int64_t many) {
    for (int64_t bytes : {few, many})
      TORCH_CHECK(bytes >= 64 && bytes <= (1 << 20) && bytes % 64 == 0,
                  "set_prefetch_bytes: multiples of 64 from 64 to 1 MiB, got ", bytes);
    prefetch_few_setting = few;
    prefetch_many_setting = many;
  }, "how far ahead in a weight block's stream lines are prefetched, in bytes, in calls of up to 8 rows and of "
     "more (the same results, another speed)");
  m.def("prefetch_bytes", []() { return std::make_pair(prefetch_few_setting, prefetch_many_setting); },
        "how far ahead weights are prefetched, in bytes: (calls of up to 8 rows, calls of more)");
  m.def("set_turns", [](bool on) { turns_setting = on; },
        "calls of more than 8 rows: units of 3 blocks in turns (true) or one-block tiles of up to 16 rows (the same results)");
  m.def("turns", []() { return TURNS && turns_setting; }, "whether calls of more than 8 rows run in turns");
  m.attr("MAX_TILE_BLOCKS") = MAX_TILE_BLOCKS;
  m.attr("ISA") = ISA;
}
