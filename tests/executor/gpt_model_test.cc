// The GPT on the CPU backend: its backward is the gradient of its forward (finite differences on
// a tiny model, every kind of parameter), and a microbatch's loss starts near log(vocabulary).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/error.h"
#include "executor/model/gpt_model.h"
#include "executor/runtime/cpu_backend.h"

namespace {

megaplan::ModelSpec tiny_model() {
  megaplan::ModelSpec model;
  model.name = "test-gpt";
  model.num_layers = 2;
  model.hidden_size = 8;
  model.num_attention_heads = 2;
  model.seq_length = 4;
  model.vocab_size = 16;
  model.make_vocab_size_divisible_by = 8;
  return model;
}

}  // namespace

TEST_CASE("the GPT's backward is the gradient of its loss", "[model]") {
  megaplan::exec::CpuBackend backend;
  megaplan::exec::GptModel model(tiny_model(), 2, backend, 42);
  std::mt19937 generator(1);
  std::uniform_int_distribution<int64_t> token(0, 15);
  std::vector<int64_t> tokens(2 * 5);
  for (int64_t& t : tokens) t = token(generator);
  const std::vector<float> mask = {1, 1, 1, 0, 1, 1, 1, 1};
  model.zero_gradients();
  const double loss = model.forward(0, tokens, mask);
  CHECK(loss == Approx(std::log(16.0)).epsilon(0.1));  // small initial weights: near uniform
  model.backward(0, 1.0f);
  int64_t checked = 0;
  for (megaplan::exec::Parameter& parameter : model.parameters()) {
    for (std::size_t i = 0; i < parameter.size; i += 1 + parameter.size / 3) {
      const float saved = parameter.value[i];
      const float step = 2e-3f;  // small: layernorm of 0.02-scale inputs bends quickly
      parameter.value[i] = saved + step;
      const double up = model.evaluate(tokens, mask);
      parameter.value[i] = saved - step;
      const double down = model.evaluate(tokens, mask);
      parameter.value[i] = saved;
      const double numeric = (up - down) / (2 * step);
      INFO(parameter.name << "[" << i << "]: analytic " << parameter.gradient[i] << ", numeric " << numeric);
      CHECK(std::abs(parameter.gradient[i] - numeric) <= 2e-3 + 5e-2 * std::abs(numeric));
      ++checked;
    }
  }
  CHECK(checked > 60);
}

TEST_CASE("the GPT's memory prediction is what it allocates, and a model too big is refused", "[model]") {
  megaplan::exec::CpuBackend backend;
  const megaplan::ModelSpec spec = tiny_model();
  {
    megaplan::exec::GptModel model(spec, 2, backend, 42);
    std::vector<int64_t> tokens(2 * 5, 3);
    const std::vector<float> mask(8, 1.0f);
    (void)model.forward(0, tokens, mask);
    model.backward(0, 1.0f);
    (void)model.evaluate(tokens, mask);
  }
  CHECK(backend.peak_bytes() == megaplan::exec::GptModel::predicted_bytes(spec, 2, backend));

  megaplan::ModelSpec huge = spec;
  huge.hidden_size = 65536;
  huge.num_attention_heads = 64;
  huge.num_layers = 64;
  huge.seq_length = 4096;
  try {
    megaplan::exec::GptModel model(huge, 8, backend, 42);
    FAIL("a model larger than memory was built");
  } catch (const megaplan::SpecError& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(message.find("--micro-batch-size") != std::string::npos);
    CHECK(message.find("are available") != std::string::npos);
  }
}
