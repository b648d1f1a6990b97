// Masked attention over the filled part of a preallocated cache (built into the same extension as
// cpu_gemm.cpp): out (B, T, Hq, D) = softmax(scale * q k^T, masked) v per query head, grouped-query
// heads reading their KV head, with a boolean mask (B or 1, 1, T, C). What a compiled decoding or
// verification step runs in every layer: T = 1-64 tree nodes against C cache slots.
//
// Why: a compiled step has fixed shapes, so it hands attention the whole cache buffer (C slots,
// rounded up to a multiple of 256) and a mask that hides the empty slots; PyTorch's CPU flash
// attention then works through all C keys. Here the keys from the last slot any query sees on are
// cut off (the mask scanned from the end) and the rest goes, in float32 on AVX-512 builds, to the
// tiled loop below, else to the same SDPA in its grouped-query form (no K/V copies;
// docs/cpu-backend.md, attention-cut). An op of its own because the cut is data-dependent: in a
// graph it would be a host sync and a new shape every step.
//
// Float32 calls take the tiled loop (query rows in the vector lanes, keys as the rows of the
// products) rather than SDPA or a loop per query row, which is slow from 4 rows
// (docs/cpu-backend.md, attention-tiled-f32).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// 0: float32 calls on AVX-512 take the tiled loop below, others SDPA; 1: every call SDPA (for A/Bs:
// experiments/perf/compiled_step_ab.py --what attention-way)
int64_t attention_way_setting = 0;
// bfloat16 calls through the tiled loop too (their values widened to float32 as they are read), where
// cpu_attention.py measured it faster than SDPA's bf16 kernel on this machine; else SDPA
bool bf16_tiled_setting = false;

#if defined(__AVX512F__)
// The tiled float32 loop (AVX-512). Per KV head the query rows of its G query heads are laid out as
// rows r = j * Tp + t (query head j of the group, node t; Tp: T rounded up to a power of two up to 16,
// else to a multiple of 16, so that a block of 16 rows maps to nodes by a shift), 16 rows to a block,
// and the work is done with keys as the rows of the products and query rows in the vector lanes:
//   scores (C, 16 lanes) per block: for each dim d, the block's packed q[., d] (one line, scale folded
//     in) times each key's k[c, d] broadcast: the small-row GEMM's tile (8 keys x up to 3 blocks);
//   softmax down each lane: max, exp and sum are vertical ops over the keys (no horizontal
//     reductions), the mask applied per (key, lane) as a 16-bit lane mask;
//   out^T (D, 16 lanes) = sum over keys of v[c, d] broadcast times p[c, lanes] (8 dims x blocks).
// The keys are split into one share per thread (each K / V row read from memory once, the same work
// in every share), and the shares' partial softmaxes (max, sum, unnormalized output) merged per row.
// A row's result does not depend on the other rows of the call (masked keys add exact zeros).
// Why: PyTorch's CPU flash attention splits the queries by head into 32-row blocks and runs a GEMM,
// an online softmax and a GEMM per block (9 small tasks for a 16-node tree on SmolLM2's 9 heads).
constexpr int64_t AL = 16;  // lanes: query rows per block

