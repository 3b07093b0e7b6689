// The MoE MLP on a Backend (executor/model/moe_mlp.h) against the CPU reference layer
// (executor/kernels/reference/moe_layer.h): the backend's operations composed as the stage chunk
// will compose them give the reference's output, losses and every gradient, dropless and under a
// capacity, by softmax and by sigmoid with the expert bias, with and without a shared expert and
// its gate.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "core/moe_spec.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/kernels/reference/moe_layer.h"
#include "executor/model/moe_mlp.h"
#include "executor/runtime/cpu_backend.h"
#include "tests/executor/kernels/gradient_check.h"

namespace ref = megaplan::exec::reference;
using megaplan::exec::Activation;
using megaplan::exec::CpuBackend;
using megaplan::exec::MoeMlp;
using megaplan::exec::MoeMlpShape;
using megaplan::test::random_vector;

namespace {

MoeMlpShape backend_shape(const ref::MoeLayerShape& shape) {
  MoeMlpShape out;
  out.tokens = shape.tokens;
  out.hidden = shape.hidden;
  out.ffn = shape.ffn;
  out.shared_ffn = shape.shared_ffn;
  out.shared_gate = shape.shared_gate;
  out.router = {.experts = shape.router.experts,
                .topk = shape.router.topk,
                .sigmoid = shape.router.score == ref::RouterScore::kSigmoid,
                .pre_softmax = shape.router.pre_softmax,
                .scaling_factor = static_cast<float>(shape.router.scaling_factor)};
  if (shape.capacity_factor > 0) {
    out.capacity = {static_cast<std::size_t>(megaplan::moe_expert_capacity(
                        static_cast<int64_t>(shape.tokens), static_cast<int64_t>(shape.router.topk),
                        static_cast<int64_t>(shape.router.experts), shape.capacity_factor)),
                    shape.drop_policy, shape.pad_to_capacity};
  }
  out.aux_loss_coeff = shape.aux_loss_coeff;
  out.z_loss_coeff = shape.z_loss_coeff;
  return out;
}

// A host vector on the CPU backend (whose activations are fp32 host memory).
struct Tensor {
  std::vector<float> host;
  Activation device = nullptr;
};

void check_close(const std::vector<float>& expected, const float* actual, const char* what) {
  INFO(what);
  for (std::size_t i = 0; i < expected.size(); ++i) REQUIRE(actual[i] == Approx(expected[i]).margin(1e-5));
}

// Random weights of an MoE MLP without a shared expert, on the CPU backend (whose activations are
// host fp32 buffers), and the gradients they add into.
struct RoutedExperts {
  RoutedExperts(const MoeMlpShape& shape, std::mt19937& generator) {
    const std::size_t h = shape.hidden, f = shape.ffn, e = shape.router.experts;
    router = random_vector(e * h, generator);
    for (std::size_t i = 0; i < e; ++i) {
      fc1.push_back(random_vector(2 * f * h, generator));
      fc2.push_back(random_vector(h * f, generator));
    }
    d_router.resize(e * h);
    d_fc.resize(e * 3 * f * h);
  }
  static Activation act(std::vector<float>& v) { return reinterpret_cast<Activation>(v.data()); }
  megaplan::exec::MoeMlpWeights weights() {
    megaplan::exec::MoeMlpWeights out{act(router), {}, {}, nullptr, nullptr, nullptr};
    for (std::size_t i = 0; i < fc1.size(); ++i) {
      out.fc1.push_back(act(fc1[i]));
      out.fc2.push_back(act(fc2[i]));
    }
    return out;
  }
  // Zeroed, each expert's fc1 then fc2 in d_fc.
  megaplan::exec::MoeMlpGradients gradients() {
    std::fill(d_router.begin(), d_router.end(), 0.0f);
    std::fill(d_fc.begin(), d_fc.end(), 0.0f);
    megaplan::exec::MoeMlpGradients out{d_router.data(), {}, {}, nullptr, nullptr, nullptr};
    float* next = d_fc.data();
    for (std::size_t i = 0; i < fc1.size(); ++i) {
      out.fc1.push_back(next);
      next += fc1[i].size();
      out.fc2.push_back(next);
      next += fc2[i].size();
    }
    return out;
  }
  std::vector<float> router, d_router, d_fc;
  std::vector<std::vector<float>> fc1, fc2;
};

// The shape the tests vary: 10 tokens to the top 2 of 4 experts, with a shared expert and both losses.
ref::MoeLayerShape dropless_shape() {
  return {.tokens = 10,
          .hidden = 6,
          .ffn = 5,
          .shared_ffn = 4,
          .router = {.experts = 4, .topk = 2},
          .aux_loss_coeff = 0.5,
          .z_loss_coeff = 0.1};
}

}  // namespace

