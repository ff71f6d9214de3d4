// quanta's CPU decode attention: one query token against a key/value cache, grouped-query heads, and an optional
// boolean key mask per batch row (True: attend).
//
// Built with csrc/int_linear.cpp into the same extension (quanta.kernels.int_linear_native), registered as
// torch.ops.quanta_cpu.decode_attention. For batch row b and key/value head g, the G = Hq / Hkv query heads
// h = g G .. g G + G - 1 read the same keys and values once, in float32:
//   s[h][t] = scale * (((q[h][0] k[t][0] + q[h][1] k[t][1]) + q[h][2] k[t][2]) + ...)   (one chain in increasing d,
//             every product and sum rounded; -inf where the mask is False)
//   p[h][t] = exp_nonpositive(s[h][t] - max_t s[h][t])   (0 where masked)
//   Z[h]    = sum_t p[h][t]: 16 partial sums (lane l takes t = 16c + l, in increasing c), then the tree
//             t8[i] = a[i] + a[i+8], t4[i] = t8[i] + t8[i+4], t2[i] = t4[i] + t4[i+2], Z = t2[0] + t2[1]
//   out[h][d] = (p[h][0] v[0][d] + p[h][1] v[1][d] + ..., increasing t) / Z[h], rounded once to the input dtype.
// decode_attention_int8 takes keys and values as int8 codes with a float32 scale per token (an int8 KV cache) and
// attends to float(T(code * scale)) with T the query's dtype: the values of the cache dequantized to T, read as
// the kernel goes (see Int8Rows), so the result has the bits of decode_attention over the dequantized cache.
// Masked keys and values are never used (a static cache's unfilled slots may hold anything), and the keys after a
// row's last live one are not visited at all (see live_length). The arithmetic is
// written with 16-lane vectors (GCC's vector extension, elementwise IEEE operations, no contraction: the library is
// compiled with -ffp-contract=off), so each instruction set that target_clones builds for (AVX-512, AVX2, baseline)
// gives the same bits; exp is the polynomial below (not libm's) for the same reason. torch's own
// scaled_dot_product_attention spends 0.2-0.5 ms a call on this shape (one query row, a few hundred keys).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

#define QUANTA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));

__attribute__((always_inline)) inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
__attribute__((always_inline)) inline v16 splat(float x) { return v16{} + x; }
inline int64_t round_up16(int64_t n) { return (n + 15) / 16 * 16; }

