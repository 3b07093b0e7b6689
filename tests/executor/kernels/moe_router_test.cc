// Megatron-Core's MoE routing on the CPU (executor/kernels/reference/moe_router.h): small cases
// worked by hand from Megatron's formulas (moe_utils.py: topk_routing_with_score_function,
// switch_load_balancing_loss_func, z_loss_func, get_capacity, apply_router_token_dropping,
// permute/unpermute, get_updated_expert_bias), and every backward against finite differences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/moe_spec.h"
#include "executor/kernels/reference/moe_router.h"
#include "tests/executor/kernels/gradient_check.h"

namespace ref = megaplan::exec::reference;
using megaplan::moe_expert_capacity;
using ref::DropPolicy;
using ref::RouterOptions;
using ref::RouterScore;

namespace {

// Logits whose experts lie at least 0.5 apart in each row (a random order of 0, 0.5, 1, ... plus
// noise below 0.05), so that the finite differences' steps never change a top-k choice.
std::vector<float> separated_logits(std::size_t tokens, std::size_t experts, std::mt19937& generator) {
  std::vector<float> logits(tokens * experts);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<float> levels(experts);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t i = 0; i < experts; ++i) levels[i] = 0.5f * static_cast<float>(i) - 1.0f;
    std::shuffle(levels.begin(), levels.end(), generator);
    for (std::size_t i = 0; i < experts; ++i) logits[t * experts + i] = levels[i] + noise(generator);
  }
  return logits;
}

}  // namespace

TEST_CASE("the router's top k: softmax after or before the choice, sigmoid with the expert bias", "[kernels][moe]") {
  const std::vector<float> logits = {1, 3, 2, 0};
  RouterOptions options{.experts = 4, .topk = 2};
  ref::TopK routed = ref::route_top_k(logits.data(), 1, options);
  CHECK(routed.experts == std::vector<int32_t>{1, 2});
  CHECK(routed.probs[0] == Approx(std::exp(1.0) / (std::exp(1.0) + 1)));  // softmax over 3 and 2
  CHECK(routed.probs[1] == Approx(1 / (std::exp(1.0) + 1)));

  options.pre_softmax = true;  // softmax over all four, then the top two, not renormalised
  const double sum = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1;
  routed = ref::route_top_k(logits.data(), 1, options);
  CHECK(routed.experts == std::vector<int32_t>{1, 2});
  CHECK(routed.probs[0] == Approx(std::exp(3.0) / sum));
  CHECK(routed.probs[1] == Approx(std::exp(2.0) / sum));

  options = {.experts = 4, .topk = 2, .score = RouterScore::kSigmoid, .scaling_factor = 2.5};
  const auto s = [](double x) { return 1 / (1 + std::exp(-x)); };
  routed = ref::route_top_k(logits.data(), 1, options);
  CHECK(routed.experts == std::vector<int32_t>{1, 2});
  CHECK(routed.probs[0] == Approx(2.5 * s(3) / (s(3) + s(2))));
  // The bias chooses (expert 3 lifted over expert 2) but the probabilities are the sigmoids'.
  const std::vector<float> bias = {0, 0, 0, 0.4f};  // s(0) + 0.4 = 0.9: below s(3), above s(2)
  options.expert_bias = bias.data();
  routed = ref::route_top_k(logits.data(), 1, options);
  CHECK(routed.experts == std::vector<int32_t>{1, 3});
  CHECK(routed.probs[1] == Approx(2.5 * s(0) / (s(3) + s(0))));
  // One expert a token: its sigmoid as it is.
  options = {.experts = 4, .topk = 1, .score = RouterScore::kSigmoid};
  CHECK(ref::route_top_k(logits.data(), 1, options).probs[0] == Approx(s(3)));
  // Ties go to the lower expert.
  const std::vector<float> tied = {2, 5, 5, 5};
  CHECK(ref::route_top_k(tied.data(), 1, {.experts = 4, .topk = 2}).experts == std::vector<int32_t>{1, 2});
}

