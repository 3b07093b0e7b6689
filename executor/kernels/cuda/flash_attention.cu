// Each kernel is instantiated for head dimensions 64 and 128 and for bf16 and fp16 inputs (P):
// fp16 runs the .f16 wgmma instructions where bf16 runs the .bf16 ones, and rounds P and dS to
// fp16 in registers; the math around them is the same fp32. And with and without dropout
// (kDropout), so that attention without it runs no mask code at all. Ring attention's block form
// (context parallelism) is a separate instantiation of the same bodies (kRing), so that the
// whole-sequence kernels' code is the block-less code.
#include "executor/kernels/cuda/flash_attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"
#include "executor/kernels/cuda/dropout.h"
#include "executor/kernels/cuda/wgmma.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

// A thread block is one warpgroup (four warps) that keeps 64 rows resident (queries for the
// forward and dQ, keys for dK and dV), each warp 16 of them, and streams 64-row tiles of the other
// side past them, multiplying with Hopper's wgmma, which reads B (and A where it is a stored tile)
// from shared memory. Tiles arrive by cp.async, the next tile's copy overlapping the current
// tile's math, in wgmma.cuh's swizzled layout. (Two warpgroups sharing the streamed tiles of 128
// resident rows halve the L2 traffic but measured slower on the H200: 0.58 / 2.39 ms against
// 0.60 / 1.77 ms for gpt-1.3b's forward / backward, one block per multiprocessor being too few
// to hide each one's waits.)
constexpr int kBlock = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
// dK/dV multiply a key block by this many queries at a time. Measured on the H200 (gpt-1.3b and
// gpt2-350m backward): 64 takes d128 from 1.30 to 1.22 ms but d64 from 0.43 to 0.46 ms.
template <int D>
constexpr int kQueryChunk = D == 128 ? 64 : 32;
template <int D>
constexpr int kTileBytes = kBlock* D * 2;  // one 64-row tile

struct Layout {
  int64_t seq, heads, group, token_stride, head_stride;
  // Offset of query head h (and its key-value head) within a token.
  __device__ int64_t query_head(int64_t h, int d) const { return (h / group) * head_stride + (h % group) * d; }
  __device__ int64_t kv_head(int64_t g) const { return g * head_stride; }
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies `bytes` (4 or 16) from global to shared without blocking; zeros when !valid (src reads nothing).
template <int Bytes>
__device__ __forceinline__ void copy_async(void* s, const void* g, bool valid) {
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(s)), "l"(g),
                 "r"(valid ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(s)), "l"(g), "r"(valid ? 4 : 0));
  }
}
__device__ __forceinline__ void copies_issued() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits for this thread's copies and hands them to the tensor cores' proxy; a barrier follows.
__device__ __forceinline__ void copies_landed() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  shared_writes_to_async_proxy();
}

// 2^x flushing subnormal results to zero: one MUFU.EX2, where exp2f adds a range check and two
// fix-ups for results below 2^-126, which are nothing beside a softmax row's sum (at least 1).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Accumulator tiles 2c and 2c + 1 (16 rows x 16 columns) as an A fragment with k = those columns,
// rounded to P.
template <DType P>
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<P>(lo[0], lo[1]);
  a[1] = pack2<P>(lo[2], lo[3]);
  a[2] = pack2<P>(hi[0], hi[1]);
  a[3] = pack2<P>(hi[2], hi[3]);
}

// A wgmma accumulator of 64 x N viewed as this thread's N / 8 mma.sync-shaped tiles: tile i holds
// columns 8i + 2t, 8i + 2t + 1 of rows g and g + 8 of the warp's 16 (g = lane / 4, t = lane % 4).
template <int Tiles>
__device__ __forceinline__ float (&flat(float (&tiles)[Tiles][4]))[Tiles * 4] {
  return reinterpret_cast<float(&)[Tiles * 4]>(tiles);
}

// Starts copying rows [row0, row0 + 64) of a token-strided tensor into a swizzled 64 x D tile
// (zeros past seq), 16 bytes per copy. Each thread keeps one 16-byte column piece and
// steps down the rows by a multiple of 8, so its swizzle, and all but one add per copy, is
// worked out once: the address arithmetic otherwise outweighs the softmax.
template <int D>
__device__ __forceinline__ void load_tile(unsigned char* tile, const Half* base, int64_t token_stride, int row0,
                                          int seq) {
  constexpr int kPieces = D / 8, kRowStep = kThreads / kPieces;
  static_assert(kRowStep % 8 == 0 && kBlock % kRowStep == 0, "rows must keep their swizzle phase");
  const int piece = threadIdx.x % kPieces, r0 = threadIdx.x / kPieces;
  unsigned char* dst = tile + swizzled_offset<kBlock>(r0, piece);
  const Half* src = base + (row0 + r0) * token_stride + piece * 8;
  const int64_t src_step = kRowStep * token_stride;
#pragma unroll
  for (int pass = 0; pass < kBlock / kRowStep; ++pass) {
    const bool valid = row0 + r0 + pass * kRowStep < seq;
    copy_async<16>(dst + pass * kRowStep * kSwizzleRowBytes, valid ? src + pass * src_step : base, valid);
  }
}

// Starts copying values [row0, row0 + 64) of an fp32 row into shared s (zeros past seq).
__device__ void load_floats(float* s, const float* row, int row0, int seq) {
  for (int i = threadIdx.x; i < kBlock; i += kThreads) {
    const bool valid = row0 + i < seq;
    copy_async<4>(s + i, row + (valid ? row0 + i : 0), valid);
  }
}

// Dynamic shared memory rounded up to the 1024 bytes the swizzle repeats over.
__device__ __forceinline__ unsigned char* aligned_shared(unsigned char* raw) {
  const uint32_t address = shared_address(raw);
  return raw + ((1024 - (address & 1023)) & 1023);
}
constexpr int kAlignSlack = 1024;

// Dropout's mask Z on the probabilities. A thread's accumulator elements are scattered over the
// tile, but the mask's elements are consecutive along a query's keys, four to a Philox draw: the
// lanes that hold the same queries split the draws of their keys between them
// (dropout_keep_bits) and pass the bits around by shuffles, so that each draw is made once per
// run of keys (a draw that straddles two runs, where runs do not start draws, by both).

// keeps_probability's element for query head h (of this call), query `query` and key `key`.
__device__ __forceinline__ uint64_t probability_element(const DropoutMask& mask, int64_t h, int64_t query,
                                                        int64_t key) {
  return static_cast<uint64_t>(((mask.first_head + h) * mask.seq + query) * mask.seq + key);
}

// Z for this thread's two rows (queries query0 and query0 + 8) of one 64-key block, with S or dP's
// rows as queries and columns as keys (the forward and dQ). The quad's four lanes hold the same
// two rows: lanes t and t ^ 2 draw alternate blocks of row t % 2 and the shuffles hand both rows
// to all four.
struct RowKeeps {
  uint64_t rows[2];  // bit 8 nt + (e & 1) of rows[e >> 1]: element [nt][e]

