// quanta's CPU integer-weight linear kernels, on torch's own thread pool (at::parallel_for).
//
// Built at first use by quanta.kernels.int_linear_native (torch.utils.cpp_extension) and registered as
// torch.ops.quanta_cpu.*. Three recipes:
//
//   int8 weight-only   y[m,n] = S(x[m,:], q[n,:]) * s[n] + b[n]        q int8 [N, K] row-major, s bf16 [N]
//   int4 weight-only   y[m,n] = S(x[m,:], w[n,:]) + b[n],  w[n,k] = fma(c[n,k] - 8, s[g,n], z[g,n])
//                      c uint4 in tiles of 16 rows [ceil(N/16), Kp/8, 64] (see below), (s, z) bf16
//                      [ceil(N/16), ceil(K/G), 2, 16]
//   int8 dynamic       y[m,n] = ((float)(A[m,n]) * sx[m]) * sw[n] + b[n],
//                      A = sum_k qx[m,k] q[n,k] - zx[m] * colsum[n]  (exact int32)
//
// S(x, w) follows one fixed summation order per path, the same on every instruction set (AVX-512, AVX2,
// portable C++), so the three give the same bits (tested). x is widened to float32 exactly (fp32/bf16/fp16
// in) and the weights are their exact dequantized float32 values.
//  int8 decode GEMV (M < 8): k is split into 16 lanes (lane l takes k = 16c + l, c = 0, 1, ...), each lane
//    accumulates acc = fma(x_k, w_k, acc) in increasing k, and the 16 lanes are added by the tree
//    t8[i] = a[i] + a[i+8], t4[i] = t8[i] + t8[i+4], t2[i] = t4[i] + t4[i+2], t1 = t2[0] + t2[1].
//  int4 decode GEMV (M < 8): two chains a_j = fma(x_k, w_k, a_j) over the k = j mod 2 in increasing order
//    (from 0), y = a_0 + a_1; each vector lane is a weight row (16 rows of a tile at once).
//  prefill GEMM (M >= 8): one chain y = fma(x_k, w_k, y) over k = 0 .. K-1 per output.
// Padding (k >= K) adds x = 0 times a finite weight, which changes nothing. The output is rounded once, to the
// output dtype, after scale and bias.
//
// int4 packing: tile t holds rows 16t .. 16t+15 as Kp/8 lines of 64 bytes (Kp = K rounded up to 64); line l holds
// k = 8l .. 8l+7, row r in the 32-bit word at byte 4r: bits 4j..4j+3 the code of k = 8l + 2j, bits 16+4j..16+4j+3
// that of k = 8l + 2j + 1 (j = 0..3). So one 64-byte load gives a word per row, a 32-bit shift by 4j (by 16+4j)
// brings the codes of k = 8l + 2j (8l + 2j + 1) of the 16 rows to the low bits of their lanes, and a 16-bit
// shift by 4j brings the pair (8l + 2j, 8l + 2j + 1) of each row to its two 16-bit halves (vdpbf16ps's layout).
// A thread reads its tiles as one sequential stream. Padding codes are 8, padding rows' (s, z) are 0.
//
// Threads: every kernel runs inside at::parallel_for (torch's intra-op pool: torch's own OpenMP runtime,
// linked from torch's lib directory), handing out tiles of output rows through an atomic counter so that a
// thread descheduled by another process does not hold up a fixed share of the work.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

constexpr int kAbiVersion = 5;

// ------------------------------------------------------------------------------------------------ ISA
// AVX512_BF16: AVX-512 plus vdpbf16ps; the bfloat16-activation paths below use it (their own order), every other
// case runs the AVX-512 code.
enum Isa : int64_t { PORTABLE = 0, AVX2 = 1, AVX512 = 2, AVX512_BF16 = 3 };

int64_t detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return __builtin_cpu_supports("avx512bf16") ? AVX512_BF16 : AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
  return PORTABLE;
}

const int64_t kCpuIsa = detect_isa();
std::atomic<int64_t> g_isa_limit{AVX512_BF16};

int64_t active_isa() { return std::min<int64_t>(kCpuIsa, g_isa_limit.load(std::memory_order_relaxed)); }

// ------------------------------------------------------------------------------------------------ helpers
// Loops over a kernel's register block (template constants) are unrolled before GCC decides where the block's
// accumulator arrays live: left to its later unrolling, it kept them on the stack too, storing every
// accumulator after each multiply-add (seen in the disassembly of the int8 dynamic and prefill kernels).
#define QUANTA_UNROLL _Pragma("GCC unroll 16")

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The lane tree of one 16-lane accumulator (the portable definition every path follows).
inline float tree16(const float* a) {
  float t8[8], t4[4], t2[2];
  for (int i = 0; i < 8; ++i) t8[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  for (int i = 0; i < 2; ++i) t2[i] = t4[i] + t4[i + 2];
  return t2[0] + t2[1];
}

inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Hand out [begin, end) in tiles to torch's intra-op threads; each thread takes the next free tile.
template <typename F>
void parallel_tiles(int64_t ntiles, const F& fn) {
  if (ntiles <= 0) return;
  const int64_t nthreads = std::min<int64_t>(at::get_num_threads(), ntiles);
  if (nthreads <= 1) {
    for (int64_t t = 0; t < ntiles; ++t) fn(t);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, nthreads, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      for (int64_t t = next.fetch_add(1); t < ntiles; t = next.fetch_add(1)) fn(t);
    }
  });
}

// The same, for streaming kernels (decode: each weight byte read once, from DRAM): thread w owns a contiguous run
// of tiles and takes them in order, so that its reads form one sequential stream the prefetchers can follow; a
// thread that runs out takes the last free tile of another's run (so one descheduled thread still holds up
// only a tile). A run's [front, back) lives in one 64-bit word, changed by compare-and-swap.
template <typename F>
void parallel_runs(int64_t ntiles, const F& fn) {
  if (ntiles <= 0) return;
  const int64_t nthreads = std::min<int64_t>({at::get_num_threads(), ntiles, 64});
  if (nthreads <= 1) {
    for (int64_t t = 0; t < ntiles; ++t) fn(t);
    return;
  }
  std::vector<std::atomic<uint64_t>> runs(static_cast<size_t>(nthreads));
  for (int64_t w = 0; w < nthreads; ++w) {
    const auto lo = static_cast<uint64_t>(ntiles * w / nthreads);
    const auto hi = static_cast<uint64_t>(ntiles * (w + 1) / nthreads);
    runs[w].store(lo << 32 | hi);
  }
  at::parallel_for(0, nthreads, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      for (int64_t i = 0; i < nthreads; ++i) {
        std::atomic<uint64_t>& run = runs[(w + i) % nthreads];
        const bool own = i == 0;
        uint64_t v = run.load();
        while (true) {
          const uint64_t lo = v >> 32, hi = v & 0xFFFFFFFFu;
          if (lo >= hi) break;
          const uint64_t next = own ? ((lo + 1) << 32 | hi) : (lo << 32 | (hi - 1));
          if (run.compare_exchange_weak(v, next)) {
            fn(static_cast<int64_t>(own ? lo : hi - 1));
            v = run.load();
          }
        }
      }
    }
  });
}

// The weight rows [n0, n1) of a tile in blocks of rmax <= 16: fn(nb, R, rows) with R the block's own rows. A
// partial block runs full width on repeated rows (the kernels keep their register layout; the extra results are
// dropped).
template <typename F>
inline void for_row_blocks(int64_t n0, int64_t n1, int rmax, const F& fn) {
  for (int64_t nb = n0; nb < n1; nb += rmax) {
    int64_t rows[16];
    const int R = static_cast<int>(std::min<int64_t>(rmax, n1 - nb));
    for (int r = 0; r < rmax; ++r) rows[r] = nb + std::min(r, R - 1);
    fn(nb, R, rows);
  }
}

// Decode reads each weight byte once, from DRAM, R rows in step; the hardware prefetchers alone reach about half
// the machine's read bandwidth on that pattern (measured: 11 vs 23 GB/s on 2 Zen 4 cores). So each load also
// asks for the same bytes of the next block of rows (`ahead` bytes on: the thread's next rows, see
// parallel_runs), into L2: a prefetch into L1 holds one of L1's few miss buffers and gained nothing.
inline void prefetch_next_rows(const void* p, int64_t ahead) {
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T1);
}

enum OutKind { OUT_F32 = 0, OUT_BF16 = 1, OUT_F16 = 2 };

OutKind out_kind(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return OUT_F32;
    case at::kBFloat16: return OUT_BF16;
    case at::kHalf: return OUT_F16;
    default: TORCH_CHECK(false, "quanta_cpu: x must be float32, bfloat16 or float16, got ", t);
  }
}

inline void store_out(void* out, int64_t idx, float v, OutKind kind) {
  switch (kind) {
    case OUT_F32: static_cast<float*>(out)[idx] = v; break;
    case OUT_BF16: static_cast<c10::BFloat16*>(out)[idx] = c10::BFloat16(v); break;
    case OUT_F16: static_cast<c10::Half*>(out)[idx] = c10::Half(v); break;
  }
}

// A 64-byte aligned float buffer (full-width vector loads never straddle two cache lines).
class AlignedFloats {
 public:
  float* data() { return ptr_; }
  const float* data() const { return ptr_; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    raw_.assign(n + 16, 0.0f);
    const auto addr = reinterpret_cast<uintptr_t>(raw_.data());
    ptr_ = raw_.data() + ((64 - addr % 64) % 64) / sizeof(float);
    cap_ = n;
  }
  void zero(size_t n) {
    reserve(n);
    std::memset(ptr_, 0, n * sizeof(float));
  }

 private:
  std::vector<float> raw_;
  float* ptr_ = nullptr;
  size_t cap_ = 0;
};

// Row stride of the float32 buffers: a row of Kp plus one cache line, so that rows 4 KiB apart do not all
// fall into the same L1 sets.
inline int64_t row_ld(int64_t Kp) { return Kp + 16; }

// x [M, K] (fp32/bf16/fp16, contiguous) -> float32 [M, row_ld(Kp)], zero padded, exact.
AlignedFloats widen_x(const at::Tensor& x, int64_t Kp) {
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t ld = row_ld(Kp);
  AlignedFloats xf;
  xf.zero(static_cast<size_t>(M * ld));
  const auto kind = out_kind(x.scalar_type());
  const void* src = x.data_ptr();
  at::parallel_for(0, M, std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1)), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      float* d = xf.data() + m * ld;
      if (kind == OUT_F32) {
        std::memcpy(d, static_cast<const float*>(src) + m * K, K * sizeof(float));
      } else if (kind == OUT_BF16) {
        const uint16_t* s = static_cast<const uint16_t*>(src) + m * K;
        for (int64_t k = 0; k < K; ++k) d[k] = bf16_to_float(s[k]);
      } else {
        const c10::Half* s = static_cast<const c10::Half*>(src) + m * K;
        for (int64_t k = 0; k < K; ++k) d[k] = static_cast<float>(s[k]);
      }
    }
  });
  return xf;
}

// ------------------------------------------------------------------------------------------------ weights
// A weight source gives, for row n and 16-lane chunk c (k = 16c .. 16c+15), the 16 float weights.
struct Int8Rows {
  const int8_t* w;  // [N, K]
  int64_t K;
};