inline __m512 exp_ps(__m512 x) {
  // e^x, Cephes' single-precision polynomial: e^x = 2^n e^r, n = round(x log2 e), |r| <= ln 2 / 2,
  // e^r = 1 + r + r^2 p(r); 2^n applied with scalef (subnormal results below e^-87, 0 below e^-103).
  // The loop calls it on scores minus their row's max (<= 0); a lane's masked keys are zeroed after.
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// a cache element as float32: E = float, or uint16_t for bfloat16 (its bits are a float32's upper half:
// exact), so bfloat16 calls run the same float32 loop on the widened values
inline float widen(const float* p) { return *p; }
inline float widen(const uint16_t* p) {
  const uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <int NB, int MT, typename E>
inline void score_tile(const float* __restrict qp, int64_t D, const E* __restrict kc, int64_t ldk,
                       float* __restrict s, int64_t lds) {
  // s[i, j * 16 + lane] = sum_d qp[j][d][lane] * kc[i * ldk + d] for MT keys x NB blocks
  __m512 acc[NB][MT];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) acc[j][i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    // the next tile's key rows, a line of each per 16 dims: in a step they come from memory (the
    // layer weights streamed through the caches since the last step); a prefetch never faults
    if (d % AL == 0)
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) _mm_prefetch(reinterpret_cast<const char*>(kc + (MT + i) * ldk + d), _MM_HINT_T0);
    __m512 w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) w[j] = _mm512_loadu_ps(qp + (j * D + d) * AL);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512 xb = _mm512_set1_ps(widen(kc + i * ldk + d));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[j][i] = _mm512_fmadd_ps(w[j], xb, acc[j][i]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) _mm512_storeu_ps(s + i * lds + j * AL, acc[j][i]);
}

template <int NB, typename E>
void score_rows(int64_t rows, const float* qp, int64_t D, const E* kc, int64_t ldk, float* s, int64_t lds) {
  switch (rows) {
#define CASE(R) case R: score_tile<NB, R, E>(qp, D, kc, ldk, s, lds); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    default: TORCH_CHECK(false, "masked_attention: score tile rows out of range");
  }
}

template <int NB, typename E>
inline void pv_tile(const float* __restrict pbuf, int64_t ldp, const uint8_t* __restrict seen, int64_t L,
                    const E* __restrict vc, int64_t ldv, int64_t D, int64_t d0, float* __restrict o) {
  // o[i * NB * 16 + j * 16 + lane] = sum_c pbuf[c * ldp + j * 16 + lane] * vc[c * ldv + d0 + i], 8 dims x NB blocks;
  // keys no lane of the group sees are skipped (their p are all zero)
  __m512 acc[NB][8];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[j][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < L; ++c) {
    if (d0 == 0)  // the first pass over the values: their rows 8 keys ahead
      for (int64_t d = 0; d < D; d += AL) _mm_prefetch(reinterpret_cast<const char*>(vc + (c + 8) * ldv + d), _MM_HINT_T0);
    if (!seen[c]) continue;
    __m512 w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) w[j] = _mm512_loadu_ps(pbuf + c * ldp + j * AL);
    const E* vr = vc + c * ldv + d0;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512 xb = _mm512_set1_ps(widen(vr + i));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[j][i] = _mm512_fmadd_ps(w[j], xb, acc[j][i]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) _mm512_storeu_ps(o + (i * NB + j) * AL, acc[j][i]);  // row i: NB * 16 lanes
}

// One group's partial attention over keys c0 .. c1 - 1 (a thread's share of the keys): per lane its
// max score mx (-inf: it sees none of these keys), sum of exp(score - mx) and unnormalized output
// o (D, 16 lanes) per block; merged across the shares by `tiled_attention`.
struct Partial {
  float* mx;   // (NB, 16)
  float* sum;  // (NB, 16)
  float* o;    // (D, NB, 16)
};

struct Layout {  // how a KV head's query rows map to lanes
  int64_t T, Tp, G;
  // lane l of the group starting at block blk0: its query head within the group (-1: no row) and node
  void lane(int64_t blk0, int64_t l, int64_t& j, int64_t& t) const {
    const int64_t r = blk0 * AL + l;
    j = r / Tp;
    t = r % Tp;
    if (j >= G || t >= T) j = -1;
  }
};

