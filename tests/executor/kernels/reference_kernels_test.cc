// The CPU reference kernels: every backward against central finite differences of its forward,
// on fresh random inputs, the vocabulary-parallel cross entropy's shards against the whole
// vocabulary, and AdamW against its formula worked by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "executor/kernels/reference/adamw.h"
#include "executor/kernels/reference/attention.h"
#include "executor/kernels/reference/cross_entropy.h"
#include "executor/kernels/reference/dropout.h"
#include "executor/kernels/reference/gelu.h"
#include "executor/kernels/reference/layernorm.h"
#include "tests/executor/kernels/gradient_check.h"
#include "tests/executor/kernels/shard_cross_entropy.h"

namespace ref = megaplan::exec::reference;

using megaplan::test::check_gradient;
using megaplan::test::random_vector;
using megaplan::test::shard_cross_entropy;
using megaplan::test::weighted_sum;

TEST_CASE("layernorm's backward is its forward's gradient", "[kernels]") {
  std::mt19937 generator(7);
  const std::size_t rows = 3, cols = 16;
  std::vector<float> x = random_vector(rows * cols, generator, 2.0f);
  std::vector<float> gamma = random_vector(cols, generator), beta = random_vector(cols, generator);
  const std::vector<float> weights = random_vector(rows * cols, generator);  // loss = sum(y * weights)
  std::vector<float> y(rows * cols), mean(rows), rstd(rows);
  const auto loss = [&] {
    ref::layernorm_forward(x.data(), gamma.data(), beta.data(), rows, cols, 1e-5f, y.data(), mean.data(), rstd.data());
    return weighted_sum(y, weights);
  };
  loss();
  std::vector<float> dx(rows * cols), dgamma(cols, 0.0f), dbeta(cols, 0.0f);
  ref::layernorm_backward(weights.data(), x.data(), gamma.data(), mean.data(), rstd.data(), rows, cols, dx.data(),
                          dgamma.data(), dbeta.data());
  for (std::size_t r = 0; r < rows; ++r) {  // normalised rows: mean 0, variance 1 before the affine part
    double sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += (y[r * cols + c] - beta[c]) / gamma[c];
    CHECK(std::abs(sum) < 1e-3);
  }
  check_gradient(x, dx, loss, "dx");
  check_gradient(gamma, dgamma, loss, "dgamma");
  check_gradient(beta, dbeta, loss, "dbeta");
}

TEST_CASE("GELU (tanh) values and gradient", "[kernels]") {
  std::vector<float> x = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f};
  std::vector<float> y(x.size());
  ref::gelu_forward(x.data(), x.size(), y.data());
  CHECK(y[2] == 0.0f);
  CHECK(y[4] == Approx(1.9545977).epsilon(1e-6));  // 2 * Phi-ish, tanh form
  CHECK(y[1] == Approx(-0.15880801).epsilon(1e-6));
  std::mt19937 generator(3);
  std::vector<float> input = random_vector(40, generator, 2.0f);
  const std::vector<float> weights = random_vector(40, generator);
  std::vector<float> out(40), dx(40);
  const auto loss = [&] {
    ref::gelu_forward(input.data(), input.size(), out.data());
    return weighted_sum(out, weights);
  };
  ref::gelu_backward(weights.data(), input.data(), input.size(), dx.data());
  check_gradient(input, dx, loss, "dx");
}

TEST_CASE("masked cross entropy and its gradient", "[kernels]") {
  std::mt19937 generator(11);
  const std::size_t tokens = 5, vocab = 7;
  std::vector<float> logits = random_vector(tokens * vocab, generator, 3.0f);
  const std::vector<int64_t> targets = {0, 6, 3, 3, 1};
  const std::vector<float> mask = {0.25f, 0.25f, 0, 0.25f, 0.25f};  // each token's share of the loss
  std::vector<float> statistics(2 * tokens), lse;                   // one shard: [lse, target logit]
  const auto loss = [&] {
    ref::cross_entropy_statistics(logits.data(), targets.data(), tokens, vocab, 0, statistics.data(),
                                  statistics.data() + tokens);
    return shard_cross_entropy(statistics, 1, mask.data(), tokens, lse);
  };
  const double mean = loss();
  double unmasked = 0;
  for (std::size_t t = 0; t < tokens; ++t) {
    CHECK(statistics[tokens + t] == logits[t * vocab + static_cast<std::size_t>(targets[t])]);
    if (t != 2) unmasked += statistics[t] - statistics[tokens + t];
  }
  CHECK(mean == Approx(unmasked / 4.0));
  std::vector<float> dlogits(tokens * vocab);
  ref::cross_entropy_backward(logits.data(), lse.data(), targets.data(), mask.data(), tokens, vocab, 0, 1.0f,
                              dlogits.data());
  check_gradient(logits, dlogits, loss, "dlogits");
  // Uniform logits: the loss is log(vocab).
  logits.assign(tokens * vocab, 0.5f);
  CHECK(loss() == Approx(std::log(7.0)));
}