struct Int4Rows {
  const uint8_t* p;    // [ceil(N/16), Kp/8, 64]
  const uint16_t* sz;  // bf16 [ceil(N/16), G, 2, 16]
  int64_t K, N, nlines, group, ngroups;  // nlines = Kp/8 a tile
  int gshift;          // log2(group)
  const uint8_t* tile(int64_t t) const { return p + t * nlines * 64; }
  int64_t group_of(int64_t k) const { return std::min<int64_t>(k >> gshift, ngroups - 1); }
  // the lines of group g in a tile (the last group also takes the padding up to Kp)
  int64_t line_begin(int64_t g) const { return g * (group / 8); }
  int64_t line_end(int64_t g) const { return g == ngroups - 1 ? nlines : (g + 1) * (group / 8); }
  // the 16 scales (which = 0) or zeros (which = 1) of tile t, group g
  const uint16_t* sz16(int64_t t, int64_t g, int which) const { return sz + ((t * ngroups + g) * 2 + which) * 16; }
  int code(int64_t n, int64_t k) const {
    uint32_t u;
    std::memcpy(&u, tile(n / 16) + (k / 8) * 64 + 4 * (n % 16), 4);
    const int i = static_cast<int>(k % 8);
    return static_cast<int>((u >> ((i & 1) * 16 + (i >> 1) * 4)) & 15u);
  }
  // w[n, k] = fma(c - 8, s, z), the dequantized weight every path uses
  float weight(int64_t n, int64_t k) const {
    const int64_t g = group_of(k);
    return std::fma(static_cast<float>(code(n, k) - 8), bf16_to_float(sz16(n / 16, g, 0)[n % 16]),
                    bf16_to_float(sz16(n / 16, g, 1)[n % 16]));
  }
};

// How far ahead (bytes) an int4 decode tile asks for its codes, into L2, and for its (scale, zero) lines (a quarter
// of that: the same groups ahead at groups of 32). A thread's tiles follow each other in memory (parallel_runs), so
// this runs on into its next tile. Measured on issue 17's model's 113 int4 GEMVs a token (2 Zen 4 cores, the
// model's own huge-page storage, alternating in one process, each round beside torch's `sum` for the read
// bandwidth of the moment), against the 1 KiB and no (scale, zero) prefetch of before:
// * the bfloat16 tile (AVX512-BF16), four runs of 60-150 rounds: at 51-54 GB/s 12-13.5 % less time a token at
//   groups of 32 and 9-10 % less at 128; at 30-36 GB/s (other tenants' traffic) from 3 % more to 7.5 % less (32)
//   and 2-8 % less (128); a compiled decode step 12 % (32) and 7.5-9 % (128) less at 51-54 GB/s. More activation
//   rows put more work on a line, so the out-of-order window sees fewer lines ahead and the distance counts more:
//   2 rows 20-21 % less, 4 rows 35-41 % less (8-16 KiB no better);
// * the common AVX-512 tile (bfloat16 activations widened): 5 % (32) and 10 % (128) less at 33-35 GB/s;
// * the AVX2 tile, which had no prefetch: 11 % (32) and 9 % (128) less at 45-58 GB/s, where 1 KiB was 10 % and
//   22 % slower than none.
// Measured and left (bfloat16 tile): 8 KiB (the same gains at 51-54 GB/s, 4 % slower at 35); 2 and 4 KiB (groups of
// 128: 1-28 % slower); the (scale, zero) lines 512 bytes ahead (groups of 32: 4-7 % slower than 1 KiB alone) or
// not at all (groups of 32: from 1 % slower to 4 % faster than 1 KiB alone). Earlier sessions, timing without
// the memory's state beside each round, found 0 to 32 KiB within 3 % of 1 KiB, and 16 KiB 3.5-5 % slower with
// two threads in slow memory.
constexpr int64_t kTileAhead = 6144, kScaleZeroAhead = kTileAhead / 4;

// 32-bit shift that brings the code of k = 8l + i (i = 0..7) of every row to the low bits of its lane
constexpr int int4_shift(int i) { return (i & 1) * 16 + (i >> 1) * 4; }

// ---- portable
inline void chunk_portable(const Int8Rows& src, int64_t n, int64_t c, float* out) {
  const int8_t* row = src.w + n * src.K;
  for (int l = 0; l < 16; ++l) {
    const int64_t k = 16 * c + l;
    out[l] = k < src.K ? static_cast<float>(row[k]) : 0.0f;
  }
}

// R rows x MB activation rows, full K, portable. acc index j = r * MB + m.
template <typename Src>
void block_portable(const Src& src, const int64_t* rows, int R, const float* const* xr, int MB, int64_t nchunks,
                    float* out /* [R*MB] */) {
  std::vector<float> acc(static_cast<size_t>(R * MB * 16), 0.0f);
  float w[16];
  for (int64_t c = 0; c < nchunks; ++c) {
    for (int r = 0; r < R; ++r) {
      chunk_portable(src, rows[r], c, w);
      for (int m = 0; m < MB; ++m) {
        float* a = acc.data() + (r * MB + m) * 16;
        const float* x = xr[m] + 16 * c;
        for (int l = 0; l < 16; ++l) a[l] = std::fma(x[l], w[l], a[l]);
      }
    }
  }
  for (int j = 0; j < R * MB; ++j) out[j] = tree16(acc.data() + j * 16);
}

// ---- AVX2: 16 lanes as two 8-lane halves
#define QUANTA_AVX2 __attribute__((target("avx2,fma")))

QUANTA_AVX2 inline void chunk_avx2(const Int8Rows& src, int64_t n, int64_t c, __m256& lo, __m256& hi) {
  const int8_t* p = src.w + n * src.K + 16 * c;
  alignas(16) int8_t tmp[16];
  if (16 * c + 16 > src.K) {
    std::memset(tmp, 0, 16);
    std::memcpy(tmp, p, static_cast<size_t>(src.K - 16 * c));
    p = tmp;
  }
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}

// The 16 lanes (lo: 0-7, hi: 8-15) added by the tree of the header comment.
QUANTA_AVX2 inline float tree16_avx2(__m256 lo, __m256 hi) {
  alignas(32) float t8[8];
  _mm256_store_ps(t8, _mm256_add_ps(lo, hi));
  float t4[4], t2[2];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  for (int i = 0; i < 2; ++i) t2[i] = t4[i] + t4[i + 2];
  return t2[0] + t2[1];
}

// int8, whole chunks: each 8-byte half sign-extended straight from memory (vpmovsxbd ymm, m64), no shuffles; the
// last, partial chunk (K not a multiple of 16) goes through chunk_avx2's zero-padded copy. Same weights, same
// order, so the same bits as the portable path. The row and activation-row loops are unrolled by pragma: GCC
// leaves them rolled under a target attribute, and the accumulator arrays then live on the stack (a store and a
// load per fma; 1.6x slower measured).
template <int R, int MB>
QUANTA_AVX2 void block_avx2_pass_int8(const Int8Rows& src, const int64_t* rows, const float* const* xr,
                                      int64_t nchunks, float* out) {
  __m256 lo[R * MB], hi[R * MB];
  for (int j = 0; j < R * MB; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
  const int8_t* rp[R];
  QUANTA_UNROLL
  for (int r = 0; r < R; ++r) rp[r] = src.w + rows[r] * src.K;
  const int64_t full = std::min<int64_t>(nchunks, src.K / 16);
  for (int64_t c = 0; c < full; ++c) {
    QUANTA_UNROLL
    for (int r = 0; r < R; ++r) {
      const int8_t* p = rp[r] + 16 * c;
      if ((c & 3) == 0) prefetch_next_rows(p, R * src.K);
      const __m256 wl = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
      const __m256 wh =
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
      QUANTA_UNROLL
      for (int m = 0; m < MB; ++m) {
        const float* x = xr[m] + 16 * c;
        lo[r * MB + m] = _mm256_fmadd_ps(_mm256_loadu_ps(x), wl, lo[r * MB + m]);
        hi[r * MB + m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), wh, hi[r * MB + m]);
      }
    }
  }
  for (int64_t c = full; c < nchunks; ++c) {
    QUANTA_UNROLL
    for (int r = 0; r < R; ++r) {
      __m256 wl, wh;
      chunk_avx2(src, rows[r], c, wl, wh);
      QUANTA_UNROLL
      for (int m = 0; m < MB; ++m) {
        const float* x = xr[m] + 16 * c;
        lo[r * MB + m] = _mm256_fmadd_ps(_mm256_loadu_ps(x), wl, lo[r * MB + m]);
        hi[r * MB + m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), wh, hi[r * MB + m]);
      }
    }
  }
  for (int j = 0; j < R * MB; ++j) out[j] = tree16_avx2(lo[j], hi[j]);
}

// AVX2 has 16 vector registers: a pass keeps at most 8 accumulators (2 per output), so R rows run as passes of
// RS rows over the whole of K. Each output's lanes still accumulate over c in increasing order: the same bits.
template <typename Src, int R, int MB>
QUANTA_AVX2 void block_avx2(const Src& src, const int64_t* rows, const float* const* xr, int64_t nchunks,
                            float* out) {
  constexpr int RS = MB >= 4 ? 1 : (4 / MB < R ? 4 / MB : R);
  static_assert(R % RS == 0, "rows per block must be a multiple of rows per pass");
  QUANTA_UNROLL
  for (int r0 = 0; r0 < R; r0 += RS) block_avx2_pass_int8<RS, MB>(src, rows + r0, xr, nchunks, out + r0 * MB);
}

// ---- AVX-512
#define QUANTA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

QUANTA_AVX512 inline __m512 chunk_avx512(const Int8Rows& src, int64_t n, int64_t c) {
  const int8_t* p = src.w + n * src.K + 16 * c;
  const int64_t left = src.K - 16 * c;
  const __m128i b = left >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                               : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << left) - 1u), p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

// 16 accumulators -> one vector whose lane j is tree16(a[j]) (the same tree, on 16 sources at once).
QUANTA_AVX512 inline __m512 reduce16_avx512(const __m512* a) {
  __m512 v[16], C[8], D[4], E[2];
  for (int s = 0; s < 16; ++s) v[s] = a[(s & 3) * 4 + (s >> 2)];
  for (int j = 0; j < 8; ++j)
    C[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)
    D[j] = _mm512_add_ps(_mm512_shuffle_f32x4(C[2 * j], C[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(C[2 * j], C[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)
    E[j] = _mm512_add_ps(_mm512_shuffle_ps(D[2 * j], D[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(D[2 * j], D[2 * j + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(E[0], E[1], 0x88), _mm512_shuffle_ps(E[0], E[1], 0xDD));
}

template <int R, int MB>
QUANTA_AVX512 void block_avx512(const Int8Rows& src, const int64_t* rows, const float* const* xr, int64_t nchunks,
                                float* out) {
  __m512 acc[16];
  QUANTA_UNROLL
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  const int8_t* rp[R];
  QUANTA_UNROLL
  for (int r = 0; r < R; ++r) rp[r] = src.w + rows[r] * src.K;
  const int64_t full = src.K / 16;
  int64_t c = 0;
  for (; c < full; ++c) {
    QUANTA_UNROLL
    for (int r = 0; r < R; ++r) {
      if ((c & 3) == 0) prefetch_next_rows(rp[r] + 16 * c, R * src.K);
      const __m512 w = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rp[r] + 16 * c))));
      QUANTA_UNROLL
      for (int m = 0; m < MB; ++m) acc[r * MB + m] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[m] + 16 * c), w, acc[r * MB + m]);
    }
  }
  for (; c < nchunks; ++c) {
    QUANTA_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 w = chunk_avx512(src, rows[r], c);
      QUANTA_UNROLL
      for (int m = 0; m < MB; ++m) acc[r * MB + m] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[m] + 16 * c), w, acc[r * MB + m]);
    }
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, reduce16_avx512(acc));
  QUANTA_UNROLL
  for (int j = 0; j < R * MB; ++j) out[j] = t[j];
}

