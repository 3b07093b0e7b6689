// A GPT stage on the CPU backend: its backward is the gradient of its forward (finite differences on
// a tiny model, every kind of parameter); the split backward (I then W) equals the fused one (B);
// its parameters are core's count for every stage of a pipeline and tensor-parallel rank; its memory
// prediction is what it allocates, with and without tensor and sequence parallelism; every tensor-
// and pipeline-parallel rank's chunk starts from the single rank's weights, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/formulas.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cpu_backend.h"
#include "tests/executor/train/training_fixtures.h"

namespace {

using megaplan::exec::MicrobatchTokens;
using megaplan::exec::StageChunk;

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

// A chunk's parameters as drawn: name, the part's cut of the whole tensor and its values.
struct DrawnPart {
  std::string name;
  megaplan::exec::TensorCut cut;
  std::vector<int64_t> global_shape;
  std::vector<float> values;
  bool output_copy;  // the tied output layer's copy of the word embedding
};

std::vector<DrawnPart> drawn_parts(StageChunk& chunk, megaplan::exec::Backend& backend) {
  std::vector<DrawnPart> parts;
  for (const megaplan::exec::Parameter& p : chunk.parameters()) {
    DrawnPart part{p.name, megaplan::exec::tensor_cut(p), p.global_shape, std::vector<float>(p.size),
                   &p == chunk.output_weight_copy()};
    backend.download(part.values.data(), p.value, p.size);
    parts.push_back(std::move(part));
  }
  return parts;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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

TEST_CASE("an MoE model's backward is the gradient of its loss and its router losses", "[model][moe]") {
  // A Llama of two MoE layers (4 experts, top 2, a gated shared expert) with large router-loss
  // coefficients, so that their gradients weigh: the training forward's LM loss plus the router
  // losses it added, against finite differences, for every kind of parameter.
  megaplan::ModelSpec model = tiny_model();
  model.swiglu = true;
  model.normalization = megaplan::Normalization::kRMSNorm;
  model.position_embedding_type = megaplan::PositionEmbedding::kRope;
  model.untie_embeddings_and_output_weights = true;
  model.add_bias_linear = false;
  model.moe.num_experts = 4;
  model.moe.ffn_hidden_size = 6;
  model.moe.router_topk = 2;
  model.moe.shared_expert_intermediate_size = 4;
  model.moe.shared_expert_gate = true;
  model.moe.aux_loss_coeff = 0.5;
  model.moe.z_loss_coeff = 0.1;
  megaplan::exec::CpuBackend backend;
  StageChunk chunk(model, one_rank(2), 0, backend, {42, 0.3});  // large weights: decisive routing
  const MicrobatchTokens data = random_microbatch(2, 4, 16, 3);
  const auto loss = [&] {
    chunk.forward(0, &data, 0);
    const double lm = chunk.take_loss_sum();
    const megaplan::exec::RouterLosses router = chunk.take_router_losses();  // logged without coefficients
    return lm + 0.5 * router.balancing + 0.1 * router.z;
  };
  loss();
  CHECK(chunk.take_router_losses().balancing == 0);  // taken
  chunk.forward(0, &data, 0);
  const megaplan::exec::RouterLosses logged = chunk.take_router_losses();
  CHECK(logged.balancing > 0);
  CHECK(logged.z > 0);
  CHECK(chunk.evaluate(&data, nullptr, nullptr) > 0);
  CHECK(chunk.take_router_losses().z == 0);  // evaluation adds no router loss
  chunk.take_loss_sum();
  // At a loss scale of one half (the interpreter's 1 / (microbatches x dp)), the router losses'
  // gradients too.
  chunk.backward_input(0, nullptr, 0.5f, nullptr, false);
  int64_t checked = 0, routers = 0;
  for (megaplan::exec::Parameter& parameter : chunk.parameters()) {
    const bool router = parameter.name.find("mlp.router") != std::string::npos;
    for (std::size_t i = 0; i < parameter.size; i += 1 + parameter.size / 3) {
      const float saved = parameter.value[i];
      const float step = 1e-3f;
      parameter.value[i] = saved + step;
      const double up = loss();
      parameter.value[i] = saved - step;
      const double down = loss();
      parameter.value[i] = saved;
      const double numeric = 0.5 * (up - down) / (2 * step);
      INFO(parameter.name << "[" << i << "]: analytic " << parameter.gradient[i] << ", numeric " << numeric);
      CHECK(std::abs(parameter.gradient[i] - numeric) <= 1e-3 + 5e-2 * std::abs(numeric));
      ++checked;
      routers += router ? 1 : 0;
    }
  }
  CHECK(checked > 80);
  CHECK(routers >= 6);
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

TEST_CASE("every tensor- and pipeline-parallel chunk starts from the single rank's weights bit for bit", "[model]") {
  // Each rank draws only its part, each element as the whole tensor's at its place (tensor_shards.h's
  // PartPlacement): column-parallel QKV (Qwen's QKV bias too) and fc1 (SwiGLU's [gate; up] cut
  // block by block), row-parallel projection and fc2, the vocabulary-parallel embedding and output
  // layer, the replicated norms; on each pipeline stage its own layers, and the GPT's last stage
  // the tied output copy of the word embedding. Data-parallel replicas build the same chunks (a
  // chunk has no data-parallel rank; the trainer's test checks replicas end to end).
  using megaplan::ScheduleKind;
  for (const megaplan::ModelSpec& model : {megaplan::test::four_layer_gpt(), megaplan::test::four_layer_llama(),
                                           megaplan::test::four_layer_qwen(), megaplan::test::four_layer_qwen3()}) {
    std::map<std::string, std::vector<float>> whole;
    {
      megaplan::exec::CpuBackend backend;
      StageChunk single(model, megaplan::test::layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), 0, backend, {1234});
      for (DrawnPart& part : drawn_parts(single, backend)) whole[part.name] = std::move(part.values);
    }
    for (const auto& [tp, pp] : {std::pair<int64_t, int64_t>{2, 1}, {1, 2}, {2, 2}}) {
      const megaplan::ParallelPlan plan = megaplan::test::layout(tp, pp, 1, 1, ScheduleKind::kOneFOneB);
      std::vector<DrawnPart> parts;  // of every stage and tensor-parallel rank
      for (int64_t stage = 0; stage < pp; ++stage) {
        megaplan::exec::InProcessWorld world(tp, std::chrono::seconds(60));
        std::vector<std::vector<DrawnPart>> ranks(static_cast<std::size_t>(tp));
        megaplan::exec::run_rank_threads(world, tp, [&](int64_t rank) {
          std::vector<int64_t> members(static_cast<std::size_t>(tp));
          for (int64_t r = 0; r < tp; ++r) members[static_cast<std::size_t>(r)] = r;
          const std::unique_ptr<megaplan::exec::Comm> group = tp > 1 ? world.group(rank, members, "tp") : nullptr;
          megaplan::exec::CpuBackend backend;
          StageChunk chunk(model, plan, stage, backend, {1234}, nullptr, group.get());
          ranks[static_cast<std::size_t>(rank)] = drawn_parts(chunk, backend);
        });
        for (auto& rank : ranks) parts.insert(parts.end(), rank.begin(), rank.end());
      }
      std::map<std::string, int64_t> parts_seen;
      for (const DrawnPart& part : parts) {
        INFO(model.name << ", tp " << tp << " pp " << pp << ": " << part.name << ", part " << part.cut.index << " of "
                        << part.cut.count);
        const std::string& source = part.output_copy ? std::string(megaplan::kWordEmbeddings) : part.name;
        REQUIRE(whole.count(source) == 1);
        CHECK(same_bits(part.values, megaplan::exec::reshard({whole.at(source)}, {}, part.global_shape, part.cut)));
        parts_seen[part.name] += 1;
      }
      // Every tensor of the single rank, in tp parts where split (the GPT's tied copy besides).
      INFO(model.name << ", tp " << tp << " pp " << pp);
      for (const auto& [name, values] : whole) CHECK(parts_seen.count(name) == 1);
      CHECK(parts_seen.at("decoder.layers.3.mlp.linear_fc1.weight") == tp);
      CHECK(parts_seen.at("decoder.layers.0.self_attention.linear_proj.weight") == tp);
      const bool output_layer = pp > 1 || model.untie_embeddings_and_output_weights;
      CHECK(parts_seen.count(megaplan::kOutputWeight) == (output_layer ? 1u : 0u));
    }
  }
}
