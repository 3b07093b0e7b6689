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
#include "executor/model/gpt_model.h"
#include "executor/runtime/cpu_backend.h"

namespace {

using megaplan::exec::GptModel;
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
  GptModel model(tiny_model(), one_rank(2), 0, backend, 42);
  MicrobatchTokens data = random_microbatch(2, 4, 16, 1);
  data.loss_mask = {1, 1, 1, 0, 1, 1, 1, 1};
  const double loss = model.forward(0, &data);
  CHECK(loss == Approx(std::log(16.0)).epsilon(0.1));  // small initial weights: near uniform
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
  GptModel fused(tiny_model(), one_rank(2), 0, backend, 42);
  GptModel split(tiny_model(), one_rank(2), 0, backend, 42);
  for (int64_t m = 0; m < 2; ++m) {
    const MicrobatchTokens data = random_microbatch(2, 4, 16, static_cast<unsigned>(m + 5));
    CHECK(fused.forward(m, &data) == split.forward(m, &data));
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

TEST_CASE("each pipeline stage holds the layers and parameters core gives it", "[model]") {
  megaplan::ModelSpec model = tiny_model();
  model.num_layers = 4;
  for (const megaplan::ScheduleKind kind :
       {megaplan::ScheduleKind::kOneFOneB, megaplan::ScheduleKind::kInterleaved, megaplan::ScheduleKind::kZeroBubbleV}) {
    megaplan::ParallelPlan plan = one_rank(1);
    plan.pipeline_parallel_size = 2;
    plan.virtual_pipeline_parallel_size = kind == megaplan::ScheduleKind::kOneFOneB ? 1 : 2;
    plan.schedule = kind;
    plan.global_batch_size = 4;
    for (const int64_t tp : {1, 2}) {
      plan.tensor_parallel_size = tp;
      for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
        for (int64_t rank = 0; rank < tp; ++rank) {
          INFO(megaplan::to_string(kind) << " stage " << stage << " tp rank " << rank << " of " << tp);
          std::size_t parameters = 0;
          for (const auto& spec : GptModel::describe_parameters(model, plan, stage, rank)) {
            parameters += spec.size;
            CHECK(spec.shard_index == (spec.shard_count > 1 ? rank : 0));
          }
          CHECK(static_cast<int64_t>(parameters) == megaplan::stage_parameters(model, plan, stage).parameters_per_gpu);
        }
      }
    }
  }
  // A V places the last stage on rank 0 beside stage 0: its output layer reads the embedding itself.
  megaplan::ParallelPlan v = one_rank(1);
  v.pipeline_parallel_size = 2;
  v.virtual_pipeline_parallel_size = 2;
  v.schedule = megaplan::ScheduleKind::kZeroBubbleV;
  const auto last = GptModel::describe_parameters(model, v, 3);
  CHECK(last.back().name == "decoder.final_layernorm.bias");
  megaplan::ParallelPlan loop = v;
  loop.schedule = megaplan::ScheduleKind::kInterleaved;
  CHECK(GptModel::describe_parameters(model, loop, 3).back().name == "output_layer.weight");
}

TEST_CASE("the GPT's memory prediction is what it allocates, with and without recomputation", "[model]") {
  megaplan::ModelSpec spec = tiny_model();
  spec.num_layers = 4;
  for (const auto& [granularity, method, layers] :
       {std::tuple{megaplan::RecomputeGranularity::kNone, megaplan::RecomputeMethod::kUniform, int64_t{1}},
        {megaplan::RecomputeGranularity::kSelective, megaplan::RecomputeMethod::kUniform, 1},
        {megaplan::RecomputeGranularity::kFull, megaplan::RecomputeMethod::kUniform, 3},
        {megaplan::RecomputeGranularity::kFull, megaplan::RecomputeMethod::kBlock, 2}}) {
    megaplan::ParallelPlan plan = one_rank(2);
    plan.recompute_granularity = granularity;
    plan.recompute_method = method;
    plan.recompute_num_layers = layers;
    INFO(megaplan::to_string(granularity) << " " << megaplan::to_string(method) << " " << layers);
    megaplan::exec::CpuBackend backend;
    {
      GptModel model(spec, plan, 0, backend, 42);
      const MicrobatchTokens data = random_microbatch(2, 4, 16, 3);
      (void)model.forward(0, &data);
      model.backward_input(0, nullptr, 1.0f, nullptr, false);
      (void)model.evaluate(&data, nullptr, nullptr);
    }
    CHECK(backend.peak_bytes() == GptModel::predicted_bytes(spec, plan, 0, 1, backend));
  }
}

TEST_CASE("the memory prediction holds under tensor and sequence parallelism", "[model]") {
  megaplan::ModelSpec spec = tiny_model();
  spec.make_vocab_size_divisible_by = 4;  // 16 rows: 8 per rank
  for (const bool sequence_parallel : {false, true}) {
    megaplan::ParallelPlan plan = one_rank(2);
    plan.tensor_parallel_size = 2;
    plan.sequence_parallel = sequence_parallel;
    INFO("sequence parallel " << sequence_parallel);
    megaplan::exec::InProcessWorld world(2, std::chrono::seconds(60));
    std::vector<int64_t> peaks(2), predicted(2);
    megaplan::exec::run_rank_threads(world, 2, [&](int64_t rank) {
      std::unique_ptr<megaplan::exec::Comm> tp = world.group(rank, {0, 1}, "tp");
      megaplan::exec::CpuBackend backend;
      {
        GptModel model(spec, plan, 0, backend, 42, nullptr, tp.get());
        const MicrobatchTokens data = random_microbatch(2, 4, 16, 3);
        (void)model.forward(0, &data);
        model.backward_input(0, nullptr, 1.0f, nullptr, false);
      }
      peaks[static_cast<std::size_t>(rank)] = backend.peak_bytes();
      predicted[static_cast<std::size_t>(rank)] = GptModel::predicted_bytes(spec, plan, 0, 1, backend);
    });
    CHECK(peaks == predicted);
  }
}