// ---- int4 decode (common paths): a tile of 16 weight rows, one row per vector lane, MB activation rows. Per
// group, the tile's 16 (scale, zero) pairs are two vectors; per 64-byte line, the 8 k's of the 16 rows are
// shifted out of the rows' words and dequantized, w = fma(c - 8, s, z), then a_{k mod 2} = fma(x_k, w, a_{k mod 2})
// (the order of the header: two chains, so that AVX2's 16 registers hold 4 activation rows' accumulators). out[m *
// 16 + r] for row 16t + r.
inline void tile_int4_portable(const Int4Rows& src, int64_t t, const float* const* xr, int mb, float* out) {
  for (int r = 0; r < 16; ++r) {
    const int64_t n = 16 * t + r;
    for (int m = 0; m < mb; ++m) {
      float a[2] = {0.0f, 0.0f};
      for (int64_t k = 0; k < 8 * src.nlines; ++k) a[k & 1] = std::fma(xr[m][k], src.weight(n, k), a[k & 1]);
      out[m * 16 + r] = a[0] + a[1];
    }
  }
}

// bfloat16 bits (8 contiguous) -> float32 vector
QUANTA_AVX2 inline __m256 bf16x8_avx2(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// 8 rows (half h of the tile) per 8-lane vector; the codes as integers: c - 8 converted exactly.
template <int MB>
QUANTA_AVX2 void tile_int4_avx2(const Int4Rows& src, int64_t t, int h, const float* const* xr, float* out) {
  __m256 a[MB][2];
  QUANTA_UNROLL
  for (int m = 0; m < MB; ++m) a[m][0] = a[m][1] = _mm256_setzero_ps();
  const __m256i nibble = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
  const uint8_t* base = src.tile(t) + 32 * h;
  for (int64_t g = 0; g < src.ngroups; ++g) {
    const __m256 s = bf16x8_avx2(src.sz16(t, g, 0) + 8 * h), z = bf16x8_avx2(src.sz16(t, g, 1) + 8 * h);
    if (h == 0) prefetch_next_rows(src.sz16(t, g, 0), kScaleZeroAhead);  // the second half reads from L2
    for (int64_t l = src.line_begin(g); l < src.line_end(g); ++l) {
      if (h == 0) prefetch_next_rows(base + 64 * l, kTileAhead);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 64 * l));
      QUANTA_UNROLL
      for (int i = 0; i < 8; ++i) {
        const __m256i c = _mm256_and_si256(_mm256_srli_epi32(v, int4_shift(i)), nibble);
        const __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c, eight)), s, z);
        QUANTA_UNROLL
        for (int m = 0; m < MB; ++m) a[m][i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(xr[m][8 * l + i]), w, a[m][i & 1]);
      }
    }
  }
  QUANTA_UNROLL
  for (int m = 0; m < MB; ++m)
    _mm256_storeu_ps(out + m * 16 + 8 * h, _mm256_add_ps(a[m][0], a[m][1]));
}

// bfloat16 bits (16 contiguous) -> float32 vector
QUANTA_AVX512 inline __m512 bf16x16_avx512(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// vpermps reads bits 3..0 of each index: a shifted word indexes the table (c - 8) by its low code, no mask.
template <int MB>
QUANTA_AVX512 void tile_int4_avx512(const Int4Rows& src, int64_t t, const float* const* xr, float* out) {
  const __m512 lut = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  __m512 a[MB][2];
  QUANTA_UNROLL
  for (int m = 0; m < MB; ++m) a[m][0] = a[m][1] = _mm512_setzero_ps();
  const uint8_t* base = src.tile(t);
  for (int64_t g = 0; g < src.ngroups; ++g) {
    prefetch_next_rows(src.sz16(t, g, 0), kScaleZeroAhead);
    const __m512 s = bf16x16_avx512(src.sz16(t, g, 0)), z = bf16x16_avx512(src.sz16(t, g, 1));
    for (int64_t l = src.line_begin(g); l < src.line_end(g); ++l) {
      prefetch_next_rows(base + 64 * l, kTileAhead);
      const __m512i v = _mm512_loadu_si512(base + 64 * l);
      QUANTA_UNROLL
      for (int i = 0; i < 8; ++i) {
        const __m512i c = i == 0 ? v : _mm512_srli_epi32(v, int4_shift(i));
        const __m512 w = _mm512_fmadd_ps(_mm512_permutexvar_ps(c, lut), s, z);
        QUANTA_UNROLL
        for (int m = 0; m < MB; ++m) a[m][i & 1] = _mm512_fmadd_ps(_mm512_set1_ps(xr[m][8 * l + i]), w, a[m][i & 1]);
      }
    }
  }
  QUANTA_UNROLL
  for (int m = 0; m < MB; ++m)
    _mm512_storeu_ps(out + m * 16, _mm512_add_ps(a[m][0], a[m][1]));
}

// MB <= 4 activation rows of tile t on the given instruction set (AVX2: each half of the tile in turn).
void tile_int4(int64_t isa, const Int4Rows& src, int64_t t, const float* const* xr, int mb, float* out) {
  if (isa >= AVX512) {
    switch (mb) {
      case 1: tile_int4_avx512<1>(src, t, xr, out); break;
      case 2: tile_int4_avx512<2>(src, t, xr, out); break;
      case 3: tile_int4_avx512<3>(src, t, xr, out); break;
      default: tile_int4_avx512<4>(src, t, xr, out); break;
    }
  } else if (isa == AVX2) {
    for (int h = 0; h < 2; ++h) {
      switch (mb) {
        case 1: tile_int4_avx2<1>(src, t, h, xr, out); break;
        case 2: tile_int4_avx2<2>(src, t, h, xr, out); break;
        case 3: tile_int4_avx2<3>(src, t, h, xr, out); break;
        default: tile_int4_avx2<4>(src, t, h, xr, out); break;
      }
    }
  } else {
    tile_int4_portable(src, t, xr, mb, out);
  }
}

// ------------------------------------------------------------------------------------------------ driver
// Rows per block for MB activation rows (R * MB <= 16 accumulators). At most 8: a block reads its rows in step,
// and rows whose stride is a multiple of 4 KiB (int8 with K = 4096) all fall into the same L1 set; 16 of them
// evicted each other's lines before they were used up (measured: an int8 4096 x 4096 GEMV took 0.66 ms with
// 16 rows, 0.33 ms with 8, on 2 Zen 4 cores; 4 rows were slower again).
template <typename Src>
constexpr int rows_for(int mb) {
  return mb <= 2 ? 8 : mb == 3 ? 5 : 4;
}

template <typename Src, int MB>
void run_block(int64_t isa, const Src& src, const int64_t* rows, int R, const float* const* xr, int64_t nchunks,
               float* out) {
  constexpr int RMAX = rows_for<Src>(MB);
  if (isa >= AVX512 && R == RMAX) {
    block_avx512<RMAX, MB>(src, rows, xr, nchunks, out);
  } else if (isa >= AVX2 && R == RMAX) {
    block_avx2<Src, RMAX, MB>(src, rows, xr, nchunks, out);
  } else {
    block_portable(src, rows, R, xr, MB, nchunks, out);
  }
}

// The whole [M, N] output; epi(n, m, sum) writes one output element.
//  decode (M < kPrefillMinRows): tiles of 16 weight rows; int8: blocks of rows_for(mb) rows x mb <= 4 activation
//    rows, the weights converted in registers as they stream past, each output summed in 16 lanes + tree;
//    int4: a tile's 16 rows in the lanes of one vector (the run_decode overload below).
//  prefill (M >= kPrefillMinRows): run_prefill below, one fma chain per output.
constexpr int64_t kDecodeTileRows = 16;
constexpr int64_t kPrefillMinRows = 8;
// int8 dynamic: from this many activation rows on, torch's int8 GEMM (oneDNN). Measured on 2 Zen 4 cores, K = N =
// 4096, after the row kernel's accumulators left the stack (QUANTA_UNROLL): row kernel vs torch 3.5 vs 4.8 ms at
// 32 rows, 4.2 vs 6.4 at 64, 9.0 vs 9.6 at 128, 18.5 vs 17.8 at 256, 35.6 vs 30.5 at 512 (bf16 F.linear: 4.2,
// 6.3, 11.2, 21.4, 41 ms).
constexpr int64_t kInt8GemmMinRows = 256;


template <typename Src, typename Epi>
void run_decode(int64_t isa, const Src& src, int64_t N, int64_t M, const float* xf, int64_t Kp, int64_t nchunks,
                const Epi& epi) {
  const int64_t ntiles = (N + kDecodeTileRows - 1) / kDecodeTileRows;
  parallel_runs(ntiles, [&](int64_t t) {
    const int64_t n0 = t * kDecodeTileRows, n1 = std::min(N, n0 + kDecodeTileRows);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mb = static_cast<int>(std::min<int64_t>(4, M - m0));
      const int rmax = rows_for<Src>(mb);
      const float* xr[4];
      for (int m = 0; m < mb; ++m) xr[m] = xf + (m0 + m) * row_ld(Kp);
      for_row_blocks(n0, n1, rmax, [&](int64_t nb, int R, const int64_t* rows) {
        float out[16];
        switch (mb) {
          case 1: run_block<Src, 1>(isa, src, rows, rmax, xr, nchunks, out); break;
          case 2: run_block<Src, 2>(isa, src, rows, rmax, xr, nchunks, out); break;
          case 3: run_block<Src, 3>(isa, src, rows, rmax, xr, nchunks, out); break;
          default: run_block<Src, 4>(isa, src, rows, rmax, xr, nchunks, out); break;
        }
        for (int r = 0; r < R; ++r)
          for (int m = 0; m < mb; ++m) epi(nb + r, m0 + m, out[r * mb + m]);
      });
    }
  });
}

// int4: a thread's tiles in order (one sequential stream of codes), 4 activation rows a pass.
template <typename Epi>
void run_decode(int64_t isa, const Int4Rows& src, int64_t N, int64_t M, const float* xf, int64_t Kp, int64_t,
                const Epi& epi) {
  parallel_runs((N + kDecodeTileRows - 1) / kDecodeTileRows, [&](int64_t t) {
    const int64_t n0 = t * kDecodeTileRows, n1 = std::min(N, n0 + kDecodeTileRows);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mb = static_cast<int>(std::min<int64_t>(4, M - m0));
      const float* xr[4];
      for (int m = 0; m < mb; ++m) xr[m] = xf + (m0 + m) * row_ld(Kp);
      alignas(64) float out[4 * 16];
      tile_int4(isa, src, t, xr, mb, out);
      for (int64_t n = n0; n < n1; ++n)
        for (int m = 0; m < mb; ++m) epi(n, m0 + m, out[m * 16 + (n - n0)]);
    }
  });
}

// ---- AVX-512 + vdpbf16ps: int4 weight-only decode on bfloat16 activations (M < kPrefillMinRows, groups 32..256)
// Its own fixed order (the exact-dequantized order above costs a float conversion and an fma per weight), the
// weight taken in its factored form w = s_g (c - 8) + z_g, one weight row per 32-bit lane:
//   y = Y + Z,  Y = fma(s_g, P_g, Y) over the groups g in increasing order (from 0),
//   P_g = (P_g,0 + P_g,1) + (P_g,2 + P_g,3),  P_g,j = over the lines l of group g in increasing order (from 0),
//           fma(x_k, c_k - 8, P) for k = 8l + 2j + 1, then k = 8l + 2j (vdpbf16ps),
//   Z = fma(z_g, X_g, Z) over g (from 0),  X_g = tree16 of the group's lane sums of x_k (see group_sums_bf16).
// x_k (c_k - 8) is exact in float32 (a bfloat16 times a 4-bit integer). vdpbf16ps flushes subnormal inputs and
// results to zero. The result agrees with the reference within float32 summation error of |x| (|s (c - 8)| + |z|).
#define QUANTA_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma")))