TEST_CASE("the MoE MLP on the CPU backend is the reference MoE layer, forward and backward", "[executor][moe]") {
  std::mt19937 generator(23);
  std::vector<float> bias = {0.3f, -0.2f, 0.0f, 0.1f};
  const ref::MoeLayerShape dropless = dropless_shape();
  ref::MoeLayerShape by_probability = dropless;
  by_probability.capacity_factor = 0.75;
  by_probability.shared_ffn = 0;
  by_probability.router.pre_softmax = true;
  ref::MoeLayerShape padded = dropless;
  padded.capacity_factor = 1.5;
  padded.drop_policy = ref::DropPolicy::kPosition;
  padded.pad_to_capacity = true;
  padded.shared_gate = true;
  ref::MoeLayerShape sigmoid = dropless;
  sigmoid.router.score = ref::RouterScore::kSigmoid;
  sigmoid.router.expert_bias = bias.data();
  sigmoid.router.scaling_factor = 2.5;
  sigmoid.aux_loss_coeff = 0;
  ref::MoeLayerShape top_one = dropless;
  top_one.router.topk = 1;
  top_one.router.pre_softmax = true;
  for (const ref::MoeLayerShape& shape : {dropless, by_probability, padded, sigmoid, top_one}) {
    const std::size_t t = shape.tokens, h = shape.hidden, f = shape.ffn, e = shape.router.experts;
    const std::size_t s = shape.shared_ffn;
    const std::vector<float> router = random_vector(e * h, generator), fc1 = random_vector(e * 2 * f * h, generator),
                             fc2 = random_vector(e * h * f, generator),
                             shared_fc1 = random_vector(2 * s * h, generator),
                             shared_fc2 = random_vector(h * s, generator), gate = random_vector(h, generator),
                             x = random_vector(t * h, generator), dy = random_vector(t * h, generator);
    const ref::MoeLayerWeights weights{router.data(),
                                       fc1.data(),
                                       fc2.data(),
                                       s ? shared_fc1.data() : nullptr,
                                       s ? shared_fc2.data() : nullptr,
                                       shape.shared_gate ? gate.data() : nullptr};
    const ref::MoeLayerForward expected = ref::moe_layer_forward(x.data(), weights, shape);
    const ref::MoeLayerGradients expected_grads =
        ref::moe_layer_backward(dy.data(), x.data(), weights, shape, expected);

    CpuBackend backend;
    // The CPU backend's activations are its fp32 buffers: weights and inputs are views of copies.
    std::vector<std::vector<float>> copies;
    const auto on_backend = [&](const std::vector<float>& values) {
      copies.push_back(values);
      return reinterpret_cast<Activation>(copies.back().data());
    };
    copies.reserve(64);
    megaplan::exec::MoeMlpWeights on_weights;
    on_weights.router = on_backend(router);
    std::vector<float> d_router(e * h, 0.0f), d_fc1(e * 2 * f * h, 0.0f), d_fc2(e * h * f, 0.0f),
        d_shared_fc1(2 * s * h, 0.0f), d_shared_fc2(h * s, 0.0f), d_gate(h, 0.0f);
    megaplan::exec::MoeMlpGradients gradients{d_router.data(),
                                              {},
                                              {},
                                              s ? d_shared_fc1.data() : nullptr,
                                              s ? d_shared_fc2.data() : nullptr,
                                              shape.shared_gate ? d_gate.data() : nullptr};
    for (std::size_t expert = 0; expert < e; ++expert) {  // each expert its own parameter, as Megatron names them
      on_weights.fc1.push_back(on_backend({fc1.begin() + expert * 2 * f * h, fc1.begin() + (expert + 1) * 2 * f * h}));
      on_weights.fc2.push_back(on_backend({fc2.begin() + expert * h * f, fc2.begin() + (expert + 1) * h * f}));
      gradients.fc1.push_back(d_fc1.data() + expert * 2 * f * h);
      gradients.fc2.push_back(d_fc2.data() + expert * h * f);
    }
    if (s) {
      on_weights.shared_fc1 = on_backend(shared_fc1);
      on_weights.shared_fc2 = on_backend(shared_fc2);
    }
    if (shape.shared_gate) on_weights.shared_gate = on_backend(gate);
    MoeMlp mlp(backend_shape(shape), backend);
    megaplan::exec::MoeMlpSaved saved = mlp.allocate_saved();
    std::vector<float> y(t * h), dx(t * h);
    const Activation x_on = on_backend(x);
    mlp.forward(x_on, x_on, on_weights, shape.router.expert_bias, saved, reinterpret_cast<Activation>(y.data()), true);
    // Logged without their coefficients, as Megatron logs them.
    const megaplan::exec::RouterLosses logged = mlp.take_losses();
    const double losses = shape.aux_loss_coeff * logged.balancing + shape.z_loss_coeff * logged.z;
    CHECK(logged.z > 0);
    check_close(expected.y, y.data(), "y");
    CHECK(losses == Approx(expected.aux_loss + expected.z_loss).epsilon(1e-6));
    std::vector<int64_t> rows_per_expert(e, 0);
    for (std::size_t expert = 0; expert < e; ++expert) {
      rows_per_expert[expert] = static_cast<int64_t>(expected.dispatch.by_expert[expert].size());
    }
    CHECK(saved.rows_per_expert == rows_per_expert);

    mlp.backward(on_backend(dy), x_on, x_on, on_weights, saved, gradients, 1.0f,
                 reinterpret_cast<Activation>(dx.data()));
    check_close(expected_grads.dx, dx.data(), "dx");
    check_close(expected_grads.router, d_router.data(), "d router");
    check_close(expected_grads.fc1, d_fc1.data(), "d fc1");
    check_close(expected_grads.fc2, d_fc2.data(), "d fc2");
    if (s) {
      check_close(expected_grads.shared_fc1, d_shared_fc1.data(), "d shared fc1");
      check_close(expected_grads.shared_fc2, d_shared_fc2.data(), "d shared fc2");
    }
    if (shape.shared_gate) check_close(expected_grads.shared_gate, d_gate.data(), "d shared gate");
    mlp.release(saved);
  }
}

