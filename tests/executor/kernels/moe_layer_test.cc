// Megatron-Core's MoE layer on one rank, the CPU reference (executor/kernels/reference/moe_layer.h):
// one expert chosen by every token is the dense SwiGLU MLP; a shared expert adds one; every
// gradient of Σ dy·y + the aux and z losses against finite differences, dropless and with
// Megatron's capacity, dropping and padding.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "executor/kernels/reference/moe_layer.h"
#include "executor/kernels/reference/swiglu.h"
#include "tests/executor/kernels/gradient_check.h"

namespace ref = megaplan::exec::reference;
using megaplan::test::random_vector;

namespace {

// The dense SwiGLU MLP, written out: y = (silu(x·gateᵀ) * x·upᵀ)·fc2ᵀ.
std::vector<float> dense_mlp(const std::vector<float>& x, const float* fc1, const float* fc2, std::size_t tokens,
                             std::size_t hidden, std::size_t ffn) {
  std::vector<float> fc1_out(tokens * 2 * ffn);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t j = 0; j < 2 * ffn; ++j) {
      double sum = 0;
      for (std::size_t l = 0; l < hidden; ++l) sum += static_cast<double>(x[t * hidden + l]) * fc1[j * hidden + l];
      fc1_out[t * 2 * ffn + j] = static_cast<float>(sum);
    }
  std::vector<float> activation(tokens * ffn);
  ref::swiglu_forward(fc1_out.data(), tokens, ffn, activation.data());
  std::vector<float> y(tokens * hidden);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t j = 0; j < hidden; ++j) {
      double sum = 0;
      for (std::size_t l = 0; l < ffn; ++l) sum += static_cast<double>(activation[t * ffn + l]) * fc2[j * ffn + l];
      y[t * hidden + j] = static_cast<float>(sum);
    }
  return y;
}

struct Layer {
  ref::MoeLayerShape shape;
  std::vector<float> router, fc1, fc2, shared_fc1, shared_fc2, shared_gate;
  ref::MoeLayerWeights weights() const {
    return {router.data(),
            fc1.data(),
            fc2.data(),
            shared_fc1.empty() ? nullptr : shared_fc1.data(),
            shared_fc2.empty() ? nullptr : shared_fc2.data(),
            shared_gate.empty() ? nullptr : shared_gate.data()};
  }
};

Layer random_layer(const ref::MoeLayerShape& shape, std::mt19937& generator) {
  Layer layer{shape, {}, {}, {}, {}, {}, {}};
  const std::size_t e = shape.router.experts, h = shape.hidden, f = shape.ffn;
  layer.router = random_vector(e * h, generator);
  layer.fc1 = random_vector(e * 2 * f * h, generator, 0.5f);
  layer.fc2 = random_vector(e * h * f, generator, 0.5f);
  if (shape.shared_ffn > 0) {
    layer.shared_fc1 = random_vector(2 * shape.shared_ffn * h, generator, 0.5f);
    layer.shared_fc2 = random_vector(h * shape.shared_ffn, generator, 0.5f);
  }
  if (shape.shared_gate) layer.shared_gate = random_vector(h, generator);
  return layer;
}

}  // namespace

TEST_CASE("one expert every token takes is the dense SwiGLU MLP; a shared expert adds one", "[kernels][moe]") {
  std::mt19937 generator(5);
  ref::MoeLayerShape shape{.tokens = 6, .hidden = 8, .ffn = 12, .router = {.experts = 1, .topk = 1}};
  const Layer one = random_layer(shape, generator);
  const std::vector<float> x = random_vector(shape.tokens * shape.hidden, generator);
  const ref::MoeLayerForward forward = ref::moe_layer_forward(x.data(), one.weights(), shape);
  const std::vector<float> dense = dense_mlp(x, one.fc1.data(), one.fc2.data(), shape.tokens, shape.hidden, shape.ffn);
  for (std::size_t i = 0; i < dense.size(); ++i) CHECK(forward.y[i] == Approx(dense[i]).margin(1e-6));

  // Four experts and a shared expert of width 10: the routed output plus the shared MLP.
  shape = {.tokens = 6, .hidden = 8, .ffn = 12, .shared_ffn = 10, .router = {.experts = 4, .topk = 2}};
  const Layer shared = random_layer(shape, generator);
  Layer routed_only = shared;
  routed_only.shape.shared_ffn = 0;
  routed_only.shared_fc1.clear();
  routed_only.shared_fc2.clear();
  const std::vector<float> with = ref::moe_layer_forward(x.data(), shared.weights(), shared.shape).y;
  const std::vector<float> without = ref::moe_layer_forward(x.data(), routed_only.weights(), routed_only.shape).y;
  const std::vector<float> shared_mlp =
      dense_mlp(x, shared.shared_fc1.data(), shared.shared_fc2.data(), shape.tokens, shape.hidden, shape.shared_ffn);
  for (std::size_t i = 0; i < with.size(); ++i) CHECK(with[i] == Approx(without[i] + shared_mlp[i]).margin(1e-5));
}