  RowKeeps() = default;
  __device__ __forceinline__ RowKeeps(const DropoutMask& mask, int64_t b, int64_t h, int query0, int key_first) {
    const int t = threadIdx.x % 4;
    const uint64_t first = probability_element(mask, h, query0 + 8 * (t & 1), key_first);
    uint64_t own = dropout_keep_bits(mask, mask.first_sample + b, first, kBlock, t >> 1, 2);
    own |= __shfl_xor_sync(0xffffffffu, own, 2);
    const uint64_t other = __shfl_xor_sync(0xffffffffu, own, 1);
    rows[0] = (t & 1 ? other : own) >> (2 * t);
    rows[1] = (t & 1 ? own : other) >> (2 * t);
  }
  __device__ __forceinline__ bool kept(int nt, int e) const { return (rows[e >> 1] >> (nt * 8 + (e & 1))) & 1; }
};

// Z for this thread's elements of a dK/dV chunk of kTiles * 8 queries from query_first, whose
// rows are keys (key_first + g and + 8 of the warp's 16) and columns queries: a query's run of 16
// keys lies down the warp's rows. The eight lanes with the same t hold the same 2 * kTiles
// queries (column c of them: tile c / 2, e & 1 = c % 2); lane g draws columns g + 8 i, and eight
// shuffles give every lane all of them. Bit 4 nt + e: element [nt][e].
template <int kTiles>
__device__ __forceinline__ uint32_t column_keeps(const DropoutMask& mask, int64_t b, int64_t h, int query_first,
                                                 int key_first) {
  static_assert(kTiles == 4 || kTiles == 8, "a lane draws one or two whole columns");
  constexpr int kPerLane = 2 * kTiles / 8;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t drawn = 0;  // 16 keys of column g + 8 i at bit 16 i
  for (int i = 0; i < kPerLane; ++i) {
    const int c = g + 8 * i;
    const uint64_t first = probability_element(mask, h, query_first + (c / 2) * 8 + 2 * t + c % 2, key_first);
    drawn |= static_cast<uint32_t>(dropout_keep_bits(mask, mask.first_sample + b, first, 16, 0, 1)) << (16 * i);
  }
  uint32_t bits = 0;
  for (int source = 0; source < 8; ++source) {
    const uint32_t columns = __shfl_sync(0xffffffffu, drawn, source * 4 + t) >> g;
    for (int i = 0; i < kPerLane; ++i) {
      const int c = source + 8 * i, nt = c / 2;
      bits |= ((columns >> (16 * i)) & 1u) << (4 * nt + c % 2);          // key g
      bits |= ((columns >> (16 * i + 8)) & 1u) << (4 * nt + 2 + c % 2);  // key g + 8
    }
  }
  return bits;
}

// The online softmax of one 64-key block of S (this thread's two rows): scales into log2 units,
// masks the future and keys past seq, moves the running maximum and sum, and leaves P = exp(S -
// max) in p. Returns each row's rescaling of the old sum in alpha.
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0, 0};

  // Reads s without writing it: registers that feed a wgmma may be defined by wgmma alone while
  // another product is in flight, or ptxas serializes the products. The running maximum is in
  // log2 units (scale_log2 > 0 commutes with the max), so P costs one FFMA and one EX2.
  __device__ __forceinline__ void step(const float (&s)[kBlock / 8][4], float (&p)[kBlock / 8][4], float (&alpha)[2],
                                       float scale_log2, int key0, int query0, int seq, bool edge) {
    const int t = threadIdx.x % 4;
    float block_max[2] = {-INFINITY, -INFINITY};
    for (int nt = 0; nt < kBlock / 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        float value = s[nt][e];
        if (edge) {
          const int key = key0 + nt * 8 + 2 * t + (e & 1), query = query0 + (e >= 2 ? 8 : 0);
          if (key > query || key >= seq) value = -INFINITY;
        }
        p[nt][e] = value;
        block_max[e >> 1] = fmaxf(block_max[e >> 1], value);
      }
    }
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      const float new_max = fmaxf(row_max[r], block_max[r] * scale_log2);
      const float safe = new_max == -INFINITY ? 0.0f : new_max;  // rows past seq see only masked keys
      alpha[r] = fast_exp2(row_max[r] - safe);
      row_max[r] = new_max;
      row_sum[r] *= alpha[r];
      block_max[r] = safe;
    }
    for (int nt = 0; nt < kBlock / 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        p[nt][e] = fast_exp2(fmaf(p[nt][e], scale_log2, -block_max[e >> 1]));
        row_sum[e >> 1] += p[nt][e];
      }
    }
  }
};

// Ring attention's block form (context parallelism) of the kernels below: `rows` queries from local
// row query_row0 of each sequence's layout.seq rows against `rows` keys and values from local row
// key_row0 of a packed kv [batch, layout.seq, kv_heads, 2, D] (each head's key, then its value),
// their first tokens at query_first and key_first of the whole sequence (dropout's mask is drawn at
// those places). A diagonal block (`causal`) masks as the whole sequence does; any other block sees
// every key. The whole-sequence kernels instantiate the same bodies with kRing false, which reads
// none of this (their code is the block-less code it was).
struct BlockPlaces {
  int64_t kv_token_stride;  // kv_heads * 2 * D
  int rows;
  int query_row0, key_row0;
  int query_first, key_first;
  bool causal;
};