// T -> float32, exactly. bfloat16: the upper half of a float's bits (a shift, which vectorizes).
template <typename T>
inline void to_float(const T* src, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t* u = reinterpret_cast<const uint16_t*>(src);
    uint32_t* o = reinterpret_cast<uint32_t*>(dst);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<uint32_t>(u[i]) << 16;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

// exp(x) for x <= 0 (a softmax's shifted scores), 16 at a time: x = (n + f) ln 2 with n = round(x log2 e),
// |f| <= 1/2, and e^(f ln 2) by its degree-6 Taylor polynomial (relative error below 2e-7); 0 below -87 and for
// -inf; NaN stays NaN. Only float adds, multiplies, compares and conversions.
__attribute__((always_inline)) inline v16 exp_nonpositive(v16 x) {
  const v16 t = x * 1.44269504088896341f;
  const v16 n = (t + 12582912.0f) - 12582912.0f;  // round to nearest, exact for |t| < 2^22
  const v16 r = (t - n) * 0.693147180559945309f;
  v16 p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  i16v e = __builtin_convertvector(n, i16v) + 127;
  e = e < 1 ? 1 : e;  // below -87 the result is replaced by 0 anyway
  const i16v bits = e << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const v16 y = p * scale;
  const v16 zero = splat(0.0f);
  const v16 kept = x != x ? x : y;  // NaN
  return x < -87.0f ? zero : kept;
}

// kt[d * ld + i] = rows[i * D + d] for the 16 rows i of a block of keys and d < D (D a multiple of 16): 16x16
// blocks transposed in registers, four rounds that each swap one bit of the row and column index (exact moves).
QUANTA_CLONES void transpose_keys(const float* __restrict rows, int64_t D, float* __restrict kt, int64_t ld) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    v16 a[16];
    for (int i = 0; i < 16; ++i) a[i] = load16(rows + i * D + d0);
    for (int r = 0; r < 16; ++r) {  // rows r and r + 8 swap the off-diagonal 8 x 8 blocks
      if (r & 8) continue;
      const v16 x = a[r], y = a[r + 8];
      a[r] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
      a[r + 8] = __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    for (int r = 0; r < 16; ++r) {  // then 4 x 4 blocks
      if (r & 4) continue;
      const v16 x = a[r], y = a[r + 4];
      a[r] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
      a[r + 4] = __builtin_shufflevector(x, y, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
    for (int r = 0; r < 16; ++r) {  // 2 x 2
      if (r & 2) continue;
      const v16 x = a[r], y = a[r + 2];
      a[r] = __builtin_shufflevector(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      a[r + 2] = __builtin_shufflevector(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    for (int r = 0; r < 16; r += 2) {  // single elements
      const v16 x = a[r], y = a[r + 1];
      a[r] = __builtin_shufflevector(x, y, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
      a[r + 1] = __builtin_shufflevector(x, y, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    }
    for (int i = 0; i < 16; ++i) store16(kt + (d0 + i) * ld, a[i]);
  }
}

// Scores of one (batch row, key/value head): s [G, Sp] for the G query heads qf [G, D] against the keys kt [D, ld]
// (transposed to float; masked and padding columns zero), 4 heads and 16 keys at a time, d in increasing order.
QUANTA_CLONES void scores(const float* __restrict qf, const float* __restrict kt, int64_t G, int64_t Sp,
                          int64_t D, int64_t ld, float* __restrict sc) {
  for (int64_t h0 = 0; h0 < G; h0 += 4) {
    const int64_t nh = std::min<int64_t>(4, G - h0);
    for (int64_t t0 = 0; t0 < Sp; t0 += 16) {
      v16 a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
      const float* q = qf + h0 * D;
      for (int64_t d = 0; d < D; ++d) {
        const v16 k = load16(kt + d * ld + t0);
        a0 = a0 + q[d] * k;
        if (nh > 1) a1 = a1 + q[D + d] * k;
        if (nh > 2) a2 = a2 + q[2 * D + d] * k;
        if (nh > 3) a3 = a3 + q[3 * D + d] * k;
      }
      store16(sc + h0 * Sp + t0, a0);
      if (nh > 1) store16(sc + (h0 + 1) * Sp + t0, a1);
      if (nh > 2) store16(sc + (h0 + 2) * Sp + t0, a2);
      if (nh > 3) store16(sc + (h0 + 3) * Sp + t0, a3);
    }
  }
}

// Scores -> probabilities in place (masked and padding keys 0), and each head's Z.
QUANTA_CLONES void softmax_numerators(float* __restrict sc, const bool* __restrict live, int64_t G, int64_t S,
                                      int64_t Sp, float scale, float* __restrict z) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < G; ++h) {
    float* s = sc + h * Sp;
    for (int64_t t = 0; t < Sp; ++t) s[t] = t >= S || (live && !live[t]) ? ninf : s[t] * scale;
    v16 m = splat(ninf);
    for (int64_t t = 0; t < Sp; t += 16) {
      const v16 x = load16(s + t);
      m = x > m ? x : m;
    }
    float mx = ninf;
    for (int l = 0; l < 16; ++l) mx = std::max(mx, m[l]);  // the maximum: the same in any order
    v16 acc = splat(0.0f);
    for (int64_t t = 0; t < Sp; t += 16) {
      const v16 p = exp_nonpositive(load16(s + t) - mx);
      store16(s + t, p);
      acc = acc + p;
    }
    float t8[8], t4[4];
    for (int i = 0; i < 8; ++i) t8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
    z[h] = (t4[0] + t4[2]) + (t4[1] + t4[3]);
  }
}

// out [G, Dp] = p [G, Sp] @ vf [S, Dp] / Z, 4 heads and 16 values of d at a time, t in increasing order.
QUANTA_CLONES void weighted_values(const float* __restrict p, const float* __restrict vf, const bool* __restrict live,
                                   const float* __restrict z, int64_t G, int64_t S, int64_t Sp, int64_t Dp,
                                   float* __restrict out) {
  for (int64_t h0 = 0; h0 < G; h0 += 4) {
    const int64_t nh = std::min<int64_t>(4, G - h0);
    const float* p0 = p + h0 * Sp;
    for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
      v16 a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t t = 0; t < S; ++t) {
        if (live && !live[t]) continue;  // its value row is never read
        const v16 v = load16(vf + t * Dp + d0);
        a0 = a0 + p0[t] * v;
        if (nh > 1) a1 = a1 + p0[Sp + t] * v;
        if (nh > 2) a2 = a2 + p0[2 * Sp + t] * v;
        if (nh > 3) a3 = a3 + p0[3 * Sp + t] * v;
      }
      store16(out + h0 * Dp + d0, a0 / z[h0]);
      if (nh > 1) store16(out + (h0 + 1) * Dp + d0, a1 / z[h0 + 1]);
      if (nh > 2) store16(out + (h0 + 2) * Dp + d0, a2 / z[h0 + 2]);
      if (nh > 3) store16(out + (h0 + 3) * Dp + d0, a3 / z[h0 + 3]);
    }
  }
}

// The keys a batch row reads: up to its last live one. The masked keys after it (a static cache's unfilled
// slots) would only add probabilities of exactly 0 to every sum, so leaving them out gives the same bits; a row
// with no live key keeps all S (its result is what it was).
inline int64_t live_length(const bool* live, int64_t S) {
  if (!live) return S;
  int64_t n = S;
  while (n > 0 && !live[n - 1]) --n;
  return n > 0 ? n : S;
}

// The rows of a key or value cache [B, Hkv, S, D] (head dimension contiguous), as float32:
// PlainRows: a T tensor, converted exactly.
template <typename T>
struct PlainRows {
  const T* p;
  int64_t sb, sh, st;
  explicit PlainRows(const at::Tensor& t)
      : p(t.data_ptr<T>()), sb(t.stride(0)), sh(t.stride(1)), st(t.stride(2)) {}
  void row(int64_t b, int64_t g, int64_t t, int64_t D, float* dst) const {
    to_float(p + b * sb + g * sh + t * st, D, dst);
  }
};

// float(T(float(c[i]) * sc)) for i < D, in loops GCC vectorizes (its vector-extension conversion from int8 was
// scalarized). bfloat16: round to nearest even on the bits, NaN to c10's quiet NaN 0x7FC0, as c10::BFloat16's
// conversion does; float16 element by element.
template <typename T>
QUANTA_CLONES void dequantize_row(const int8_t* __restrict c, float sc, int64_t D, float* __restrict dst) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < D; ++i) dst[i] = static_cast<float>(c[i]) * sc;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (int64_t i = 0; i < D; ++i) {
      const float f = static_cast<float>(c[i]) * sc;
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
      u = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : rounded;
      std::memcpy(dst + i, &u, sizeof u);
    }
  } else {
    for (int64_t i = 0; i < D; ++i) dst[i] = static_cast<float>(static_cast<T>(static_cast<float>(c[i]) * sc));
  }
}

