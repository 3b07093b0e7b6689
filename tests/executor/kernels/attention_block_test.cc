// Ring attention's reference pieces (context parallelism): the blocks each rank computes at each
// step of the ring (core/context_parallel.h), merged by their log-sum-exp, equal causal attention
// over the whole sequence, forward and backward, with and without dropout.
#include "executor/kernels/reference/attention_block.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "core/context_parallel.h"
#include "executor/kernels/reference/attention.h"
#include "tests/executor/kernels/gradient_check.h"

namespace ref = megaplan::exec::reference;

namespace {

// Rows [first, first + count) of every head of a [heads x seq x dim] tensor.
std::vector<float> rows_of(const std::vector<float>& x, std::size_t heads, std::size_t seq, std::size_t dim,
                           std::size_t first, std::size_t count) {
  std::vector<float> part(heads * count * dim);
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t r = 0; r < count * dim; ++r) part[(h * count) * dim + r] = x[(h * seq + first) * dim + r];
  }
  return part;
}

void add_rows(std::vector<float>& x, const std::vector<float>& part, std::size_t heads, std::size_t seq,
              std::size_t dim, std::size_t first, std::size_t count) {
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t r = 0; r < count * dim; ++r) x[(h * seq + first) * dim + r] += part[(h * count) * dim + r];
  }
}

}  // namespace

TEST_CASE("the ring's blocks, merged by log-sum-exp, are causal attention over the whole sequence",
          "[kernels][context_parallel]") {
  std::mt19937 generator(11);
  const std::size_t heads = 2, dim = 4, chunk = 3;
  for (const int64_t cp : {1, 2, 4}) {
    const std::size_t seq = 2 * static_cast<std::size_t>(cp) * chunk, n = heads * seq * dim;
    const std::vector<float> q = megaplan::test::random_vector(n, generator),
                             k = megaplan::test::random_vector(n, generator),
                             v = megaplan::test::random_vector(n, generator),
                             d_o = megaplan::test::random_vector(n, generator);
    for (const float p : {0.0f, 0.3f}) {
      INFO("cp " << cp << ", attention dropout " << p);
      megaplan::exec::DropoutMask dropout;
      dropout.seed = 3;
      dropout.seq = static_cast<int64_t>(seq);
      dropout.probability = p;
      std::vector<float> o(n), probs(heads * seq * seq), dq(n), dk(n), dv(n);
      ref::attention_forward(q.data(), k.data(), v.data(), heads, seq, dim, dropout, 1, 2, o.data(), probs.data());
      ref::attention_backward(d_o.data(), q.data(), k.data(), v.data(), probs.data(), heads, seq, dim, dropout, 1, 2,
                              dq.data(), dk.data(), dv.data());

      // Each rank's rows: the forward merged over its ring, then each block's backward from it; a
      // key chunk's dk and dv gather from every rank that used it (the ring sends them back).
      std::vector<float> ring_o(n), ring_dq(n, 0.0f), ring_dk(n, 0.0f), ring_dv(n, 0.0f);
      const auto first_row = [&](int64_t whole_chunk) { return static_cast<std::size_t>(whole_chunk) * chunk; };
      for (int64_t rank = 0; rank < cp; ++rank) {
        const std::array<int64_t, 2> mine = megaplan::context_chunks(rank, cp);
        std::vector<std::vector<float>> rank_o(2, std::vector<float>(heads * chunk * dim, 0.0f));
        std::vector<std::vector<float>> rank_lse(2, std::vector<float>(heads * chunk, -INFINITY));
        std::vector<float> block_o(heads * chunk * dim), block_lse(heads * chunk);
        for (int pass = 0; pass < 2; ++pass) {  // 0: forward, 1: backward
          for (int64_t step = 0; step < cp; ++step) {
            const megaplan::RingStep ring = megaplan::ring_step(rank, step, cp);
            const std::array<int64_t, 2> theirs = megaplan::context_chunks(ring.source, cp);
            for (int b = 0; b < ring.count; ++b) {
              const megaplan::AttentionBlock& block = ring.blocks[static_cast<std::size_t>(b)];
              const auto qi = static_cast<std::size_t>(block.query_chunk);
              const std::size_t q_first = first_row(mine[qi]);
              const std::size_t kv_first = first_row(theirs[static_cast<std::size_t>(block.key_chunk)]);
              const ref::BlockPlaces places{q_first, kv_first};
              const std::vector<float> qb = rows_of(q, heads, seq, dim, q_first, chunk),
                                       kb = rows_of(k, heads, seq, dim, kv_first, chunk),
                                       vb = rows_of(v, heads, seq, dim, kv_first, chunk);
              if (pass == 0) {
                ref::attention_block_forward(qb.data(), kb.data(), vb.data(), heads, chunk, chunk, dim, places, dropout,
                                             1, 2, block_o.data(), block_lse.data());
                ref::merge_attention_block(rank_o[qi].data(), rank_lse[qi].data(), block_o.data(), block_lse.data(),
                                           heads, chunk, dim);
                continue;
              }
              const std::vector<float> gb = rows_of(d_o, heads, seq, dim, q_first, chunk);
              std::vector<float> dqb(heads * chunk * dim, 0.0f), dkb(dqb), dvb(dqb);
              ref::attention_block_backward(gb.data(), qb.data(), kb.data(), vb.data(), rank_o[qi].data(),
                                            rank_lse[qi].data(), heads, chunk, chunk, dim, places, dropout, 1, 2,
                                            dqb.data(), dkb.data(), dvb.data());
              add_rows(ring_dq, dqb, heads, seq, dim, q_first, chunk);
              add_rows(ring_dk, dkb, heads, seq, dim, kv_first, chunk);
              add_rows(ring_dv, dvb, heads, seq, dim, kv_first, chunk);
            }
          }
        }
        for (std::size_t qi = 0; qi < 2; ++qi)
          add_rows(ring_o, rank_o[qi], heads, seq, dim, first_row(mine[qi]), chunk);
      }
      const auto check_equal = [](const std::vector<float>& ring, const std::vector<float>& whole, const char* what) {
        INFO(what);
        for (std::size_t i = 0; i < whole.size(); ++i) CHECK(ring[i] == Approx(whole[i]).margin(1e-5));
      };
      check_equal(ring_o, o, "o");
      check_equal(ring_dq, dq, "dq");
      check_equal(ring_dk, dk, "dk");
      check_equal(ring_dv, dv, "dv");
    }
  }
}

TEST_CASE("a block that sees no key leaves the running rows as they were", "[kernels][context_parallel]") {
  const std::vector<float> q{1, 0}, k{0, 1}, v{5, 6};
  std::vector<float> o{0.5f, 0.25f}, lse{0.75f}, block_o(2), block_lse(1);
  // One query at token 0, one key at token 1: in its future.
  ref::attention_block_forward(q.data(), k.data(), v.data(), 1, 1, 1, 2, {0, 1}, {}, 0, 0, block_o.data(),
                               block_lse.data());
  CHECK(block_lse[0] == -INFINITY);
  CHECK(block_o == std::vector<float>{0, 0});
  ref::merge_attention_block(o.data(), lse.data(), block_o.data(), block_lse.data(), 1, 1, 2);
  CHECK(o == std::vector<float>{0.5f, 0.25f});
  CHECK(lse[0] == 0.75f);
}
