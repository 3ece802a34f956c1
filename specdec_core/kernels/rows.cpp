// A few-row matrix product for CPU passes over a few tokens: Y[m, n] = sum_k X[m, k] W[n, k] (+ b[n]).
//
// A verification pass multiplies M = 1-512 token rows by every weight matrix of the model. The weights do not fit in
// cache, so the pass is bound by how fast they stream from memory, and should cost about the same for any small M.
// A general GEMM library tunes for large M (it packs X and W into panels for every call and picks its tile shape
// and threading from M); here the weights are packed once, when a model is set up, so each call is a plain stream:
//
//  * W is stored as column blocks of NB = 2 vector widths: block b holds W[b*NB : (b+1)*NB, :] transposed, k-major,
//    so the block is one contiguous run of memory read front to back (pack()).
//  * Each thread takes a contiguous run of blocks, so it reads one stream of memory front to back, and prefetches
//    it a few KiB ahead into L2. A tile of up to MT rows of X (14 with AVX-512) walks a block with 2 x MT
//    accumulators in registers (one broadcast of X[m, k] times two weight vectors): up to MT rows, the weights are
//    read once for all of them while the fused multiply-adds run in the shadow of the memory stream. More rows run
//    in balanced tiles over k-chunks of 32 KiB, the later tiles rereading the chunk from L1.
//  * Every output is one accumulator: fused multiply-adds over k in increasing order, starting from zero, whatever
//    tile it falls in, however many rows share the call, and however the blocks are split among threads. A row's
//    result therefore does not depend on M: the logits of a position are the same bits whether it is verified alone
//    or with 31 others (row invariance). It is not the same order as MKL's, so the bits differ from torch's matmul.
//  * The packed weights may be float16 (pack() of a float16 matrix): each weight vector is widened to float32 as it
//    is loaded (F16C), and the products and sums stay float32, in the same order. Half the bytes stream; and where
//    the weights are exactly float16 numbers (a draft stored in float16), the outputs are the float32 path's bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>
#include <type_traits>
#include <utility>