// Int8Rows: int8 codes with one float32 scale per token, dequantized to the model's dtype T and widened:
// float(T(float(code) * scale)), the values the cache's dequantized T tensors hold, so attention over them gives
// the bits of attention over those tensors.
template <typename T>
struct Int8Rows {
  const int8_t* p;
  int64_t sb, sh, st;
  const float* s;
  int64_t ssb, ssh, sst;
  Int8Rows(const at::Tensor& codes, const at::Tensor& scales)
      : p(codes.data_ptr<int8_t>()), sb(codes.stride(0)), sh(codes.stride(1)), st(codes.stride(2)),
        s(scales.data_ptr<float>()), ssb(scales.stride(0)), ssh(scales.stride(1)), sst(scales.stride(2)) {}
  void row(int64_t b, int64_t g, int64_t t, int64_t D, float* dst) const {
    dequantize_row<T>(p + b * sb + g * sh + t * st, s[b * ssb + g * ssh + t * sst], D, dst);
  }
};

template <typename T, typename Rows>
void run(const at::Tensor& q, const Rows& kr, const Rows& vr, int64_t Hkv, int64_t S, double scale, const bool* mask,
         int64_t mask_batch_stride, at::Tensor& out) {
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(3);
  const int64_t G = Hq / Hkv, Sp = round_up16(S), Dp = round_up16(D);
  // Rows of the transposed keys: 16 floats more than the padded length, so that rows 4 KiB apart (S = 1024)
  // do not all fall into the same L1 sets (the transposing writes otherwise ran 10x slower).
  const int64_t ld = Sp + 16;
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    // Per-thread buffers kept between calls: a fresh allocation of this size is an mmap whose page faults
    // cost more than the attention itself (every element read is written first, below).
    thread_local std::vector<float> buffer;
    const int64_t sizes[] = {G * D, 16 * Dp, Dp * ld, S * Dp, G * Sp, G, G * Dp};
    int64_t total = 0;
    for (int64_t n : sizes) total += round_up16(n);
    if (static_cast<int64_t>(buffer.size()) < total) buffer.resize(total);
    float* parts[7];
    float* next = buffer.data();
    for (int i = 0; i < 7; ++i) {
      parts[i] = next;
      next += round_up16(sizes[i]);
    }
    float *qf = parts[0], *kblk = parts[1], *kt = parts[2], *vf = parts[3], *probs = parts[4], *z = parts[5],
          *acc = parts[6];
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      for (int64_t h = 0; h < G; ++h)
        to_float(qp + b * q.stride(0) + (g * G + h) * q.stride(1), D, qf + h * D);
      const bool* live = mask ? mask + b * mask_batch_stride : nullptr;
      const int64_t Sb = live_length(live, S), Spb = round_up16(Sb);
      for (int64_t t0 = 0; t0 < Spb; t0 += 16) {  // 16 keys to float, then transposed into kt's columns t0..
        for (int64_t t = t0; t < t0 + 16; ++t) {
          float* key = kblk + (t - t0) * Dp;
          if (t >= Sb || (live && !live[t])) {  // zero keys: finite scores, replaced by -inf after
            std::memset(key, 0, Dp * sizeof(float));
            continue;
          }
          kr.row(b, g, t, D, key);
          vr.row(b, g, t, D, vf + t * Dp);
          for (int64_t d = D; d < Dp; ++d) key[d] = vf[t * Dp + d] = 0.0f;
        }
        transpose_keys(kblk, Dp, kt + t0, ld);
      }
      scores(qf, kt, G, Spb, D, ld, probs);
      softmax_numerators(probs, live, G, Sb, Spb, sc, z);
      weighted_values(probs, vf, live, z, G, Sb, Spb, Dp, acc);
      for (int64_t h = 0; h < G; ++h)
        for (int64_t d = 0; d < D; ++d)  // out is [B, 1, Hq, D]
          op[(b * Hq + g * G + h) * D + d] = static_cast<T>(acc[h * Dp + d]);
    }
  });
}