TEST_CASE("vocabulary-parallel cross entropy: two shards merge into the whole vocabulary's", "[kernels]") {
  std::mt19937 generator(13);
  const std::size_t tokens = 6, vocab = 10;
  const std::vector<std::size_t> starts = {0, 4}, sizes = {4, 6};  // uneven, so no shard mirrors the other
  const std::vector<float> logits = random_vector(tokens * vocab, generator, 3.0f);
  const std::vector<int64_t> targets = {0, 9, 3, 4, 7, 2};  // each shard holds some
  const std::vector<float> mask = {0.2f, 0, 0.2f, 0.2f, 0.2f, 0.2f};
  std::vector<float> whole_statistics(2 * tokens), whole_lse;
  ref::cross_entropy_statistics(logits.data(), targets.data(), tokens, vocab, 0, whole_statistics.data(),
                                whole_statistics.data() + tokens);
  const double whole_loss = shard_cross_entropy(whole_statistics, 1, mask.data(), tokens, whole_lse);
  std::vector<float> whole_dlogits(tokens * vocab);
  ref::cross_entropy_backward(logits.data(), whole_lse.data(), targets.data(), mask.data(), tokens, vocab, 0, 0.5f,
                              whole_dlogits.data());

  std::vector<std::vector<float>> shard_logits(starts.size());
  std::vector<float> statistics(starts.size() * 2 * tokens), lse;
  for (std::size_t s = 0; s < starts.size(); ++s) {
    for (std::size_t t = 0; t < tokens; ++t) {
      const float* row = &logits[t * vocab + starts[s]];
      shard_logits[s].insert(shard_logits[s].end(), row, row + sizes[s]);
    }
    float* shard_statistics = &statistics[s * 2 * tokens];
    ref::cross_entropy_statistics(shard_logits[s].data(), targets.data(), tokens, sizes[s], starts[s], shard_statistics,
                                  shard_statistics + tokens);
    for (std::size_t t = 0; t < tokens; ++t) {
      const bool held =
          targets[t] >= static_cast<int64_t>(starts[s]) && targets[t] < static_cast<int64_t>(starts[s] + sizes[s]);
      INFO("shard " << s << ", token " << t);
      CHECK(shard_statistics[tokens + t] == (held ? whole_statistics[tokens + t] : 0.0f));
    }
  }
  CHECK(shard_cross_entropy(statistics, starts.size(), mask.data(), tokens, lse) == Approx(whole_loss).epsilon(1e-6));
  for (std::size_t t = 0; t < tokens; ++t) CHECK(lse[t] == Approx(whole_lse[t]).epsilon(1e-6));

  for (std::size_t s = 0; s < starts.size(); ++s) {
    std::vector<float>& dlogits = shard_logits[s];  // in place
    ref::cross_entropy_backward(dlogits.data(), lse.data(), targets.data(), mask.data(), tokens, sizes[s], starts[s],
                                0.5f, dlogits.data());
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t v = 0; v < sizes[s]; ++v) {
        INFO("shard " << s << ", token " << t << ", column " << v);
        CHECK(dlogits[t * sizes[s] + v] == Approx(whole_dlogits[t * vocab + starts[s] + v]).margin(1e-6));
      }
    }
  }
}

TEST_CASE("causal attention's backward is its forward's gradient, with and without dropout", "[kernels]") {
  std::mt19937 generator(5);
  const std::size_t heads = 2, seq = 5, dim = 4;
  const std::size_t n = heads * seq * dim;
  std::vector<float> q = random_vector(n, generator), k = random_vector(n, generator), v = random_vector(n, generator);
  const std::vector<float> weights = random_vector(n, generator);
  megaplan::exec::DropoutMask dropout;
  dropout.seed = 7;
  dropout.seq = static_cast<int64_t>(seq);
  for (const float p : {0.0f, 0.3f}) {
    INFO("attention dropout " << p);
    dropout.probability = p;
    std::vector<float> o(n), probs(heads * seq * seq);
    // Heads 1 and 2 of sequence 3: the mask places the blocks in the model.
    const auto loss = [&] {
      ref::attention_forward(q.data(), k.data(), v.data(), heads, seq, dim, dropout, 3, 1, o.data(), probs.data());
      return weighted_sum(o, weights);
    };
    loss();
    // Causal: the first query sees only the first key, so its output is the first value (or 0, dropped).
    const bool first_kept = !dropout.active() || dropout.keeps_probability(3, 1, 0, 0);
    for (std::size_t d = 0; d < dim; ++d) CHECK(o[d] == Approx(first_kept ? v[d] * dropout.scale() : 0.0f));
    CHECK(probs[1] == 0.0f);
    std::vector<float> dq(n), dk(n), dv(n);
    ref::attention_backward(weights.data(), q.data(), k.data(), v.data(), probs.data(), heads, seq, dim, dropout, 3, 1,
                            dq.data(), dk.data(), dv.data());
    check_gradient(q, dq, loss, "dq");
    check_gradient(k, dk, loss, "dk");
    check_gradient(v, dv, loss, "dv");
  }
}

