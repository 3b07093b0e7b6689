// The CPU references of the row kernels added for Llama-style models and the embedding: RMSNorm,
// SwiGLU and RoPE backwards against central finite differences of their forwards on fresh random
// inputs, and values worked by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <random>
#include <vector>

#include "executor/kernels/reference/embedding.h"
#include "executor/kernels/reference/rmsnorm.h"
#include "executor/kernels/reference/rope.h"
#include "executor/kernels/reference/swiglu.h"
#include "tests/executor/kernels/gradient_check.h"

namespace ref = megaplan::exec::reference;

using megaplan::test::check_gradient;
using megaplan::test::random_vector;
using megaplan::test::weighted_sum;

TEST_CASE("RMSNorm's backward is its forward's gradient", "[kernels]") {
  std::mt19937 generator(17);
  const std::size_t rows = 3, cols = 16;
  std::vector<float> x = random_vector(rows * cols, generator, 2.0f), gamma = random_vector(cols, generator);
  const std::vector<float> weights = random_vector(rows * cols, generator);  // loss = sum(y * weights)
  std::vector<float> y(rows * cols), rstd(rows);
  const auto loss = [&] {
    ref::rmsnorm_forward(x.data(), gamma.data(), rows, cols, 1e-5f, y.data(), rstd.data());
    return weighted_sum(y, weights);
  };
  loss();
  const std::vector<float> dgamma_start = random_vector(cols, generator);
  std::vector<float> dx(rows * cols), dgamma = dgamma_start;
  ref::rmsnorm_backward(weights.data(), x.data(), gamma.data(), rstd.data(), rows, cols, dx.data(), dgamma.data());
  std::vector<float> dgamma_step(cols);  // the accumulated part alone
  for (std::size_t c = 0; c < cols; ++c) dgamma_step[c] = dgamma[c] - dgamma_start[c];
  check_gradient(x, dx, loss, "dx");
  check_gradient(gamma, dgamma_step, loss, "dgamma");
}

TEST_CASE("the query and key norms: each head RMSNorm's by its own weight, values passed, the gradient exact",
          "[kernels]") {
  // Two tokens of three groups of two query heads, a key and a value, heads of 8: a value head
  // comes out as it went in; a query or key head as rmsnorm_forward of that row by q_gamma or
  // k_gamma; and the backward is the forward's gradient, both weights' included.
  std::mt19937 generator(29);
  const std::size_t tokens = 2, groups = 3, group = 2, dim = 8, period = group + 2;
  const std::size_t rows = tokens * groups * period;
  std::vector<float> qkv = random_vector(rows * dim, generator, 2.0f), q_gamma = random_vector(dim, generator),
                     k_gamma = random_vector(dim, generator);
  const std::vector<float> weights = random_vector(rows * dim, generator);
  std::vector<float> y(rows * dim), rstd(rows);
  const auto loss = [&] {
    ref::head_rmsnorm_forward(qkv.data(), q_gamma.data(), k_gamma.data(), tokens, groups, group, dim, 1e-6f, y.data(),
                              rstd.data());
    return weighted_sum(y, weights);
  };
  loss();
  for (std::size_t row = 0; row < rows; ++row) {
    INFO("row " << row);
    const std::size_t role = row % period;
    std::vector<float> want(dim), want_rstd(1);
    if (role == group + 1) {
      std::copy_n(qkv.begin() + static_cast<std::ptrdiff_t>(row * dim), dim, want.begin());
    } else {
      ref::rmsnorm_forward(qkv.data() + row * dim, (role < group ? q_gamma : k_gamma).data(), 1, dim, 1e-6f,
                           want.data(), want_rstd.data());
    }
    for (std::size_t e = 0; e < dim; ++e) CHECK(y[row * dim + e] == want[e]);
  }
  std::vector<float> dx = weights, dq_gamma(dim, 0.0f), dk_gamma(dim, 0.0f);  // in place, as the executor runs it
  ref::head_rmsnorm_backward(dx.data(), qkv.data(), q_gamma.data(), k_gamma.data(), rstd.data(), tokens, groups, group,
                             dim, dx.data(), dq_gamma.data(), dk_gamma.data());
  check_gradient(qkv, dx, loss, "dqkv");
  check_gradient(q_gamma, dq_gamma, loss, "dq_gamma");
  check_gradient(k_gamma, dk_gamma, loss, "dk_gamma");
}

