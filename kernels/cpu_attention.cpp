// Masked attention over the filled part of a preallocated cache (built into the same extension as
// cpu_gemm.cpp): out (B, T, Hq, D) = softmax(scale * q k^T, masked) v per query head, grouped-query
// heads reading their KV head, with a boolean mask (B or 1, 1, T, C). What a compiled decoding or
// verification step runs in every layer: T = 1-64 tree nodes against C cache slots.
//
// Why: a compiled step has fixed shapes, so it hands attention the whole cache buffer (C slots,
// rounded up to a multiple of 256) and a mask that hides the empty slots; PyTorch's CPU flash
// attention then works through all C keys. Here the keys from the last slot any query sees on are
// cut off (the mask scanned from the end) and the rest goes to the same SDPA in its grouped-query
// form (no K/V copies). On SmolLM2-135M (3 KV heads, 512 slots, 300 filled; 30 layers' buffers in
// turn) that took 0.77x / 0.75x / 0.68x the time of SDPA on the whole buffer with the query heads
// folded (eagle/attention.py) for 1 / 4 / 16 rows (docs/kernels.md). An op of its own because the
// cut is data-dependent: in a graph it would be a host sync and a new shape every step.
//
// A hand-written loop (per query row: dot products, ATen's vectorized exp, weighted sum of value
// rows) measured 0.7-0.9x SDPA's time at one row but 1.4-3.7x at 4-64 rows, and was dropped.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace {

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
  // SDPA's own grouped-query form: each KV head read once for its query heads, the mask broadcast
  // over heads (folding the query heads into the rows instead needs the mask repeated per head:
  // 1.05-1.35x the time for 1-16 rows)
  // the mask as SDPA's additive form (0 / -inf, q's dtype), made here in one pass: SDPA's own
  // conversion of a boolean mask (two `where`s, ~17 us each for 16 rows) took longer than its cut saved
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
}
