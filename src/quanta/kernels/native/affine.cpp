// quanta native affine kernels: one pass over memory for Q, DQ, QDQ and their backward.
//
// Plain C++ (no torch headers, so it compiles in about a second), called through ctypes.
// Numerics are exactly those of quanta/kernels/affine.py and the NumPy reference:
//   Q(x)  = clamp(nearbyint(x / s) - o, qmin, qmax)    (true division, ties to even)
//   DQ(q) = (q + o) * s
// in the compute type C (float or double), storage converted with round-to-nearest-even.
// Built with -ffp-contract=off and without -ffast-math, so every operation rounds as written.
//
// Layout: the input is contiguous and viewed as (P, S, B); element (p, s, b) uses scale[s].
// Gradient sums are computed over a partition that depends only on the shape, never on the
// thread count, and added in a fixed order, so they are deterministic.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

struct F32 {
  using S = float;
  static inline float load(float v) { return v; }
  template <class C> static inline float store(C v) { return static_cast<float>(v); }
};
struct F64 {
  using S = double;
  static inline double load(double v) { return v; }
  template <class C> static inline double store(C v) { return static_cast<double>(v); }
};
struct F16 {
  using S = _Float16;
  static inline float load(_Float16 v) { return static_cast<float>(v); }
  template <class C> static inline _Float16 store(C v) { return static_cast<_Float16>(v); }
};
struct BF16 {
  using S = uint16_t;
  static inline float load(uint16_t v) {
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static inline uint16_t from_float(float f) {
    // torch's float -> bfloat16: round to nearest even, NaN -> 0x7FC0
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (f != f) return 0x7FC0;
    uint32_t bias = ((u >> 16) & 1u) + 0x7FFFu;
    return static_cast<uint16_t>((u + bias) >> 16);
  }
  template <class C> static inline uint16_t store(C v) { return from_float(static_cast<float>(v)); }
};

enum Mode { QDQ = 0, Q = 1, DQ = 2 };

constexpr int64_t kChunk = 16384;  // elements per forward work item

template <class T, class C, int MODE>
static inline void fwd_const(const typename T::S* __restrict x, typename T::S* __restrict y,
                             uint8_t* __restrict mask, int64_t n, C s, C o, C qmin, C qmax) {
  for (int64_t i = 0; i < n; ++i) {
    C xv = static_cast<C>(T::load(x[i]));
    C out;
    if (MODE == DQ) {
      out = (xv + o) * s;
    } else {
      C v = std::nearbyint(xv / s) - o;
      if (mask) mask[i] = (v >= qmin) & (v <= qmax);
      C q = v < qmin ? qmin : (v > qmax ? qmax : v);
      out = MODE == Q ? q : (q + o) * s;
    }
    y[i] = T::store(out);
  }
}

template <class T, class C, int MODE>
static inline void fwd_vec(const typename T::S* __restrict x, typename T::S* __restrict y,
                           uint8_t* __restrict mask, int64_t n, const C* __restrict s,
                           const C* __restrict o, C qmin, C qmax) {
  for (int64_t i = 0; i < n; ++i) {
    C xv = static_cast<C>(T::load(x[i]));
    C out;
    if (MODE == DQ) {
      out = (xv + o[i]) * s[i];
    } else {
      C v = std::nearbyint(xv / s[i]) - o[i];
      if (mask) mask[i] = (v >= qmin) & (v <= qmax);
      C q = v < qmin ? qmin : (v > qmax ? qmax : v);
      out = MODE == Q ? q : (q + o[i]) * s[i];
    }
    y[i] = T::store(out);
  }
}

template <class T, class C, int MODE>
void forward(const typename T::S* x, typename T::S* y, uint8_t* mask, int64_t P, int64_t S, int64_t B,
             const C* sc, const C* of, C qmin, C qmax, int nthreads) {
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
        fwd_vec<T, C, MODE>(x + e, y + e, mask ? mask + e : nullptr, len, sc + s0, of + s0, qmin, qmax);
        e += len;
      } else {  // a run of elements sharing one scale
        const int64_t b0 = e % B;
        const int64_t s = (e / B) % S;
        int64_t len = B - b0;
        if (len > end - e) len = end - e;
        fwd_const<T, C, MODE>(x + e, y + e, mask ? mask + e : nullptr, len, sc[s], of[s], qmin, qmax);
        e += len;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------ backward

constexpr int kLanes = 16;  // fixed lane count: sums are deterministic and vectorizable

struct Acc {
  double ds[kLanes];
  double dof[kLanes];
  void zero() {
    for (int j = 0; j < kLanes; ++j) ds[j] = dof[j] = 0.0;
  }
  double sum_ds() const {
    double t = 0.0;
    for (int j = 0; j < kLanes; ++j) t += ds[j];
    return t;
  }
  double sum_do() const {
    double t = 0.0;
    for (int j = 0; j < kLanes; ++j) t += dof[j];
    return t;
  }
};

// One element of the backward pass. MODE QDQ: straight-through estimator of fake quantization;
// MODE Q: of quantization. Writes dx, returns the scale and offset terms.
template <class C, int MODE>
static inline void bwd_elem(C g, C xv, C s, C o, C qmin, C qmax, C& dx, C& ds, C& dof) {
  C xs = xv / s;
  C r = std::nearbyint(xs);
  C v = r - o;
  bool below = v < qmin, above = v > qmax;
  bool inside = (v >= qmin) & (v <= qmax);
  if (MODE == QDQ) {
    dx = inside ? g : C(0);
    C d = inside ? r - xs : (below ? qmin + o : (above ? qmax + o : C(0)));
    ds = g * d;
    dof = (below | above) ? g * s : C(0);
  } else {
    C gi = inside ? g : C(0);
    dx = gi / s;
    ds = gi != C(0) ? -gi * xs / s : C(0);
    dof = -gi;
  }
}

template <class T, class C, int MODE>
static inline void bwd_const(const typename T::S* __restrict g, const typename T::S* __restrict x,
                             typename T::S* __restrict dx, int64_t n, C s, C o, C qmin, C qmax, Acc& acc) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      C d, ds, dof;
      bwd_elem<C, MODE>(static_cast<C>(T::load(g[i + j])), static_cast<C>(T::load(x[i + j])), s, o, qmin,
                        qmax, d, ds, dof);
      if (dx) dx[i + j] = T::store(d);
      acc.ds[j] += static_cast<double>(ds);
      acc.dof[j] += static_cast<double>(dof);
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    C d, ds, dof;
    bwd_elem<C, MODE>(static_cast<C>(T::load(g[i])), static_cast<C>(T::load(x[i])), s, o, qmin, qmax, d, ds,
                      dof);
    if (dx) dx[i] = T::store(d);
    acc.ds[j] += static_cast<double>(ds);
    acc.dof[j] += static_cast<double>(dof);
  }
}

