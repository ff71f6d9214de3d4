// quanta native affine kernels: one pass over memory for Q, DQ, QDQ and their backward.
//
// Plain C++ (no torch headers, so it compiles in seconds), called through ctypes.
// Numerics are exactly those of quanta/kernels/affine.py and the NumPy reference:
//   Q(x)  = clamp(nearbyint(x / s) - o, qmin, qmax)    (true division, ties to even)
//   DQ(q) = (q + o) * s
// in the compute type C (float or double); half/bfloat16 storage is converted to C and back
// with round-to-nearest-even, as torch's .to() does. Built with -ffp-contract=off and without
// -ffast-math, so every operation rounds as written.
//
// Layout: the input is contiguous and viewed as (P, S, B); element (p, s, b) uses scale[s].
// Gradient sums are computed over a partition that depends only on the shape, never on the
// thread count, and added in a fixed order, so they are deterministic.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

// ------------------------------------------------------------------------------------------ storage

struct F32 { using S = float; };
struct F64 { using S = double; };
struct F16 { using S = uint16_t; };
struct BF16 { using S = uint16_t; };

inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  // torch's float -> bfloat16: round to nearest even, NaN -> 0x7FC0 (branch-free, vectorizable)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t bias = ((u >> 16) & 1u) + 0x7FFFu;
  uint16_t r = static_cast<uint16_t>((u + bias) >> 16);
  return f != f ? static_cast<uint16_t>(0x7FC0) : r;
}

inline float f16_to_float(uint16_t v) {
#if defined(__F16C__)
  return _cvtsh_ss(v);
#else
  _Float16 h;
  std::memcpy(&h, &v, 2);
  return static_cast<float>(h);
#endif
}

inline uint16_t float_to_f16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  _Float16 h = static_cast<_Float16>(f);
  uint16_t v;
  std::memcpy(&v, &h, 2);
  return v;
#endif
}

