// quanta's CPU decode attention: one query token against a key/value cache, grouped-query heads, and an optional
// boolean key mask per batch row (True: attend).
//
// Built with csrc/int_linear.cpp into the same extension (quanta.kernels.int_linear_native), registered as
// torch.ops.quanta_cpu.decode_attention. For batch row b and key/value head g, the G = Hq / Hkv query heads
// h = g G .. g G + G - 1 read the same keys and values once:
//   s[h][t] = scale * sum_d q[h][d] k[t][d]             (float32; 16 partial sums over d, then added in order;
//                                                         -inf where the mask is False: p = 0, k and v not read)
//   p[h][t] = exp(s[h][t] - max_t s[h][t]),  Z[h] = sum_t p[h][t]  (in increasing t)
//   out[h][d] = (sum_t p[h][t] v[t][d]) / Z[h]         (in increasing t), rounded once to the input dtype.
// torch's own scaled_dot_product_attention spends 0.2-0.5 ms a call on this shape (one query row, a few hundred
// keys), more than the layer's weights take to stream; this takes tens of microseconds.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline void load_row(const T* src, int64_t D, float* dst) {
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]);
}

// sum_d a[d] b[d] in 16 partial sums (vectorisable without reassociation), added in order
inline float dot16(const float* a, const float* b, int64_t D) {
  float part[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int l = 0; l < 16; ++l) part[l] += a[d + l] * b[d + l];
  for (int l = 0; d < D; ++d, ++l) part[l] += a[d] * b[d];
  float s = 0.0f;
  for (int l = 0; l < 16; ++l) s += part[l];
  return s;
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, const bool* mask,
         int64_t mask_batch_stride, at::Tensor& out) {
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t G = Hq / Hkv;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), row(D), scores(G * S), acc(G * D);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      for (int64_t h = 0; h < G; ++h)
        load_row(qp + b * q.stride(0) + (g * G + h) * q.stride(1), D, qf.data() + h * D);
      const T* kb = kp + b * k.stride(0) + g * k.stride(1);
      const bool* mb = mask ? mask + b * mask_batch_stride : nullptr;
      for (int64_t t = 0; t < S; ++t) {
        if (mb && !mb[t]) {
          for (int64_t h = 0; h < G; ++h) scores[h * S + t] = -std::numeric_limits<float>::infinity();
          continue;
        }
        load_row(kb + t * k.stride(2), D, row.data());
        for (int64_t h = 0; h < G; ++h) scores[h * S + t] = sc * dot16(qf.data() + h * D, row.data(), D);
      }
      std::vector<float> z(G, 0.0f);
      for (int64_t h = 0; h < G; ++h) {
        float* s = scores.data() + h * S;
        const float mx = *std::max_element(s, s + S);
        for (int64_t t = 0; t < S; ++t) {
          s[t] = std::exp(s[t] - mx);
          z[h] += s[t];
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      const T* vb = vp + b * v.stride(0) + g * v.stride(1);
      for (int64_t t = 0; t < S; ++t) {
        if (mb && !mb[t]) continue;
        load_row(vb + t * v.stride(2), D, row.data());
        for (int64_t h = 0; h < G; ++h) {
          const float p = scores[h * S + t];
          float* a = acc.data() + h * D;
          for (int64_t d = 0; d < D; ++d) a[d] += p * row[d];
        }
      }
      for (int64_t h = 0; h < G; ++h)
        for (int64_t d = 0; d < D; ++d)  // out is [B, 1, Hq, D]
          op[(b * Hq + g * G + h) * D + d] = static_cast<T>(acc[h * D + d] / z[h]);
    }
  });
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
  const bool* mp = nullptr;
  int64_t mstride = 0;
  if (mask.has_value()) {
    const at::Tensor& m = *mask;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(1) == k.size(2) && m.stride(1) == 1 &&
                    (m.size(0) == 1 || m.size(0) == q.size(0)),
                "quanta_cpu: mask must be bool [B or 1, S] with a contiguous last dimension");
    mp = m.data_ptr<bool>();
    mstride = m.size(0) == 1 ? 0 : m.stride(0);
  }
  at::Tensor out = at::empty({q.size(0), 1, q.size(1), q.size(3)}, q.options());
  switch (q.scalar_type()) {
    case at::kFloat: run<float>(q, k, v, scale, mp, mstride, out); break;
    case at::kBFloat16: run<c10::BFloat16>(q, k, v, scale, mp, mstride, out); break;
    case at::kHalf: run<c10::Half>(q, k, v, scale, mp, mstride, out); break;
    default: TORCH_CHECK(false, "quanta_cpu: decode_attention takes float32, bfloat16 or float16, got ",
                         q.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quanta_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale, Tensor? mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(quanta_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