TEST_CASE("the router's backward equals finite differences of its probabilities", "[kernels][moe]") {
  std::mt19937 generator(7);
  const std::size_t tokens = 5, experts = 6;
  std::vector<float> bias = megaplan::test::random_vector(experts, generator, 0.01f);
  const std::vector<RouterOptions> variants = {
      {.experts = experts, .topk = 2},
      {.experts = experts, .topk = 3, .pre_softmax = true},
      {.experts = experts, .topk = 2, .score = RouterScore::kSigmoid, .scaling_factor = 1.5},
      {.experts = experts, .topk = 2, .score = RouterScore::kSigmoid, .expert_bias = bias.data()},
      {.experts = experts, .topk = 1, .score = RouterScore::kSigmoid},
  };
  for (const RouterOptions& options : variants) {
    std::vector<float> logits = separated_logits(tokens, experts, generator);
    const std::vector<float> weights = megaplan::test::random_vector(tokens * options.topk, generator);
    const ref::TopK routed = ref::route_top_k(logits.data(), tokens, options);
    std::vector<float> d_logits(tokens * experts, 0.0f);
    ref::route_top_k_backward(logits.data(), routed, weights.data(), tokens, options, d_logits.data());
    megaplan::test::check_gradient(
        logits, d_logits,
        [&] {
          const ref::TopK again = ref::route_top_k(logits.data(), tokens, options);
          REQUIRE(again.experts == routed.experts);  // the step never changes the choice
          return megaplan::test::weighted_sum(again.probs, weights);
        },
        "d_logits");
  }
}

TEST_CASE("the switch, sequence and z losses: Megatron's values and gradients", "[kernels][moe]") {
  // Two tokens, two experts, top 1, softmax: counts (1, 1); the loss is
  // E coeff / (k T^2) * sum_i P_i f_i with P_i the summed softmax scores.
  const std::vector<float> two = {2, 0, 0, 1};
  const RouterOptions options{.experts = 2, .topk = 1};
  const std::vector<int64_t> counts = ref::aux_loss_tokens_per_expert(two.data(), 2, options);
  CHECK(counts == std::vector<int64_t>{1, 1});
  std::vector<float> unused(4, 0.0f);
  const double p0 = 1 / (1 + std::exp(-2.0)) + 1 / (1 + std::exp(1.0));  // expert 0's scores summed
  CHECK(ref::switch_aux_loss(two.data(), 2, options, counts, 2, 0.01, unused.data()) ==
        Approx(2 * 0.01 / 4 * (p0 * 1 + (2 - p0) * 1)));
  // z loss: coeff times the mean squared logsumexp.
  const double lse0 = std::log(std::exp(2.0) + 1), lse1 = std::log(1 + std::exp(1.0));
  CHECK(ref::z_loss(two.data(), 2, 2, 1e-3, unused.data()) == Approx(1e-3 * (lse0 * lse0 + lse1 * lse1) / 2));

  std::mt19937 generator(11);
  const std::size_t tokens = 6, experts = 5;
  for (const RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    const RouterOptions router{.experts = experts, .topk = 2, .score = score};
    std::vector<float> logits = separated_logits(tokens, experts, generator);
    // Counts of a larger group (this rank's tokens among 24), held fixed as Megatron holds them.
    std::vector<int64_t> group = ref::aux_loss_tokens_per_expert(logits.data(), tokens, router);
    for (int64_t& count : group) count = 4 * count + 1;
    std::vector<float> d_logits(tokens * experts, 0.0f);
    ref::switch_aux_loss(logits.data(), tokens, router, group, 24, 0.1, d_logits.data());
    for (float& d : d_logits) d *= 100;  // the loss scaled too, so its differences stand above float rounding
    megaplan::test::check_gradient(
        logits, d_logits,
        [&] {
          std::vector<float> scratch(tokens * experts, 0.0f);
          return 100 * ref::switch_aux_loss(logits.data(), tokens, router, group, 24, 0.1, scratch.data());
        },
        "switch d_logits");
  }
  // The sequence-level loss: each sequence's switch loss with its own counts, averaged; one sequence
  // is the microbatch's switch loss; its gradient by finite differences.
  for (const RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    const RouterOptions router{.experts = experts, .topk = 2, .score = score};
    const std::vector<float> logits = separated_logits(tokens, experts, generator);
    std::vector<float> unused_d(tokens * experts, 0.0f);
    double mean = 0;
    for (std::size_t b = 0; b < 3; ++b) {
      const float* rows = logits.data() + b * 2 * experts;
      mean += ref::switch_aux_loss(rows, 2, router, ref::aux_loss_tokens_per_expert(rows, 2, router), 2, 0.1,
                                   unused_d.data()) /
              3;
    }
    CHECK(ref::sequence_aux_loss(logits.data(), tokens, 3, router, 0.1, unused_d.data()) == Approx(mean));
    CHECK(ref::sequence_aux_loss(logits.data(), tokens, 1, router, 0.1, unused_d.data()) ==
          Approx(ref::switch_aux_loss(logits.data(), tokens, router,
                                      ref::aux_loss_tokens_per_expert(logits.data(), tokens, router), tokens, 0.1,
                                      unused_d.data())));
    std::vector<float> varied = logits;
    std::vector<float> d_logits(tokens * experts, 0.0f);
    ref::sequence_aux_loss(varied.data(), tokens, 3, router, 0.1, d_logits.data());
    for (float& d : d_logits) d *= 100;
    megaplan::test::check_gradient(
        varied, d_logits,
        [&] {
          std::vector<float> scratch(tokens * experts, 0.0f);
          return 100 * ref::sequence_aux_loss(varied.data(), tokens, 3, router, 0.1, scratch.data());
        },
        "sequence d_logits");
  }
  std::vector<float> logits = megaplan::test::random_vector(tokens * experts, generator, 2.0f);
  std::vector<float> d_logits(tokens * experts, 0.0f);
  ref::z_loss(logits.data(), tokens, experts, 0.5, d_logits.data());
  megaplan::test::check_gradient(
      logits, d_logits,
      [&] {
        std::vector<float> scratch(tokens * experts, 0.0f);
        return ref::z_loss(logits.data(), tokens, experts, 0.5, scratch.data());
      },
      "z d_logits");
}