namespace {

#if defined(__AVX512F__)
using vec = __m512;
constexpr int L = 16, REGS = 32;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vload(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vbcast(const float* p) { return _mm512_set1_ps(*p); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec _mm_set1_like(float x) { return _mm512_set1_ps(x); }
inline vec _mm_sub_like(vec a, vec b) { return _mm512_sub_ps(a, b); }
constexpr const char* ISA = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int L = 8, REGS = 16;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vload(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vbcast(const float* p) { return _mm256_broadcast_ss(p); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec _mm_set1_like(float x) { return _mm256_set1_ps(x); }
inline vec _mm_sub_like(vec a, vec b) { return _mm256_sub_ps(a, b); }
constexpr const char* ISA = "avx2";
#else
#error "rows.cpp needs AVX2 with FMA, or AVX-512"
#endif

constexpr int NV = 2;                          // weight vectors per block
constexpr int NB = NV * L;                     // output columns per block
constexpr int MT = (REGS - NV - 2) / NV;       // rows per tile: NV x MT accumulators + NV weights + broadcasts
constexpr int64_t KC = 256;                    // k per chunk when M needs more than one tile (32 KiB on AVX-512)
constexpr int64_t AHEAD = 4096;                // bytes of weights prefetched (into L2) ahead of the first tile

// rows [m0, m0 + mt) of one block, k in [k0, k1); `first`: the accumulators start from zero, else from Y;
// W: the packed weights' type (float, or at::Half widened on load)
template <int mt, typename W>
void tile(const W* P, const float* X, float* Y, int64_t K, int64_t ldy, int64_t m0, int64_t k0, int64_t k1,
          bool first, bool lead) {
  vec acc[mt][NV];
#pragma GCC unroll 32
  for (int i = 0; i < mt; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = first ? vzero() : vload(Y + (m0 + i) * ldy + v * L);
  const float* x = X + m0 * K;
  for (int64_t k = k0; k < k1; ++k) {
    const W* w = P + k * NB;
    if (lead) {  // the first tile over a chunk reads it from memory: keep the stream ahead of it in flight
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm_prefetch(reinterpret_cast<const char*>(w + v * L) + AHEAD, _MM_HINT_T1);
    }
    vec wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) wv[v] = vload(w + v * L);
#pragma GCC unroll 32
    for (int i = 0; i < mt; ++i) {
      const vec xb = vbcast(x + i * K + k);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = vfma(wv[v], xb, acc[i][v]);
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < mt; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(Y + (m0 + i) * ldy + v * L, acc[i][v]);
}

template <typename W>
using tile_fn = void (*)(const W*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool);
template <typename W, std::size_t... I>
constexpr std::array<tile_fn<W>, sizeof...(I)> tiles(std::index_sequence<I...>) { return {&tile<int(I) + 1, W>...}; }
template <typename W>
constexpr auto TILES = tiles<W>(std::make_index_sequence<MT>{});  // TILES<W>[mt - 1] handles mt rows

}  // namespace

// W [N, K] -> [ceil(N / NB), K, NB]: block b, row k holds W[b*NB : b*NB + NB, k] (zeros past N), in W's dtype
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.device().is_cpu() && (w.scalar_type() == torch::kFloat || w.scalar_type() == torch::kHalf)
              && w.dim() == 2, "rows.pack: a float32 or float16 CPU matrix [N, K], got ", w.scalar_type(), " with ",
              w.dim(), " dims");
  const int64_t N = w.size(0), K = w.size(1), blocks = (N + NB - 1) / NB;
  auto padded = torch::zeros({blocks * NB, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({blocks, NB, K}).transpose(1, 2).contiguous();
}

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> b) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat, "rows.linear: float32 CPU input only");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == NB && packed.is_contiguous()
              && (packed.scalar_type() == torch::kFloat || packed.scalar_type() == torch::kHalf),
              "rows.linear: weight must come from rows.pack");
  const int64_t blocks = packed.size(0), K = packed.size(1);
  TORCH_CHECK(x.size(-1) == K, "rows.linear: input's last dimension ", x.size(-1), " != weight's ", K);
  TORCH_CHECK(N > (blocks - 1) * NB && N <= blocks * NB, "rows.linear: N = ", N, " does not match the packing");
  auto shape = x.sizes().vec();
  shape.back() = N;
  auto X = x.reshape({-1, K}).contiguous();
  const int64_t M = X.size(0), ldy = blocks * NB;
  auto Y = torch::empty({M, ldy}, x.options());
  const float* Xp = X.data_ptr<float>();
  float* Yp = Y.data_ptr<float>();
  // balanced tiles: 40 rows run as 20 + 20, not 28 + 12
  const int64_t tiles_n = (M + MT - 1) / MT, rows_per = (M + tiles_n - 1) / tiles_n;
  const int64_t kc = tiles_n == 1 ? K : KC;  // one tile streams the whole block; more reuse a chunk from L1
  auto run = [&](auto Pp) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(Pp)>>;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {  // contiguous runs of blocks per thread
      for (int64_t blk = begin; blk < end; ++blk) {
        const W* P = Pp + blk * K * NB;
        float* Yb = Yp + blk * NB;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
          const int64_t k1 = std::min(K, k0 + kc);
          for (int64_t m0 = 0, t = 0; m0 < M; m0 += rows_per, ++t)
            TILES<W>[std::min(rows_per, M - m0) - 1](P, Xp, Yb, K, ldy, m0, k0, k1, k0 == 0, t == 0);
        }
      }
    });
  };
  if (packed.scalar_type() == torch::kHalf)
    run(static_cast<const at::Half*>(packed.data_ptr<at::Half>()));
  else
    run(static_cast<const float*>(packed.data_ptr<float>()));
  auto out = ldy == N ? Y : Y.narrow(1, 0, N).contiguous();
  if (b.has_value() && b->defined()) out.add_(*b);
  return out.view(shape);
}

// -- attention over the cache, one query row at a time -----------------------------------------------------------
// out[b, t, h] = softmax_s(q[b, h, t] . k[b, h / G, s] * scale + mask[t, s]) v[b, h / G, s] over the keys s that
// the mask leaves open (all of them without a mask), in increasing s, in three passes over a row's scores (max, sum
// of exponentials, weighted sum of values). Blocked keys are skipped, not added as zeros, so a query's result
// depends only on the keys it sees: the same bits whether the pass holds 1 query or 32, whatever the cache's
// capacity or the other queries' masks. q, k and v are read through their strides (no copy of the cache's first S
// positions per layer), a boolean mask directly; the weighted sum of values keeps up to 8 vector accumulators side
// by side (one per slice of the head), each summing over the kept keys in increasing order, so the passes' latency
// chains overlap and every output lane is summed in the same order as by one accumulator. Packed (queries given):
// q [1, H, N, D] holds row b's queries[b] queries back to back (a packed pass's rows, each its own length), the
// mask is [B, 1, max(queries), >= S] as for those rows padded to the longest, and the output is [1, N, H, D]: one
// call for every row, no padding computed or copied.
namespace {

// e^x for a vector: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6 polynomial (Cephes' coefficients), 2^n
// from the exponent bits; within 2 ulp of expf on [-87, 88], 0 below
inline vec vexp(vec x) {
#if defined(__AVX512F__)
  const vec hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365478515625f);
  x = _mm512_min_ps(x, hi);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  vec p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(~under, p, _mm512_castsi512_ps(e));
#else
  const vec hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
  x = _mm256_min_ps(x, hi);
  const vec under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const vec n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vec r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  vec p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
#endif
}