constexpr int64_t kBf16MaxRows = 8;  // activation rows per Z pass

// x [M, K] bfloat16 as rows of at least Kp words, zero from K on: x itself when K == Kp, else a padded copy
// (a row of Kp plus one cache line, so that rows 4 KiB apart do not share L1 sets).
struct Bf16Rows {
  AlignedFloats buf;  // the copy, viewed as uint16 words
  const uint16_t* data = nullptr;
  int64_t ld = 0;
  const uint16_t* row(int64_t m) const { return data + m * ld; }
};

Bf16Rows bf16_rows(const at::Tensor& x, int64_t Kp) {
  const int64_t M = x.size(0), K = x.size(1);
  const uint16_t* s = reinterpret_cast<const uint16_t*>(x.data_ptr());
  Bf16Rows r;
  if (K == Kp) {
    r.data = s;
    r.ld = K;
    return r;
  }
  r.ld = Kp + 32;
  r.buf.zero(static_cast<size_t>((M * r.ld + 1) / 2));
  uint16_t* d = reinterpret_cast<uint16_t*>(r.buf.data());
  for (int64_t m = 0; m < M; ++m) std::memcpy(d + m * r.ld, s + m * K, K * sizeof(uint16_t));
  r.data = d;
  return r;
}

// bfloat16 (c - 8) at word lanes c and c + 16: vpermw reads bits 4..0 of each index, so a word shifted right by
// 4j indexes by its code j with no mask (bit 4, the next code's lowest bit, picks the same value)
alignas(64) constexpr uint16_t kCodeMinus8Bf16[32] = {
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000,
    0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040,
    0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
alignas(64) constexpr uint16_t kOnesBf16[32] = {
    0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80,
    0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80,
    0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80};

QUANTA_AVX512BF16 inline __m512 dp_bf16(__m512 acc, const uint16_t* x, __m512i w) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(x), (__m512bh)w);
}

// The (c - 8) pairs (8l + 2j, 8l + 2j + 1) of a line's 16 rows, as vdpbf16ps's bfloat16 pairs
QUANTA_AVX512BF16 inline __m512i line_pairs_bf16(__m512i v, int j, __m512i lut) {
  return _mm512_permutexvar_epi16(j == 0 ? v : _mm512_srli_epi16(v, 4 * j), lut);
}

// X[m * ngroups + g] for the MB rows of x
QUANTA_AVX512BF16 void group_sums_bf16(const Int4Rows& src, const Bf16Rows& xb, int64_t M, int64_t Kp, float* X) {
  const __m512i ones = _mm512_load_si512(kOnesBf16);
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xr = xb.row(m);
    for (int64_t g = 0; g < src.ngroups; ++g) {
      const int64_t k1 = g == src.ngroups - 1 ? Kp : std::min(Kp, (g + 1) * src.group);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = g * src.group; k < k1; k += 32) acc = dp_bf16(acc, xr + k, ones);
      alignas(64) float t[16];
      _mm512_store_ps(t, acc);
      X[m * src.ngroups + g] = tree16(t);
    }
  }
}

// Y + Z of the header above for tile t and MB <= 4 activation rows (X: their group sums, [MB][ngroups]):
// out[m * 16 + r]. Z as zero_terms_bf16 computes it, inside the group loop (where its chain of fmas hides).
template <int MB>
QUANTA_AVX512BF16 void tile_int4_bf16(const Int4Rows& src, int64_t t, const uint16_t* const* xr, const float* X,
                                      float* out) {
  const __m512i lut = _mm512_load_si512(kCodeMinus8Bf16);
  __m512 Y[MB], Z[MB];
  QUANTA_UNROLL
  for (int m = 0; m < MB; ++m) Y[m] = Z[m] = _mm512_setzero_ps();
  const uint8_t* base = src.tile(t);
  for (int64_t g = 0; g < src.ngroups; ++g) {
    prefetch_next_rows(src.sz16(t, g, 0), kScaleZeroAhead);
    __m512 P[MB][4];
    QUANTA_UNROLL
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < 4; ++j) P[m][j] = _mm512_setzero_ps();
    for (int64_t l = src.line_begin(g); l < src.line_end(g); ++l) {
      prefetch_next_rows(base + 64 * l, kTileAhead);
      const __m512i v = _mm512_loadu_si512(base + 64 * l);
      QUANTA_UNROLL
      for (int j = 0; j < 4; ++j) {
        const __m512i w = line_pairs_bf16(v, j, lut);
        QUANTA_UNROLL
        for (int m = 0; m < MB; ++m) {
          const __m512bh xp = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xr[m] + 8 * l + 2 * j));
          P[m][j] = _mm512_dpbf16_ps(P[m][j], xp, (__m512bh)w);
        }
      }
    }
    const __m512 s = bf16x16_avx512(src.sz16(t, g, 0)), z = bf16x16_avx512(src.sz16(t, g, 1));
    QUANTA_UNROLL
    for (int m = 0; m < MB; ++m) {
      Y[m] = _mm512_fmadd_ps(s, _mm512_add_ps(_mm512_add_ps(P[m][0], P[m][1]), _mm512_add_ps(P[m][2], P[m][3])), Y[m]);
      Z[m] = _mm512_fmadd_ps(z, _mm512_set1_ps(X[m * src.ngroups + g]), Z[m]);
    }
  }
  QUANTA_UNROLL
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + m * 16, _mm512_add_ps(Y[m], Z[m]));
}

// Z for the 16 rows of tile t (one per lane) and mb activation rows: Zout[m * 16 + r].
QUANTA_AVX512BF16 void zero_terms_bf16(const Int4Rows& src, int64_t t, const float* X, int64_t m0, int mb,
                                       float* Zout) {
  __m512 Z[kBf16MaxRows];
  for (int m = 0; m < mb; ++m) Z[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < src.ngroups; ++g) {
    const __m512 z = bf16x16_avx512(src.sz16(t, g, 1));
    for (int m = 0; m < mb; ++m)
      Z[m] = _mm512_fmadd_ps(z, _mm512_set1_ps(X[(m0 + m) * src.ngroups + g]), Z[m]);
  }
  for (int m = 0; m < mb; ++m) _mm512_storeu_ps(Zout + m * 16, Z[m]);
}

// Decode (M < kPrefillMinRows): a thread's tiles in order (one sequential stream), 4 activation rows a pass;
// each output follows the order of the header above whatever the other rows. Several weights that share x, K and
// the group size (srcs[i] with N_i rows) run as one sequence of tiles, weight after weight; epi(i, n, m, v).
template <typename Epi>
void run_int4_bf16(const std::vector<Int4Rows>& srcs, int64_t M, const at::Tensor& x, int64_t Kp, const Epi& epi) {
  const Int4Rows& first = srcs.front();
  const Bf16Rows xb = bf16_rows(x, Kp);
  std::vector<float> X(static_cast<size_t>(M * first.ngroups));
  group_sums_bf16(first, xb, M, Kp, X.data());  // the same for every weight: they share K and the groups
  std::vector<int64_t> tile0(srcs.size() + 1, 0);  // the first tile of each weight in the sequence
  for (size_t i = 0; i < srcs.size(); ++i)
    tile0[i + 1] = tile0[i] + (srcs[i].N + kDecodeTileRows - 1) / kDecodeTileRows;
  parallel_runs(tile0.back(), [&](int64_t tt) {
    size_t i = 0;
    while (tt >= tile0[i + 1]) ++i;
    const Int4Rows& src = srcs[i];
    const int64_t t = tt - tile0[i], n0 = t * kDecodeTileRows, n1 = std::min(src.N, n0 + kDecodeTileRows);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mb = static_cast<int>(std::min<int64_t>(4, M - m0));
      const uint16_t* xr[4];
      for (int m = 0; m < mb; ++m) xr[m] = xb.row(m0 + m);
      alignas(64) float out[4 * 16];
      switch (mb) {
        case 1: tile_int4_bf16<1>(src, t, xr, X.data() + m0 * src.ngroups, out); break;
        case 2: tile_int4_bf16<2>(src, t, xr, X.data() + m0 * src.ngroups, out); break;
        case 3: tile_int4_bf16<3>(src, t, xr, X.data() + m0 * src.ngroups, out); break;
        default: tile_int4_bf16<4>(src, t, xr, X.data() + m0 * src.ngroups, out); break;
      }
      for (int64_t n = n0; n < n1; ++n)
        for (int m = 0; m < mb; ++m) epi(i, n, m0 + m, out[m * 16 + (n - n0)]);
    }
  });
}
// ---- prefill (M >= kPrefillMinRows): a GEMM with a different, equally fixed order. Each output is ONE
// chain y = fma(x_k, w_k, y) over k = 0 .. K-1 (from y = 0), the same on every instruction set. The weights of
// a panel of 64 rows and a block of kKc k's are dequantized (to the same float32 values the decode path uses)
// and transposed into a cache Bp[k][64]; the micro-kernel keeps 6 activation rows x 64 outputs in registers,
// broadcasting x[m][k] against four 16-wide rows of Bp.
constexpr int64_t kPanel = 64, kKc = 128, kMr = 6;

// Bp[kk][i] = w[n0 + i][k0 + kk] for kk < kc, i < 64 (rows past N repeat the last row; their outputs are dropped).
inline void dequant_T_portable(const Int8Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc, float* Bp) {
  for (int64_t i = 0; i < kPanel; ++i) {
    const int8_t* row = src.w + (n0 + std::min(i, nrows - 1)) * src.K;
    for (int64_t kk = 0; kk < kc; ++kk) Bp[kk * kPanel + i] = static_cast<float>(row[k0 + kk]);
  }
}

inline void dequant_T_portable(const Int4Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc, float* Bp) {
  for (int64_t i = 0; i < kPanel; ++i) {
    const int64_t n = n0 + std::min(i, nrows - 1);
    for (int64_t kk = 0; kk < kc; ++kk) Bp[kk * kPanel + i] = src.weight(n, k0 + kk);
  }
}

QUANTA_AVX512 void dequant_T_avx512(const Int8Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc,
                                    float* Bp) {
  const int64_t kfull = std::min(kc, ((src.K - k0) / 4) * 4);  // 4-k groups read whole (never past a row end)
  for (int64_t j = 0; j < kPanel / 16; ++j) {
    alignas(64) int32_t off[16];
    for (int i = 0; i < 16; ++i) off[i] = static_cast<int32_t>((std::min<int64_t>(16 * j + i, nrows - 1)) * src.K);
    const __m512i vo = _mm512_load_si512(off);
    const int8_t* base = src.w + n0 * src.K + k0;
    for (int64_t kk = 0; kk < kfull; kk += 4) {
      const __m512i g = _mm512_i32gather_epi32(vo, base + kk, 1);  // 4 k's of 16 rows
      _mm512_storeu_ps(Bp + (kk + 0) * kPanel + 16 * j, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(g, 24), 24)));
      _mm512_storeu_ps(Bp + (kk + 1) * kPanel + 16 * j, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(g, 16), 24)));
      _mm512_storeu_ps(Bp + (kk + 2) * kPanel + 16 * j, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(g, 8), 24)));
      _mm512_storeu_ps(Bp + (kk + 3) * kPanel + 16 * j, _mm512_cvtepi32_ps(_mm512_srai_epi32(g, 24)));
    }
  }
  if (kfull < kc) {  // the last few k's of the row
    for (int64_t i = 0; i < kPanel; ++i) {
      const int8_t* row = src.w + (n0 + std::min(i, nrows - 1)) * src.K;
      for (int64_t kk = kfull; kk < kc; ++kk) Bp[kk * kPanel + i] = static_cast<float>(row[k0 + kk]);
    }
  }
}