template <class T, class C, int MODE>
static inline void bwd_vec(const typename T::S* __restrict g, const typename T::S* __restrict x,
                           typename T::S* __restrict dx, int64_t n, const C* __restrict s, const C* __restrict o,
                           C qmin, C qmax, double* __restrict ds_out, double* __restrict do_out) {
  for (int64_t i = 0; i < n; ++i) {
    C d, ds, dof;
    bwd_elem<C, MODE>(static_cast<C>(T::load(g[i])), static_cast<C>(T::load(x[i])), s[i], o[i], qmin, qmax, d,
                      ds, dof);
    if (dx) dx[i] = T::store(d);
    ds_out[i] += static_cast<double>(ds);
    do_out[i] += static_cast<double>(dof);
  }
}

// Process the elements (p in [p0, p1), s in [s0, s1), b in [b0, b1)), adding scale/offset terms
// into ds_acc[s] / do_acc[s] (arrays of length S).
template <class T, class C, int MODE>
static void bwd_block(const typename T::S* g, const typename T::S* x, typename T::S* dx, int64_t S, int64_t B,
                      const C* sc, const C* of, C qmin, C qmax, int64_t p0, int64_t p1, int64_t s0, int64_t s1,
                      int64_t b0, int64_t b1, double* ds_acc, double* do_acc) {
  for (int64_t p = p0; p < p1; ++p) {
    if (B == 1) {
      const int64_t e = p * S + s0;
      bwd_vec<T, C, MODE>(g + e, x + e, dx ? dx + e : nullptr, s1 - s0, sc + s0, of + s0, qmin, qmax,
                          ds_acc + s0, do_acc + s0);
      continue;
    }
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t e = (p * S + s) * B + b0;
      Acc acc;
      acc.zero();
      bwd_const<T, C, MODE>(g + e, x + e, dx ? dx + e : nullptr, b1 - b0, sc[s], of[s], qmin, qmax, acc);
      ds_acc[s] += acc.sum_ds();
      do_acc[s] += acc.sum_do();
    }
  }
}

template <class T, class C, int MODE>
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
      bwd_block<T, C, MODE>(g, x, dx, S, B, sc, of, qmin, qmax, k * P / items, (k + 1) * P / items, 0, S, 0, B,
                            pds.data() + k * S, pdo.data() + k * S);
    } else if (strategy == 1) {
      bwd_block<T, C, MODE>(g, x, dx, S, B, sc, of, qmin, qmax, 0, P, k * S / items, (k + 1) * S / items, 0, B,
                            ds_out, do_out);
    } else {
      bwd_block<T, C, MODE>(g, x, dx, S, B, sc, of, qmin, qmax, 0, P, 0, S, k * B / items, (k + 1) * B / items,
                            pds.data() + k * S, pdo.data() + k * S);
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
  if (mode == QDQ) backward<T, C, QDQ>(gs, xs, dxs, P, S, B, s, o, C(qmin), C(qmax), ds, dof, nt);
  else backward<T, C, Q>(gs, xs, dxs, P, S, B, s, o, C(qmin), C(qmax), ds, dof, nt);
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

int quanta_abi_version() { return 1; }

}  // extern "C"