TEST_CASE("the MoE MLP scales the router losses' gradients as the LM loss's", "[executor][moe]") {
  // d router at scale 3 minus at scale 1 is twice the losses' share alone (the routing's share
  // does not scale): the losses' gradient seen apart from the probabilities'.
  std::mt19937 generator(29);
  const MoeMlpShape shape{.tokens = 6,
                          .hidden = 4,
                          .ffn = 3,
                          .router = {.experts = 3, .topk = 2},
                          .capacity = {},
                          .aux_loss_coeff = 0.3,
                          .z_loss_coeff = 0.2};
  const std::size_t t = shape.tokens, h = shape.hidden;
  RoutedExperts experts(shape, generator);
  std::vector<float> x = random_vector(t * h, generator), dy = random_vector(t * h, generator);
  const auto act = RoutedExperts::act;
  const auto router_gradient = [&](float scale, bool with_output_gradient) {
    CpuBackend backend;
    MoeMlp mlp(shape, backend);
    megaplan::exec::MoeMlpSaved saved = mlp.allocate_saved();
    std::vector<float> y(t * h), dx(t * h), zero(t * h, 0.0f);
    mlp.forward(act(x), act(x), experts.weights(), nullptr, saved, act(y), false);
    mlp.backward(with_output_gradient ? act(dy) : act(zero), act(x), act(x), experts.weights(), saved,
                 experts.gradients(), scale, act(dx));
    mlp.release(saved);
    return experts.d_router;
  };
  const std::vector<float> at_one = router_gradient(1.0f, true), at_three = router_gradient(3.0f, true),
                           losses_alone = router_gradient(1.0f, false);
  bool losses_move_it = false;
  for (std::size_t i = 0; i < at_one.size(); ++i) {
    CHECK(at_three[i] - at_one[i] == Approx(2 * losses_alone[i]).margin(1e-5));
    losses_move_it = losses_move_it || std::abs(losses_alone[i]) > 1e-4;
  }
  CHECK(losses_move_it);
}