void lane_masks(const uint64_t* vis, int64_t c0, int64_t c1, int64_t blk0, int64_t nb, const Layout& lay,
                std::vector<__mmask16>& lanes, std::vector<uint8_t>& seen) {
  // for keys c0 .. c1 - 1 and the nb blocks from blk0: per key and block the lanes that see it
  // (lanes (L, nb), 16-bit masks), and per key whether any lane of the group does (seen (L,)); the
  // same for every KV head, so a share computes them once per group
  const int64_t L = c1 - c0;
  lanes.resize(L * nb);
  seen.assign(L, 0);
  for (int64_t j = 0; j < nb; ++j) {
    uint64_t valid = 0;  // lanes of block j holding a row
    int64_t t0 = 0;      // Tp >= 16: the block's lanes are nodes t0 .. t0 + 15
    for (int64_t l = 0; l < AL; ++l) {
      int64_t h, t;
      lay.lane(blk0 + j, l, h, t);
      valid |= uint64_t(h >= 0) << l;
      if (l == 0) t0 = t;
    }
    uint64_t rep = 0;  // Tp < 16: lanes repeat nodes 0 .. Tp - 1
    for (int64_t h = 0; h < AL; h += lay.Tp) rep |= uint64_t(1) << h;
    const uint64_t low = lay.Tp >= 64 ? ~uint64_t(0) : (uint64_t(1) << lay.Tp) - 1;
    for (int64_t c = 0; c < L; ++c) {
      const uint64_t m = lay.Tp >= AL ? vis[c0 + c] >> t0 : (vis[c0 + c] & low) * rep;  // no carries: low < 2^Tp
      const auto lm = static_cast<__mmask16>(m & valid);
      lanes[c * nb + j] = lm;
      seen[c] |= lm != 0;
    }
  }
}

template <int NB, typename E>
void attend_share(const E* qd, const int64_t* qs, const E* kd, int64_t ldk, const E* vd, int64_t ldv,
                  int64_t D, int64_t c0, int64_t c1, int64_t kvh, int64_t blk0, const Layout& lay, float scale,
                  const std::vector<__mmask16>& lanes, const std::vector<uint8_t>& seen, Partial part,
                  std::vector<float>& qp, std::vector<float>& s) {
  // qd/qs: q's data (batch b applied) and strides (B, Hq, T, D); kd/vd: KV head kvh's keys / values;
  // lanes / seen: the group's lane masks over keys c0 .. c1 - 1 (`lane_masks`)
  const int64_t W = NB * AL, L = c1 - c0;
  // the queries packed (NB, D, 16), scaled
  qp.assign(NB * D * AL, 0.f);
  for (int64_t l = 0; l < W; ++l) {
    int64_t j, t;
    lay.lane(blk0, l, j, t);
    if (j < 0) continue;
    const E* qr = qd + (kvh * lay.G + j) * qs[1] + t * qs[2];
    for (int64_t d = 0; d < D; ++d) qp[((l / AL) * D + d) * AL + l % AL] = widen(qr + d * qs[3]) * scale;
  }
  // scores (L, W), then probabilities in place
  s.resize(L * W);
  int64_t c = 0;
  for (; c + 8 <= L; c += 8) score_tile<NB, 8, E>(qp.data(), D, kd + (c0 + c) * ldk, ldk, s.data() + c * W, W);
  if (c < L) score_rows<NB, E>(L - c, qp.data(), D, kd + (c0 + c) * ldk, ldk, s.data() + c * W, W);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx[NB], base[NB], sum[NB];
  for (int64_t j = 0; j < NB; ++j) {
    mx[j] = minus_inf;
    sum[j] = _mm512_setzero_ps();
  }
  for (c = 0; c < L; ++c)
    for (int64_t j = 0; j < NB; ++j)
      mx[j] = _mm512_mask_max_ps(mx[j], lanes[c * NB + j], mx[j], _mm512_loadu_ps(s.data() + c * W + j * AL));
  for (int64_t j = 0; j < NB; ++j)  // a lane that sees none of these keys: exp relative to 0 (its p stay 0)
    base[j] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mx[j], minus_inf, _CMP_NEQ_OQ), mx[j]);
  for (c = 0; c < L; ++c)
    for (int64_t j = 0; j < NB; ++j) {
      float* sp = s.data() + c * W + j * AL;
      const __m512 p = _mm512_maskz_mov_ps(lanes[c * NB + j], exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sp), base[j])));
      _mm512_storeu_ps(sp, p);
      sum[j] = _mm512_add_ps(sum[j], p);
    }
  for (int64_t j = 0; j < NB; ++j) {
    _mm512_storeu_ps(part.mx + j * AL, mx[j]);
    _mm512_storeu_ps(part.sum + j * AL, sum[j]);
  }
  // o^T (D, W), 8 dims at a time
  for (int64_t d0 = 0; d0 < D; d0 += 8) pv_tile<NB, E>(s.data(), W, seen.data(), L, vd + c0 * ldv, ldv, D, d0, part.o + d0 * W);
}

