#include "executor/kernels/cuda/flash_attention.h"

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

// 64 x 64 tiles, four warps each owning 16 rows. Tiles reach shared memory by cp.async, the next
// tile's copy overlapping the current tile's math, and leave it by ldmatrix (.trans where the
// tile is needed transposed, so no transposed copies). Rows are padded by 8 elements so that the
// eight row addresses of an ldmatrix fall in different banks.
constexpr int kBlock = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

struct Layout {
  int64_t seq, heads, group, token_stride, head_stride;
  // Offset of query head h (and its key-value head) within a token.
  __device__ int64_t query_head(int64_t h, int d) const { return (h / group) * head_stride + (h % group) * d; }
  __device__ int64_t kv_head(int64_t g) const { return g * head_stride; }
};

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const Bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const Bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// Copies `bytes` (4 or 16) from global to shared without blocking; zeros when !valid (src reads nothing).
template <int Bytes>
__device__ __forceinline__ void copy_async(void* s, const void* g, bool valid) {
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(s)), "l"(g),
                 "r"(valid ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(s)), "l"(g),
                 "r"(valid ? 4 : 0));
  }
}
__device__ __forceinline__ void copies_issued() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copies_landed() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// The m16n8k16 A fragment (16 rows x 16 k) of a row-major shared matrix, rows from row0, k from k0.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const Bf16* s, int ld, int row0, int k0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4(a, s + (row0 + (m % 2) * 8 + lane % 8) * ld + k0 + (m / 2) * 8);
}

// B fragments (16 k x 8 n) of n tiles n0 and n0 + 8, where B[k][n] = s[n][k]: rows of s are B's
// columns. b = {b0, b1 of tile n0, b0, b1 of tile n0 + 8}.
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const Bf16* s, int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4(b, s + (n0 + (m / 2) * 8 + lane % 8) * ld + k0 + (m % 2) * 8);
}

// The same where B[k][n] = s[k][n] (s row-major in k), through ldmatrix's transpose.
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], const Bf16* s, int ld, int k0, int n0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4_trans(b, s + (k0 + (m % 2) * 8 + lane % 8) * ld + n0 + (m / 2) * 8);
}

// Accumulator tiles 2c and 2c + 1 (16 rows x 16 columns) as an A fragment with k = those columns.
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// Starts copying rows [row0, row0 + 64) of a token-strided tensor into shared s[64][D + kPad]
// (zeros past seq), 16 bytes per copy.
template <int D>
__device__ void load_rows(Bf16* s, const Bf16* base, int64_t token_stride, int row0, int seq) {
  constexpr int kVectors = D / 8, kLd = D + kPad;
  for (int i = threadIdx.x; i < kBlock * kVectors; i += kThreads) {
    const int r = i / kVectors, c = (i % kVectors) * 8;
    const bool valid = row0 + r < seq;
    copy_async<16>(s + r * kLd + c, base + (valid ? (row0 + r) * token_stride + c : 0), valid);
  }
}

// Starts copying values [row0, row0 + 64) of an fp32 row into shared s (zeros past seq).
__device__ void load_floats(float* s, const float* row, int row0, int seq) {
  for (int i = threadIdx.x; i < kBlock; i += kThreads) {
    const bool valid = row0 + i < seq;
    copy_async<4>(s + i, row + (valid ? row0 + i : 0), valid);
  }
}