// One query block against its key blocks, software-pipelined within the warpgroup: while the
// tensor cores run O += P V for block kb, the warps already compute the softmax of block kb + 1,
// whose S = Q K^T they issued first. K and V have two stages each; block kb's barrier frees K of
// kb (its S is done) and V of kb - 1 (its PV is done), which take K of kb + 2 and V of kb + 1.
//
// Dropout zeroes P after the softmax has summed it (the sum, and the lse, are the undropped ones);
// its 1 / (1 - p) joins the final division by the sum.
//
// The block form (kRing) takes k as the packed kv (v = k + D) and merges its result into the
// running fp32 out32 [batch, layout.seq, heads, D] and lse [batch, heads, layout.seq] by their
// log-sum-exp, where the whole sequence writes out and lse.
template <DType P, int D, bool kDropout, bool kRing>
__device__ __forceinline__ void forward_body(const Layout& layout, const Half* q, const Half* k, const Half* v,
                                             Half* out, float* lse, float scale_log2, const DropoutMask& dropout,
                                             const BlockPlaces& block, float* out32) {
  extern __shared__ unsigned char shared_raw[];
  constexpr int kTile = kTileBytes<D>;
  unsigned char* qs = aligned_shared(shared_raw);
  unsigned char* k_stages = qs + kTile;
  unsigned char* v_stages = k_stages + 2 * kTile;

  const int query_blocks = gridDim.x;
  const int qb = query_blocks - 1 - blockIdx.x;  // longest rows first
  const int64_t bh = blockIdx.y, b = bh / layout.heads, h = bh % layout.heads;
  const int seq = kRing ? block.rows : static_cast<int>(layout.seq);
  const int64_t kv_stride = kRing ? block.kv_token_stride : layout.token_stride;
  const Half* q_base;
  const Half* k_base;
  const Half* v_base;
  if constexpr (kRing) {
    q_base = q + (b * layout.seq + block.query_row0) * layout.token_stride + layout.query_head(h, D);
    k_base = k + (b * layout.seq + block.key_row0) * kv_stride + (h / layout.group) * 2 * D;
    v_base = k_base + D;
  } else {
    q_base = q + b * seq * layout.token_stride + layout.query_head(h, D);
    k_base = k + b * seq * layout.token_stride + layout.kv_head(h / layout.group);
    v_base = v + b * seq * layout.token_stride + layout.kv_head(h / layout.group);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int query0 = qb * kBlock + warp * 16 + g;  // this thread's rows: query0, query0 + 8
  // Without the causal mask a block's queries see every key: its masking compares keys with a
  // query past them all.
  const bool causal = !kRing || block.causal;
  const int key_blocks = causal ? qb + 1 : (seq + kBlock - 1) / kBlock;
  const int mask_query0 = causal ? query0 : seq;
  const auto edge = [&](int kb) { return (causal && kb == qb) || (kb + 1) * kBlock > seq; };
  const auto k_stage = [&](int kb) { return k_stages + (kb % 2) * kTile; };
  const auto v_stage = [&](int kb) { return v_stages + (kb % 2) * kTile; };
  const auto drop = [&](float(&p)[kBlock / 8][4], int kb) {
    const RowKeeps keeps = kRing ? RowKeeps(dropout, b, h, block.query_first + query0, block.key_first + kb * kBlock)
                                 : RowKeeps(dropout, b, h, query0, kb * kBlock);
    for (int nt = 0; nt < kBlock / 8; ++nt) {
      for (int e = 0; e < 4; ++e) p[nt][e] = keeps.kept(nt, e) ? p[nt][e] : 0.0f;
    }
  };
  const uint32_t q_tile = shared_address(qs), k_tiles = shared_address(k_stages), v_tiles = shared_address(v_stages);
  const auto issue_s = [&](float(&s)[kBlock / 8][4], int kb) {
    const uint32_t k_tile = k_tiles + (kb % 2) * kTile;
    for (int step = 0; step < D / 16; ++step) {
      wgmma<P, 0>(flat(s), k_major<kBlock>(q_tile, 0, step), k_major<kBlock>(k_tile, 0, step), step > 0);  // S = Q K^T
    }
    wgmma_commit();
  };

  load_tile<D>(qs, q_base, layout.token_stride, qb * kBlock, seq);
  load_tile<D>(k_stage(0), k_base, kv_stride, 0, seq);
  load_tile<D>(v_stage(0), v_base, kv_stride, 0, seq);
  if (key_blocks > 1) load_tile<D>(k_stage(1), k_base, kv_stride, kBlock, seq);
  copies_issued();

  float o[D / 8][4] = {};
  OnlineSoftmax softmax;
  float s[kBlock / 8][4], p[kBlock / 8][4];
  uint32_t pa[kBlock / 16][4];
  float alpha[2];

  copies_landed();
  __syncthreads();
  wgmma_fence();
  issue_s(s, 0);
  wgmma_wait<0>();
  wgmma_pin(flat(s));
  softmax.step(s, p, alpha, scale_log2, 0, mask_query0, seq, edge(0));
  if constexpr (kDropout) drop(p, 0);
  for (int kc = 0; kc < kBlock / 16; ++kc) to_a<P>(pa[kc], p[2 * kc], p[2 * kc + 1]);

  for (int kb = 0; kb < key_blocks; ++kb) {
    copies_landed();
    __syncthreads();  // K of kb + 1 and V of kb are in; K of kb and V of kb - 1 are free
    if (kb + 2 < key_blocks) load_tile<D>(k_stage(kb + 2), k_base, kv_stride, (kb + 2) * kBlock, seq);
    if (kb + 1 < key_blocks) load_tile<D>(v_stage(kb + 1), v_base, kv_stride, (kb + 1) * kBlock, seq);
    copies_issued();
    const bool more = kb + 1 < key_blocks;
    wgmma_fence();
    // Unconditional, the last one multiplying a stale stage for nothing: under a branch, ptxas
    // added warpgroup synchronisation around it.
    issue_s(s, kb + 1);
    for (int kc = 0; kc < kBlock / 16; ++kc) {
      wgmma<P, 1>(flat(o), pa[kc], mn_major<kBlock>(v_tiles + (kb % 2) * kTile, kc * 16), true);  // O += P V
    }
    wgmma_commit();
    if (more) {
      wgmma_wait<1>();  // S of kb + 1 is done, PV of kb may still run
      wgmma_pin(flat(s));
      softmax.step(s, p, alpha, scale_log2, (kb + 1) * kBlock, mask_query0, seq, edge(kb + 1));
      if constexpr (kDropout) drop(p, kb + 1);
      wgmma_wait<0>();  // PV of kb has read pa and written o
      wgmma_pin(flat(o));
      for (int kc = 0; kc < kBlock / 16; ++kc) to_a<P>(pa[kc], p[2 * kc], p[2 * kc + 1]);
      // Most blocks leave every row's maximum where it was: skip the 64 multiplies then.
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
        for (int dt = 0; dt < D / 8; ++dt) {
          o[dt][0] *= alpha[0];
          o[dt][1] *= alpha[0];
          o[dt][2] *= alpha[1];
          o[dt][3] *= alpha[1];
        }
      }
    } else {
      wgmma_wait<0>();
      wgmma_pin(flat(o));
    }
  }

  float* row_sum = softmax.row_sum;
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  if constexpr (kRing) {
    // The rows' running lse, read by the quad's four lanes before its first lane rewrites it.
    float* lse_rows = lse + (b * layout.heads + h) * layout.seq + block.query_row0;
    float old_lse[2];
    for (int r = 0; r < 2; ++r) old_lse[r] = query0 + 8 * r < seq ? lse_rows[query0 + 8 * r] : 0.0f;
    __syncwarp();
    for (int r = 0; r < 2; ++r) {
      const int query = query0 + 8 * r;
      if (query >= seq) continue;
      // Every row of a ring block sees a key (its first, at least): the block's lse is finite.
      const float block_lse = (softmax.row_max[r] + log2f(row_sum[r])) / kLog2e, old = old_lse[r];
      const float merged = old == -INFINITY ? block_lse : fmaxf(old, block_lse) + log1pf(expf(-fabsf(old - block_lse)));
      const float keep = old == -INFINITY ? 0.0f : expf(old - merged);
      const float take = expf(block_lse - merged) * (kDropout ? dropout.scale() : 1.0f) / row_sum[r];
      float* row = out32 + ((b * layout.seq + block.query_row0 + query) * layout.heads + h) * D;
      for (int dt = 0; dt < D / 8; ++dt) {
        float2* pair = reinterpret_cast<float2*>(row + dt * 8 + 2 * t);
        const float2 before = *pair;
        *pair = make_float2(keep * before.x + take * o[dt][2 * r], keep * before.y + take * o[dt][2 * r + 1]);
      }
      if (t == 0) lse_rows[query] = merged;
    }
  } else {
    for (int r = 0; r < 2; ++r) {
      const int query = query0 + 8 * r;
      if (query >= seq) continue;
      const float inverse = (kDropout ? dropout.scale() : 1.0f) / row_sum[r];
      Half* row = out + ((b * seq + query) * layout.heads + h) * D;
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * t) =
            pack2<P>(o[dt][2 * r] * inverse, o[dt][2 * r + 1] * inverse);
      }
      if (t == 0) lse[(b * layout.heads + h) * seq + query] = (softmax.row_max[r] + log2f(row_sum[r])) / kLog2e;
    }
  }
}