QUANTA_AVX512 void dequant_T_avx512(const Int4Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc,
                                    float* Bp) {
  // n0 is a multiple of 64 and k0, kc of 64 here (kKc is; the packed tiles are padded to 64 k's): whole tiles and
  // lines. A tile past the last row repeats the last tile (its outputs are dropped).
  const __m512 lut = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t j = 0; j < kPanel / 16; ++j) {
    const int64_t t = (n0 + std::min<int64_t>(16 * j, nrows - 1)) / 16;
    const uint8_t* base = src.tile(t);
    int64_t group = -1;
    __m512 s = _mm512_setzero_ps(), z = s;
    for (int64_t l = k0 / 8; l < (k0 + kc) / 8; ++l) {
      if (src.group_of(8 * l) != group) {
        group = src.group_of(8 * l);
        s = bf16x16_avx512(src.sz16(t, group, 0));
        z = bf16x16_avx512(src.sz16(t, group, 1));
      }
      const __m512i v = _mm512_loadu_si512(base + 64 * l);
      QUANTA_UNROLL
      for (int i = 0; i < 8; ++i) {
        const __m512i c = i == 0 ? v : _mm512_srli_epi32(v, int4_shift(i));
        _mm512_storeu_ps(Bp + (8 * l - k0 + i) * kPanel + 16 * j, _mm512_fmadd_ps(_mm512_permutexvar_ps(c, lut), s, z));
      }
    }
  }
}

// C[m][0..63] (+)= sum_{kk < kc} x[m][kk] * Bp[kk][0..63] for MR rows, one fma chain per output.
template <int MR>
QUANTA_AVX512 void gemm_mk_avx512(const float* Bp, const float* const* xr, int64_t kc, float* C, bool first) {
  __m512 c[MR][4];
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) c[m][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(C + m * kPanel + 16 * j);
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float* b = Bp + kk * kPanel;
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), b2 = _mm512_load_ps(b + 32),
                 b3 = _mm512_load_ps(b + 48);
    QUANTA_UNROLL
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_set1_ps(xr[m][kk]);
      c[m][0] = _mm512_fmadd_ps(xv, b0, c[m][0]);
      c[m][1] = _mm512_fmadd_ps(xv, b1, c[m][1]);
      c[m][2] = _mm512_fmadd_ps(xv, b2, c[m][2]);
      c[m][3] = _mm512_fmadd_ps(xv, b3, c[m][3]);
    }
  }
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(C + m * kPanel + 16 * j, c[m][j]);
}

template <int MR>
QUANTA_AVX2 void gemm_mk_avx2(const float* Bp, const float* const* xr, int64_t kc, float* C, bool first) {
  QUANTA_UNROLL
  for (int j = 0; j < 8; ++j) {  // 8-wide slices of the 64 outputs: each output's chain is unchanged
    __m256 c[MR];
    QUANTA_UNROLL
    for (int m = 0; m < MR; ++m) c[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(C + m * kPanel + 8 * j);
    for (int64_t kk = 0; kk < kc; ++kk) {
      const __m256 b = _mm256_loadu_ps(Bp + kk * kPanel + 8 * j);
      QUANTA_UNROLL
      for (int m = 0; m < MR; ++m) c[m] = _mm256_fmadd_ps(_mm256_set1_ps(xr[m][kk]), b, c[m]);
    }
    QUANTA_UNROLL
    for (int m = 0; m < MR; ++m) _mm256_storeu_ps(C + m * kPanel + 8 * j, c[m]);
  }
}

void gemm_mk_portable(int mr, const float* Bp, const float* const* xr, int64_t kc, float* C, bool first) {
  for (int m = 0; m < mr; ++m)
    for (int64_t i = 0; i < kPanel; ++i) {
      float acc = first ? 0.0f : C[m * kPanel + i];
      for (int64_t kk = 0; kk < kc; ++kk) acc = std::fma(xr[m][kk], Bp[kk * kPanel + i], acc);
      C[m * kPanel + i] = acc;
    }
}

template <int MR>
void gemm_mk(int64_t isa, const float* Bp, const float* const* xr, int64_t kc, float* C, bool first) {
  if (isa >= AVX512) {
    gemm_mk_avx512<MR>(Bp, xr, kc, C, first);
  } else if (isa == AVX2) {
    gemm_mk_avx2<MR>(Bp, xr, kc, C, first);
  } else {
    gemm_mk_portable(MR, Bp, xr, kc, C, first);
  }
}

template <typename Src>
void dequant_T(int64_t isa, const Src& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc, float* Bp) {
  if (isa >= AVX512) {
    dequant_T_avx512(src, n0, nrows, k0, kc, Bp);
  } else {
    dequant_T_portable(src, n0, nrows, k0, kc, Bp);
  }
}

template <typename Src, typename Epi>
void run_prefill(int64_t isa, const Src& src, int64_t N, int64_t M, int64_t K, const float* xf, int64_t Kp,
                 const Epi& epi) {
  const int64_t npanels = (N + kPanel - 1) / kPanel;
  const int64_t ld = row_ld(Kp);
  parallel_tiles(npanels, [&](int64_t t) {
    const int64_t n0 = t * kPanel, nrows = std::min(N, n0 + kPanel) - n0;
    thread_local AlignedFloats bp, cbuf;
    bp.reserve(static_cast<size_t>(kKc * kPanel));
    cbuf.reserve(static_cast<size_t>(M * kPanel));
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      // int4 reads whole 64-k blocks: dequantize up to the padded end (the extra k's are never used)
      dequant_T(isa, src, n0, nrows, k0, std::is_same<Src, Int4Rows>::value ? std::min(kKc, Kp - k0) : kc, bp.data());
      for (int64_t m0 = 0; m0 < M; m0 += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, M - m0));
        const float* xr[kMr];
        for (int m = 0; m < mr; ++m) xr[m] = xf + (m0 + m) * ld + k0;
        float* C = cbuf.data() + m0 * kPanel;
        switch (mr) {
          case 1: gemm_mk<1>(isa, bp.data(), xr, kc, C, k0 == 0); break;
          case 2: gemm_mk<2>(isa, bp.data(), xr, kc, C, k0 == 0); break;
          case 3: gemm_mk<3>(isa, bp.data(), xr, kc, C, k0 == 0); break;
          case 4: gemm_mk<4>(isa, bp.data(), xr, kc, C, k0 == 0); break;
          case 5: gemm_mk<5>(isa, bp.data(), xr, kc, C, k0 == 0); break;
          default: gemm_mk<6>(isa, bp.data(), xr, kc, C, k0 == 0); break;
        }
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < nrows; ++i) epi(n0 + i, m, cbuf.data()[m * kPanel + i]);
  });
}

// ---- AVX-512 + vdpbf16ps GEMM (M >= kPrefillMinRows) on bfloat16 activations. A panel of 64 weight rows and a
// block of k's is dequantized into a cache Bp in pair layout (dword [p][i] holds the bfloat16 weights of row n0 + i
// at k0 + 2p and k0 + 2p + 1); the micro-kernel keeps 6 activation rows x 64 outputs in registers and, per pair,
// broadcasts (x[m][2p], x[m][2p + 1]) against the four 16-row vectors of Bp. Its own fixed order, per output:
//   int8: y = S * s + b, S = one chain over the pairs p = 0, 1, ..: fma(x_k, q_k, S) for k = 2p + 1, then k = 2p
//         (from 0; q is exact in bfloat16, so every product is exact);
//   int4: P_g = the same chain over the pairs of group g of x_k (c_k - 8) (from 0), S = fma(s_g, P_g, S) over g
//         (from 0), y = S + Z with Z as in the decode path above.
// Padding (k >= K) adds x = 0 times a zero or finite weight. vdpbf16ps flushes subnormal inputs and results.
// k per block: the block's packed panel (kKcBf16 * 128 bytes, 256 KiB) streams from L2 while the 6 activation
// rows' share of it (24 KiB) stays in L1. Measured against blocks of 256 (the panel in L1, the rows streaming),
// alternating in one process on issue 17's layer shapes, 2 Zen 4 cores: at 512 rows int8 1.01-1.05 -> 0.96-1.00x
// bf16 F.linear, int4 g128 1.03-1.12 -> 1.01-1.05x, g32 1.15-1.17 -> 1.13-1.17x; at 8-128 rows mostly faster
// (4096 x 4096, g128, 16 rows: 0.69-0.73 -> 0.63-0.66x), at most 5 % slower (the 14336 shapes, 16 rows).
constexpr int64_t kKcBf16 = 2048;
// int4 GEMM rows from which the micro-kernel takes 6 rows against half a panel instead of 3 against all of it
// (measured with the blocks above, issue 17's layer shapes, 2 Zen 4 cores: at 16 rows 3-10 % faster, at 8 and 12
// within the noise either way, so the threshold)
constexpr int64_t kHalfPanelMinRows = 16;
static_assert(kKcBf16 % 256 == 0, "a k block holds whole groups of every size the int4 op takes (32 .. 256)");

inline __mmask16 mask16(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1u);
}

// r[i] (row i: 16 dwords) -> r[p] (column p), the usual three rounds of unpacks and 128-bit lane shuffles
QUANTA_AVX512BF16 inline void transpose16_epi32(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xDD);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
  }
}

// Bp[p * kPanel + i] for int8 rows n0 + i (rows past N repeat the last) and k0 + 2p, k0 + 2p + 1 (k >= K: zero)
QUANTA_AVX512BF16 void pack_pairs(const Int8Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc,
                                  uint32_t* Bp) {
  for (int64_t kb = 0; kb < kc; kb += 32) {
    const int64_t left = src.K - (k0 + kb);
    const __mmask16 m0 = mask16(left), m1 = mask16(left - 16);
    for (int64_t j = 0; j < kPanel / 16; ++j) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int8_t* row = src.w + (n0 + std::min<int64_t>(16 * j + i, nrows - 1)) * src.K + k0 + kb;
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m0, row)));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m1, row + 16)));
        r[i] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      }
      transpose16_epi32(r);
      for (int p = 0; p < 16; ++p) _mm512_store_si512(Bp + (kb / 2 + p) * kPanel + 16 * j, r[p]);
    }
  }
}

// The same for int4 codes, as bfloat16 (c - 8): a line gives 4 pairs of the tile's 16 rows, no transposition.
// n0 is a multiple of 64, k0 and kc of 64 (whole lines); a tile past the last row repeats the last tile.
QUANTA_AVX512BF16 void pack_pairs(const Int4Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t kc,
                                  uint32_t* Bp) {
  const __m512i lut = _mm512_load_si512(kCodeMinus8Bf16);
  for (int64_t j = 0; j < kPanel / 16; ++j) {
    const uint8_t* base = src.tile((n0 + std::min<int64_t>(16 * j, nrows - 1)) / 16);
    for (int64_t l = k0 / 8; l < (k0 + kc) / 8; ++l) {
      const __m512i v = _mm512_loadu_si512(base + 64 * l);
      QUANTA_UNROLL
      for (int jj = 0; jj < 4; ++jj)
        _mm512_store_si512(Bp + ((8 * l - k0) / 2 + jj) * kPanel + 16 * j, line_pairs_bf16(v, jj, lut));
    }
  }
}