// Three blocks per multiprocessor for D = 128 (measured 5% faster on the H100 than letting the
// registers decide); D = 64 gets there by itself and is slower when forced (0: no minimum).
template <int D>
__global__ void __launch_bounds__(kThreads, D == 128 ? 3 : 0) forward_kernel(Layout layout, const Bf16* q, const Bf16* k, const Bf16* v,
                                                           Bf16* out, float* lse, float scale_log2) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  constexpr int kLd = D + kPad, kTile = kBlock * kLd;
  Bf16* kv = reinterpret_cast<Bf16*>(shared_bytes);  // two stages of {K, V}
  // Q passes through the second stage's K slot on its way to registers: the smaller footprint
  // lets three blocks share a multiprocessor.
  Bf16* qs = kv + 2 * kTile;

  const int query_blocks = gridDim.x;
  const int qb = query_blocks - 1 - blockIdx.x;  // longest rows first
  const int64_t bh = blockIdx.y, b = bh / layout.heads, h = bh % layout.heads;
  const int seq = static_cast<int>(layout.seq);
  const Bf16* q_base = q + b * seq * layout.token_stride + layout.query_head(h, D);
  const Bf16* k_base = k + b * seq * layout.token_stride + layout.kv_head(h / layout.group);
  const Bf16* v_base = v + b * seq * layout.token_stride + layout.kv_head(h / layout.group);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  load_rows<D>(qs, q_base, layout.token_stride, qb * kBlock, seq);
  load_rows<D>(kv, k_base, layout.token_stride, 0, seq);
  load_rows<D>(kv + kTile, v_base, layout.token_stride, 0, seq);
  copies_issued();

  uint32_t qa[D / 16][4];
  float o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0, 0};
  const int query0 = qb * kBlock + warp * 16 + g;  // this thread's rows: query0, query0 + 8

  for (int kb = 0; kb <= qb; ++kb) {
    copies_landed();
    __syncthreads();  // this block's K and V are in; everyone is done with the other stage
    if (kb == 0) {
      for (int kc = 0; kc < D / 16; ++kc) load_a(qa[kc], qs, kLd, warp * 16, kc * 16);
      __syncthreads();  // Q is in registers before the next stage overwrites it
    }
    if (kb < qb) {
      Bf16* next = kv + ((kb + 1) % 2) * 2 * kTile;
      load_rows<D>(next, k_base, layout.token_stride, (kb + 1) * kBlock, seq);
      load_rows<D>(next + kTile, v_base, layout.token_stride, (kb + 1) * kBlock, seq);
    }
    copies_issued();
    const Bf16* ks = kv + (kb % 2) * 2 * kTile;
    const Bf16* vs = ks + kTile;

    float s[kBlock / 8][4] = {};
    for (int kc = 0; kc < D / 16; ++kc) {
      for (int np = 0; np < kBlock / 16; ++np) {
        uint32_t bf[4];
        load_b(bf, ks, kLd, np * 16, kc * 16);
        mma(s[2 * np], qa[kc], bf[0], bf[1]);
        mma(s[2 * np + 1], qa[kc], bf[2], bf[3]);
      }
    }
    // Scale into log2 units; mask the future and keys past the end (only the last blocks have any).
    const bool edge = kb == qb || (kb + 1) * kBlock > seq;
    float block_max[2] = {-INFINITY, -INFINITY};
    for (int nt = 0; nt < kBlock / 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        float value = s[nt][e] * scale_log2;
        if (edge) {
          const int key = kb * kBlock + nt * 8 + 2 * t + (e & 1), query = query0 + (e >= 2 ? 8 : 0);
          if (key > query || key >= seq) value = -INFINITY;
        }
        s[nt][e] = value;
        block_max[e >> 1] = fmaxf(block_max[e >> 1], value);
      }
    }
    float alpha[2];
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      const float new_max = fmaxf(row_max[r], block_max[r]);
      const float safe = new_max == -INFINITY ? 0.0f : new_max;  // rows past seq see only masked keys
      alpha[r] = exp2f(row_max[r] - safe);
      row_max[r] = new_max;
      row_sum[r] *= alpha[r];
      block_max[r] = safe;
    }
    for (int nt = 0; nt < kBlock / 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - block_max[e >> 1]);
        s[nt][e] = p;
        row_sum[e >> 1] += p;
      }
    }
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }
    for (int kc = 0; kc < kBlock / 16; ++kc) {
      uint32_t pa[4];
      to_a(pa, s[2 * kc], s[2 * kc + 1]);
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bf[4];
        load_b_trans(bf, vs, kLd, kc * 16, dp * 16);
        mma(o[2 * dp], pa, bf[0], bf[1]);
        mma(o[2 * dp + 1], pa, bf[2], bf[3]);
      }
    }
  }

  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  for (int r = 0; r < 2; ++r) {
    const int query = query0 + 8 * r;
    if (query >= seq) continue;
    const float inverse = 1.0f / row_sum[r];
    Bf16* row = out + ((b * seq + query) * layout.heads + h) * D;
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * t) = pack(o[dt][2 * r] * inverse, o[dt][2 * r + 1] * inverse);
    }
    if (t == 0) lse[(b * layout.heads + h) * seq + query] = (row_max[r] + log2f(row_sum[r])) / kLog2e;
  }
}