// Convert n stored values to the compute type, and back.
template <class T, class C>
inline void load_tile(const typename T::S* __restrict src, C* __restrict dst, int64_t n) {
  if constexpr (std::is_same<T, F16>::value) {
    int64_t i = 0;
#if defined(__F16C__)
    if constexpr (std::is_same<C, float>::value) {
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
#endif
    for (; i < n; ++i) dst[i] = static_cast<C>(f16_to_float(src[i]));
  } else if constexpr (std::is_same<T, BF16>::value) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<C>(bf16_to_float(src[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<C>(src[i]);
  }
}

template <class T, class C>
inline void store_tile(const C* __restrict src, typename T::S* __restrict dst, int64_t n) {
  if constexpr (std::is_same<T, F16>::value) {
    int64_t i = 0;
#if defined(__F16C__)
    if constexpr (std::is_same<C, float>::value) {
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; ++i) dst[i] = float_to_f16(static_cast<float>(src[i]));
  } else if constexpr (std::is_same<T, BF16>::value) {
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(static_cast<float>(src[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<typename T::S>(src[i]);
  }
}

template <class T, class C>
constexpr bool kDirect = std::is_same<typename T::S, C>::value;

constexpr int64_t kTile = 1024;    // elements converted at a time for non-native storage
constexpr int64_t kChunk = 16384;  // elements per forward work item

// AMAX_FQ / AMAX_Q: TensorRT's amax convention; the scale s is a multiplier and the "offset" slot holds
// amax: q = clamp(nearbyint(x * s), qmin, qmax) * (amax > 2**-24 ? 1 : 0), fake = q / s,
// mask = |x| <= amax (the straight-through window).
enum Mode { QDQ = 0, Q = 1, DQ = 2, FLOAT_QDQ = 3, AMAX_FQ = 4, AMAX_Q = 5 };

// A float format for FLOAT_QDQ: round to nearest even at step 2**(clamp(floor(log2|v|), emin, emax) - m),
// saturate at +-fmax, NaN passes; no_neg_zero turns -0.0 into +0.0 (fnuz formats); ties_up: with 0
// mantissa bits a tie goes up to the next exponent (AIMET's grids) instead of to the even exponent.
struct Fmt {
  int emin = 0, emax = 0, mbits = 0;
  double fmax = 0.0;
  int no_neg_zero = 0;
  int ties_up = 0;
};

inline double pow2(int k) {  // exact 2**k for -1022 <= k <= 1023
  uint64_t b = static_cast<uint64_t>(k + 1023) << 52;
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

template <class C>
inline C float_cast(C v, const Fmt& f) {
  const double d = static_cast<double>(v);
  uint64_t b;
  std::memcpy(&b, &d, 8);
  int e = static_cast<int>((b >> 52) & 0x7FF) - 1023;  // floor(log2|d|) for normal d
  e = e < f.emin ? f.emin : (e > f.emax ? f.emax : e);
  const int k = e - f.mbits;
  const double t = d * pow2(-k);
  double rt = std::nearbyint(t);
  // with 0 mantissa bits a tie lies between two exponent codes: ties to even means the even code
  if (f.mbits == 0 && !f.ties_up && std::fabs(t) == 1.5 && ((e + 1 - f.emin) & 1) == 0) rt = t > 0 ? 1.0 : -1.0;
  double r = rt * pow2(k);
  r = r > f.fmax ? f.fmax : (r < -f.fmax ? -f.fmax : r);
  if (f.no_neg_zero) r = r == 0.0 ? 0.0 : r;
  return static_cast<C>(r);
}

// The same rounding for float inputs with integer arithmetic on the bit pattern (vectorizes):
// normal range: round-to-nearest-even of the float32 pattern to m mantissa bits (the carry runs
// into the exponent as it should); below the format's smallest normal, and below float32's (a
// subnormal pattern has no implicit bit to round at; formats with emin = -127, bias 128, reach
// there): (|v| + c) - c with c = 2**(emin - m + 23), whose float addition rounds |v| to a multiple of
// 2**(emin - m), ties even (for emin = -127 that is the step of [2**-127, 2**-126) too).
struct FmtF {
  uint32_t drop_bits, half_minus_1, keep_mask, nan_or_inf;
  float min_normal, magic, fmax;
  int no_neg_zero;
  explicit FmtF(const Fmt& f) {
    drop_bits = static_cast<uint32_t>(23 - f.mbits);
    half_minus_1 = drop_bits ? (1u << (drop_bits - 1)) - 1u : 0u;
    keep_mask = ~((1u << drop_bits) - 1u);
    nan_or_inf = 0x7F800000u;
    min_normal = static_cast<float>(pow2(f.emin < -126 ? -126 : f.emin));
    magic = static_cast<float>(pow2(f.emin - f.mbits + 23));
    fmax = static_cast<float>(f.fmax);
    no_neg_zero = f.no_neg_zero;
  }
};

inline float float_cast_f32(float v, const FmtF& f) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t lsb = f.drop_bits ? (a >> f.drop_bits) & 1u : 0u;
  const uint32_t rn = (a + f.half_minus_1 + lsb) & f.keep_mask;
  float normal;
  std::memcpy(&normal, &rn, 4);
  float av;
  std::memcpy(&av, &a, 4);
  const float sub = (av + f.magic) - f.magic;
  float r = av < f.min_normal ? sub : normal;
  r = r > f.fmax ? f.fmax : r;  // also +inf; a NaN pattern is restored below
  uint32_t ru;
  std::memcpy(&ru, &r, 4);
  ru |= sign;
  if (f.no_neg_zero) ru = (ru & 0x7FFFFFFFu) == 0u ? 0u : ru;
  ru = a > f.nan_or_inf ? u : ru;  // NaN stays NaN
  float out;
  std::memcpy(&out, &ru, 4);
  return out;
}

// ------------------------------------------------------------------------------------------ forward

// One run of n elements in the compute type; VEC: scale/offset per element, else one for the run.
template <class C, int MODE, bool VEC, bool MASK>
inline void fwd_compute(const C* __restrict x, C* __restrict y, uint8_t* __restrict mask, int64_t n,
                        const C* __restrict sp, const C* __restrict op, C qmin, C qmax, const Fmt& fmt) {
  const C s0 = sp[0], o0 = op[0];
  const FmtF fmtf(fmt);
  if constexpr (MODE == FLOAT_QDQ && std::is_same<C, float>::value) {
    if (fmt.mbits) {  // the bit-pattern path in a loop of its own, so that it vectorizes
      const float fm = static_cast<float>(fmt.fmax);
      for (int64_t i = 0; i < n; ++i) {
        const float s = VEC ? sp[i] : s0;
        const float v = x[i] / s;
        if (MASK) mask[i] = static_cast<uint8_t>(std::fabs(v) <= fm);
        y[i] = float_cast_f32(v, fmtf) * s;
      }
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const C s = VEC ? sp[i] : s0;
    const C o = VEC ? op[i] : o0;
    const C xv = x[i];
    if (MODE == AMAX_FQ || MODE == AMAX_Q) {
      const C v = std::nearbyint(xv * s);
      const C keep = o > C(5.9604644775390625e-08) ? C(1) : C(0);
      const C q = (v < qmin ? qmin : (v > qmax ? qmax : v)) * keep;
      if (MASK) mask[i] = static_cast<uint8_t>(std::fabs(xv) <= o);
      y[i] = MODE == AMAX_Q ? q : q / s;
    } else if (MODE == FLOAT_QDQ) {
      const C v = xv / s;
      if (MASK) mask[i] = static_cast<uint8_t>(std::fabs(v) <= static_cast<C>(fmt.fmax));
      // the bit-pattern rounding of float_cast_f32 needs mantissa bits to round into
      if constexpr (std::is_same<C, float>::value) y[i] = (fmt.mbits ? float_cast_f32(v, fmtf) : float_cast(v, fmt)) * s;
      else y[i] = float_cast(v, fmt) * s;
    } else if (MODE == DQ) {
      y[i] = (xv + o) * s;
    } else {
      const C v = std::nearbyint(xv / s) - o;
      if (MASK) mask[i] = static_cast<uint8_t>((v >= qmin) & (v <= qmax));
      const C q = v < qmin ? qmin : (v > qmax ? qmax : v);
      y[i] = MODE == Q ? q : (q + o) * s;
    }
  }
}

template <class T, class C, int MODE, bool VEC>
inline void fwd_run(const typename T::S* x, typename T::S* y, uint8_t* mask, int64_t n, const C* sp, const C* op,
                    C qmin, C qmax, const Fmt& fmt) {
  if constexpr (kDirect<T, C>) {
    if (mask) fwd_compute<C, MODE, VEC, true>(x, y, mask, n, sp, op, qmin, qmax, fmt);
    else fwd_compute<C, MODE, VEC, false>(x, y, nullptr, n, sp, op, qmin, qmax, fmt);
  } else {
    C xb[kTile], yb[kTile];
    for (int64_t off = 0; off < n; off += kTile) {
      const int64_t m = n - off < kTile ? n - off : kTile;
      load_tile<T, C>(x + off, xb, m);
      const C* s = VEC ? sp + off : sp;
      const C* o = VEC ? op + off : op;
      if (mask) fwd_compute<C, MODE, VEC, true>(xb, yb, mask + off, m, s, o, qmin, qmax, fmt);
      else fwd_compute<C, MODE, VEC, false>(xb, yb, nullptr, m, s, o, qmin, qmax, fmt);
      store_tile<T, C>(yb, y + off, m);
    }
  }
}

template <class T, class C, int MODE>
void forward(const typename T::S* x, typename T::S* y, uint8_t* mask, int64_t P, int64_t S, int64_t B,
             const C* sc, const C* of, C qmin, C qmax, int nthreads, const Fmt& fmt = Fmt()) {
  const int64_t n = P * S * B;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t e = c * kChunk;
    const int64_t end = e + kChunk < n ? e + kChunk : n;
    while (e < end) {
      if (B == 1) {  // the scale varies along the innermost dimension
        const int64_t s0 = e % S;
        int64_t len = S - s0;
        if (len > end - e) len = end - e;
        fwd_run<T, C, MODE, true>(x + e, y + e, mask ? mask + e : nullptr, len, sc + s0, of + s0, qmin, qmax, fmt);
        e += len;
      } else {  // a run of elements sharing one scale
        const int64_t s = (e / B) % S;
        int64_t len = B - e % B;
        if (len > end - e) len = end - e;
        fwd_run<T, C, MODE, false>(x + e, y + e, mask ? mask + e : nullptr, len, sc + s, of + s, qmin, qmax, fmt);
        e += len;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------ backward

constexpr int kLanes = 16;  // fixed lane count: sums are deterministic and vectorizable

// One element of the backward pass, branch-free. QDQ: straight-through estimator of fake
// quantization; Q: of quantization. Returns dx and the scale and offset terms.
template <class C, int MODE>
inline void bwd_elem(C g, C xv, C s, C o, C qmin, C qmax, C& dx, C& ds, C& dof) {
  const C xs = xv / s;
  const C r = std::nearbyint(xs);
  const C v = r - o;
  const bool below = v < qmin, above = v > qmax;
  const bool inside = (v >= qmin) & (v <= qmax);  // false for NaN, like below and above
  if (MODE == QDQ) {
    dx = inside ? g : C(0);
    C d = inside ? r - xs : C(0);
    d = below ? qmin + o : d;
    d = above ? qmax + o : d;
    ds = g * d;
    dof = (below | above) ? g * s : C(0);
  } else {
    const C gi = inside ? g : C(0);
    dx = gi / s;
    ds = gi != C(0) ? -gi * xs / s : C(0);
    dof = -gi;
  }
}

// Per-element backward of n elements (no reductions here, so the loop vectorizes).
template <class C, int MODE, bool DX, bool VEC>
inline void bwd_terms(const C* __restrict g, const C* __restrict x, C* __restrict dx, int64_t n,
                      const C* __restrict sp, const C* __restrict op, C qmin, C qmax, C* __restrict dsv,
                      C* __restrict dov) {
  const C s0 = sp[0], o0 = op[0];
  for (int64_t i = 0; i < n; ++i) {
    C d, ds, dof;
    bwd_elem<C, MODE>(g[i], x[i], VEC ? sp[i] : s0, VEC ? op[i] : o0, qmin, qmax, d, ds, dof);
    if (DX) dx[i] = d;
    dsv[i] = ds;
    dov[i] = dof;
  }
}

// n elements sharing one scale: dx, and per-lane sums of the scale/offset terms (lane = index mod 16).
template <class C, int MODE, bool DX>
inline void bwd_compute_const(const C* __restrict g, const C* __restrict x, C* __restrict dx, int64_t n, C s, C o,
                              C qmin, C qmax, double* __restrict acc_ds, double* __restrict acc_do) {
  C dsv[kTile], dov[kTile];
  for (int64_t off = 0; off < n; off += kTile) {
    const int64_t m = n - off < kTile ? n - off : kTile;
    bwd_terms<C, MODE, DX, false>(g + off, x + off, DX ? dx + off : nullptr, m, &s, &o, qmin, qmax, dsv, dov);
    for (int64_t i = m; i < (m + kLanes - 1) / kLanes * kLanes; ++i) dsv[i] = dov[i] = C(0);
    // lane sums within the tile in C (at most 64 terms each), then into the double accumulators
    C lane_ds[kLanes] = {0}, lane_do[kLanes] = {0};
    for (int64_t i = 0; i < m; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        lane_ds[j] += dsv[i + j];
        lane_do[j] += dov[i + j];
      }
    }
    for (int j = 0; j < kLanes; ++j) {
      acc_ds[j] += static_cast<double>(lane_ds[j]);
      acc_do[j] += static_cast<double>(lane_do[j]);
    }
  }
}

// n elements with per-element scales: dx, and sums into ds_out[i] / do_out[i].
template <class C, int MODE, bool DX>
inline void bwd_compute_vec(const C* __restrict g, const C* __restrict x, C* __restrict dx, int64_t n,
                            const C* __restrict s, const C* __restrict o, C qmin, C qmax, double* __restrict ds_out,
                            double* __restrict do_out) {
  C dsv[kTile], dov[kTile];
  for (int64_t off = 0; off < n; off += kTile) {
    const int64_t m = n - off < kTile ? n - off : kTile;
    bwd_terms<C, MODE, DX, true>(g + off, x + off, DX ? dx + off : nullptr, m, s + off, o + off, qmin, qmax, dsv,
                                 dov);
    for (int64_t i = 0; i < m; ++i) {
      ds_out[off + i] += static_cast<double>(dsv[i]);
      do_out[off + i] += static_cast<double>(dov[i]);
    }
  }
}

template <class T, class C, int MODE, bool DX>
inline void bwd_run_const(const typename T::S* g, const typename T::S* x, typename T::S* dx, int64_t n, C s, C o,
                          C qmin, C qmax, double* ds_sum, double* do_sum) {
  double acc_ds[kLanes] = {0}, acc_do[kLanes] = {0};
  if constexpr (kDirect<T, C>) {
    bwd_compute_const<C, MODE, DX>(g, x, dx, n, s, o, qmin, qmax, acc_ds, acc_do);
  } else {
    C gb[kTile], xb[kTile], db[kTile];
    for (int64_t off = 0; off < n; off += kTile) {
      const int64_t m = n - off < kTile ? n - off : kTile;
      load_tile<T, C>(g + off, gb, m);
      load_tile<T, C>(x + off, xb, m);
      bwd_compute_const<C, MODE, DX>(gb, xb, db, m, s, o, qmin, qmax, acc_ds, acc_do);
      if (DX) store_tile<T, C>(db, dx + off, m);
    }
  }
  double t_ds = 0.0, t_do = 0.0;
  for (int j = 0; j < kLanes; ++j) {
    t_ds += acc_ds[j];
    t_do += acc_do[j];
  }
  *ds_sum += t_ds;
  *do_sum += t_do;
}

template <class T, class C, int MODE, bool DX>
inline void bwd_run_vec(const typename T::S* g, const typename T::S* x, typename T::S* dx, int64_t n, const C* s,
                        const C* o, C qmin, C qmax, double* ds_out, double* do_out) {
  if constexpr (kDirect<T, C>) {
    bwd_compute_vec<C, MODE, DX>(g, x, dx, n, s, o, qmin, qmax, ds_out, do_out);
  } else {
    C gb[kTile], xb[kTile], db[kTile];
    for (int64_t off = 0; off < n; off += kTile) {
      const int64_t m = n - off < kTile ? n - off : kTile;
      load_tile<T, C>(g + off, gb, m);
      load_tile<T, C>(x + off, xb, m);
      bwd_compute_vec<C, MODE, DX>(gb, xb, db, m, s + off, o + off, qmin, qmax, ds_out + off, do_out + off);
      if (DX) store_tile<T, C>(db, dx + off, m);
    }
  }
}

// Elements (p in [p0, p1), s in [s0, s1), b in [b0, b1)); scale/offset terms added into acc[s].
template <class T, class C, int MODE, bool DX>
void bwd_block(const typename T::S* g, const typename T::S* x, typename T::S* dx, int64_t S, int64_t B,
               const C* sc, const C* of, C qmin, C qmax, int64_t p0, int64_t p1, int64_t s0, int64_t s1, int64_t b0,
               int64_t b1, double* ds_acc, double* do_acc) {
  for (int64_t p = p0; p < p1; ++p) {
    if (B == 1) {
      const int64_t e = p * S + s0;
      bwd_run_vec<T, C, MODE, DX>(g + e, x + e, DX ? dx + e : nullptr, s1 - s0, sc + s0, of + s0, qmin, qmax,
                                  ds_acc + s0, do_acc + s0);
      continue;
    }
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t e = (p * S + s) * B + b0;
      bwd_run_const<T, C, MODE, DX>(g + e, x + e, DX ? dx + e : nullptr, b1 - b0, sc[s], of[s], qmin, qmax,
                                    ds_acc + s, do_acc + s);
    }
  }
}

template <class T, class C, int MODE, bool DX>
void backward(const typename T::S* g, const typename T::S* x, typename T::S* dx, int64_t P, int64_t S, int64_t B,
              const C* sc, const C* of, C qmin, C qmax, double* ds_out, double* do_out, int nthreads) {
  // Partition by shape only (deterministic): rows of P, else ranges of S, else ranges of B.
  const int64_t kItems = 64;
  int strategy;
  int64_t items;
  if (P >= kItems) {
    strategy = 0;
    items = kItems;
    while (items > 1 && items * S > (int64_t(1) << 22)) items /= 2;  // bound the partial sums' memory
  } else if (S >= kItems) {
    strategy = 1;
    items = S < 256 ? S : 256;
  } else {
    strategy = 2;
    items = B < kItems ? B : kItems;
  }
  if (items < 1) items = 1;
  const bool partial = strategy != 1;
  std::vector<double> pds(partial ? items * S : 0, 0.0), pdo(partial ? items * S : 0, 0.0);
  for (int64_t s = 0; s < S; ++s) ds_out[s] = do_out[s] = 0.0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (items > 1 && P * S * B > 32768)
  for (int64_t k = 0; k < items; ++k) {
    if (strategy == 0) {
      bwd_block<T, C, MODE, DX>(g, x, dx, S, B, sc, of, qmin, qmax, k * P / items, (k + 1) * P / items, 0, S, 0,
                                B, pds.data() + k * S, pdo.data() + k * S);
    } else if (strategy == 1) {
      bwd_block<T, C, MODE, DX>(g, x, dx, S, B, sc, of, qmin, qmax, 0, P, k * S / items, (k + 1) * S / items, 0,
                                B, ds_out, do_out);
    } else {
      bwd_block<T, C, MODE, DX>(g, x, dx, S, B, sc, of, qmin, qmax, 0, P, 0, S, k * B / items,
                                (k + 1) * B / items, pds.data() + k * S, pdo.data() + k * S);
    }
  }
  if (partial) {
    for (int64_t k = 0; k < items; ++k) {
      for (int64_t s = 0; s < S; ++s) {
        ds_out[s] += pds[k * S + s];
        do_out[s] += pdo[k * S + s];
      }
    }
  }
}

// ------------------------------------------------------------------------------------------ dispatch

template <class T, class C>
void forward_mode(int mode, const void* x, void* y, uint8_t* mask, int64_t P, int64_t S, int64_t B, const void* sc,
                  const void* of, double qmin, double qmax, int nt) {
  using St = typename T::S;
  auto xs = static_cast<const St*>(x);
  auto ys = static_cast<St*>(y);
  auto s = static_cast<const C*>(sc);
  auto o = static_cast<const C*>(of);
  if (mode == QDQ) forward<T, C, QDQ>(xs, ys, mask, P, S, B, s, o, C(qmin), C(qmax), nt);
  else if (mode == Q) forward<T, C, Q>(xs, ys, mask, P, S, B, s, o, C(qmin), C(qmax), nt);
  else if (mode == AMAX_FQ) forward<T, C, AMAX_FQ>(xs, ys, mask, P, S, B, s, o, C(qmin), C(qmax), nt);
  else if (mode == AMAX_Q) forward<T, C, AMAX_Q>(xs, ys, mask, P, S, B, s, o, C(qmin), C(qmax), nt);
  else forward<T, C, DQ>(xs, ys, mask, P, S, B, s, o, C(qmin), C(qmax), nt);
}

template <class T, class C>
void backward_mode(int mode, const void* g, const void* x, void* dx, int64_t P, int64_t S, int64_t B,
                   const void* sc, const void* of, double qmin, double qmax, double* ds, double* dof, int nt) {
  using St = typename T::S;
  auto gs = static_cast<const St*>(g);
  auto xs = static_cast<const St*>(x);
  auto dxs = static_cast<St*>(dx);
  auto s = static_cast<const C*>(sc);
  auto o = static_cast<const C*>(of);
  const C lo = C(qmin), hi = C(qmax);
  if (mode == QDQ) {
    if (dxs) backward<T, C, QDQ, true>(gs, xs, dxs, P, S, B, s, o, lo, hi, ds, dof, nt);
    else backward<T, C, QDQ, false>(gs, xs, dxs, P, S, B, s, o, lo, hi, ds, dof, nt);
  } else {
    if (dxs) backward<T, C, Q, true>(gs, xs, dxs, P, S, B, s, o, lo, hi, ds, dof, nt);
    else backward<T, C, Q, false>(gs, xs, dxs, P, S, B, s, o, lo, hi, ds, dof, nt);
  }
}

// out[i] = mask[i] ? g[i] : +0, on the raw bits of 2-, 4- or 8-byte elements (the straight-through
// backward). torch.where on a bool mask branches per element and is several times slower.
template <class U>
void masked_copy(const U* __restrict g, const uint8_t* __restrict mask, U* __restrict out, int64_t n,
                        int nthreads) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (chunks > 1 && nthreads > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t e0 = c * kChunk, e1 = e0 + kChunk < n ? e0 + kChunk : n;
    for (int64_t i = e0; i < e1; ++i) out[i] = mask[i] ? g[i] : U(0);
  }
}

}  // namespace

extern "C" {

// dtype: 0 float32, 1 float64, 2 float16, 3 bfloat16 (storage); wide: compute in double.
int quanta_affine_forward(int mode, int dtype, int wide, const void* x, void* y, uint8_t* mask, int64_t P,
                          int64_t S, int64_t B, const void* sc, const void* of, double qmin, double qmax,
                          int nthreads) {
  if (dtype == 0 && !wide) forward_mode<F32, float>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else if (dtype == 0) forward_mode<F32, double>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else if (dtype == 1) forward_mode<F64, double>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else if (dtype == 2 && !wide) forward_mode<F16, float>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else if (dtype == 2) forward_mode<F16, double>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else if (dtype == 3 && !wide) forward_mode<BF16, float>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else if (dtype == 3) forward_mode<BF16, double>(mode, x, y, mask, P, S, B, sc, of, qmin, qmax, nthreads);
  else return 1;
  return 0;
}

// The constants of one prepared forward call (quanta.kernels.native.Bound): a call through ctypes then
// converts five arguments instead of fourteen, about a microsecond less per call.
struct AffineArgs {
  int32_t mode, dtype, wide, unused;
  int64_t P, S, B;
  const void* sc;
  const void* of;
  double qmin, qmax;
};

int quanta_affine_forward_bound(const AffineArgs* a, const void* x, void* y, uint8_t* mask, int nthreads) {
  return quanta_affine_forward(a->mode, a->dtype, a->wide, x, y, mask, a->P, a->S, a->B, a->sc, a->of, a->qmin,
                               a->qmax, nthreads);
}

int quanta_affine_backward(int mode, int dtype, int wide, const void* g, const void* x, void* dx, int64_t P,
                           int64_t S, int64_t B, const void* sc, const void* of, double qmin, double qmax,
                           double* ds, double* dof, int nthreads) {
  if (dtype == 0 && !wide) backward_mode<F32, float>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else if (dtype == 0) backward_mode<F32, double>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else if (dtype == 1) backward_mode<F64, double>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else if (dtype == 2 && !wide) backward_mode<F16, float>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else if (dtype == 2) backward_mode<F16, double>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else if (dtype == 3 && !wide) backward_mode<BF16, float>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else if (dtype == 3) backward_mode<BF16, double>(mode, g, x, dx, P, S, B, sc, of, qmin, qmax, ds, dof, nthreads);
  else return 1;
  return 0;
}

// Float fake quantization cast(x / s) * s, computed in float (double for float64 storage).
int quanta_float_forward(int dtype, const void* x, void* y, uint8_t* mask, int64_t P, int64_t S, int64_t B,
                         const void* sc, int emin, int emax, int mbits, double fmax, int flags, int nthreads) {
  // flags: bit 0 no_neg_zero, bit 1 ties_up (see Fmt)
  Fmt f;
  f.emin = emin;
  f.emax = emax;
  f.mbits = mbits;
  f.fmax = fmax;
  f.no_neg_zero = flags & 1;
  f.ties_up = (flags >> 1) & 1;
  if (dtype == 0) {
    auto s = static_cast<const float*>(sc);
    forward<F32, float, FLOAT_QDQ>(static_cast<const float*>(x), static_cast<float*>(y), mask, P, S, B, s, s, 0.f,
                                   0.f, nthreads, f);
  } else if (dtype == 1) {
    auto s = static_cast<const double*>(sc);
    forward<F64, double, FLOAT_QDQ>(static_cast<const double*>(x), static_cast<double*>(y), mask, P, S, B, s, s,
                                    0.0, 0.0, nthreads, f);
  } else if (dtype == 2 || dtype == 3) {
    auto s = static_cast<const float*>(sc);
    auto xs = static_cast<const uint16_t*>(x);
    auto ys = static_cast<uint16_t*>(y);
    if (dtype == 2) forward<F16, float, FLOAT_QDQ>(xs, ys, mask, P, S, B, s, s, 0.f, 0.f, nthreads, f);
    else forward<BF16, float, FLOAT_QDQ>(xs, ys, mask, P, S, B, s, s, 0.f, 0.f, nthreads, f);
  } else {
    return 1;
  }
  return 0;
}

int quanta_masked_copy(int element_size, const void* g, const uint8_t* mask, void* out, int64_t n, int nthreads) {
  if (element_size == 2) masked_copy(static_cast<const uint16_t*>(g), mask, static_cast<uint16_t*>(out), n, nthreads);
  else if (element_size == 4) masked_copy(static_cast<const uint32_t*>(g), mask, static_cast<uint32_t*>(out), n, nthreads);
  else if (element_size == 8) masked_copy(static_cast<const uint64_t*>(g), mask, static_cast<uint64_t*>(out), n, nthreads);
  else return 1;
  return 0;
}

int quanta_abi_version() { return 9; }

}  // extern "C"