TEST_CASE("the MoE MLP's sequence-level load-balancing loss: its value and its gradient", "[executor][moe]") {
  // Two sequences of 5 tokens: the loss is the reference's mean of each one's switch loss over the
  // router's logits, and the router's gradient (with no output gradient) equals its finite
  // differences.
  std::mt19937 generator(31);
  const MoeMlpShape shape{.tokens = 10,
                          .hidden = 4,
                          .ffn = 3,
                          .router = {.experts = 4, .topk = 2},
                          .capacity = {},
                          .aux_loss_coeff = 0.4,
                          .aux_loss_sequences = 2};
  const std::size_t t = shape.tokens, h = shape.hidden, e = shape.router.experts;
  RoutedExperts experts(shape, generator);
  std::vector<float> x = random_vector(t * h, generator), y(t * h), dx(t * h), zero(t * h, 0.0f);
  const auto act = RoutedExperts::act;
  CpuBackend backend;
  MoeMlp mlp(shape, backend);
  const megaplan::exec::MoeMlpWeights weights = experts.weights();
  const megaplan::exec::MoeMlpGradients gradients = experts.gradients();
  const auto loss = [&] {
    megaplan::exec::MoeMlpSaved saved = mlp.allocate_saved();
    mlp.forward(act(x), act(x), weights, nullptr, saved, act(y), true);
    mlp.release(saved);
    return 0.4 * mlp.take_losses().balancing;
  };
  megaplan::exec::MoeMlpSaved saved = mlp.allocate_saved();
  mlp.forward(act(x), act(x), weights, nullptr, saved, act(y), true);
  const double value = 0.4 * mlp.take_losses().balancing;
  std::vector<float> unused(t * e, 0.0f);
  const ref::RouterOptions options{.experts = e, .topk = 2};
  CHECK(value ==
        Approx(ref::sequence_aux_loss(reinterpret_cast<const float*>(saved.logits), t, 2, options, 0.4, unused.data()))
            .epsilon(1e-9));
  CHECK(value > 0);
  mlp.backward(act(zero), act(x), act(x), weights, saved, gradients, 1.0f, act(dx));
  mlp.release(saved);
  megaplan::test::check_gradient(experts.router, experts.d_router, loss, "d router");
}

