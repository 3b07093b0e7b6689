// A GPT stage on the CPU backend: its backward is the gradient of its forward (finite differences on
// a tiny model, every kind of parameter); the split backward (I then W) equals the fused one (B);
// its parameters are core's count for every stage of a pipeline and tensor-parallel rank; its memory
// prediction is what it allocates, with and without tensor and sequence parallelism.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <tuple>

#include "core/error.h"
#include "core/formulas.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cpu_backend.h"

namespace {

using megaplan::exec::StageChunk;
using megaplan::exec::MicrobatchTokens;

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

megaplan::ParallelPlan one_rank(int64_t micro_batch_size) {
  megaplan::ParallelPlan plan;
  plan.micro_batch_size = micro_batch_size;
  plan.global_batch_size = micro_batch_size;
  return plan;
}

MicrobatchTokens random_microbatch(std::size_t batch, std::size_t seq, int64_t vocab, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  MicrobatchTokens data;
  data.tokens.resize(batch * (seq + 1));
  for (int64_t& t : data.tokens) t = token(generator);
  data.loss_mask.assign(batch * seq, 1.0f);
  return data;
}

}  // namespace

TEST_CASE("the GPT's backward is the gradient of its loss", "[model]") {
  megaplan::exec::CpuBackend backend;
  StageChunk model(tiny_model(), one_rank(2), 0, backend, {42});
  MicrobatchTokens data = random_microbatch(2, 4, 16, 1);
  data.loss_mask = {1, 1, 1, 0, 1, 1, 1, 1};
  model.forward(0, &data);
  const double loss = model.take_loss_sum();
  CHECK(loss == Approx(std::log(16.0)).epsilon(0.1));  // small initial weights: near uniform
  CHECK(model.take_loss_sum() == 0);                   // taken: the sum starts again
  model.backward_input(0, nullptr, 1.0f, nullptr, false);
  int64_t checked = 0;
  for (megaplan::exec::Parameter& parameter : model.parameters()) {
    for (std::size_t i = 0; i < parameter.size; i += 1 + parameter.size / 3) {
      const float saved = parameter.value[i];
      const float step = 2e-3f;  // small: layernorm of 0.02-scale inputs bends quickly
      parameter.value[i] = saved + step;
      const double up = model.evaluate(&data, nullptr, nullptr);
      parameter.value[i] = saved - step;
      const double down = model.evaluate(&data, nullptr, nullptr);
      parameter.value[i] = saved;
      const double numeric = (up - down) / (2 * step);
      INFO(parameter.name << "[" << i << "]: analytic " << parameter.gradient[i] << ", numeric " << numeric);
      CHECK(std::abs(parameter.gradient[i] - numeric) <= 2e-3 + 5e-2 * std::abs(numeric));
      ++checked;
    }
  }
  CHECK(checked > 60);
}

TEST_CASE("a backward split into I and W gives B's gradients", "[model]") {
  megaplan::exec::CpuBackend backend;
  StageChunk fused(tiny_model(), one_rank(2), 0, backend, {42});
  StageChunk split(tiny_model(), one_rank(2), 0, backend, {42});
  for (int64_t m = 0; m < 2; ++m) {
    const MicrobatchTokens data = random_microbatch(2, 4, 16, static_cast<unsigned>(m + 5));
    fused.forward(m, &data);
    split.forward(m, &data);
    CHECK(fused.take_loss_sum() == split.take_loss_sum());
  }
  fused.backward_input(0, nullptr, 0.5f, nullptr, false);
  fused.backward_input(1, nullptr, 0.5f, nullptr, false);
  split.backward_input(0, nullptr, 0.5f, nullptr, true);
  split.backward_input(1, nullptr, 0.5f, nullptr, true);  // two microbatches await W at once
  split.backward_weight(1);
  split.backward_weight(0);
  for (std::size_t p = 0; p < fused.parameters().size(); ++p) {
    const auto& a = fused.parameters()[p];
    const auto& b = split.parameters()[p];
    INFO(a.name);
    for (std::size_t i = 0; i < a.size; ++i) CHECK(b.gradient[i] == Approx(a.gradient[i]).margin(1e-7));
  }
}