inline float hsum(vec v) {  // the same fixed tree of adds over the lanes for every call
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
#endif
}

}  // namespace

torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                        double scale, c10::optional<torch::Tensor> queries) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat
              && q.device().is_cpu(), "rows.attention: float32 CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), "rows.attention: q [B, H, T, D], k and v [B, Hkv, S, D]");
  const bool packed = queries.has_value() && queries->defined();
  const int64_t B = k.size(0), H = q.size(1), D = q.size(3), Hk = k.size(1), S = k.size(2);
  // packed: q [1, H, N, D] holds row b's queries[b] queries back to back; at[i] = b * T + t of its i-th query
  int64_t T = q.size(2), N = 0;
  std::vector<int64_t> at;
  if (packed) {
    TORCH_CHECK(queries->dim() == 1 && queries->size(0) == B && queries->scalar_type() == torch::kLong
                && q.size(0) == 1,
                "rows.attention: queries must be int64 [B] (row b's queries back to back in q [1, H, N, D])");
    const auto Qn = queries->contiguous();
    const int64_t* Qr = Qn.data_ptr<int64_t>();
    T = 0;
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(Qr[b] >= 0, "rows.attention: queries must be >= 0");
      T = std::max(T, Qr[b]);
      N += Qr[b];
    }
    TORCH_CHECK(N == q.size(2), "rows.attention: queries sum to ", N, ", q holds ", q.size(2));
    at.reserve(N);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Qr[b]; ++t) at.push_back(b * T + t);
  } else {
    TORCH_CHECK(q.size(0) == B, "rows.attention: q and k hold different batch sizes");
  }
  TORCH_CHECK(k.size(3) == D && Hk > 0 && H % Hk == 0 && D % L == 0,
              "rows.attention: shapes do not match (head size must be a multiple of ", L, ")");
  // q, k and v are read through their strides (a head-major view of the projections, the cache's first S
  // positions): only the head dimension must be contiguous
  auto Q = q.stride(3) == 1 ? q : q.contiguous();
  auto Kc = k.stride(3) == 1 ? k : k.contiguous();
  auto Vc = v.stride(3) == 1 ? v : v.contiguous();
  torch::Tensor Mk;
  const float* Mf = nullptr;     // an additive mask: blocked where < -1e30
  const bool* Mb = nullptr;      // a boolean one: blocked where false
  int64_t mb = 0, mt = 0;        // mask strides over batch and query rows (keys contiguous)
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->dim() == 4 && mask->size(1) == 1 && mask->size(2) == T && mask->size(3) >= S
                && (mask->size(0) == B || mask->size(0) == 1)
                && (mask->scalar_type() == torch::kFloat || mask->scalar_type() == torch::kBool),
                "rows.attention: mask must be float32 (additive) or bool (true: attend) [B or 1, 1, T, >= S]");
    Mk = mask->stride(3) == 1 ? *mask : mask->contiguous();
    if (Mk.scalar_type() == torch::kBool) Mb = Mk.data_ptr<bool>(); else Mf = Mk.data_ptr<float>();
    mb = Mk.size(0) == 1 ? 0 : Mk.stride(0);
    mt = Mk.stride(2);
  }
  // the items: each (row, head, query), or packed each (query, head), so that the threads share the real queries
  // evenly whatever the rows' lengths
  auto out = packed ? torch::empty({1, N, H, D}, q.options()) : torch::empty({B, T, H, D}, q.options());
  const int64_t items = packed ? N * H : B * H * T;
  const float *Qp = Q.data_ptr<float>(), *Kp = Kc.data_ptr<float>(), *Vp = Vc.data_ptr<float>();
  const int64_t qb = Q.stride(0), qh = Q.stride(1), qt = Q.stride(2);
  const int64_t kb_ = Kc.stride(0), kh = Kc.stride(1), ks = Kc.stride(2);
  const int64_t vb_ = Vc.stride(0), vh = Vc.stride(1), vs = Vc.stride(2);
  float* Op = out.data_ptr<float>();
  const int64_t G = H / Hk;
  const float sc = float(scale), blocked = -1e30f;
  constexpr int CH = 8;  // value chunks accumulated side by side (independent chains, each over s in order)
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score(S + L);
    std::vector<int64_t> keep(S);
    for (int64_t item = begin; item < end; ++item) {
      int64_t b, h, t, row;  // row: the query's place in q and out (packed: its index among the N)
      if (packed) {
        row = item / H, h = item % H, b = at[row] / T, t = at[row] % T;
      } else {
        b = item / (H * T), h = (item / T) % H, t = item % T, row = b * T + t;
      }
      const float* qr = Qp + (packed ? row * qt : b * qb + t * qt) + h * qh;
      const float* kb = Kp + b * kb_ + (h / G) * kh;
      const float* vb = Vp + b * vb_ + (h / G) * vh;
      const int64_t mrow = b * mb + t * mt;
      int64_t n = 0;
      float mx = -INFINITY;
      for (int64_t s = 0; s < S; ++s) {
        float add = 0.0f;
        if (Mb) {
          if (!Mb[mrow + s]) continue;
        } else if (Mf) {
          add = Mf[mrow + s];
          if (add < blocked) continue;
        }
        vec acc = vzero();
        for (int64_t d = 0; d < D; d += L) acc = vfma(vload(qr + d), vload(kb + s * ks + d), acc);
        const float x = hsum(acc) * sc + add;
        score[n] = x;
        keep[n++] = s;
        mx = std::max(mx, x);
      }
      float* o = Op + (row * H + h) * D;
      if (n == 0) {  // a fully masked row (padding): zeros, as a softmax over nothing has no value
        std::fill(o, o + D, 0.0f);
        continue;
      }
      std::fill(score.begin() + n, score.begin() + ((n + L - 1) / L) * L, -INFINITY);
      const vec vmx = _mm_set1_like(mx);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; i += L) {
        const vec e = vexp(_mm_sub_like(vload(&score[i]), vmx));
        vstore(&score[i], e);
      }
      for (int64_t i = 0; i < n; ++i) sum += score[i];
      for (int64_t d0 = 0; d0 < D; d0 += CH * L) {
        const int nc = int(std::min<int64_t>(CH, (D - d0) / L));
        vec acc[CH];
        for (int c = 0; c < nc; ++c) acc[c] = vzero();
        for (int64_t i = 0; i < n; ++i) {
          const vec w = vbcast(&score[i]);
          const float* vr = vb + keep[i] * vs + d0;
          for (int c = 0; c < nc; ++c) acc[c] = vfma(w, vload(vr + c * L), acc[c]);
        }
        for (int c = 0; c < nc; ++c) vstore(o + d0 + c * L, acc[c]);
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
  });
  return out;
}