// delta[b, h, i] = sum_d dout * out over row i: the softmax backward's row term.
template <int D>
__global__ void delta_kernel(const Bf16* dout, const Bf16* out, int64_t rows, int64_t heads, int64_t seq,
                             float* delta) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;  // (b * seq + i) * heads + h
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float sum = 0;
  for (int d = lane; d < D; d += 32) sum += load(dout, row * D + d) * load(out, row * D + d);
  sum = warp_sum(sum);
  if (lane == 0) {
    const int64_t h = row % heads, token = row / heads, b = token / seq, i = token % seq;
    delta[(b * heads + h) * seq + i] = sum;
  }
}

// dK and dV of one key block of one key-value head: over every query head of its group and every
// query block at or after it (causal), 32 queries at a time; the next query block's Q, dO, lse and
// delta are copied in while the current one is used.
template <int D>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(Layout layout, const Bf16* dout, const Bf16* q, const Bf16* k,
                                                        const Bf16* v, const float* lse, const float* delta,
                                                        int64_t d_token_stride, Bf16* dk, Bf16* dv, float scale,
                                                        float scale_log2) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  constexpr int kLd = D + kPad, kTile = kBlock * kLd;
  Bf16* ks = reinterpret_cast<Bf16*>(shared_bytes);
  Bf16* vs = ks + kTile;
  Bf16* stages = vs + kTile;                                  // two stages of {Q, dO}
  float* row_stats = reinterpret_cast<float*>(stages + 4 * kTile);  // two stages of {lse, delta}

  const int kb = blockIdx.x;
  const int64_t kv_heads = layout.heads / layout.group;
  const int64_t bg = blockIdx.y, b = bg / kv_heads, kvh = bg % kv_heads;
  const int seq = static_cast<int>(layout.seq);
  const int query_blocks = (seq + kBlock - 1) / kBlock, blocks_per_head = query_blocks - kb;
  const int steps = static_cast<int>(layout.group) * blocks_per_head;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t token0 = b * seq, do_stride = layout.heads * D;

  const auto start_step = [&](int step) {
    const int64_t h = kvh * layout.group + step / blocks_per_head;
    const int row0 = (kb + step % blocks_per_head) * kBlock;
    Bf16* stage = stages + (step % 2) * 2 * kTile;
    float* stats = row_stats + (step % 2) * 2 * kBlock;
    load_rows<D>(stage, q + token0 * layout.token_stride + layout.query_head(h, D), layout.token_stride, row0, seq);
    load_rows<D>(stage + kTile, dout + (token0 * layout.heads + h) * D, do_stride, row0, seq);
    load_floats(stats, lse + (b * layout.heads + h) * seq, row0, seq);
    load_floats(stats + kBlock, delta + (b * layout.heads + h) * seq, row0, seq);
  };
  load_rows<D>(ks, k + token0 * layout.token_stride + layout.kv_head(kvh), layout.token_stride, kb * kBlock, seq);
  load_rows<D>(vs, v + token0 * layout.token_stride + layout.kv_head(kvh), layout.token_stride, kb * kBlock, seq);
  start_step(0);
  copies_issued();

  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  const int key0 = kb * kBlock + warp * 16 + g;  // this thread's keys: key0, key0 + 8

  for (int step = 0; step < steps; ++step) {
    copies_landed();
    __syncthreads();
    if (step + 1 < steps) start_step(step + 1);
    copies_issued();
    const int row0 = (kb + step % blocks_per_head) * kBlock;
    const Bf16* qs = stages + (step % 2) * 2 * kTile;
    const Bf16* dos = qs + kTile;
    const float* lse_s = row_stats + (step % 2) * 2 * kBlock;
    const float* delta_s = lse_s + kBlock;
    const bool edge = row0 == kb * kBlock || row0 + kBlock > seq || (kb + 1) * kBlock > seq;
    for (int half = 0; half < 2; ++half) {
      const int n0 = half * 32;  // queries n0 .. n0 + 31 of the block
      float p[4][4] = {}, dp[4][4] = {};
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t ka[4], va[4];
        load_a(ka, ks, kLd, warp * 16, kc * 16);
        load_a(va, vs, kLd, warp * 16, kc * 16);
        for (int np = 0; np < 2; ++np) {
          uint32_t bf[4];
          load_b(bf, qs, kLd, n0 + np * 16, kc * 16);
          mma(p[2 * np], ka, bf[0], bf[1]);  // S^T = K Q^T
          mma(p[2 * np + 1], ka, bf[2], bf[3]);
          load_b(bf, dos, kLd, n0 + np * 16, kc * 16);
          mma(dp[2 * np], va, bf[0], bf[1]);  // dP^T = V dO^T
          mma(dp[2 * np + 1], va, bf[2], bf[3]);
        }
      }
      float ds[4][4];
      for (int nt = 0; nt < 4; ++nt) {
        for (int e = 0; e < 4; ++e) {
          const int column = n0 + nt * 8 + 2 * t + (e & 1);
          bool live = true;
          if (edge) {
            const int query = row0 + column, key = key0 + (e >= 2 ? 8 : 0);
            live = query >= key && query < seq && key < seq;
          }
          const float prob = live ? exp2f(p[nt][e] * scale_log2 - lse_s[column] * kLog2e) : 0.0f;
          p[nt][e] = prob;
          ds[nt][e] = prob * (dp[nt][e] - delta_s[column]);
        }
      }
      for (int kc = 0; kc < 2; ++kc) {
        uint32_t pa[4], dsa[4];
        to_a(pa, p[2 * kc], p[2 * kc + 1]);
        to_a(dsa, ds[2 * kc], ds[2 * kc + 1]);
        for (int dpair = 0; dpair < D / 16; ++dpair) {
          uint32_t bf[4];
          load_b_trans(bf, dos, kLd, n0 + kc * 16, dpair * 16);
          mma(dv_acc[2 * dpair], pa, bf[0], bf[1]);  // dV += P^T dO
          mma(dv_acc[2 * dpair + 1], pa, bf[2], bf[3]);
          load_b_trans(bf, qs, kLd, n0 + kc * 16, dpair * 16);
          mma(dk_acc[2 * dpair], dsa, bf[0], bf[1]);  // dK += dS^T Q
          mma(dk_acc[2 * dpair + 1], dsa, bf[2], bf[3]);
        }
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= seq) continue;
    Bf16* dk_row = dk + (token0 + key) * d_token_stride + layout.kv_head(kvh);
    Bf16* dv_row = dv + (token0 + key) * d_token_stride + layout.kv_head(kvh);
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(dk_row + dt * 8 + 2 * t) =
          pack(dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_row + dt * 8 + 2 * t) = pack(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
    }
  }
}

