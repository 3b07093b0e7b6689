// Ring attention on a backend (Backend's block calls, context parallelism) against the same
// backend's causal attention over the whole sequence: every rank of a cp group emulated in one
// process, its chunks cut from the whole qkv, the blocks of each ring step (core/context_parallel.h)
// run against the packed keys and values of the step's source, the forward merged in fp32, the
// backward's dK and dV summed where their keys live. Used for the CPU backend (exact up to fp32
// rounding) and the CUDA backend (bf16).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/context_parallel.h"
#include "executor/runtime/backend.h"

namespace megaplan::test {

struct RingAttentionCase {
  std::size_t batch = 2, heads = 4, groups = 2, dim = 8, chunk = 3;
  int64_t cp = 2;
  float dropout = 0;
};

// The largest |a - b| over the largest |b| (1 where b is all zeros).
inline double scaled_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double difference = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference = std::max(difference, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return difference / (scale > 0 ? scale : 1);
}

// Checks out and dqkv of the ring against the whole sequence's within `tolerance` (scaled_difference).
inline void check_ring_attention(exec::Backend& backend, const RingAttentionCase& c, double tolerance) {
  const std::size_t group = c.heads / c.groups, width = c.groups * (group + 2) * c.dim;
  const auto cp = static_cast<std::size_t>(c.cp);
  const std::size_t seq = 2 * cp * c.chunk, local = 2 * c.chunk;
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(c.batch * seq * width), d_out(c.batch * seq * c.heads * c.dim);
  for (float& x : qkv) x = normal(generator);
  for (float& x : d_out) x = normal(generator);
  exec::DropoutMask dropout;
  dropout.probability = c.dropout;
  dropout.seed = 5;
  dropout.seq = static_cast<int64_t>(seq);

  // The whole sequence.
  const auto upload = [&](const std::vector<float>& host) {
    exec::Activation a = backend.allocate_activation(host.size());
    backend.upload(a, host.data(), host.size());
    return a;
  };
  const std::size_t out_size = c.batch * seq * c.heads * c.dim;
  exec::Activation whole_qkv = upload(qkv), whole_d_out = upload(d_out),
                   whole_out = backend.allocate_activation(out_size),
                   whole_dqkv = backend.allocate_activation(qkv.size());
  float* saved = backend.allocate(backend.attention_saved_size(c.batch, seq, c.heads, c.dim));
  backend.attention_forward(whole_qkv, c.batch, seq, c.heads, c.groups, c.dim, dropout, whole_out, saved);
  backend.attention_backward(whole_d_out, whole_qkv, whole_out, saved, c.batch, seq, c.heads, c.groups, c.dim, dropout,
                             whole_dqkv);
  std::vector<float> expected_out(out_size), expected_dqkv(qkv.size());
  backend.download(expected_out.data(), whole_out, out_size);
  backend.download(expected_dqkv.data(), whole_dqkv, qkv.size());

  // Rank r's rows of a token-major [batch x seq x row_width] tensor, and back.
  const auto token_of = [&](std::size_t r, std::size_t t) {
    const std::array<int64_t, 2> chunks = context_chunks(static_cast<int64_t>(r), c.cp);
    return static_cast<std::size_t>(chunks[t / c.chunk]) * c.chunk + t % c.chunk;
  };
  const auto cut = [&](const std::vector<float>& x, std::size_t r, std::size_t row_width) {
    std::vector<float> part(c.batch * local * row_width);
    for (std::size_t b = 0; b < c.batch; ++b) {
      for (std::size_t t = 0; t < local; ++t) {
        std::copy_n(x.data() + (b * seq + token_of(r, t)) * row_width, row_width,
                    part.data() + (b * local + t) * row_width);
      }
    }
    return part;
  };
  const exec::AttentionDims dims{c.batch, local, c.heads, c.groups, c.dim};
  const std::size_t kv_size = c.batch * local * c.groups * 2 * c.dim, local_out = c.batch * local * c.heads * c.dim;
  std::vector<exec::Activation> rank_qkv(cp), kv(cp), dkv(cp), rank_out(cp), rank_d_out(cp), rank_dqkv(cp);
  std::vector<float*> out32(cp), lse(cp);
  for (std::size_t r = 0; r < cp; ++r) {
    rank_qkv[r] = upload(cut(qkv, r, width));
    rank_d_out[r] = upload(cut(d_out, r, c.heads * c.dim));
    kv[r] = backend.allocate_activation(kv_size);
    backend.pack_key_values(rank_qkv[r], dims, kv[r]);
    dkv[r] = backend.allocate_activation(kv_size);
    backend.zero(dkv[r], kv_size);
    rank_out[r] = backend.allocate_activation(local_out);
    rank_dqkv[r] = backend.allocate_activation(c.batch * local * width);
    backend.zero(rank_dqkv[r], c.batch * local * width);
    out32[r] = backend.allocate(local_out);
    lse[r] = backend.allocate(c.batch * c.heads * local);
    backend.fill(lse[r], c.batch * c.heads * local, -INFINITY);
  }
  const auto for_each_block = [&](const auto& run) {
    for (std::size_t r = 0; r < cp; ++r) {
      const std::array<int64_t, 2> mine = context_chunks(static_cast<int64_t>(r), c.cp);
      for (int64_t step = 0; step < c.cp; ++step) {
        const RingStep ring = ring_step(static_cast<int64_t>(r), step, c.cp);
        const std::array<int64_t, 2> theirs = context_chunks(ring.source, c.cp);
        for (int i = 0; i < ring.count; ++i) {
          const AttentionBlock& b = ring.blocks[static_cast<std::size_t>(i)];
          const auto q_chunk = static_cast<std::size_t>(b.query_chunk), k_chunk = static_cast<std::size_t>(b.key_chunk);
          run(r, static_cast<std::size_t>(ring.source),
              exec::AttentionChunkBlock{q_chunk, k_chunk, mine[q_chunk] * static_cast<int64_t>(c.chunk),
                                        theirs[k_chunk] * static_cast<int64_t>(c.chunk)});
        }
      }
    }
  };
  for_each_block([&](std::size_t r, std::size_t source, const exec::AttentionChunkBlock& block) {
    backend.attention_block_forward(rank_qkv[r], kv[source], dims, block, dropout, out32[r], lse[r]);
  });
  for (std::size_t r = 0; r < cp; ++r) backend.convert(out32[r], local_out, rank_out[r]);
  for_each_block([&](std::size_t r, std::size_t source, const exec::AttentionChunkBlock& block) {
    backend.attention_block_backward(rank_d_out[r], rank_qkv[r], rank_out[r], lse[r], kv[source], dims, block, dropout,
                                     rank_dqkv[r], dkv[source]);
  });

  for (std::size_t r = 0; r < cp; ++r) {
    INFO("cp " << c.cp << ", rank " << r << ", attention dropout " << c.dropout);
    backend.unpack_key_value_gradients(dkv[r], dims, rank_dqkv[r]);
    std::vector<float> out(local_out), dqkv(c.batch * local * width);
    backend.download(out.data(), rank_out[r], local_out);
    backend.download(dqkv.data(), rank_dqkv[r], dqkv.size());
    CHECK(scaled_difference(out, cut(expected_out, r, c.heads * c.dim)) < tolerance);
    CHECK(scaled_difference(dqkv, cut(expected_dqkv, r, width)) < tolerance);
  }
  for (std::size_t r = 0; r < cp; ++r) {
    for (exec::Activation a : {rank_qkv[r], kv[r], dkv[r], rank_out[r], rank_d_out[r], rank_dqkv[r]})
      backend.release(a);
    backend.release(out32[r]);
    backend.release(lse[r]);
  }
  for (exec::Activation a : {whole_qkv, whole_d_out, whole_out, whole_dqkv}) backend.release(a);
  backend.release(saved);
}

}  // namespace megaplan::test