// s[q * kPanel + i]: the scale of row n0 + i in the q-th of the ng groups from k0, as float32; 0 past the last
// tile (rows of the last tile past N keep its padding scale; their outputs are never stored). A vector a tile:
// the scalar loop this replaces took a quarter of the time of 16-row GEMMs with groups of 32.
QUANTA_AVX512BF16 void panel_scales_bf16(const Int4Rows& src, int64_t n0, int64_t nrows, int64_t k0, int64_t ng,
                                         float* s) {
  for (int64_t q = 0; q < ng; ++q) {
    const int64_t g = src.group_of(k0 + q * src.group);
    for (int64_t j = 0; j < kPanel / 16; ++j)
      _mm512_store_ps(s + q * kPanel + 16 * j,
                      16 * j < nrows ? bf16x16_avx512(src.sz16(n0 / 16 + j, g, 0)) : _mm512_setzero_ps());
  }
}

// One pair step of the micro-kernels below: acc[m][j] += the pair p of x row m against Bp's 16-row vector j
// (j < NV: NV = 4 is a whole panel, NV = 2 the half of one that Bp points at).
template <int MR, int NV = 4>
QUANTA_AVX512BF16 __attribute__((always_inline)) inline void pair_step_bf16(const uint32_t* Bp, int64_t p,
                                                                            const uint16_t* const* xr,
                                                                            __m512 (*acc)[NV]) {
  __m512i b[NV];
  QUANTA_UNROLL
  for (int j = 0; j < NV; ++j) b[j] = _mm512_load_si512(Bp + p * kPanel + 16 * j);
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m) {
    const __m512bh xb = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xr[m] + 2 * p));
    QUANTA_UNROLL
    for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, (__m512bh)b[j]);
  }
}

// acc[m][j] (+)= the pair chain of x rows xr[m] against Bp's npairs pairs; from C (first: from 0) into C.
template <int MR>
QUANTA_AVX512BF16 void gemm_mk_bf16(const uint32_t* Bp, const uint16_t* const* xr, int64_t npairs, float* C,
                                    bool first, int64_t x_ahead) {
  __m512 c[MR][4];
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) c[m][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(C + m * kPanel + 16 * j);
  for (int64_t p = 0; p < npairs; ++p) {
    if ((p & 15) == 0 && x_ahead)  // the next row block's line of x, while this one computes (the int4 groups
      for (int m = 0; m < MR; ++m)  // kernel below measured slower with it)
        _mm_prefetch(reinterpret_cast<const char*>(xr[m] + 2 * p + x_ahead), _MM_HINT_T0);
    pair_step_bf16<MR>(Bp, p, xr, c);
  }
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(C + m * kPanel + 16 * j, c[m][j]);
}

void gemm_mk_bf16_rows(int mr, const uint32_t* Bp, const uint16_t* const* xr, int64_t npairs, float* C, bool first,
                       int64_t x_ahead) {
  switch (mr) {
    case 1: gemm_mk_bf16<1>(Bp, xr, npairs, C, first, x_ahead); break;
    case 2: gemm_mk_bf16<2>(Bp, xr, npairs, C, first, x_ahead); break;
    case 3: gemm_mk_bf16<3>(Bp, xr, npairs, C, first, x_ahead); break;
    case 4: gemm_mk_bf16<4>(Bp, xr, npairs, C, first, x_ahead); break;
    case 5: gemm_mk_bf16<5>(Bp, xr, npairs, C, first, x_ahead); break;
    default: gemm_mk_bf16<6>(Bp, xr, npairs, C, first, x_ahead); break;
  }
}

// int4: MR rows and NV vectors (MR * NV <= 12) keep S (C) and P both in registers through the ng groups (GP
// pairs each; the last may be shorter) of a k block.
template <int MR, int GP, int NV>
QUANTA_AVX512BF16 void gemm_mk_bf16_groups(const uint32_t* Bp, const uint16_t* const* xr, int64_t ng,
                                           int64_t npairs, const float* s, float* C) {
  static_assert(MR * NV <= 12, "S and P must fit the 32 vector registers beside the B vectors");
  __m512 c[MR][NV], P[MR][NV];
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j) c[m][j] = _mm512_loadu_ps(C + m * kPanel + 16 * j);
  for (int64_t q = 0; q < ng; ++q) {
    QUANTA_UNROLL
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NV; ++j) P[m][j] = _mm512_setzero_ps();
    const int64_t p0 = q * GP, p1 = std::min<int64_t>(npairs, p0 + GP);
    if (p1 - p0 == GP) {
      for (int64_t p = p0; p < p0 + GP; ++p) pair_step_bf16<MR, NV>(Bp, p, xr, P);  // a constant trip count
    } else {
      for (int64_t p = p0; p < p1; ++p) pair_step_bf16<MR, NV>(Bp, p, xr, P);
    }
    QUANTA_UNROLL
    for (int j = 0; j < NV; ++j) {
      const __m512 sj = _mm512_load_ps(s + q * kPanel + 16 * j);
      QUANTA_UNROLL
      for (int m = 0; m < MR; ++m) c[m][j] = _mm512_fmadd_ps(sj, P[m][j], c[m][j]);
    }
  }
  QUANTA_UNROLL
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(C + m * kPanel + 16 * j, c[m][j]);
}

template <int MR, int NV>
void run_groups_bf16_rows(int64_t group, const uint32_t* Bp, const uint16_t* const* xr, int64_t ng, int64_t npairs,
                          const float* s, float* C) {
  switch (group) {
    case 32: gemm_mk_bf16_groups<MR, 16, NV>(Bp, xr, ng, npairs, s, C); break;
    case 64: gemm_mk_bf16_groups<MR, 32, NV>(Bp, xr, ng, npairs, s, C); break;
    case 128: gemm_mk_bf16_groups<MR, 64, NV>(Bp, xr, ng, npairs, s, C); break;
    default: gemm_mk_bf16_groups<MR, 128, NV>(Bp, xr, ng, npairs, s, C); break;  // 256 (checked by the op)
  }
}

// mr <= 3 rows against a whole panel (NV = 4), or mr <= 6 rows against the half panel at Bp, s, C (NV = 2; the
// cases from 4 rows on are reached only then)
template <int NV>
void run_groups_bf16(int mr, int64_t group, const uint32_t* Bp, const uint16_t* const* xr, int64_t ng,
                     int64_t npairs, const float* s, float* C) {
  switch (std::min(mr, 12 / NV)) {
    case 1: run_groups_bf16_rows<1, NV>(group, Bp, xr, ng, npairs, s, C); break;
    case 2: run_groups_bf16_rows<2, NV>(group, Bp, xr, ng, npairs, s, C); break;
    case 3: run_groups_bf16_rows<3, NV>(group, Bp, xr, ng, npairs, s, C); break;
    case 4: run_groups_bf16_rows<4, 2>(group, Bp, xr, ng, npairs, s, C); break;
    case 5: run_groups_bf16_rows<5, 2>(group, Bp, xr, ng, npairs, s, C); break;
    default: run_groups_bf16_rows<6, 2>(group, Bp, xr, ng, npairs, s, C); break;
  }
}

// The bfloat16 output of the bf16 paths, 16 outputs at a time, in the order of the scalar epilogues:
// y[m, n] = bf16(((v * s[n]) + b[n])) for int8, bf16((v + Z) + b[n]) for int4 (round to nearest even).
struct Bf16Out {
  const uint16_t* scale;  // int8's bfloat16 row scales, or null
  const float* bias;      // or null
  uint16_t* y;            // [M, N]
  int64_t N;
};

QUANTA_AVX512BF16 void finish16_bf16(const Bf16Out& o, int64_t m, int64_t n, int64_t cnt, const float* v,
                                     const float* z) {
  const __mmask16 mask = mask16(cnt);
  __m512 r = _mm512_maskz_loadu_ps(mask, v);
  if (o.scale)
    r = _mm512_mul_ps(r, _mm512_castsi512_ps(_mm512_slli_epi32(
                             _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, o.scale + n)), 16)));
  if (z) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, z));
  if (o.bias) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, o.bias + n));
  _mm256_mask_storeu_epi16(o.y + m * o.N + n, mask, (__m256i)_mm512_cvtneps_pbh(r));
}

// int8: k blocks of kKcBf16, one chain per output through C.
void run_gemm_bf16(const Int8Rows& src, int64_t N, int64_t M, const at::Tensor& x, int64_t Kp, const Bf16Out& out) {
  const Bf16Rows xb = bf16_rows(x, Kp);
  parallel_tiles((N + kPanel - 1) / kPanel, [&](int64_t t) {
    const int64_t n0 = t * kPanel, nrows = std::min(N, n0 + kPanel) - n0;
    thread_local AlignedFloats bp, cbuf;
    bp.reserve(static_cast<size_t>(kKcBf16 / 2 * kPanel));
    cbuf.reserve(static_cast<size_t>(M * kPanel));
    uint32_t* Bp = reinterpret_cast<uint32_t*>(bp.data());
    for (int64_t k0 = 0; k0 < Kp; k0 += kKcBf16) {
      const int64_t kc = std::min(kKcBf16, Kp - k0);
      pack_pairs(src, n0, nrows, k0, kc, Bp);
      for (int64_t m0 = 0; m0 < M; m0 += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, M - m0));
        const uint16_t* xr[kMr];
        for (int m = 0; m < mr; ++m) xr[m] = xb.row(m0 + m) + k0;
        gemm_mk_bf16_rows(mr, Bp, xr, kc / 2, cbuf.data() + m0 * kPanel, k0 == 0, m0 + 2 * kMr <= M ? kMr * xb.ld : 0);
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < nrows; i += 16)
        finish16_bf16(out, m, n0 + i, nrows - i, cbuf.data() + m * kPanel + i, nullptr);
  });
}

// int4: k blocks of whole groups; per group the micro-kernel sums P from 0, then S = fma(s_g, P_g, S).
void run_gemm_bf16(const Int4Rows& src, int64_t N, int64_t M, const at::Tensor& x, int64_t Kp, const Bf16Out& out) {
  const Bf16Rows xb = bf16_rows(x, Kp);
  std::vector<float> X(static_cast<size_t>(M * src.ngroups));
  group_sums_bf16(src, xb, M, Kp, X.data());
  parallel_tiles((N + kPanel - 1) / kPanel, [&](int64_t t) {
    const int64_t n0 = t * kPanel, nrows = std::min(N, n0 + kPanel) - n0;
    thread_local AlignedFloats bp, cbuf, sbuf;
    bp.reserve(static_cast<size_t>(kKcBf16 / 2 * kPanel));
    cbuf.zero(static_cast<size_t>(M * kPanel));
    sbuf.reserve(static_cast<size_t>(kKcBf16 / src.group * kPanel));
    uint32_t* Bp = reinterpret_cast<uint32_t*>(bp.data());
    for (int64_t k0 = 0; k0 < Kp; k0 += kKcBf16) {
      const int64_t kc = std::min(kKcBf16, Kp - k0);
      pack_pairs(src, n0, nrows, k0, kc, Bp);
      // the block's groups' scales (a block holds whole groups: group_size <= 256 on this path)
      const int64_t ng = (kc + src.group - 1) / src.group;
      panel_scales_bf16(src, n0, nrows, k0, ng, sbuf.data());
      // S and P stay in registers through the block's groups: 3 activation rows against the whole panel, or, from
      // kHalfPanelMinRows rows on, 6 rows against each half of it in turn (half the B bytes a dp; the same sums
      // in the same order either way)
      const bool half = M >= kHalfPanelMinRows;
      const int64_t rows = half ? 6 : 3, width = half ? kPanel / 2 : kPanel;
      const auto run = half ? &run_groups_bf16<2> : &run_groups_bf16<4>;
      for (int64_t h = 0; h < kPanel; h += width)
        for (int64_t m0 = 0; m0 < M; m0 += rows) {
          const int mr = static_cast<int>(std::min<int64_t>(rows, M - m0));
          const uint16_t* xr[6];
          for (int m = 0; m < mr; ++m) xr[m] = xb.row(m0 + m) + k0;
          run(mr, src.group, Bp + h, xr, ng, kc / 2, sbuf.data() + h, cbuf.data() + m0 * kPanel + h);
        }
    }
    for (int64_t m0 = 0; m0 < M; m0 += kBf16MaxRows) {
      const int mb = static_cast<int>(std::min<int64_t>(kBf16MaxRows, M - m0));
      for (int64_t j = 0; j * 16 < nrows; ++j) {
        alignas(64) float Z[kBf16MaxRows * 16];
        zero_terms_bf16(src, (n0 + 16 * j) / 16, X.data(), m0, mb, Z);
        for (int m = 0; m < mb; ++m)
          finish16_bf16(out, m0 + m, n0 + 16 * j, nrows - 16 * j, cbuf.data() + (m0 + m) * kPanel + 16 * j,
                        Z + m * 16);
      }
    }
  });
}