template <DType P, int D, bool kDropout>
__global__ void __launch_bounds__(kThreads, 2)
    forward_kernel(Layout layout, const Half* q, const Half* k, const Half* v, Half* out, float* lse, float scale_log2,
                   DropoutMask dropout) {
  forward_body<P, D, kDropout, false>(layout, q, k, v, out, lse, scale_log2, dropout, BlockPlaces{}, nullptr);
}

template <DType P, int D, bool kDropout>
__global__ void __launch_bounds__(kThreads, 2)
    forward_block_kernel(Layout layout, const Half* q, const Half* kv, float* out32, float* lse, float scale_log2,
                         DropoutMask dropout, BlockPlaces block) {
  forward_body<P, D, kDropout, true>(layout, q, kv, kv + D, nullptr, lse, scale_log2, dropout, block, out32);
}

// delta[b, h, i] = sum_d dout * out over row i: the softmax backward's row term.
template <DType P, int D>
__global__ void delta_kernel(const Half* dout, const Half* out, int64_t rows, int64_t heads, int64_t seq,
                             float* delta) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;  // (b * seq + i) * heads + h
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float sum = 0;
  for (int d = lane; d < D; d += 32) sum += load<P>(dout, row * D + d) * load<P>(out, row * D + d);
  sum = warp_sum(sum);
  if (lane == 0) {
    const int64_t h = row % heads, token = row / heads, b = token / seq, i = token % seq;
    delta[(b * heads + h) * seq + i] = sum;
  }
}

// delta of a ring block's query rows: rows row0 .. row0 + block_rows of each sequence's seq local
// rows, into delta [b, h, block_rows].
template <DType P, int D>
__global__ void delta_block_kernel(const Half* dout, const Half* out, int64_t rows, int64_t heads, int64_t seq,
                                   int64_t row0, int64_t block_rows, float* delta) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;  // (b * block_rows + i) * heads + h
  if (row >= rows) return;
  const int64_t h = row % heads, token = row / heads, b = token / block_rows, i = token % block_rows;
  const int64_t at = ((b * seq + row0 + i) * heads + h) * D;
  const int lane = threadIdx.x % 32;
  float sum = 0;
  for (int d = lane; d < D; d += 32) sum += load<P>(dout, at + d) * load<P>(out, at + d);
  sum = warp_sum(sum);
  if (lane == 0) delta[(b * heads + h) * block_rows + i] = sum;
}

// Adds two values to a pair of 16-bit elements (the block form's read-add-write of gradients).
template <DType P>
__device__ __forceinline__ void add_pair(Half* pair, float first, float second) {
  const uint32_t before = *reinterpret_cast<const uint32_t*>(pair);
  *reinterpret_cast<uint32_t*>(pair) = pack2<P>(from_bits<P>(static_cast<uint16_t>(before & 0xffffu)) + first,
                                                from_bits<P>(static_cast<uint16_t>(before >> 16)) + second);
}