TEST_CASE("under expert parallelism each rank's MoE MLP is the reference layer on its own tokens", "[executor][moe]") {
  // Two ranks as threads, each with tokens of its own, rank r holding experts 2r and 2r + 1: its
  // output, input gradient and router gradient are the reference's on its tokens, and each of its
  // experts' gradients sums both ranks' tokens'. Also when the expert bias sends every token to
  // rank 0's experts, so that rank 1's compute no rows and its all-to-all segments are empty.
  std::vector<float> to_rank_zero = {10.0f, 10.0f, -10.0f, -10.0f};
  const ref::MoeLayerShape dropless = dropless_shape();
  ref::MoeLayerShape one_sided = dropless;
  one_sided.router.score = ref::RouterScore::kSigmoid;
  one_sided.router.expert_bias = to_rank_zero.data();
  one_sided.aux_loss_coeff = 0;
  for (const ref::MoeLayerShape& shape : {dropless, one_sided}) {
    INFO((shape.router.expert_bias ? "every token to rank 0's experts" : "dropless softmax"));
    std::mt19937 generator(31);
    const std::size_t t = shape.tokens, h = shape.hidden, f = shape.ffn, e = shape.router.experts, s = shape.shared_ffn;
    const std::vector<float> router = random_vector(e * h, generator), fc1 = random_vector(e * 2 * f * h, generator),
                             fc2 = random_vector(e * h * f, generator),
                             shared_fc1 = random_vector(2 * s * h, generator),
                             shared_fc2 = random_vector(h * s, generator);
    const ref::MoeLayerWeights weights{router.data(),     fc1.data(),        fc2.data(),
                                       shared_fc1.data(), shared_fc2.data(), nullptr};
    std::array<std::vector<float>, 2> x, dy;
    std::array<ref::MoeLayerGradients, 2> expected;
    std::array<std::vector<float>, 2> expected_y;
    for (std::size_t r = 0; r < 2; ++r) {
      x[r] = random_vector(t * h, generator);
      dy[r] = random_vector(t * h, generator);
      const ref::MoeLayerForward forward = ref::moe_layer_forward(x[r].data(), weights, shape);
      expected_y[r] = forward.y;
      expected[r] = ref::moe_layer_backward(dy[r].data(), x[r].data(), weights, shape, forward);
    }
    // What each rank computed, checked on the test's own thread (Catch's assertions are not thread-safe).
    struct RankResult {
      std::vector<float> y, dx, d_router, d_shared_fc1, d_fc1, d_fc2;
      std::vector<int64_t> received;
    };
    std::array<RankResult, 2> results;
    megaplan::exec::InProcessWorld world(2, std::chrono::seconds(30));
    megaplan::exec::run_rank_threads(world, 2, [&](int64_t rank) {
      const auto r = static_cast<std::size_t>(rank);
      CpuBackend backend;
      const std::unique_ptr<megaplan::exec::Comm> ep = world.group(rank, {0, 1}, "ep", {});
      std::vector<std::vector<float>> copies;
      copies.reserve(16);
      const auto on_backend = [&](const std::vector<float>& values) {
        copies.push_back(values);
        return reinterpret_cast<Activation>(copies.back().data());
      };
      megaplan::exec::MoeMlpWeights on_weights;
      on_weights.router = on_backend(router);
      on_weights.shared_fc1 = on_backend(shared_fc1);
      on_weights.shared_fc2 = on_backend(shared_fc2);
      std::vector<float> d_router(e * h, 0.0f), d_fc1(2 * 2 * f * h, 0.0f), d_fc2(2 * h * f, 0.0f),
          d_shared_fc1(2 * s * h, 0.0f), d_shared_fc2(h * s, 0.0f);
      megaplan::exec::MoeMlpGradients gradients{d_router.data(),     {},     {}, d_shared_fc1.data(),
                                                d_shared_fc2.data(), nullptr};
      for (std::size_t local = 0; local < 2; ++local) {
        const std::size_t expert = 2 * r + local;
        on_weights.fc1.push_back(
            on_backend({fc1.begin() + expert * 2 * f * h, fc1.begin() + (expert + 1) * 2 * f * h}));
        on_weights.fc2.push_back(on_backend({fc2.begin() + expert * h * f, fc2.begin() + (expert + 1) * h * f}));
        gradients.fc1.push_back(d_fc1.data() + local * 2 * f * h);
        gradients.fc2.push_back(d_fc2.data() + local * h * f);
      }
      MoeMlp mlp(backend_shape(shape), backend, ep.get());
      megaplan::exec::MoeMlpSaved saved = mlp.allocate_saved();
      std::vector<float> y(t * h), dx(t * h);
      const Activation x_on = on_backend(x[r]);
      mlp.forward(x_on, x_on, on_weights, shape.router.expert_bias, saved, reinterpret_cast<Activation>(y.data()),
                  true);
      mlp.backward(on_backend(dy[r]), x_on, x_on, on_weights, saved, gradients, 1.0f,
                   reinterpret_cast<Activation>(dx.data()));
      results[r] = {y, dx, d_router, d_shared_fc1, d_fc1, d_fc2, saved.received};
      mlp.release(saved);
    });
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("rank " << r);
      const RankResult& got = results[r];
      if (shape.router.expert_bias) {  // [sender x local expert]: both ranks' 2 x 10 routes go to rank 0
        CHECK(got.received == (r == 0 ? std::vector<int64_t>{10, 10, 10, 10} : std::vector<int64_t>(4, 0)));
      }
      check_close(expected_y[r], got.y.data(), "y");
      check_close(expected[r].dx, got.dx.data(), "dx");
      check_close(expected[r].router, got.d_router.data(), "d router");
      check_close(expected[r].shared_fc1, got.d_shared_fc1.data(), "d shared fc1");
      for (std::size_t local = 0; local < 2; ++local) {  // both ranks' tokens
        const std::size_t expert = 2 * r + local;
        std::vector<float> fc1_sum(2 * f * h), fc2_sum(h * f);
        for (std::size_t i = 0; i < fc1_sum.size(); ++i) {
          fc1_sum[i] = expected[0].fc1[expert * 2 * f * h + i] + expected[1].fc1[expert * 2 * f * h + i];
        }
        for (std::size_t i = 0; i < fc2_sum.size(); ++i) {
          fc2_sum[i] = expected[0].fc2[expert * h * f + i] + expected[1].fc2[expert * h * f + i];
        }
        check_close(fc1_sum, got.d_fc1.data() + local * 2 * f * h, "d fc1, both ranks' tokens");
        check_close(fc2_sum, got.d_fc2.data() + local * h * f, "d fc2, both ranks' tokens");
      }
    }
  }
}