template <typename Src, typename Epi>
void run_linear(const Src& src, int64_t N, int64_t M, const AlignedFloats& xf, int64_t Kp, int64_t nchunks,
                const Epi& epi) {
  const int64_t isa = active_isa();
  if (M < kPrefillMinRows) {
    run_decode(isa, src, N, M, xf.data(), Kp, nchunks, epi);
  } else {
    run_prefill(isa, src, N, M, src.K, xf.data(), Kp, epi);
  }
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.is_contiguous() && x.device().is_cpu(),
              "quanta_cpu: x must be a contiguous CPU [M, ", K, "] matrix");
}

const float* bias_ptr(const c10::optional<at::Tensor>& bias, int64_t N) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
              "quanta_cpu: bias must be a contiguous float32 [N] tensor");
  return bias->data_ptr<float>();
}

// ------------------------------------------------------------------------------------------------ ops
at::Tensor int8_weight_only_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                                   const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.is_contiguous(), "quanta_cpu: w must be int8 [N, K]");
  const int64_t N = w.size(0), K = w.size(1), M = x.size(0);
  check_x(x, K);
  TORCH_CHECK(scale.scalar_type() == at::kBFloat16 && scale.is_contiguous() && scale.numel() == N,
              "quanta_cpu: scale must be bfloat16 [N]");
  const float* b = bias_ptr(bias, N);
  const auto kind = out_kind(x.scalar_type());
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const int64_t Kp = round_up(std::max<int64_t>(K, 1), 64);
  const Int8Rows src{w.data_ptr<int8_t>(), K};
  const uint16_t* s = reinterpret_cast<const uint16_t*>(scale.data_ptr());
  void* out = y.data_ptr();
  const auto epi = [&](int64_t n, int64_t m, float v) {
    float r = v * bf16_to_float(s[n]);
    if (b) r = r + b[n];
    store_out(out, m * N + n, r, kind);
  };
  if (active_isa() == AVX512_BF16 && kind == OUT_BF16 && M >= kPrefillMinRows) {
    run_gemm_bf16(src, N, M, x, Kp, Bf16Out{s, b, static_cast<uint16_t*>(out), N});
    return y;
  }
  run_linear(src, N, M, widen_x(x, Kp), Kp, (K + 15) / 16, epi);
  return y;
}

// The checked view of one packed int4 weight of N rows
Int4Rows int4_rows(const at::Tensor& packed, const at::Tensor& sz, int64_t group_size, int64_t K, int64_t N) {
  TORCH_CHECK(N >= 1 && K >= 1, "quanta_cpu: N and K must be >= 1");
  const int64_t tiles = (N + 15) / 16, Kp = round_up(K, 64);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous() &&
                  packed.size(0) == tiles && packed.size(1) == 8 * Kp,
              "quanta_cpu: packed must be contiguous uint8 [ceil(N/16), 8 * Kp] = [", tiles, ", ", 8 * Kp, "]");
  TORCH_CHECK(group_size >= 32 && group_size <= 256 && (group_size & (group_size - 1)) == 0,
              "quanta_cpu: group_size must be 32, 64, 128 or 256");
  const int64_t ngroups = (K + group_size - 1) / group_size;
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && sz.is_contiguous() && sz.dim() == 4 && sz.size(0) == tiles &&
                  sz.size(1) == ngroups && sz.size(2) == 2 && sz.size(3) == 16,
              "quanta_cpu: scale_and_zero must be contiguous bfloat16 [ceil(N/16), ceil(K/group_size), 2, 16]");
  return Int4Rows{packed.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(sz.data_ptr()), K, N, Kp / 8,
                  group_size, ngroups, __builtin_ctzll(static_cast<unsigned long long>(group_size))};
}

at::Tensor int4_weight_only_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz,
                                   int64_t group_size, int64_t K, int64_t N, const c10::optional<at::Tensor>& bias) {
  const Int4Rows src = int4_rows(packed, sz, group_size, K, N);
  const int64_t M = x.size(0), Kp = round_up(K, 64);
  check_x(x, K);
  const float* b = bias_ptr(bias, N);
  const auto kind = out_kind(x.scalar_type());
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  void* out = y.data_ptr();
  const auto epi = [&](int64_t n, int64_t m, float v) { store_out(out, m * N + n, b ? v + b[n] : v, kind); };
  if (active_isa() == AVX512_BF16 && kind == OUT_BF16) {  // every group size the op takes fits kKcBf16
    if (M < kPrefillMinRows) {
      run_int4_bf16({src}, M, x, Kp, [&](size_t, int64_t n, int64_t m, float v) { epi(n, m, v); });
    } else {
      run_gemm_bf16(src, N, M, x, Kp, Bf16Out{nullptr, b, static_cast<uint16_t*>(out), N});
    }
    return y;
  }
  run_linear(src, N, M, widen_x(x, Kp), Kp, Kp / 16, epi);
  return y;
}

// Several int4 weights that share x, K and the group size, in one call: y [M, N_0 + N_1 + ..] holds weight i's
// outputs in its columns off_i .. off_i + N_i - 1 (off_i = N_0 + .. + N_{i-1}), each the bits of
// int4_weight_only_linear on that weight alone. Decode on bfloat16 activations (AVX512-BF16, M <
// kPrefillMinRows) runs the weights' tiles as one sequence: the threads stream the weights back to back, where
// separate calls each start their streams cold (measured on issue 17's model, its q/k/v and gate/up
// projections so fused, alternating runs of a token's GEMVs: 11.78 -> 11.41 ms for groups of 128, 15.21 ->
// 15.09 for groups of 32); other cases run the weights one after the other.
at::Tensor int4_weight_only_linear_multi(const at::Tensor& x, at::TensorList packed, at::TensorList sz,
                                         int64_t group_size, int64_t K, at::IntArrayRef Ns,
                                         const c10::List<c10::optional<at::Tensor>>& bias) {
  const size_t W = packed.size();
  TORCH_CHECK(W >= 1 && sz.size() == W && Ns.size() == W && bias.size() == W,
              "quanta_cpu: packed, scale_and_zero, N and bias must be lists of the same length >= 1");
  std::vector<Int4Rows> srcs;
  std::vector<const float*> b(W);
  std::vector<int64_t> off(W + 1, 0);
  check_x(x, K);
  for (size_t i = 0; i < W; ++i) {
    srcs.push_back(int4_rows(packed[i], sz[i], group_size, K, Ns[i]));
    const c10::optional<at::Tensor> bi = bias.get(i);
    b[i] = bias_ptr(bi, Ns[i]);
    off[i + 1] = off[i] + Ns[i];
  }
  const int64_t M = x.size(0), Nt = off[W], Kp = round_up(K, 64);
  const auto kind = out_kind(x.scalar_type());
  at::Tensor y = at::empty({M, Nt}, x.options());
  if (!(active_isa() == AVX512_BF16 && kind == OUT_BF16 && M < kPrefillMinRows)) {
    for (size_t i = 0; i < W; ++i)
      y.narrow(1, off[i], Ns[i]).copy_(int4_weight_only_linear(x, packed[i], sz[i], group_size, K, Ns[i],
                                                               bias.get(i)));
    return y;
  }
  if (M == 0) return y;
  void* out = y.data_ptr();
  run_int4_bf16(srcs, M, x, Kp, [&](size_t i, int64_t n, int64_t m, float v) {
    store_out(out, m * Nt + off[i] + n, b[i] ? v + b[i][n] : v, kind);
  });
  return y;
}

// ---- int8 x int8 -> int32 (exact; any order gives the same bits)
// x_u8 = q_x + 128 in [0, 255], zero padded to Kp; acc = sum x_u8 * w = sum q_x w + 128 colsum.
// The row pointers are taken once and the loop has no early exit, so that the accumulators stay in registers
// (the loop with a break in it kept them on the stack: a store after every vpdpbusd).
template <int R, int MB>
QUANTA_AVX512 void dot_i8_avx512(const int8_t* w, int64_t K, const int64_t* rows, const uint8_t* const* xr,
                                 int32_t* out) {
  __m512i acc[R * MB];
  QUANTA_UNROLL
  for (int j = 0; j < R * MB; ++j) acc[j] = _mm512_setzero_si512();
  const int8_t* wr[R];
  QUANTA_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = w + rows[r] * K;
  const int64_t nchunks = (K + 63) / 64, full = K / 64, ahead = R * K;
  const __mmask64 tail = K % 64 ? (1ULL << (K % 64)) - 1ULL : ~0ULL;
  for (int64_t c = 0; c < nchunks; ++c) {
    const __mmask64 mask = c < full ? ~0ULL : tail;
    __m512i xv[MB];
    QUANTA_UNROLL
    for (int m = 0; m < MB; ++m) xv[m] = _mm512_loadu_si512(xr[m] + 64 * c);
    QUANTA_UNROLL
    for (int r = 0; r < R; ++r) {
      prefetch_next_rows(wr[r] + 64 * c, ahead);
      const __m512i wv = _mm512_maskz_loadu_epi8(mask, wr[r] + 64 * c);
      QUANTA_UNROLL
      for (int m = 0; m < MB; ++m) acc[r * MB + m] = _mm512_dpbusd_epi32(acc[r * MB + m], xv[m], wv);
    }
  }
  QUANTA_UNROLL
  for (int j = 0; j < R * MB; ++j) out[j] = _mm512_reduce_add_epi32(acc[j]);
}

template <int R, int MB>
QUANTA_AVX2 void dot_i8_avx2(const int8_t* w, int64_t K, const int64_t* rows, const uint8_t* const* xr,
                             int32_t* out) {
  __m256i acc[R * MB];
  QUANTA_UNROLL
  for (int j = 0; j < R * MB; ++j) acc[j] = _mm256_setzero_si256();
  alignas(16) int8_t tmp[16];
  for (int64_t c = 0; 16 * c < K; ++c) {
    const int64_t left = K - 16 * c;
    QUANTA_UNROLL
    for (int r = 0; r < R; ++r) {
      const int8_t* p = w + rows[r] * K + 16 * c;
      if ((c & 3) == 0) prefetch_next_rows(p, R * K);
      if (left < 16) {
        std::memset(tmp, 0, 16);
        std::memcpy(tmp, p, static_cast<size_t>(left));
        p = tmp;
      }
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      QUANTA_UNROLL
      for (int m = 0; m < MB; ++m) {
        const __m256i xv = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[m] + 16 * c)));
        acc[r * MB + m] = _mm256_add_epi32(acc[r * MB + m], _mm256_madd_epi16(xv, wv));
      }
    }
  }
  QUANTA_UNROLL
  for (int j = 0; j < R * MB; ++j) {
    alignas(32) int32_t t[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), acc[j]);
    int32_t s = 0;
    QUANTA_UNROLL
    for (int i = 0; i < 8; ++i) s += t[i];
    out[j] = s;
  }
}