// -- one Llama decoder layer of a single sequence's decoding pass, in one call -------------------------------------
// x [T, E] (float32, the residual stream) after the cache's first `start` positions; returns the layer's output.
//   h = rms(x) * w_in; q, k, v = h W_qkv (one product); rotary positions on q and k (cos, sin [T, D]);
//   k, v written to the cache at [start, start + T); a = attention of q over the cache's [0, start + T), causal;
//   x += a W_o; h = rms(x) * w_post; g, u = h W_gate_up (one product); x += (silu(g) * u) W_down.
// The products and the attention are linear() and attention() above (row-invariant); the norms sum squares in
// float32 in increasing order. The draft's decoding passes run it (models/draft_step.py): a pass of a two-layer
// draft was mostly the thirty-odd small operations around its products, each a Python call.
namespace {
void rms(const float* x, const float* w, float* y, int64_t E, float eps) {
  float ss = 0.0f;
  for (int64_t e = 0; e < E; ++e) ss += x[e] * x[e];
  const float r = 1.0f / std::sqrt(ss / float(E) + eps);
  for (int64_t e = 0; e < E; ++e) y[e] = w[e] * (x[e] * r);
}
void rotate(float* v, const float* c, const float* s, int64_t D) {  // v * cos + rotate_half(v) * sin
  const int64_t h = D / 2;
  for (int64_t d = 0; d < h; ++d) {
    const float a = v[d], b = v[d + h];
    v[d] = a * c[d] - b * s[d];
    v[d + h] = b * c[d + h] + a * s[d + h];
  }
}
}  // namespace