TEST_CASE("the MoE layer's gradients equal finite differences, dropless and under a capacity", "[kernels][moe]") {
  std::mt19937 generator(17);
  const ref::MoeLayerShape dropless{.tokens = 8,
                                    .hidden = 6,
                                    .ffn = 5,
                                    .shared_ffn = 4,
                                    .router = {.experts = 4, .topk = 2},
                                    .aux_loss_coeff = 0.5,
                                    .z_loss_coeff = 0.1};
  // Capacity ceil(8·2/4 · 0.75) = 3 of each expert's routes, the earliest kept: dropping by
  // probability is a step of the weights (a route drops when another's probability passes it), so
  // finite differences check the position policy; moe_router_test holds the probability policy.
  ref::MoeLayerShape dropping = dropless;
  dropping.capacity_factor = 0.75;
  dropping.drop_policy = ref::DropPolicy::kPosition;
  dropping.shared_ffn = 0;
  dropping.router.score = ref::RouterScore::kSigmoid;
  ref::MoeLayerShape padded = dropless;
  padded.capacity_factor = 1.5;
  padded.drop_policy = ref::DropPolicy::kPosition;
  padded.pad_to_capacity = true;
  padded.router.pre_softmax = true;
  padded.shared_gate = true;  // Qwen2-MoE's sigmoid(x·g) on the shared expert
  for (const ref::MoeLayerShape& shape : {dropless, dropping, padded}) {
    Layer layer = random_layer(shape, generator);
    std::vector<float> x = random_vector(shape.tokens * shape.hidden, generator);
    const std::vector<float> dy = random_vector(shape.tokens * shape.hidden, generator);
    const ref::MoeLayerForward forward = ref::moe_layer_forward(x.data(), layer.weights(), shape);
    const ref::MoeLayerGradients grads = ref::moe_layer_backward(dy.data(), x.data(), layer.weights(), shape, forward);
    const auto loss = [&] {
      const ref::MoeLayerForward again = ref::moe_layer_forward(x.data(), layer.weights(), shape);
      REQUIRE(again.routed.experts == forward.routed.experts);  // no step changes a choice
      REQUIRE(again.tokens_per_expert == forward.tokens_per_expert);
      return megaplan::test::weighted_sum(again.y, dy) + again.aux_loss + again.z_loss;
    };
    megaplan::test::check_gradient(x, grads.dx, loss, "dx");
    megaplan::test::check_gradient(layer.router, grads.router, loss, "d router");
    megaplan::test::check_gradient(layer.fc1, grads.fc1, loss, "d fc1");
    megaplan::test::check_gradient(layer.fc2, grads.fc2, loss, "d fc2");
    if (shape.shared_ffn > 0) {
      megaplan::test::check_gradient(layer.shared_fc1, grads.shared_fc1, loss, "d shared fc1");
      megaplan::test::check_gradient(layer.shared_fc2, grads.shared_fc2, loss, "d shared fc2");
    }
    if (shape.shared_gate) megaplan::test::check_gradient(layer.shared_gate, grads.shared_gate, loss, "d shared gate");
    if (shape.capacity_factor > 0 && !shape.pad_to_capacity) {
      CHECK(forward.dispatch.rows() < shape.tokens * shape.router.topk);  // some routes were dropped
    }
    if (shape.pad_to_capacity) CHECK(forward.dispatch.rows() == 4 * 6);  // every expert padded to ceil(4 · 1.5)
  }
}