// dK and dV of one key block of one key-value head: over every query head of its group and every
// query block at or after it (causal), kQueryChunk queries at a time; the next query block's Q, dO,
// lse and delta are copied in while the current one is used. Dropout's 1 / (1 - p) on dV's P is
// applied once, to the sum.
//
// The block form (kRing) reads k and v from the packed kv (v = k + D), lse [batch, heads,
// layout.seq] at the query chunk's rows and delta [batch, heads, block.rows], takes every query
// block unless the block is diagonal, and adds dK and dV to dk and dv, laid out as k and v.
template <DType P, int D, bool kDropout, bool kRing>
__device__ __forceinline__ void dkdv_body(const Layout& layout, const Half* dout, const Half* q, const Half* k,
                                          const Half* v, const float* lse, const float* delta, int64_t d_token_stride,
                                          Half* dk, Half* dv, float scale, float scale_log2, const DropoutMask& dropout,
                                          const BlockPlaces& block) {
  extern __shared__ unsigned char shared_raw[];
  constexpr int kTile = kTileBytes<D>;
  unsigned char* ks = aligned_shared(shared_raw);
  unsigned char* vs = ks + kTile;
  unsigned char* stages = vs + kTile;                               // two stages of {Q, dO}
  float* row_stats = reinterpret_cast<float*>(stages + 4 * kTile);  // two stages of {lse, delta}

  const int kb = blockIdx.x;
  const int64_t kv_heads = layout.heads / layout.group;
  const int64_t bg = blockIdx.y, b = bg / kv_heads, kvh = bg % kv_heads;
  const int seq = kRing ? block.rows : static_cast<int>(layout.seq);
  const bool causal = !kRing || block.causal;
  const int first_query_block = causal ? kb : 0;
  const int query_blocks = (seq + kBlock - 1) / kBlock, blocks_per_head = query_blocks - first_query_block;
  const int steps = static_cast<int>(layout.group) * blocks_per_head;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The first query row's token, and the first key row's (the same but in the block form).
  const int64_t token0 = kRing ? b * layout.seq + block.query_row0 : b * seq, do_stride = layout.heads * D;
  const int64_t key_token0 = kRing ? b * layout.seq + block.key_row0 : token0;
  const int64_t kv_stride = kRing ? block.kv_token_stride : layout.token_stride;
  const int64_t kv_head = kRing ? kvh * 2 * D : layout.kv_head(kvh);
  const int64_t lse_stride = kRing ? layout.seq : seq, lse_row0 = kRing ? block.query_row0 : 0;

  const auto start_step = [&](int step) {
    const int64_t h = kvh * layout.group + step / blocks_per_head;
    const int row0 = (first_query_block + step % blocks_per_head) * kBlock;
    unsigned char* stage = stages + (step % 2) * 2 * kTile;
    float* stats = row_stats + (step % 2) * 2 * kBlock;
    load_tile<D>(stage, q + token0 * layout.token_stride + layout.query_head(h, D), layout.token_stride, row0, seq);
    load_tile<D>(stage + kTile, dout + (token0 * layout.heads + h) * D, do_stride, row0, seq);
    load_floats(stats, lse + (b * layout.heads + h) * lse_stride + lse_row0, row0, seq);
    load_floats(stats + kBlock, delta + (b * layout.heads + h) * seq, row0, seq);
  };
  load_tile<D>(ks, k + key_token0 * kv_stride + kv_head, kv_stride, kb * kBlock, seq);
  load_tile<D>(vs, v + key_token0 * kv_stride + kv_head, kv_stride, kb * kBlock, seq);
  start_step(0);
  copies_issued();

  const uint32_t k_tile = shared_address(ks), v_tile = shared_address(vs), stage_tiles = shared_address(stages);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  const int key0 = kb * kBlock + warp * 16 + g;  // this thread's keys: key0, key0 + 8

  for (int step = 0; step < steps; ++step) {
    copies_landed();
    __syncthreads();
    if (step + 1 < steps) start_step(step + 1);
    copies_issued();
    const int row0 = (first_query_block + step % blocks_per_head) * kBlock;
    const uint32_t q_tile = stage_tiles + (step % 2) * 2 * kTile, do_tile = q_tile + kTile;
    const float* lse_s = row_stats + (step % 2) * 2 * kBlock;
    const float* delta_s = lse_s + kBlock;
    const bool edge = (causal && row0 == kb * kBlock) || row0 + kBlock > seq || (kb + 1) * kBlock > seq;
    for (int n0 = 0; n0 < kBlock; n0 += kQueryChunk<D>) {  // queries n0 .. n0 + chunk - 1 of the block
      constexpr int kTiles = kQueryChunk<D> / 8;
      // Z before the products rather than while they run: S^T and dP^T's registers would spill the draws.
      uint32_t keeps = 0;
      if constexpr (kDropout) {
        const int64_t h = kvh * layout.group + step / blocks_per_head;
        if constexpr (kRing) {
          keeps = column_keeps<kTiles>(dropout, b, h, block.query_first + row0 + n0,
                                       block.key_first + kb * kBlock + warp * 16);
        } else {
          keeps = column_keeps<kTiles>(dropout, b, h, row0 + n0, kb * kBlock + warp * 16);
        }
        asm volatile("" : "+r"(keeps));  // ordered before the fence: no draw sinks past it
      }
      float p[kTiles][4], dp[kTiles][4];
      wgmma_fence();
      for (int s = 0; s < D / 16; ++s) {
        wgmma<P, 0>(flat(p), k_major<kBlock>(k_tile, 0, s), k_major<kBlock>(q_tile, n0, s), s > 0);    // S^T = K Q^T
        wgmma<P, 0>(flat(dp), k_major<kBlock>(v_tile, 0, s), k_major<kBlock>(do_tile, n0, s), s > 0);  // dP^T = V dO^T
      }
      wgmma_commit();
      // This thread's columns' lse (in log2 units) and delta, read while the products run.
      float2 column_lse[kTiles], column_delta[kTiles];
      for (int nt = 0; nt < kTiles; ++nt) {
        column_lse[nt] = *reinterpret_cast<const float2*>(lse_s + n0 + nt * 8 + 2 * t);
        column_lse[nt].x *= kLog2e;
        column_lse[nt].y *= kLog2e;
        column_delta[nt] = *reinterpret_cast<const float2*>(delta_s + n0 + nt * 8 + 2 * t);
      }
      wgmma_wait<0>();
      wgmma_pin(flat(p));
      wgmma_pin(flat(dp));
      // P and dS overwrite S and dP: nothing is in flight, and the registers are what bounds this kernel.
      for (int nt = 0; nt < kTiles; ++nt) {
        for (int e = 0; e < 4; ++e) {
          const float lse_log2 = e & 1 ? column_lse[nt].y : column_lse[nt].x;
          const float delta_value = e & 1 ? column_delta[nt].y : column_delta[nt].x;
          bool live = true;
          if (edge) {
            const int query = row0 + n0 + nt * 8 + 2 * t + (e & 1), key = key0 + (e >= 2 ? 8 : 0);
            live = (!causal || query >= key) && query < seq && key < seq;
          }
          p[nt][e] = live ? fast_exp2(fmaf(p[nt][e], scale_log2, -lse_log2)) : 0.0f;
          if constexpr (kDropout) {
            const bool kept = (keeps >> (4 * nt + e)) & 1;
            dp[nt][e] = p[nt][e] * ((kept ? dp[nt][e] * dropout.scale() : 0.0f) - delta_value);
            if (!kept) p[nt][e] = 0.0f;
          } else {
            dp[nt][e] = p[nt][e] * (dp[nt][e] - delta_value);
          }
        }
      }
      uint32_t pa[kTiles / 2][4], dsa[kTiles / 2][4];
      for (int kc = 0; kc < kTiles / 2; ++kc) {
        to_a<P>(pa[kc], p[2 * kc], p[2 * kc + 1]);
        to_a<P>(dsa[kc], dp[2 * kc], dp[2 * kc + 1]);
      }
      wgmma_fence();
      for (int kc = 0; kc < kTiles / 2; ++kc) {
        wgmma<P, 1>(flat(dv_acc), pa[kc], mn_major<kBlock>(do_tile, n0 + kc * 16), true);  // dV += P^T dO
        wgmma<P, 1>(flat(dk_acc), dsa[kc], mn_major<kBlock>(q_tile, n0 + kc * 16), true);  // dK += dS^T Q
      }
      wgmma_commit();
      wgmma_wait<0>();  // the products read pa and dsa from registers
      wgmma_pin(flat(dv_acc));
      wgmma_pin(flat(dk_acc));
    }
  }
  const float dv_scale = kDropout ? dropout.scale() : 1.0f;
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= seq) continue;
    Half* dk_row = dk + (key_token0 + key) * d_token_stride + kv_head;
    Half* dv_row = dv + (key_token0 + key) * d_token_stride + kv_head;
    for (int dt = 0; dt < D / 8; ++dt) {
      if constexpr (kRing) {
        add_pair<P>(dk_row + dt * 8 + 2 * t, dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
        add_pair<P>(dv_row + dt * 8 + 2 * t, dv_acc[dt][2 * r] * dv_scale, dv_acc[dt][2 * r + 1] * dv_scale);
      } else {
        *reinterpret_cast<uint32_t*>(dk_row + dt * 8 + 2 * t) =
            pack2<P>(dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv_row + dt * 8 + 2 * t) =
            pack2<P>(dv_acc[dt][2 * r] * dv_scale, dv_acc[dt][2 * r + 1] * dv_scale);
      }
    }
  }
}

template <DType P, int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(Layout layout, const Half* dout, const Half* q, const Half* k, const Half* v, const float* lse,
                const float* delta, int64_t d_token_stride, Half* dk, Half* dv, float scale, float scale_log2,
                DropoutMask dropout) {
  dkdv_body<P, D, kDropout, false>(layout, dout, q, k, v, lse, delta, d_token_stride, dk, dv, scale, scale_log2,
                                   dropout, BlockPlaces{});
}

template <DType P, int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    dkdv_block_kernel(Layout layout, const Half* dout, const Half* q, const Half* kv, const float* lse,
                      const float* delta, Half* dkv, float scale, float scale_log2, DropoutMask dropout,
                      BlockPlaces block) {
  dkdv_body<P, D, kDropout, true>(layout, dout, q, kv, kv + D, lse, delta, block.kv_token_stride, dkv, dkv + D, scale,
                                  scale_log2, dropout, block);
}