// The mask's pointer and batch stride (0 for a [1, S] mask), checked against S keys.
std::pair<const bool*, int64_t> mask_of(const c10::optional<at::Tensor>& mask, const at::Tensor& q, int64_t S) {
  if (!mask.has_value()) return {nullptr, 0};
  const at::Tensor& m = *mask;
  TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(1) == S && m.stride(1) == 1 &&
                  (m.size(0) == 1 || m.size(0) == q.size(0)),
              "quanta_cpu: mask must be bool [B or 1, S] with a contiguous last dimension");
  return {m.data_ptr<bool>(), m.size(0) == 1 ? 0 : m.stride(0)};
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "quanta_cpu: q, k, v must be [B, H, T, D]");
  TORCH_CHECK(q.size(2) == 1, "quanta_cpu: decode_attention takes one query token, got ", q.size(2));
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && k.size(2) >= 1,
              "quanta_cpu: k and v must be [B, Hkv, S >= 1, D] like q");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "quanta_cpu: query heads must be a multiple of key/value heads");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "quanta_cpu: q, k, v must share one dtype");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "quanta_cpu: the head dimension must be "
              "contiguous");
  const auto [mp, mstride] = mask_of(mask, q, k.size(2));
  at::Tensor out = at::empty({q.size(0), 1, q.size(1), q.size(3)}, q.options());
  const int64_t Hkv = k.size(1), S = k.size(2);
  switch (q.scalar_type()) {
    case at::kFloat: run<float>(q, PlainRows<float>(k), PlainRows<float>(v), Hkv, S, scale, mp, mstride, out); break;
    case at::kBFloat16:
      run<c10::BFloat16>(q, PlainRows<c10::BFloat16>(k), PlainRows<c10::BFloat16>(v), Hkv, S, scale, mp, mstride, out);
      break;
    case at::kHalf:
      run<c10::Half>(q, PlainRows<c10::Half>(k), PlainRows<c10::Half>(v), Hkv, S, scale, mp, mstride, out);
      break;
    default: TORCH_CHECK(false, "quanta_cpu: decode_attention takes float32, bfloat16 or float16, got ",
                         q.scalar_type());
  }
  return out;
}