TEST_CASE("RMSNorm values by hand", "[kernels]") {
  // The row (3, 4): mean square 12.5, so y = x / sqrt(12.5) * gamma.
  const std::vector<float> x = {3.0f, 4.0f}, gamma = {1.0f, 2.0f};
  std::vector<float> y(2), rstd(1);
  ref::rmsnorm_forward(x.data(), gamma.data(), 1, 2, 0.0f, y.data(), rstd.data());
  CHECK(rstd[0] == Approx(1.0 / std::sqrt(12.5)));
  CHECK(y[0] == Approx(3.0 / std::sqrt(12.5)));
  CHECK(y[1] == Approx(8.0 / std::sqrt(12.5)));
}

TEST_CASE("SwiGLU values and gradient", "[kernels]") {
  // gate 0: silu(0) = 0; gate 2: silu(2) = 2 / (1 + e^-2).
  const std::vector<float> fixed = {0.0f, 2.0f, 5.0f, -3.0f};  // one row, width 2: gates (0, 2), ups (5, -3)
  std::vector<float> out(2);
  ref::swiglu_forward(fixed.data(), 1, 2, out.data());
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == Approx(-3.0 * 2.0 / (1.0 + std::exp(-2.0))));

  std::mt19937 generator(19);
  const std::size_t rows = 3, width = 5;
  std::vector<float> x = random_vector(rows * 2 * width, generator, 2.0f);
  const std::vector<float> weights = random_vector(rows * width, generator);
  std::vector<float> y(rows * width), dx(rows * 2 * width);
  const auto loss = [&] {
    ref::swiglu_forward(x.data(), rows, width, y.data());
    return weighted_sum(y, weights);
  };
  ref::swiglu_backward(weights.data(), x.data(), rows, width, dx.data());
  check_gradient(x, dx, loss, "dx");
}

TEST_CASE("Llama 3.1's RoPE scaling: long wavelengths divided by the factor, short ones kept, the middle blended",
          "[kernels]") {
  // theta 10000, rotary_dim 8: frequencies 1, 0.1, 0.01, 0.001 (wavelengths 6.3, 62.8, 628, 6283).
  // Original positions 64, factors 1 and 4: wavelengths below 16 keep theirs, above 64 are divided
  // by 8, and 62.8 lies between: s = (64 / 62.83 - 1) / 3 weighs the kept frequency.
  megaplan::exec::RotaryFrequencies frequencies(10000.0);
  frequencies.scaling.factor = 8;
  frequencies.scaling.low_freq_factor = 1;
  frequencies.scaling.high_freq_factor = 4;
  frequencies.scaling.original_max_position_embeddings = 64;
  const double s = (64 / (2 * std::numbers::pi / 0.1) - 1) / 3;
  const double want[4] = {1.0, (1 - s) * 0.1 / 8 + s * 0.1, 0.01 / 8, 0.001 / 8};
  const std::size_t t = 7;  // the position whose angles are read
  std::vector<float> x((t + 1) * 8, 0.0f);
  for (std::size_t token = 0; token <= t; ++token) {
    for (std::size_t i = 0; i < 4; ++i) x[token * 8 + i] = 1.0f;  // x1 = 1, x2 = 0: out = (cos, sin)
  }
  ref::rope_apply(x.data(), 1, t + 1, 1, 8, 8, 8, frequencies, false);
  for (std::size_t i = 0; i < 4; ++i) {
    INFO("pair " << i);
    CHECK(std::atan2(x[t * 8 + 4 + i], x[t * 8 + i]) ==
          Approx(std::remainder(static_cast<double>(t) * want[i], 2 * std::numbers::pi)).margin(1e-6));
  }
  // Unscaled (factor 0) is plain RoPE.
  CHECK(megaplan::exec::scaled_inverse_frequency(0.001, megaplan::exec::RotaryFrequencies(10000.0)) == 0.001);
}