// dQ of one query block of one query head, over the key blocks up to it; the next key block's K
// and V are copied in while the current one is used.
//
// The block form (kRing) reads k and v from the packed kv (v = k + D), lse and delta as the dK/dV
// kernel's does, takes every key block unless the block is diagonal, and adds dQ to dq.
template <DType P, int D, bool kDropout, bool kRing>
__device__ __forceinline__ void dq_body(const Layout& layout, const Half* dout, const Half* q, const Half* k,
                                        const Half* v, const float* lse, const float* delta, int64_t d_token_stride,
                                        Half* dq, float scale, float scale_log2, const DropoutMask& dropout,
                                        const BlockPlaces& block) {
  extern __shared__ unsigned char shared_raw[];
  constexpr int kTile = kTileBytes<D>;
  unsigned char* qs = aligned_shared(shared_raw);
  unsigned char* dos = qs + kTile;
  unsigned char* kv = dos + kTile;  // two stages of {K, V}

  const int query_blocks = gridDim.x;
  const int qb = query_blocks - 1 - blockIdx.x;
  const int64_t bh = blockIdx.y, b = bh / layout.heads, h = bh % layout.heads;
  const int seq = kRing ? block.rows : static_cast<int>(layout.seq);
  // The first query row's token, and the first key row's (the same but in the block form). (The
  // whole sequence's declarations keep their order: any other moved its code.)
  const int64_t token0 = kRing ? b * layout.seq + block.query_row0 : b * seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t key_token0 = kRing ? b * layout.seq + block.key_row0 : token0;
  const int64_t kv_stride = kRing ? block.kv_token_stride : layout.token_stride;
  const int64_t kv_head = kRing ? (h / layout.group) * 2 * D : layout.kv_head(h / layout.group);
  const Half* k_base = k + key_token0 * kv_stride + kv_head;
  const Half* v_base = v + key_token0 * kv_stride + kv_head;
  const int row0 = qb * kBlock;
  const bool causal = !kRing || block.causal;
  const int last_key_block = causal ? qb : query_blocks - 1;
  const int64_t lse_stride = kRing ? layout.seq : seq, lse_row0 = kRing ? block.query_row0 : 0;

  load_tile<D>(qs, q + token0 * layout.token_stride + layout.query_head(h, D), layout.token_stride, row0, seq);
  load_tile<D>(dos, dout + (token0 * layout.heads + h) * D, layout.heads * D, row0, seq);
  load_tile<D>(kv, k_base, kv_stride, 0, seq);
  load_tile<D>(kv + kTile, v_base, kv_stride, 0, seq);
  copies_issued();
  const int query0 = row0 + warp * 16 + g;
  float row_lse[2], row_delta[2];
  for (int r = 0; r < 2; ++r) {
    const int query = query0 + 8 * r;
    const bool valid = query < seq;
    row_lse[r] = valid ? lse[(b * layout.heads + h) * lse_stride + lse_row0 + query] * kLog2e : 0.0f;
    row_delta[r] = valid ? delta[(b * layout.heads + h) * seq + query] : 0.0f;
  }
  const uint32_t q_tile = shared_address(qs), do_tile = shared_address(dos), kv_tiles = shared_address(kv);
  float dq_acc[D / 8][4] = {};

  // Not pipelined as the forward is: issuing S and dP of block kb + 1 ahead of dQ of kb measured
  // slower on the H200 (gpt-1.3b backward 1.27 against 1.22 ms), the extra barrier and registers
  // costing more than the overlap gains.
  for (int kb = 0; kb <= last_key_block; ++kb) {
    copies_landed();
    __syncthreads();
    if (kb < last_key_block) {
      unsigned char* next = kv + ((kb + 1) % 2) * 2 * kTile;
      load_tile<D>(next, k_base, kv_stride, (kb + 1) * kBlock, seq);
      load_tile<D>(next + kTile, v_base, kv_stride, (kb + 1) * kBlock, seq);
    }
    copies_issued();
    const uint32_t k_tile = kv_tiles + (kb % 2) * 2 * kTile, v_tile = k_tile + kTile;
    const bool edge = (causal && kb == qb) || (kb + 1) * kBlock > seq;
    float p[kBlock / 8][4], dp[kBlock / 8][4];
    wgmma_fence();
    for (int s = 0; s < D / 16; ++s) {
      wgmma<P, 0>(flat(p), k_major<kBlock>(q_tile, 0, s), k_major<kBlock>(k_tile, 0, s), s > 0);    // S = Q K^T
      wgmma<P, 0>(flat(dp), k_major<kBlock>(do_tile, 0, s), k_major<kBlock>(v_tile, 0, s), s > 0);  // dP = dO V^T
    }
    wgmma_commit();
    RowKeeps keeps{};
    if constexpr (kDropout) {
      keeps = kRing ? RowKeeps(dropout, b, h, block.query_first + query0, block.key_first + kb * kBlock)
                    : RowKeeps(dropout, b, h, query0, kb * kBlock);
    }
    wgmma_wait<0>();
    wgmma_pin(flat(p));
    wgmma_pin(flat(dp));
    uint32_t dsa[kBlock / 16][4];
    for (int kc = 0; kc < kBlock / 16; ++kc) {
      float ds[2][4];
      for (int half = 0; half < 2; ++half) {
        const int nt = 2 * kc + half;
        for (int e = 0; e < 4; ++e) {
          bool live = true;
          if (edge) {
            const int key = kb * kBlock + nt * 8 + 2 * t + (e & 1), query = query0 + (e >= 2 ? 8 : 0);
            live = (!causal || key <= query) && key < seq && query < seq;
          }
          const float prob = live ? fast_exp2(fmaf(p[nt][e], scale_log2, -row_lse[e >> 1])) : 0.0f;
          float dp_value = dp[nt][e];
          if constexpr (kDropout) dp_value = keeps.kept(nt, e) ? dp_value * dropout.scale() : 0.0f;
          ds[half][e] = prob * (dp_value - row_delta[e >> 1]);
        }
      }
      to_a<P>(dsa[kc], ds[0], ds[1]);
    }
    wgmma_fence();
    for (int kc = 0; kc < kBlock / 16; ++kc) {
      wgmma<P, 1>(flat(dq_acc), dsa[kc], mn_major<kBlock>(k_tile, kc * 16), true);  // dQ += dS K
    }
    wgmma_commit();
    wgmma_wait<0>();  // before the next block's copies overwrite this K and dsa is rewritten
    wgmma_pin(flat(dq_acc));
  }
  for (int r = 0; r < 2; ++r) {
    const int query = query0 + 8 * r;
    if (query >= seq) continue;
    Half* row = dq + (token0 + query) * d_token_stride + layout.query_head(h, D);
    for (int dt = 0; dt < D / 8; ++dt) {
      if constexpr (kRing) {
        add_pair<P>(row + dt * 8 + 2 * t, dq_acc[dt][2 * r] * scale, dq_acc[dt][2 * r + 1] * scale);
      } else {
        *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * t) =
            pack2<P>(dq_acc[dt][2 * r] * scale, dq_acc[dt][2 * r + 1] * scale);
      }
    }
  }
}