TEST_CASE("dropout masks depend on the element's place in the model alone", "[kernels][dropout]") {
  // One tensor of 2 sequences x 8 tokens x 16 columns: the whole, and its two halves of rows as two
  // sequence-parallel ranks hold them, draw the same mask; about p of the elements are dropped.
  megaplan::exec::DropoutMask mask;
  mask.probability = 0.25f;
  mask.seed = 1234;
  mask.site = megaplan::exec::dropout_site(5, megaplan::exec::DropoutKind::kMlpBranch);
  mask.first_sample = 40;
  mask.seq = 8;
  const std::size_t rows = 16, cols = 16;
  std::vector<float> x(rows * cols, 1.0f), whole(rows * cols), halves(rows * cols);
  ref::dropout(x.data(), nullptr, rows, cols, mask, whole.data());
  for (int64_t rank = 0; rank < 2; ++rank) {
    megaplan::exec::DropoutMask part = mask;
    part.first_row = rank * 8;
    const auto at = static_cast<std::size_t>(rank) * 8 * cols;
    ref::dropout(x.data() + at, nullptr, 8, cols, part, halves.data() + at);
  }
  CHECK(halves == whole);
  std::size_t dropped = 0;
  for (const float value : whole) {
    CHECK((value == 0.0f || value == Approx(1.0f / 0.75f)));
    dropped += value == 0.0f ? 1 : 0;
  }
  CHECK(dropped > rows * cols / 8);  // p = 1/4 of 256: 64 expected
  CHECK(dropped < rows * cols * 3 / 8);
  // Another sample, site or seed draws another mask.
  for (const auto change :
       {+[](megaplan::exec::DropoutMask& m) { ++m.first_sample; }, +[](megaplan::exec::DropoutMask& m) { ++m.site; },
        +[](megaplan::exec::DropoutMask& m) { ++m.seed; }}) {
    megaplan::exec::DropoutMask other = mask;
    change(other);
    std::vector<float> redrawn(rows * cols);
    ref::dropout(x.data(), nullptr, rows, cols, other, redrawn.data());
    CHECK(redrawn != whole);
  }
  // The dropout-add: the residual plus the same masked values, in place on the residual too.
  std::vector<float> residual(rows * cols), added(rows * cols);
  for (std::size_t i = 0; i < residual.size(); ++i) residual[i] = 0.5f * static_cast<float>(i % 7);
  ref::dropout(x.data(), residual.data(), rows, cols, mask, added.data());
  for (std::size_t i = 0; i < added.size(); ++i) CHECK(added[i] == residual[i] + whole[i]);
  ref::dropout(x.data(), residual.data(), rows, cols, mask, residual.data());
  CHECK(residual == added);
  // Inactive: the identity, or the plain add.
  mask.probability = 0;
  ref::dropout(x.data(), nullptr, rows, cols, mask, whole.data());
  CHECK(whole == x);
  ref::dropout(x.data(), x.data(), rows, cols, mask, whole.data());
  CHECK(whole == std::vector<float>(rows * cols, 2.0f));
}

TEST_CASE("AdamW steps as torch.optim.AdamW", "[kernels]") {
  std::vector<float> w = {1.0f, -2.0f}, g = {0.5f, 0.1f}, m = {0, 0}, v = {0, 0};
  ref::AdamWParameters parameters;
  parameters.lr = 0.1;
  parameters.weight_decay = 0.01;
  ref::adamw_step(w.data(), g.data(), m.data(), v.data(), 2, 1, parameters);
  // Step 1: m_hat = g, v_hat = g^2, so the Adam part is g / (|g| + eps) = sign(g).
  CHECK(w[0] == Approx(1.0 - 0.1 * (1.0 + 0.01 * 1.0)).epsilon(1e-6));
  CHECK(w[1] == Approx(-2.0 - 0.1 * (1.0 + 0.01 * -2.0)).epsilon(1e-6));
  CHECK(m[0] == Approx(0.05));
  CHECK(v[0] == Approx(0.00025));
  ref::adamw_step(w.data(), g.data(), m.data(), v.data(), 2, 2, parameters);
  // Constant gradients keep m_hat = g and v_hat = g^2 after bias correction.
  CHECK(w[0] == Approx(0.899 - 0.1 * (1.0 + 0.01 * 0.899)).epsilon(1e-5));
}