// dQ of one query block of one query head, over the key blocks up to it, 32 keys at a time; the
// next key block's K and V are copied in while the current one is used.
template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(Layout layout, const Bf16* dout, const Bf16* q, const Bf16* k,
                                                      const Bf16* v, const float* lse, const float* delta,
                                                      int64_t d_token_stride, Bf16* dq, float scale,
                                                      float scale_log2) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  constexpr int kLd = D + kPad, kTile = kBlock * kLd;
  Bf16* qs = reinterpret_cast<Bf16*>(shared_bytes);
  Bf16* dos = qs + kTile;
  Bf16* kv = dos + kTile;  // two stages of {K, V}

  const int query_blocks = gridDim.x;
  const int qb = query_blocks - 1 - blockIdx.x;
  const int64_t bh = blockIdx.y, b = bh / layout.heads, h = bh % layout.heads;
  const int seq = static_cast<int>(layout.seq);
  const int64_t token0 = b * seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const Bf16* k_base = k + token0 * layout.token_stride + layout.kv_head(h / layout.group);
  const Bf16* v_base = v + token0 * layout.token_stride + layout.kv_head(h / layout.group);
  const int row0 = qb * kBlock;

  load_rows<D>(qs, q + token0 * layout.token_stride + layout.query_head(h, D), layout.token_stride, row0, seq);
  load_rows<D>(dos, dout + (token0 * layout.heads + h) * D, layout.heads * D, row0, seq);
  load_rows<D>(kv, k_base, layout.token_stride, 0, seq);
  load_rows<D>(kv + kTile, v_base, layout.token_stride, 0, seq);
  copies_issued();
  const int query0 = row0 + warp * 16 + g;
  float row_lse[2], row_delta[2];
  for (int r = 0; r < 2; ++r) {
    const int query = query0 + 8 * r;
    const bool valid = query < seq;
    row_lse[r] = valid ? lse[(b * layout.heads + h) * seq + query] * kLog2e : 0.0f;
    row_delta[r] = valid ? delta[(b * layout.heads + h) * seq + query] : 0.0f;
  }
  float dq_acc[D / 8][4] = {};

  for (int kb = 0; kb <= qb; ++kb) {
    copies_landed();
    __syncthreads();
    if (kb < qb) {
      Bf16* next = kv + ((kb + 1) % 2) * 2 * kTile;
      load_rows<D>(next, k_base, layout.token_stride, (kb + 1) * kBlock, seq);
      load_rows<D>(next + kTile, v_base, layout.token_stride, (kb + 1) * kBlock, seq);
    }
    copies_issued();
    const Bf16* ks = kv + (kb % 2) * 2 * kTile;
    const Bf16* vs = ks + kTile;
    const bool edge = kb == qb || (kb + 1) * kBlock > seq;
    for (int half = 0; half < 2; ++half) {
      const int n0 = half * 32;  // keys n0 .. n0 + 31 of the block
      float p[4][4] = {}, dp[4][4] = {};
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t qa[4], da[4];
        load_a(qa, qs, kLd, warp * 16, kc * 16);
        load_a(da, dos, kLd, warp * 16, kc * 16);
        for (int np = 0; np < 2; ++np) {
          uint32_t bf[4];
          load_b(bf, ks, kLd, n0 + np * 16, kc * 16);
          mma(p[2 * np], qa, bf[0], bf[1]);  // S = Q K^T
          mma(p[2 * np + 1], qa, bf[2], bf[3]);
          load_b(bf, vs, kLd, n0 + np * 16, kc * 16);
          mma(dp[2 * np], da, bf[0], bf[1]);  // dP = dO V^T
          mma(dp[2 * np + 1], da, bf[2], bf[3]);
        }
      }
      float ds[4][4];
      for (int nt = 0; nt < 4; ++nt) {
        for (int e = 0; e < 4; ++e) {
          bool live = true;
          if (edge) {
            const int key = kb * kBlock + n0 + nt * 8 + 2 * t + (e & 1), query = query0 + (e >= 2 ? 8 : 0);
            live = key <= query && key < seq && query < seq;
          }
          const float prob = live ? exp2f(p[nt][e] * scale_log2 - row_lse[e >> 1]) : 0.0f;
          ds[nt][e] = prob * (dp[nt][e] - row_delta[e >> 1]);
        }
      }
      for (int kc = 0; kc < 2; ++kc) {
        uint32_t dsa[4];
        to_a(dsa, ds[2 * kc], ds[2 * kc + 1]);
        for (int dpair = 0; dpair < D / 16; ++dpair) {
          uint32_t bf[4];
          load_b_trans(bf, ks, kLd, n0 + kc * 16, dpair * 16);
          mma(dq_acc[2 * dpair], dsa, bf[0], bf[1]);  // dQ += dS K
          mma(dq_acc[2 * dpair + 1], dsa, bf[2], bf[3]);
        }
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    const int query = query0 + 8 * r;
    if (query >= seq) continue;
    Bf16* row = dq + (token0 + query) * d_token_stride + layout.query_head(h, D);
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * t) = pack(dq_acc[dt][2 * r] * scale, dq_acc[dt][2 * r + 1] * scale);
    }
  }
}