template <DType P, int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(Layout layout, const Half* dout, const Half* q, const Half* k, const Half* v, const float* lse,
              const float* delta, int64_t d_token_stride, Half* dq, float scale, float scale_log2,
              DropoutMask dropout) {
  dq_body<P, D, kDropout, false>(layout, dout, q, k, v, lse, delta, d_token_stride, dq, scale, scale_log2, dropout,
                                 BlockPlaces{});
}

template <DType P, int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    dq_block_kernel(Layout layout, const Half* dout, const Half* q, const Half* kv, const float* lse,
                    const float* delta, Half* dq, float scale, float scale_log2, DropoutMask dropout,
                    BlockPlaces block) {
  dq_body<P, D, kDropout, true>(layout, dout, q, kv, kv + D, lse, delta, layout.token_stride, dq, scale, scale_log2,
                                dropout, block);
}

Layout layout_of(const AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128) {
    throw SpecError("--kv-channels",
                    "flash attention takes head dimensions 64 and 128, got " + std::to_string(s.head_dim));
  }
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) {
    throw SpecError("--num-query-groups",
                    std::to_string(s.kv_heads) + " must divide the " + std::to_string(s.heads) + " attention heads");
  }
  const DropoutMask& dropout = s.dropout;
  if (dropout.active() && (!(dropout.probability < 1.0f) || dropout.seq != s.seq)) {
    throw SpecError("--attention-dropout", "flash attention's dropout needs p < 1 and the mask's seq " +
                                               std::to_string(dropout.seq) + " to be the sequence's " +
                                               std::to_string(s.seq));
  }
  return Layout{s.seq, s.heads, s.heads / s.kv_heads, s.qkv_token_stride, s.qkv_head_stride};
}

// kBlock rows of Q and two stages of K and V.
template <int D>
constexpr int forward_shared_bytes() {
  return 5 * kTileBytes<D> + kAlignSlack;
}
// kBlock rows of K and V, two stages of Q and dO, two stages of 64 lse and 64 delta values.
template <int D>
constexpr int dkdv_shared_bytes() {
  return 6 * kTileBytes<D> + 4 * kBlock * 4 + kAlignSlack;
}
// kBlock rows of Q and dO, two stages of K and V.
template <int D>
constexpr int dq_shared_bytes() {
  return 6 * kTileBytes<D> + kAlignSlack;
}

template <DType P, int D>
void forward(const AttentionShape& shape, const Half* q, const Half* k, const Half* v, Half* out, float* lse,
             cudaStream_t stream) {
  const Layout layout = layout_of(shape);
  constexpr int bytes = forward_shared_bytes<D>();
  const auto kernel = shape.dropout.active() ? forward_kernel<P, D, true> : forward_kernel<P, D, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "flash attention forward shared memory");
  const dim3 grid(static_cast<unsigned>((shape.seq + kBlock - 1) / kBlock),
                  static_cast<unsigned>(shape.batch * shape.heads));
  kernel<<<grid, kThreads, bytes, stream>>>(layout, q, k, v, out, lse, shape.softmax_scale * kLog2e, shape.dropout);
  check_launch("flash attention forward");
}

template <DType P, int D>
void backward(const AttentionShape& shape, const Half* dout, const Half* q, const Half* k, const Half* v,
              const Half* out, const float* lse, int64_t d_stride, Half* dq, Half* dk, Half* dv, void* workspace,
              cudaStream_t stream) {
  const Layout layout = layout_of(shape);
  float* delta = static_cast<float*>(workspace);
  const int64_t rows = shape.batch * shape.seq * shape.heads;
  delta_kernel<P, D><<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(dout, out, rows, shape.heads, shape.seq, delta);
  check_launch("flash attention delta");
  const unsigned blocks = static_cast<unsigned>((shape.seq + kBlock - 1) / kBlock);
  const float scale = shape.softmax_scale, scale_log2 = shape.softmax_scale * kLog2e;
  const bool dropout = shape.dropout.active();
  constexpr int dkdv_bytes = dkdv_shared_bytes<D>();
  const auto dkdv = dropout ? dkdv_kernel<P, D, true> : dkdv_kernel<P, D, false>;
  check(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, dkdv_bytes),
        "flash attention dK/dV shared memory");
  dkdv<<<dim3(blocks, static_cast<unsigned>(shape.batch * shape.kv_heads)), kThreads, dkdv_bytes, stream>>>(
      layout, dout, q, k, v, lse, delta, d_stride, dk, dv, scale, scale_log2, shape.dropout);
  check_launch("flash attention dK/dV");
  constexpr int dq_bytes = dq_shared_bytes<D>();
  const auto dq_pass = dropout ? dq_kernel<P, D, true> : dq_kernel<P, D, false>;
  check(cudaFuncSetAttribute(dq_pass, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_bytes),
        "flash attention dQ shared memory");
  dq_pass<<<dim3(blocks, static_cast<unsigned>(shape.batch * shape.heads)), kThreads, dq_bytes, stream>>>(
      layout, dout, q, k, v, lse, delta, d_stride, dq, scale, scale_log2, shape.dropout);
  check_launch("flash attention dQ");
}

// The block form's layout and places: the shape's checks but dropout's, whose mask spans the whole
// sequence; the block's rows within the local ones; one of the ring's two kinds of block.
Layout block_layout_of(const AttentionBlockShape& s) {
  AttentionShape without_dropout = s.shape;
  without_dropout.dropout = {};
  const Layout layout = layout_of(without_dropout);
  const DropoutMask& dropout = s.shape.dropout;
  if (dropout.active() &&
      (!(dropout.probability < 1.0f) || dropout.seq < std::max(s.query_first, s.key_first) + s.rows)) {
    throw SpecError("--attention-dropout", "flash attention's dropout needs p < 1 and the mask's seq " +
                                               std::to_string(dropout.seq) + " to hold the block's tokens");
  }
  return layout;
}

BlockPlaces places_of(const AttentionBlockShape& s) {
  if (s.rows <= 0 || s.query_row0 < 0 || s.key_row0 < 0 || s.query_row0 + s.rows > s.shape.seq ||
      s.key_row0 + s.rows > s.shape.seq || s.query_first < 0 || s.key_first < 0) {
    throw std::logic_error("flash attention block: rows " + std::to_string(s.rows) + " from " +
                           std::to_string(s.query_row0) + " and " + std::to_string(s.key_row0) +
                           " do not lie in the sequence's " + std::to_string(s.shape.seq));
  }
  const bool diagonal = s.query_first == s.key_first;
  if (!diagonal && s.key_first + s.rows > s.query_first) {
    throw std::logic_error("flash attention block: keys from " + std::to_string(s.key_first) +
                           " against queries from " + std::to_string(s.query_first) + " (" + std::to_string(s.rows) +
                           " each) are neither the diagonal nor wholly before the queries");
  }
  return BlockPlaces{s.shape.kv_heads * 2 * s.shape.head_dim,
                     static_cast<int>(s.rows),
                     static_cast<int>(s.query_row0),
                     static_cast<int>(s.key_row0),
                     static_cast<int>(s.query_first),
                     static_cast<int>(s.key_first),
                     diagonal};
}