torch::Tensor layer(torch::Tensor x, torch::Tensor w_in, torch::Tensor w_post, double eps, torch::Tensor qkv,
                    int64_t heads, int64_t kv_heads, torch::Tensor o, torch::Tensor gate_up, int64_t inter,
                    torch::Tensor down, torch::Tensor cos, torch::Tensor sin, torch::Tensor kc, torch::Tensor vc,
                    int64_t start, double scale) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat, "rows.layer: x must be [T, E]");
  const int64_t T = x.size(0), E = x.size(1), D = kc.size(3), G = kv_heads, H = heads;
  TORCH_CHECK(kc.dim() == 4 && kc.size(0) == 1 && kc.size(1) == G && kc.is_contiguous() && vc.sizes() == kc.sizes()
              && vc.is_contiguous() && start >= 0 && start + T <= kc.size(2), "rows.layer: the cache cannot take ",
              T, " positions after ", start);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == T && cos.size(1) == D && cos.is_contiguous()
              && sin.is_contiguous() && D % 2 == 0, "rows.layer: cos and sin must be [T, head size]");
  TORCH_CHECK(w_in.numel() == E && w_post.numel() == E, "rows.layer: norm weights must hold E values");
  const float fe = float(eps);
  auto h = torch::empty_like(x);
  for (int64_t t = 0; t < T; ++t)
    rms(x.data_ptr<float>() + t * E, w_in.data_ptr<float>(), h.data_ptr<float>() + t * E, E, fe);
  auto p = linear(h, qkv, (H + 2 * G) * D, c10::nullopt);  // [T, (H + 2G) D]: q, then k, then v
  float* P = p.data_ptr<float>();
  const int64_t W = (H + 2 * G) * D, S = start + T;
  float* K = kc.data_ptr<float>();
  float* V = vc.data_ptr<float>();
  const int64_t cap = kc.size(2);
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos.data_ptr<float>() + t * D;
    const float* s = sin.data_ptr<float>() + t * D;
    float* row = P + t * W;
    for (int64_t j = 0; j < H + G; ++j) rotate(row + j * D, c, s, D);
    for (int64_t g = 0; g < G; ++g) {
      std::copy(row + (H + g) * D, row + (H + g + 1) * D, K + (g * cap + start + t) * D);
      std::copy(row + (H + G + g) * D, row + (H + G + g + 1) * D, V + (g * cap + start + t) * D);
    }
  }
  auto q = p.view({1, T, H + 2 * G, D}).narrow(2, 0, H).transpose(1, 2);  // [1, H, T, D], read through strides
  c10::optional<torch::Tensor> mask;
  if (T > 1)  // causal over the cache: query t sees the keys up to its own position, start + t
    mask = torch::arange(S).le(torch::arange(start, S).unsqueeze(1)).view({1, 1, T, S});
  auto a = attention(q, kc.narrow(2, 0, S), vc.narrow(2, 0, S), mask, scale, c10::nullopt).reshape({T, H * D});
  auto y = x + linear(a, o, E, c10::nullopt);
  for (int64_t t = 0; t < T; ++t)
    rms(y.data_ptr<float>() + t * E, w_post.data_ptr<float>(), h.data_ptr<float>() + t * E, E, fe);
  auto gu = linear(h, gate_up, 2 * inter, c10::nullopt);
  auto z = torch::empty({T, inter}, x.options());
  const float* GU = gu.data_ptr<float>();
  float* Z = z.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      const float g = GU[t * 2 * inter + i];
      Z[t * inter + i] = g / (1.0f + std::exp(-g)) * GU[t * 2 * inter + inter + i];
    }
  return y.add_(linear(z, down, E, c10::nullopt));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention", &attention, "attention of each query row over the keys its mask leaves open, row-invariant",
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("mask"), pybind11::arg("scale"),
        pybind11::arg("queries") = pybind11::none());
  m.def("pack", &pack, "weights [N, K] packed into column blocks for rows.linear");
  m.def("linear", &linear, "few-row matrix product against packed weights, row-invariant");
  m.def("layer", &layer, "one Llama decoder layer of a single sequence's decoding pass (the draft's)");
  m.attr("ISA") = ISA;
  m.attr("BLOCK") = NB;
  m.attr("ROWS_PER_TILE") = MT;
  m.attr("LANES") = L;
}