TEST_CASE("expert capacity and Megatron's drop policies", "[kernels][moe]") {
  CHECK(moe_expert_capacity(10, 2, 4, 1.0) == 5);  // ceil(20 / 4)
  CHECK(moe_expert_capacity(10, 2, 4, 1.1) == 6);  // ceil(5.5)
  CHECK(moe_expert_capacity(3, 1, 4, 1.0) == 1);   // ceil(0.75)
  // Five tokens, two experts, top 1: expert 0 gets tokens 0, 1, 3, 4 with these probabilities.
  ref::TopK routed;
  routed.experts = {0, 0, 1, 0, 0};
  routed.probs = {0.6f, 0.9f, 0.7f, 0.9f, 0.8f};
  const auto tokens_of = [](const std::vector<ref::Route>& routes) {
    std::vector<int64_t> tokens;
    for (const ref::Route& r : routes) tokens.push_back(r.slot < 0 ? -1 - r.token : r.token);  // pads negative
    return tokens;
  };
  ref::Dispatch dropless = ref::dispatch_routes(routed, 5, 2, 1, 0, DropPolicy::kProbs, false);
  CHECK(tokens_of(dropless.by_expert[0]) == std::vector<int64_t>{0, 1, 3, 4});
  CHECK(dropless.rows() == 5);
  // Capacity 2: by probability tokens 1 and 3 (0.9, the tie to the earlier); by position 0 and 1.
  CHECK(tokens_of(ref::dispatch_routes(routed, 5, 2, 1, 2, DropPolicy::kProbs, false).by_expert[0]) ==
        std::vector<int64_t>{1, 3});
  CHECK(tokens_of(ref::dispatch_routes(routed, 5, 2, 1, 2, DropPolicy::kPosition, false).by_expert[0]) ==
        std::vector<int64_t>{0, 1});
  // Padded to capacity 3: expert 0 keeps three routes; expert 1 (token 2) fills with tokens 0 and 1.
  const ref::Dispatch padded = ref::dispatch_routes(routed, 5, 2, 1, 3, DropPolicy::kProbs, true);
  CHECK(tokens_of(padded.by_expert[0]) == std::vector<int64_t>{1, 3, 4});
  CHECK(tokens_of(padded.by_expert[1]) == std::vector<int64_t>{-1, -2, 2});
  CHECK(padded.rows() == 6);
}