template <DType P, int D>
void block_forward(const AttentionBlockShape& block, const Half* q, const Half* kv, float* out, float* lse,
                   cudaStream_t stream) {
  const AttentionShape& shape = block.shape;
  const Layout layout = block_layout_of(block);
  const BlockPlaces places = places_of(block);
  constexpr int bytes = forward_shared_bytes<D>();
  const auto kernel = shape.dropout.active() ? forward_block_kernel<P, D, true> : forward_block_kernel<P, D, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "flash attention block forward shared memory");
  const dim3 grid(static_cast<unsigned>((block.rows + kBlock - 1) / kBlock),
                  static_cast<unsigned>(shape.batch * shape.heads));
  kernel<<<grid, kThreads, bytes, stream>>>(layout, q, kv, out, lse, shape.softmax_scale * kLog2e, shape.dropout,
                                            places);
  check_launch("flash attention block forward");
}

template <DType P, int D>
void block_backward(const AttentionBlockShape& block, const Half* dout, const Half* q, const Half* kv, const Half* out,
                    const float* lse, Half* dq, Half* dkv, void* workspace, cudaStream_t stream) {
  const AttentionShape& shape = block.shape;
  const Layout layout = block_layout_of(block);
  const BlockPlaces places = places_of(block);
  float* delta = static_cast<float*>(workspace);
  const int64_t rows = shape.batch * block.rows * shape.heads;
  delta_block_kernel<P, D><<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(dout, out, rows, shape.heads, shape.seq,
                                                                              block.query_row0, block.rows, delta);
  check_launch("flash attention block delta");
  const unsigned blocks = static_cast<unsigned>((block.rows + kBlock - 1) / kBlock);
  const float scale = shape.softmax_scale, scale_log2 = shape.softmax_scale * kLog2e;
  const bool dropout = shape.dropout.active();
  constexpr int dkdv_bytes = dkdv_shared_bytes<D>();
  const auto dkdv = dropout ? dkdv_block_kernel<P, D, true> : dkdv_block_kernel<P, D, false>;
  check(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, dkdv_bytes),
        "flash attention block dK/dV shared memory");
  dkdv<<<dim3(blocks, static_cast<unsigned>(shape.batch * shape.kv_heads)), kThreads, dkdv_bytes, stream>>>(
      layout, dout, q, kv, lse, delta, dkv, scale, scale_log2, shape.dropout, places);
  check_launch("flash attention block dK/dV");
  constexpr int dq_bytes = dq_shared_bytes<D>();
  const auto dq_pass = dropout ? dq_block_kernel<P, D, true> : dq_block_kernel<P, D, false>;
  check(cudaFuncSetAttribute(dq_pass, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_bytes),
        "flash attention block dQ shared memory");
  dq_pass<<<dim3(blocks, static_cast<unsigned>(shape.batch * shape.heads)), kThreads, dq_bytes, stream>>>(
      layout, dout, q, kv, lse, delta, dq, scale, scale_log2, shape.dropout, places);
  check_launch("flash attention block dQ");
}

}  // namespace

void flash_attention_forward(const AttentionShape& shape, const Half* q, const Half* k, const Half* v, Half* out,
                             float* lse, DType precision, cudaStream_t stream) {
  if (shape.batch * shape.seq * shape.heads == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    if (shape.head_dim == 128) return forward<P, 128>(shape, q, k, v, out, lse, stream);
    if (shape.head_dim == 64) return forward<P, 64>(shape, q, k, v, out, lse, stream);
    (void)layout_of(shape);  // throws the head-dimension error
  });
}

std::size_t flash_attention_backward_workspace_bytes(const AttentionShape& shape) {
  return static_cast<std::size_t>(shape.batch * shape.heads * shape.seq) * sizeof(float);
}

void flash_attention_backward(const AttentionShape& shape, const Half* dout, const Half* q, const Half* k,
                              const Half* v, const Half* out, const float* lse, int64_t dqkv_token_stride, Half* dq,
                              Half* dk, Half* dv, void* workspace, DType precision, cudaStream_t stream) {
  if (shape.batch * shape.seq * shape.heads == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    if (shape.head_dim == 128) {
      return backward<P, 128>(shape, dout, q, k, v, out, lse, dqkv_token_stride, dq, dk, dv, workspace, stream);
    }
    if (shape.head_dim == 64) {
      return backward<P, 64>(shape, dout, q, k, v, out, lse, dqkv_token_stride, dq, dk, dv, workspace, stream);
    }
    (void)layout_of(shape);
  });
}

void flash_attention_block_forward(const AttentionBlockShape& block, const Half* q, const Half* kv, float* out,
                                   float* lse, DType precision, cudaStream_t stream) {
  if (block.shape.batch * block.rows * block.shape.heads == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    if (block.shape.head_dim == 128) return block_forward<P, 128>(block, q, kv, out, lse, stream);
    if (block.shape.head_dim == 64) return block_forward<P, 64>(block, q, kv, out, lse, stream);
    (void)block_layout_of(block);  // throws the head-dimension error
  });
}

std::size_t flash_attention_block_backward_workspace_bytes(const AttentionBlockShape& block) {
  return static_cast<std::size_t>(block.shape.batch * block.shape.heads * block.rows) * sizeof(float);
}

void flash_attention_block_backward(const AttentionBlockShape& block, const Half* dout, const Half* q, const Half* kv,
                                    const Half* out, const float* lse, Half* dq, Half* dkv, void* workspace,
                                    DType precision, cudaStream_t stream) {
  if (block.shape.batch * block.rows * block.shape.heads == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    if (block.shape.head_dim == 128) {
      return block_backward<P, 128>(block, dout, q, kv, out, lse, dq, dkv, workspace, stream);
    }
    if (block.shape.head_dim == 64) {
      return block_backward<P, 64>(block, dout, q, kv, out, lse, dq, dkv, workspace, stream);
    }
    (void)block_layout_of(block);
  });
}

void copy_key_values(const Half* from, Half* to, int64_t batch, int64_t seq, int64_t groups, int64_t group, int64_t dim,
                     bool unpack, cudaStream_t stream) {
  if (batch * seq * groups * dim == 0) return;
  // One row of 2 dim elements per token and group, (group + 2) dim apart in qkv, 2 dim in kv.
  const std::size_t row = static_cast<std::size_t>(2 * dim) * sizeof(Half);
  const std::size_t qkv_pitch = static_cast<std::size_t>((group + 2) * dim) * sizeof(Half);
  const auto rows = static_cast<std::size_t>(batch * seq * groups);
  if (unpack) {
    check(cudaMemcpy2DAsync(to + group * dim, qkv_pitch, from, row, row, rows, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync (unpack keys and values)");
  } else {
    check(cudaMemcpy2DAsync(to, row, from + group * dim, qkv_pitch, row, rows, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync (pack keys and values)");
  }
}

}  // namespace megaplan::exec::cuda