Layout layout_of(const AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128) {
    throw SpecError("--kv-channels", "flash attention takes head dimensions 64 and 128, got " +
                                         std::to_string(s.head_dim));
  }
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) {
    throw SpecError("--num-query-groups", std::to_string(s.kv_heads) + " must divide the " + std::to_string(s.heads) +
                                              " attention heads");
  }
  return Layout{s.seq, s.heads, s.heads / s.kv_heads, s.qkv_token_stride, s.qkv_head_stride};
}

// Two stages of K and V (Q borrows one).
template <int D>
constexpr int forward_shared_bytes() {
  return 4 * kBlock * (D + kPad) * 2;
}
// K, V, two stages of Q and dO, two stages of 64 lse and 64 delta values.
template <int D>
constexpr int dkdv_shared_bytes() {
  return 6 * kBlock * (D + kPad) * 2 + 4 * kBlock * 4;
}
// Q, dO, two stages of K and V.
template <int D>
constexpr int dq_shared_bytes() {
  return 6 * kBlock * (D + kPad) * 2;
}

template <int D>
void forward(const AttentionShape& shape, const Bf16* q, const Bf16* k, const Bf16* v, Bf16* out, float* lse) {
  const Layout layout = layout_of(shape);
  constexpr int bytes = forward_shared_bytes<D>();
  check(cudaFuncSetAttribute(forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "flash attention forward shared memory");
  const dim3 grid(static_cast<unsigned>((shape.seq + kBlock - 1) / kBlock), static_cast<unsigned>(shape.batch * shape.heads));
  forward_kernel<D><<<grid, kThreads, bytes>>>(layout, q, k, v, out, lse, shape.softmax_scale * kLog2e);
  check_launch("flash attention forward");
}

template <int D>
void backward(const AttentionShape& shape, const Bf16* dout, const Bf16* q, const Bf16* k, const Bf16* v,
              const Bf16* out, const float* lse, int64_t d_stride, Bf16* dq, Bf16* dk, Bf16* dv, void* workspace) {
  const Layout layout = layout_of(shape);
  float* delta = static_cast<float*>(workspace);
  const int64_t rows = shape.batch * shape.seq * shape.heads;
  delta_kernel<D><<<blocks_for(rows, kWarps), kThreads>>>(dout, out, rows, shape.heads, shape.seq, delta);
  check_launch("flash attention delta");
  const unsigned blocks = static_cast<unsigned>((shape.seq + kBlock - 1) / kBlock);
  const float scale = shape.softmax_scale, scale_log2 = shape.softmax_scale * kLog2e;
  constexpr int dkdv_bytes = dkdv_shared_bytes<D>();
  check(cudaFuncSetAttribute(dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dkdv_bytes),
        "flash attention dK/dV shared memory");
  dkdv_kernel<D><<<dim3(blocks, static_cast<unsigned>(shape.batch * shape.kv_heads)), kThreads, dkdv_bytes>>>(
      layout, dout, q, k, v, lse, delta, d_stride, dk, dv, scale, scale_log2);
  check_launch("flash attention dK/dV");
  constexpr int dq_bytes = dq_shared_bytes<D>();
  check(cudaFuncSetAttribute(dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_bytes),
        "flash attention dQ shared memory");
  dq_kernel<D><<<dim3(blocks, static_cast<unsigned>(shape.batch * shape.heads)), kThreads, dq_bytes>>>(
      layout, dout, q, k, v, lse, delta, d_stride, dq, scale, scale_log2);
  check_launch("flash attention dQ");
}

}  // namespace