TEST_CASE("tokens permuted to the experts and combined back by their probabilities", "[kernels][moe]") {
  std::mt19937 generator(3);
  const std::size_t tokens = 6, experts = 3, topk = 2, hidden = 4;
  const RouterOptions options{.experts = experts, .topk = topk};
  const std::vector<float> logits = separated_logits(tokens, experts, generator);
  ref::TopK routed = ref::route_top_k(logits.data(), tokens, options);
  const ref::Dispatch dispatch = ref::dispatch_routes(
      routed, tokens, experts, topk, moe_expert_capacity(tokens, topk, experts, 1.0), DropPolicy::kPosition, true);
  std::vector<float> x = megaplan::test::random_vector(tokens * hidden, generator);
  std::vector<float> rows(dispatch.rows() * hidden);
  ref::permute_tokens(x.data(), hidden, dispatch, rows.data());
  // Expert by expert, each row its token's.
  std::size_t row = 0;
  for (const auto& routes : dispatch.by_expert) {
    for (const ref::Route& route : routes) {
      for (std::size_t h = 0; h < hidden; ++h) CHECK(rows[row * hidden + h] == x[route.token * hidden + h]);
      ++row;
    }
  }
  // The identity expert: a token comes back as the sum of its kept routes' probabilities times itself.
  std::vector<float> y(tokens * hidden);
  ref::combine_tokens(rows.data(), hidden, dispatch, routed, tokens, topk, y.data());
  std::vector<double> kept(tokens, 0.0);
  for (const auto& routes : dispatch.by_expert)
    for (const ref::Route& route : routes)
      if (route.slot >= 0) kept[route.token] += routed.probs[route.token * topk + route.slot];
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t h = 0; h < hidden; ++h) CHECK(y[t * hidden + h] == Approx(kept[t] * x[t * hidden + h]));

  // Backward: d rows and d probs of the combine, dx of the permutation, by finite differences.
  const std::vector<float> dy = megaplan::test::random_vector(tokens * hidden, generator);
  std::vector<float> d_rows(rows.size());
  std::vector<float> d_probs(routed.probs.size(), 0.0f);
  ref::combine_tokens_backward(dy.data(), rows.data(), hidden, dispatch, routed, topk, d_rows.data(), d_probs.data());
  const auto combined = [&] {
    std::vector<float> out(tokens * hidden);
    ref::combine_tokens(rows.data(), hidden, dispatch, routed, tokens, topk, out.data());
    return megaplan::test::weighted_sum(out, dy);
  };
  megaplan::test::check_gradient(rows, d_rows, combined, "d_rows");
  megaplan::test::check_gradient(routed.probs, d_probs, combined, "d_probs");
  std::vector<float> dx(x.size(), 0.0f);
  ref::permute_tokens_backward(d_rows.data(), hidden, dispatch, dx.data());
  megaplan::test::check_gradient(
      x, dx,
      [&] {
        std::vector<float> permuted(rows.size()), out(tokens * hidden);
        ref::permute_tokens(x.data(), hidden, dispatch, permuted.data());
        ref::combine_tokens(permuted.data(), hidden, dispatch, routed, tokens, topk, out.data());
        return megaplan::test::weighted_sum(out, dy);
      },
      "dx");
}

TEST_CASE("the expert bias moves toward the mean load", "[kernels][moe]") {
  std::vector<float> bias = {0.0f, 0.1f, -0.1f, 0.0f};
  ref::update_expert_bias({10, 2, 4, 4}, 1e-3, bias.data());  // mean 5
  CHECK(bias[0] == Approx(-1e-3));
  CHECK(bias[1] == Approx(0.1 + 1e-3));
  CHECK(bias[2] == Approx(-0.1 + 1e-3));
  CHECK(bias[3] == Approx(1e-3));
  ref::update_expert_bias({5, 5}, 1e-3, bias.data());  // at the mean: unchanged
  CHECK(bias[0] == Approx(-1e-3));
}