TEST_CASE("RoPE rotates pairs by position-dependent angles, and its inverse is its gradient", "[kernels]") {
  // head_dim 4, rotary_dim 4, theta 100: pair 0 (dims 0, 2) turns by t, pair 1 (dims 1, 3) by t / 10.
  std::vector<float> head = {1.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f};  // seq 2, one head
  ref::rope_apply(head.data(), 1, 2, 1, 4, 4, 4, 100.0, false);
  CHECK(head[0] == 1.0f);  // position 0 stays
  CHECK(head[2] == 0.0f);
  CHECK(head[4] == Approx(std::cos(1.0)));
  CHECK(head[6] == Approx(std::sin(1.0)));
  CHECK(head[5] == Approx(std::cos(0.1)));
  CHECK(head[7] == Approx(std::sin(0.1)));

  // Two heads of head_dim 6 in a token row of 14 (2 dims after them untouched); rotary_dim 4
  // (dims 4, 5 of each head pass through).
  std::mt19937 generator(23);
  const std::size_t batch = 2, seq = 3, heads = 2, head_dim = 6, stride = 14, rotary = 4;
  std::vector<float> x = random_vector(batch * seq * stride, generator);
  const std::vector<float> original = x;
  std::vector<float> y = x;
  ref::rope_apply(y.data(), batch, seq, heads, head_dim, stride, rotary, 10000.0, false);
  for (std::size_t token = 0; token < batch * seq; ++token) {
    for (std::size_t d : {4u, 5u, 10u, 11u, 12u, 13u}) CHECK(y[token * stride + d] == x[token * stride + d]);
  }
  std::vector<float> back = y;
  ref::rope_apply(back.data(), batch, seq, heads, head_dim, stride, rotary, 10000.0, true);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(back[i] == Approx(original[i]).margin(1e-6));

  const std::vector<float> weights = random_vector(x.size(), generator);
  const auto loss = [&] {
    std::vector<float> rotated = x;
    ref::rope_apply(rotated.data(), batch, seq, heads, head_dim, stride, rotary, 10000.0, false);
    return weighted_sum(rotated, weights);
  };
  std::vector<float> dx = weights;  // the gradient is the inverse rotation of the output's gradient
  ref::rope_apply(dx.data(), batch, seq, heads, head_dim, stride, rotary, 10000.0, true);
  check_gradient(x, dx, loss, "dx");
}

TEST_CASE("embedding values and accumulated gradients by hand", "[kernels]") {
  // Vocabulary 3, hidden 2, batch 2 of seq 2: tokens (2, 0 | 2, 2).
  const std::vector<int64_t> tokens = {2, 0, 2, 2};
  const std::vector<float> word = {1, 2, 3, 4, 5, 6}, position = {10, 20, 30, 40};
  std::vector<float> y(8);
  ref::embedding_forward(tokens.data(), 4, 2, word.data(), 0, 3, position.data(), 2, y.data());
  CHECK(y == std::vector<float>{15, 26, 31, 42, 15, 26, 35, 46});
  ref::embedding_forward(tokens.data(), 4, 2, word.data(), 0, 3, nullptr, 2, y.data());
  CHECK(y == std::vector<float>{5, 6, 1, 2, 5, 6, 5, 6});

  const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> dword = {100, 100, 100, 100, 100, 100}, dposition = {1, 1, 1, 1};
  ref::embedding_backward(dy.data(), tokens.data(), 4, 2, 2, 0, 3, dword.data(), dposition.data());
  CHECK(dword == std::vector<float>{103, 104, 100, 100, 113, 116});  // row 1 unused; row 2 gets tokens 0, 2, 3
  CHECK(dposition == std::vector<float>{7, 9, 11, 13});
  ref::embedding_backward(dy.data(), tokens.data(), 4, 2, 2, 0, 3, dword.data(), nullptr);  // no position table
  CHECK(dword == std::vector<float>{106, 108, 100, 100, 126, 132});
}

TEST_CASE("vocabulary-parallel embedding: shards add up to the whole table's", "[kernels]") {
  // The table above split into rows 0 | 1, 2 (tokens 2, 0 | 2, 2): the first shard adds no
  // position, as under tensor parallelism, where one rank adds it and the group sums.
  const std::vector<int64_t> tokens = {2, 0, 2, 2};
  const std::vector<float> first = {1, 2}, second = {3, 4, 5, 6}, position = {10, 20, 30, 40};
  std::vector<float> y_first(8), y_second(8);
  ref::embedding_forward(tokens.data(), 4, 2, first.data(), 0, 1, nullptr, 2, y_first.data());
  CHECK(y_first == std::vector<float>{0, 0, 1, 2, 0, 0, 0, 0});  // only token 0 is in the first shard
  ref::embedding_forward(tokens.data(), 4, 2, second.data(), 1, 2, position.data(), 2, y_second.data());
  CHECK(y_second == std::vector<float>{15, 26, 30, 40, 15, 26, 35, 46});  // token 0: the position alone
  std::vector<float> sum(8);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = y_first[i] + y_second[i];
  CHECK(sum == std::vector<float>{15, 26, 31, 42, 15, 26, 35, 46});  // the whole table's, above

  const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> dword = {100, 100, 100, 100}, dposition = {1, 1, 1, 1};
  ref::embedding_backward(dy.data(), tokens.data(), 4, 2, 2, 1, 2, dword.data(), dposition.data());
  CHECK(dword == std::vector<float>{100, 100, 113, 116});  // token 1 unused, token 0 another shard's
  CHECK(dposition == std::vector<float>{7, 9, 11, 13});    // every token's, its shard or not
  std::vector<float> dword_first = {100, 100};
  ref::embedding_backward(dy.data(), tokens.data(), 4, 2, 2, 0, 1, dword_first.data(), nullptr);
  CHECK(dword_first == std::vector<float>{103, 104});
}