void flash_attention_forward(const AttentionShape& shape, const Bf16* q, const Bf16* k, const Bf16* v, Bf16* out,
                             float* lse) {
  if (shape.batch * shape.seq * shape.heads == 0) return;
  if (shape.head_dim == 128) return forward<128>(shape, q, k, v, out, lse);
  if (shape.head_dim == 64) return forward<64>(shape, q, k, v, out, lse);
  (void)layout_of(shape);  // throws the head-dimension error
}

std::size_t flash_attention_backward_workspace_bytes(const AttentionShape& shape) {
  return static_cast<std::size_t>(shape.batch * shape.heads * shape.seq) * sizeof(float);
}

void flash_attention_backward(const AttentionShape& shape, const Bf16* dout, const Bf16* q, const Bf16* k,
                              const Bf16* v, const Bf16* out, const float* lse, int64_t dqkv_token_stride, Bf16* dq,
                              Bf16* dk, Bf16* dv, void* workspace) {
  if (shape.batch * shape.seq * shape.heads == 0) return;
  if (shape.head_dim == 128) return backward<128>(shape, dout, q, k, v, out, lse, dqkv_token_stride, dq, dk, dv, workspace);
  if (shape.head_dim == 64) return backward<64>(shape, dout, q, k, v, out, lse, dqkv_token_stride, dq, dk, dv, workspace);
  (void)layout_of(shape);
}

}  // namespace megaplan::exec::cuda