bool tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const bool* mp, int64_t Bm,
                     int64_t C, int64_t L, double scale, at::Tensor& out) {
  // out (B, T, Hq, D) float32 from the tiled loop; false where it does not apply (then SDPA runs).
  // The keys are split into one share per thread (each K / V row read once, every share the same
  // work); each share runs every KV head's query rows in groups of up to 3 blocks, and the shares'
  // partial softmaxes are merged at the end.
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), G = Hq / Hkv;
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (attention_way_setting != 0 || !(q.scalar_type() == at::kFloat || (bf16 && bf16_tiled_setting)) || D % 8 != 0 ||
      T > 64 || k.stride(3) != 1 || v.stride(3) != 1)
    return false;
  // batched calls with fewer rows per KV head than a block's lanes stay on SDPA, whose (batch x head)
  // tasks already fill the threads (e.g. the self-distillation data stage: 24 sequences of one token
  // a step, 3 of 16 lanes holding a row; docs/cpu-backend.md, attention-tiled-f32)
  if (B > 1 && G * T < AL) return false;
  int64_t Tp = 1;
  if (T <= AL)
    while (Tp < T) Tp *= 2;
  else
    Tp = (T + AL - 1) / AL * AL;
  const Layout lay{T, Tp, G};
  const int64_t blocks = (G * Tp + AL - 1) / AL;  // per KV head
  const int64_t groups = (blocks + 2) / 3;        // of up to 3 blocks
  // the nodes that see each key, one bit per node (T <= 64), per mask batch
  std::vector<uint64_t> vis(Bm * L, 0);
  for (int64_t bm = 0; bm < Bm; ++bm)
    for (int64_t t = 0; t < T; ++t) {
      const bool* row = mp + (bm * T + t) * C;
      uint64_t* vb = vis.data() + bm * L;
      for (int64_t c = 0; c < L; ++c) vb[c] |= uint64_t(row[c]) << t;
    }
  // shares of the keys: one per thread, multiples of 8 keys (the score tile)
  const int64_t per = std::max<int64_t>(8, (L + at::get_num_threads() - 1) / at::get_num_threads() + 7) / 8 * 8;
  const int64_t shares = (L + per - 1) / per;
  const int64_t lanes_per_head = blocks * AL;
  // partials: (B, shares, Hkv, lanes_per_head) for mx and sum; o (B, shares, Hkv, blocks/3 groups..)
  // laid out per (b, share, kvh, group) as (D, NB * 16)
  const int64_t pl = B * shares * Hkv * lanes_per_head;
  std::vector<float> mxs(pl), sums(pl), os(pl * D);
  const float sc = static_cast<float>(scale);
  const int64_t qs[4] = {q.stride(0), q.stride(1), q.stride(2), q.stride(3)};
  // E: the cache's element type (float, or uint16_t holding bfloat16 bits), widened as it is read
  auto body = [&](auto tag) {
    using E = decltype(tag);
    auto data = [](const at::Tensor& t) {
      if constexpr (std::is_same_v<E, float>)
        return t.data_ptr<float>();
      else
        return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
    };
    const E* qd = data(q);
    const E* kd0 = data(k);
    const E* vd0 = data(v);
    at::parallel_for(0, B * shares, 1, [&](int64_t w0, int64_t w1) {
      std::vector<float> qp, sbuf;
      std::vector<__mmask16> lanes;
      std::vector<uint8_t> seen;
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t b = w / shares, sh = w % shares, c0 = sh * per, c1 = std::min(L, c0 + per);
        const uint64_t* vb = vis.data() + (Bm == 1 ? 0 : b) * L;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t blk0 = g * 3, width = std::min<int64_t>(3, blocks - blk0);
          lane_masks(vb, c0, c1, blk0, width, lay, lanes, seen);
          for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
            const E* kd = kd0 + b * k.stride(0) + kvh * k.stride(1);
            const E* vd = vd0 + b * v.stride(0) + kvh * v.stride(1);
            const int64_t at = ((b * shares + sh) * Hkv + kvh) * lanes_per_head + blk0 * AL;
            const Partial part{mxs.data() + at, sums.data() + at, os.data() + at * D};
            auto run = [&](auto nb) {  // nb: the group's blocks, a compile-time constant
              attend_share<decltype(nb)::value, E>(qd + b * qs[0], qs, kd, k.stride(2), vd, v.stride(2), D, c0, c1, kvh,
                                                   blk0, lay, sc, lanes, seen, part, qp, sbuf);
            };
            if (width == 1)
              run(std::integral_constant<int, 1>{});
            else if (width == 2)
              run(std::integral_constant<int, 2>{});
            else
              run(std::integral_constant<int, 3>{});
          }
        }
      }
    });
  };
  if (bf16)
    body(uint16_t{});
  else
    body(float{});
  // merge the shares: per row, weights exp(mx_share - max over shares) (0 for a share it saw nothing of);
  // float32 (a bfloat16 call's output rounded once at the end)
  out = at::empty({B, T, Hq, D}, q.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (int64_t l = 0; l < lanes_per_head; ++l) {
        int64_t j, t;
        lay.lane(0, l, j, t);
        if (j < 0) continue;
        const int64_t g = l / (3 * AL), width = std::min<int64_t>(3, blocks - g * 3) * AL, lg = l % (3 * AL);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t sh = 0; sh < shares; ++sh) m = std::max(m, mxs[((b * shares + sh) * Hkv + kvh) * lanes_per_head + l]);
        float* orow = op + ((b * T + t) * Hq + kvh * G + j) * D;
        for (int64_t d = 0; d < D; ++d) orow[d] = 0.f;
        float total = 0.f;
        for (int64_t sh = 0; sh < shares; ++sh) {
          const int64_t at = ((b * shares + sh) * Hkv + kvh) * lanes_per_head;
          if (!(sums[at + l] > 0.f)) continue;
          const float wgt = shares == 1 ? 1.f : std::exp(mxs[at + l] - m);
          total += sums[at + l] * wgt;
          const float* o = os.data() + (at + g * 3 * AL) * D;  // the group's (D, width)
          for (int64_t d = 0; d < D; ++d) orow[d] += o[d * width + lg] * wgt;
        }
        const float inv = total > 0.f ? 1.f / total : 0.f;
        for (int64_t d = 0; d < D; ++d) orow[d] *= inv;
      }
  if (bf16) out = out.to(at::kBFloat16);  // rounded to nearest, ties to even
  return true;
}
#else
bool tiled_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const bool*, int64_t, int64_t, int64_t,
                     double, at::Tensor&) {
  return false;  // AVX2 builds: SDPA
}
#endif

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  // q (B, Hq, T, D), k / v (B, Hkv, C, D), mask (B or 1, 1, T, C) bool -> (B, T, Hq, D), q's dtype
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4,
              "masked_attention: q (B, Hq, T, D), k and v (B, Hkv, C, D), mask (B or 1, 1, T, C)");
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3), Hkv = k.size(1), C = k.size(2);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "masked_attention: k and v (B, Hkv, C, D) with Hq a multiple of Hkv");
  TORCH_CHECK(mask.scalar_type() == at::kBool && (mask.size(0) == 1 || mask.size(0) == B) && mask.size(1) == 1 &&
              mask.size(2) == T_ && mask.size(3) == C, "masked_attention: mask (B or 1, 1, T, C) bool");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
              (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "masked_attention: float32 or bfloat16 q, k, v, alike");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() && mask.device().is_cpu(),
              "masked_attention: CPU tensors only");
  // the keys from the last one any query sees on are cut off (a preallocated cache's empty slots)
  const at::Tensor mc = mask.contiguous();
  const bool* mp = mc.data_ptr<bool>();
  const int64_t Bm = mask.size(0);
  int64_t kv_len = C;
  auto column_seen = [&](int64_t c) {
    for (int64_t r = 0; r < Bm * T_; ++r)
      if (mp[r * C + c]) return true;
    return false;
  };
  while (kv_len > 0 && !column_seen(kv_len - 1)) --kv_len;
  kv_len = std::max<int64_t>(kv_len, 1);  // SDPA takes no empty key axis (a row that sees nothing stays masked)
  at::Tensor tiled;
  if (tiled_attention(q, k, v, mp, Bm, C, kv_len, scale, tiled)) return tiled;
  // SDPA's own grouped-query form: each KV head read once for its query heads, the mask broadcast
  // over heads (folding the query heads into the rows instead needs the mask repeated per head,
  // which is slower; docs/cpu-backend.md, attention-cut)
  // the mask as SDPA's additive form (0 / -inf, q's dtype), made here in one pass: SDPA's own
  // conversion of a boolean mask (two `where`s) costs about what the cut saves (docs/cpu-backend.md,
  // attention-cut)
  at::Tensor bias = at::empty({Bm, 1, T_, kv_len}, q.options());
  auto fill = [&](auto* out) {
    using S = std::remove_pointer_t<decltype(out)>;
    const S zero(0.f), minus_inf(-std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < Bm * T_; ++r)
      for (int64_t c = 0; c < kv_len; ++c) out[r * kv_len + c] = mp[r * C + c] ? zero : minus_inf;
  };
  if (q.scalar_type() == at::kFloat)
    fill(bias.data_ptr<float>());
  else
    fill(bias.data_ptr<at::BFloat16>());
  const at::Tensor out = at::scaled_dot_product_attention(q, k.narrow(2, 0, kv_len), v.narrow(2, 0, kv_len), bias, 0.0,
                                                          false, scale, /*enable_gqa=*/true);  // (B, Hq, T, D)
  return out.transpose(1, 2).contiguous();  // (B, T, Hq, D)
}

}  // namespace

#define EAGLE_ATTENTION_LIBRARY(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)  // expands TORCH_EXTENSION_NAME first
EAGLE_ATTENTION_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("masked_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  m.impl("masked_attention", c10::DispatchKey::CPU, TORCH_FN(masked_attention));
  // the way setting, for A/Bs (kernels/cpu_attention.py: set_way / way): 0 the tiled float32 loop where
  // it applies, 1 SDPA for every call
  m.def("set_attention_way(int way) -> ()", [](int64_t way) {
    TORCH_CHECK(way == 0 || way == 1, "set_attention_way: 0 (tiled float32 loop where it applies) or 1 (SDPA)");
    attention_way_setting = way;
  });
  m.def("attention_way() -> int", []() -> int64_t { return attention_way_setting; });
  m.def("set_attention_bf16_tiled(bool on) -> ()", [](bool on) { bf16_tiled_setting = on; });
  m.def("attention_bf16_tiled() -> bool", []() -> bool { return bf16_tiled_setting; });
}