// Keys and values as int8 codes [B, Hkv, S, D] (head dimension contiguous) with float32 scales [B, Hkv, S]: the
// attention over their dequantized values in q's dtype, read straight from the codes.
at::Tensor decode_attention_int8(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& ks, const at::Tensor& vc,
                                 const at::Tensor& vs, double scale, const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(q.dim() == 4 && kc.dim() == 4 && vc.dim() == 4, "quanta_cpu: q, k codes, v codes must be [B, H, T, D]");
  TORCH_CHECK(q.size(2) == 1, "quanta_cpu: decode_attention takes one query token, got ", q.size(2));
  TORCH_CHECK(kc.sizes() == vc.sizes() && kc.size(0) == q.size(0) && kc.size(3) == q.size(3) && kc.size(2) >= 1,
              "quanta_cpu: k and v codes must be [B, Hkv, S >= 1, D] like q");
  TORCH_CHECK(q.size(1) % kc.size(1) == 0, "quanta_cpu: query heads must be a multiple of key/value heads");
  TORCH_CHECK(kc.scalar_type() == at::kChar && vc.scalar_type() == at::kChar, "quanta_cpu: k and v codes must be int8");
  TORCH_CHECK(q.stride(3) == 1 && kc.stride(3) == 1 && vc.stride(3) == 1, "quanta_cpu: the head dimension must be "
              "contiguous");
  for (const at::Tensor* s : {&ks, &vs})
    TORCH_CHECK(s->scalar_type() == at::kFloat && s->dim() == 3 && s->sizes() == kc.sizes().slice(0, 3),
                "quanta_cpu: k and v scales must be float32 [B, Hkv, S]");
  const auto [mp, mstride] = mask_of(mask, q, kc.size(2));
  at::Tensor out = at::empty({q.size(0), 1, q.size(1), q.size(3)}, q.options());
  const int64_t Hkv = kc.size(1), S = kc.size(2);
  switch (q.scalar_type()) {
    case at::kFloat:
      run<float>(q, Int8Rows<float>(kc, ks), Int8Rows<float>(vc, vs), Hkv, S, scale, mp, mstride, out);
      break;
    case at::kBFloat16:
      run<c10::BFloat16>(q, Int8Rows<c10::BFloat16>(kc, ks), Int8Rows<c10::BFloat16>(vc, vs), Hkv, S, scale, mp,
                         mstride, out);
      break;
    case at::kHalf:
      run<c10::Half>(q, Int8Rows<c10::Half>(kc, ks), Int8Rows<c10::Half>(vc, vs), Hkv, S, scale, mp, mstride, out);
      break;
    default: TORCH_CHECK(false, "quanta_cpu: decode_attention_int8 takes a float32, bfloat16 or float16 query, got ",
                         q.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quanta_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale, Tensor? mask) -> Tensor");
  m.def("decode_attention_int8(Tensor q, Tensor k_codes, Tensor k_scales, Tensor v_codes, Tensor v_scales, "
        "float scale, Tensor? mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(quanta_cpu, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("decode_attention_int8", &decode_attention_int8);
}