void dot_i8_portable(const int8_t* w, int64_t K, const int64_t* rows, int R, const uint8_t* const* xr, int MB,
                     int32_t* out) {
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) {
      const int8_t* wr = w + rows[r] * K;
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<int32_t>(xr[m][k]) * static_cast<int32_t>(wr[k]);
      out[r * MB + m] = s;
    }
}

template <int MB>
void run_dot_block(int64_t isa, const int8_t* w, int64_t K, const int64_t* rows, int R, const uint8_t* const* xr,
                   int32_t* out) {
  constexpr int RMAX = rows_for<Int8Rows>(MB);
  if (isa >= AVX512 && R == RMAX) {
    dot_i8_avx512<RMAX, MB>(w, K, rows, xr, out);
  } else if (isa >= AVX2 && R == RMAX) {
    dot_i8_avx2<RMAX, MB>(w, K, rows, xr, out);
  } else {
    dot_i8_portable(w, K, rows, R, xr, MB, out);
  }
}

at::Tensor int8_dynamic_linear(const at::Tensor& qx, const c10::optional<at::Tensor>& zx, const at::Tensor& sx,
                               const at::Tensor& w, const at::Tensor& sw, const at::Tensor& colsum,
                               const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.is_contiguous(), "quanta_cpu: w must be int8 [N, K]");
  const int64_t N = w.size(0), K = w.size(1), M = qx.size(0);
  TORCH_CHECK(qx.scalar_type() == at::kChar && qx.dim() == 2 && qx.size(1) == K && qx.is_contiguous(),
              "quanta_cpu: qx must be int8 [M, K]");
  TORCH_CHECK(sx.scalar_type() == at::kFloat && sx.numel() == M && sx.is_contiguous(), "quanta_cpu: sx float32 [M]");
  TORCH_CHECK(sw.scalar_type() == at::kFloat && sw.numel() == N && sw.is_contiguous(), "quanta_cpu: sw float32 [N]");
  TORCH_CHECK(colsum.scalar_type() == at::kInt && colsum.numel() == N && colsum.is_contiguous(),
              "quanta_cpu: colsum int32 [N]");
  const int8_t* zp = nullptr;
  if (zx.has_value()) {
    TORCH_CHECK(zx->scalar_type() == at::kChar && zx->numel() == M && zx->is_contiguous(), "quanta_cpu: zx int8 [M]");
    zp = zx->data_ptr<int8_t>();
  }
  const float* b = bias_ptr(bias, N);
  const auto kind = out_kind(out_dtype);
  at::Tensor y = at::empty({M, N}, qx.options().dtype(out_dtype));
  if (M == 0 || N == 0) return y;
  const float* sxp = sx.data_ptr<float>();
  const float* swp = sw.data_ptr<float>();
  const int32_t* cs = colsum.data_ptr<int32_t>();
  void* out = y.data_ptr();
  // y from the exact int32 A[m, n] = sum_k q[m, k] w[n, k] (any summation order gives these bits; wraps around as
  // the reference's int32 tensors do)
  const auto finish = [&](int64_t m, int64_t n, int64_t dot) {
    const int64_t z = zp ? static_cast<int64_t>(zp[m]) : 0;
    const int32_t a = static_cast<int32_t>(static_cast<uint32_t>(dot - z * static_cast<int64_t>(cs[n])));
    float v = static_cast<float>(a) * sxp[m];
    v = v * swp[n];
    if (b) v = v + b[n];
    store_out(out, m * N + n, v, kind);
  };
  if (M >= kInt8GemmMinRows) {
    // prefill: torch's blocked int8 GEMM (oneDNN, on torch's threads) on the [N, K] codes seen as [K, N]; the
    // row-by-row kernel below re-reads every weight once per 4 rows
    const at::Tensor A = at::_int_mm(qx, w.t());
    const int32_t* ap = A.data_ptr<int32_t>();
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t n = 0; n < N; ++n) finish(m, n, ap[m * N + n]);
    });
    return y;
  }
  const int64_t Kp = round_up(std::max<int64_t>(K, 1), 64);
  std::vector<uint8_t> xu(static_cast<size_t>(M * Kp), 0);
  const int8_t* q = qx.data_ptr<int8_t>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xu[m * Kp + k] = static_cast<uint8_t>(static_cast<int32_t>(q[m * K + k]) + 128);
  const int64_t isa = active_isa();
  const int8_t* wp = w.data_ptr<int8_t>();
  const int64_t tile_rows = M <= 4 ? 16 : 64;
  const int64_t ntiles = (N + tile_rows - 1) / tile_rows;
  parallel_runs(ntiles, [&](int64_t t) {
    const int64_t n0 = t * tile_rows, n1 = std::min(N, n0 + tile_rows);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mb = static_cast<int>(std::min<int64_t>(4, M - m0));
      const int rmax = rows_for<Int8Rows>(mb);
      const uint8_t* xr[4];
      for (int m = 0; m < mb; ++m) xr[m] = xu.data() + (m0 + m) * Kp;
      for_row_blocks(n0, n1, rmax, [&](int64_t nb, int R, const int64_t* rows) {
        int32_t acc[16];
        switch (mb) {
          case 1: run_dot_block<1>(isa, wp, K, rows, rmax, xr, acc); break;
          case 2: run_dot_block<2>(isa, wp, K, rows, rmax, xr, acc); break;
          case 3: run_dot_block<3>(isa, wp, K, rows, rmax, xr, acc); break;
          default: run_dot_block<4>(isa, wp, K, rows, rmax, xr, acc); break;
        }
        // acc sums (q + 128) w: the dot is acc - 128 * colsum
        for (int r = 0; r < R; ++r)
          for (int m = 0; m < mb; ++m)
            finish(m0 + m, nb + r, static_cast<int64_t>(acc[r * mb + m]) - 128 * static_cast<int64_t>(cs[nb + r]));
      });
    }
  });
  return y;
}

// v rounded to bfloat16 (to nearest even, NaN to the quiet NaN 0x7FC0: c10::BFloat16's conversion), as a float;
// on the bits, so that the loops below vectorize.
inline float round_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  u = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &u, sizeof u);
  return v;
}

// torchao's symmetric per-token int8 quantization of a float32 or bfloat16 [M, K] matrix (quanta.kernels.int_linear.
// quantize_per_token_int8, its reference), row by row, each step rounded to x's dtype T as torch's ops on T round:
//   a = max(-min(min_k x, 0), max(max_k x, 0)),  s = max(T(a / 127), T(1e-5)),  r = T(1 / s),
//   q = clamp(rint(T(x * r)), -127, 127)
// A row holding NaN gets s = NaN, one holding an infinity s = inf (their codes are meaningless): the caller raises.
template <typename T>
void quantize_rows_int8(const T* xp, int64_t M, int64_t K, int8_t* qp, T* sp) {
  const auto to_t = [](float v) {  // v in T, widened (float: unchanged)
    if constexpr (std::is_same_v<T, float>) {
      return v;
    } else {
      return round_to_bf16(v);
    }
  };
  at::parallel_for(0, M, std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const T* r = xp + m * K;
      float lo = 0.0f, hi = 0.0f;
      bool nan = false;
      for (int64_t k = 0; k < K; ++k) {
        const float v = static_cast<float>(r[k]);
        nan |= v != v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      float sc = to_t(std::max(-lo, hi) / 127.0f);
      sc = nan ? std::numeric_limits<float>::quiet_NaN() : std::max(sc, to_t(1e-5f));
      sp[m] = static_cast<T>(sc);
      const float inv = to_t(1.0f / sc);
      int8_t* out = qp + m * K;
      for (int64_t k = 0; k < K; ++k) {
        // |x r| <= 127 (and a little) in a finite row: adding and taking away 1.5 * 2^23 rounds it to nearest even
        const float v = to_t(static_cast<float>(r[k]) * inv);
        const float c = (v + 12582912.0f) - 12582912.0f;
        out[k] = static_cast<int8_t>(static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, c))));  // NaN: -127
      }
    }
  });
}

// (codes, scales, rows whose scale is not finite: the caller's error, without a pass of torch ops to find it)
std::tuple<at::Tensor, at::Tensor, int64_t> quantize_per_token_int8(const at::Tensor& x) {
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 2 &&
                  x.is_contiguous() && x.device().is_cpu(),
              "quanta_cpu: x must be a contiguous CPU float32 or bfloat16 [M, K] matrix");
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor s = at::empty({M}, x.options());
  if (x.scalar_type() == at::kFloat) {
    quantize_rows_int8(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), s.data_ptr<float>());
  } else {
    quantize_rows_int8(x.data_ptr<c10::BFloat16>(), M, K, q.data_ptr<int8_t>(), s.data_ptr<c10::BFloat16>());
  }
  const at::Tensor s32 = s.to(at::kFloat);
  const float* sv = s32.data_ptr<float>();
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m) bad += !std::isfinite(sv[m]);
  return {q, s, bad};
}

int64_t set_isa_limit(int64_t level) {
  TORCH_CHECK(level >= PORTABLE && level <= AVX512_BF16, "quanta_cpu: isa level must be 0, 1, 2 or 3");
  g_isa_limit.store(level);
  return active_isa();
}

int64_t cpu_isa() { return kCpuIsa; }
int64_t current_isa() { return active_isa(); }
int64_t abi_version() { return kAbiVersion; }

}  // namespace

TORCH_LIBRARY(quanta_cpu, m) {
  m.def("int8_weight_only_linear(Tensor x, Tensor w, Tensor scale, Tensor? bias) -> Tensor");
  m.def("int4_weight_only_linear(Tensor x, Tensor packed, Tensor scale_and_zero, int group_size, int K, int N, "
        "Tensor? bias) -> Tensor");
  m.def("int4_weight_only_linear_multi(Tensor x, Tensor[] packed, Tensor[] scale_and_zero, int group_size, int K, "
        "int[] N, Tensor?[] bias) -> Tensor");
  m.def("int8_dynamic_linear(Tensor qx, Tensor? zx, Tensor sx, Tensor w, Tensor sw, Tensor colsum, Tensor? bias, "
        "ScalarType out_dtype) -> Tensor");
  m.def("quantize_per_token_int8(Tensor x) -> (Tensor, Tensor, int)");
  m.def("set_isa_limit(int level) -> int", &set_isa_limit);
  m.def("cpu_isa() -> int", &cpu_isa);
  m.def("current_isa() -> int", &current_isa);
  m.def("abi_version() -> int", &abi_version);
}

TORCH_LIBRARY_IMPL(quanta_cpu, CPU, m) {
  m.impl("int8_weight_only_linear", &int8_weight_only_linear);
  m.impl("int4_weight_only_linear", &int4_weight_only_linear);
  m.impl("int4_weight_only_linear_multi", &int4_weight_only_linear_multi);
  m.impl("int8_dynamic_linear", &int8_dynamic_linear);
  m.impl("quantize_per_token_int8", &quantize_per_token_int8);
}

