// Checkpoints between megaplan's format and Hugging Face's: a model's tensors written as a megaplan
// checkpoint of any layout and read back whole, and written as a Hugging Face directory and read
// back, bit for bit (fp32), for the Llama family, Qwen2 and GPT-2, in one file or in shards; the
// Hugging Face tensors where transformers expects them; an export's true vocabulary, its tokenizer
// files and special ids; and safetensors files that break the format refused with the file and
// the rule.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parameter_list.h"
#include "core/text_file.h"
#include "executor/io/hf_checkpoint.h"
#include "executor/io/safetensors.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/checkpoint.h"
#include "executor/train/trainer.h"
#include "tests/executor/train/training_fixtures.h"
#include "tests/executor/train/training_run.h"

namespace exec = megaplan::exec;

namespace {

// Every tensor of the whole model, random normal values; the vocabulary's unpadded.
std::map<std::string, exec::WholeTensor> random_tensors(const megaplan::ModelSpec& model) {
  megaplan::ParallelPlan plan;
  std::mt19937 generator(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::map<std::string, exec::WholeTensor> tensors;
  for (megaplan::ParameterSpec& spec : megaplan::describe_parameters(model, plan, 0)) {
    if (spec.name == megaplan::kOutputWeight && !model.untie_embeddings_and_output_weights) continue;
    if (spec.name == megaplan::kWordEmbeddings || spec.name == megaplan::kOutputWeight) {
      spec.global_shape[0] = model.vocab_size;
      spec.size = static_cast<std::size_t>(model.vocab_size * spec.global_shape[1]);
    }
    exec::WholeTensor tensor{spec.global_shape, std::vector<float>(spec.size)};
    for (float& value : tensor.values) value = normal(generator);
    tensors.emplace(spec.name, std::move(tensor));
  }
  return tensors;
}

void check_equal(const std::map<std::string, exec::WholeTensor>& got,
                 const std::map<std::string, exec::WholeTensor>& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, tensor] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).shape == tensor.shape);
    CHECK(std::memcmp(got.at(name).values.data(), tensor.values.data(), tensor.values.size() * sizeof(float)) == 0);
  }
}

// A safetensors file of `header` (its length written as given) and `data` bytes.
void write_raw(const std::string& path, const std::string& header, std::size_t data, uint64_t length) {
  std::ofstream file(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) file.put(static_cast<char>(length >> (8 * i)));
  file << header << std::string(data, '\0');
}

}  // namespace

TEST_CASE("a model's tensors round-trip through megaplan checkpoints and Hugging Face directories", "[convert]") {
  megaplan::ModelSpec qwen = megaplan::test::four_layer_llama();
  qwen.name = "four-layer-qwen2";
  qwen.add_qkv_bias = true;
  megaplan::ModelSpec gpt = megaplan::test::four_layer_gpt();
  gpt.untie_embeddings_and_output_weights = false;
  for (const auto& [model, type] :
       {std::pair{megaplan::test::four_layer_llama(), std::string("llama")}, std::pair{qwen, std::string("qwen2")},
        std::pair{gpt, std::string("gpt2")}, std::pair{megaplan::test::four_layer_qwen3(), std::string("qwen3")}}) {
    INFO(model.name);
    const megaplan::test::ScratchDirectory scratch;
    const std::map<std::string, exec::WholeTensor> tensors = random_tensors(model);
    // A megaplan checkpoint of tp 2 x pp 2, read back whole.
    megaplan::ParallelPlan plan = megaplan::test::layout(2, 2, 1, 1, megaplan::ScheduleKind::kOneFOneB);
    exec::write_checkpoint_weights(scratch.file("megaplan"), model, plan, tensors, 7);
    const exec::CheckpointWeights read = exec::read_checkpoint_weights(scratch.file("megaplan"));
    CHECK(megaplan::model_spec_to_json(read.model) == megaplan::model_spec_to_json(model));
    check_equal(read.tensors, tensors);
    // A Hugging Face directory, in one file and in shards of about a quarter of the model.
    CHECK(exec::hf_model_type(model, "") == type);
    exec::write_hf_checkpoint(scratch.file("hf"), model, type, tensors, exec::SafetensorsDtype::kF32);
    CHECK(std::filesystem::exists(scratch.file("hf/model.safetensors")));
    const nlohmann::json config = nlohmann::json::parse(megaplan::read_text_file(scratch.file("hf/config.json")));
    CHECK(config.at("model_type") == type);
    CHECK(config.at("vocab_size") == tensors.at(megaplan::kWordEmbeddings).shape[0]);
    const exec::HfCheckpoint back = exec::read_hf_checkpoint(scratch.file("hf"));
    check_equal(back.tensors, tensors);
    CHECK(back.model.num_layers == model.num_layers);
    CHECK(back.model.effective_num_query_groups() == model.effective_num_query_groups());
    CHECK(back.model.qk_layernorm == model.qk_layernorm);
    CHECK(back.model.effective_kv_channels() == model.effective_kv_channels());
    exec::write_hf_checkpoint(scratch.file("sharded"), model, type, tensors, exec::SafetensorsDtype::kF32, {}, 40'000);
    CHECK(std::filesystem::exists(scratch.file("sharded/model.safetensors.index.json")));
    CHECK_FALSE(std::filesystem::exists(scratch.file("sharded/model.safetensors")));
    check_equal(exec::read_hf_checkpoint(scratch.file("sharded")).tensors, tensors);
    // Back into a megaplan checkpoint of another layout, and read whole again.
    exec::write_checkpoint_weights(scratch.file("again"), back.model,
                                   megaplan::test::layout(2, 1, 1, 1, megaplan::ScheduleKind::kOneFOneB), back.tensors,
                                   7);
    // The vocabulary is padded again for the layout, and read back at its true rows.
    check_equal(exec::read_checkpoint_weights(scratch.file("again")).tensors, tensors);
  }
}

namespace {

// Four layers of 4 experts (top 2, width 16) as Mixtral has them, and as Qwen2-MoE: QKV biases, the
// first layer dense, a gated shared expert of width 8, the top k's probabilities as they are.
megaplan::ModelSpec four_layer_mixtral() {
  megaplan::ModelSpec model = megaplan::test::four_layer_llama();
  model.name = "four-layer-mixtral";
  model.moe.num_experts = 4;
  model.moe.ffn_hidden_size = 16;
  model.moe.aux_loss_coeff = 0.02;
  return model;
}
megaplan::ModelSpec four_layer_qwen2_moe() {
  megaplan::ModelSpec model = four_layer_mixtral();
  model.name = "four-layer-qwen2-moe";
  model.add_qkv_bias = true;
  model.moe.layer_pattern = {0, 1, 1, 1};
  model.moe.shared_expert_intermediate_size = 8;
  model.moe.shared_expert_gate = true;
  model.moe.router_pre_softmax = true;
  model.moe.aux_loss_coeff = 0;
  return model;
}

}  // namespace

TEST_CASE("experts round-trip through Hugging Face's Mixtral, Qwen2-MoE and Qwen3-MoE directories", "[convert]") {
  for (const auto& [model, type] : {std::pair{four_layer_mixtral(), std::string("mixtral")},
                                    std::pair{four_layer_qwen2_moe(), std::string("qwen2_moe")},
                                    std::pair{megaplan::test::four_layer_qwen3_moe(), std::string("qwen3_moe")}}) {
    INFO(model.name);
    const megaplan::test::ScratchDirectory scratch;
    const std::map<std::string, exec::WholeTensor> tensors = random_tensors(model);
    CHECK(exec::hf_model_type(model, "") == type);
    exec::write_hf_checkpoint(scratch.file("hf"), model, type, tensors, exec::SafetensorsDtype::kF32);
    // config.json as transformers reads it, read back as the same model.
    const nlohmann::json config = nlohmann::json::parse(megaplan::read_text_file(scratch.file("hf/config.json")));
    CHECK(config.at("model_type") == type);
    const exec::HfCheckpoint back = exec::read_hf_checkpoint(scratch.file("hf"));
    check_equal(back.tensors, tensors);
    CHECK(megaplan::model_spec_to_json(back.model).at("num_experts") == 4);
    CHECK(back.model.moe.moe_layers(0, 4) == model.moe.moe_layers(0, 4));
    CHECK(back.model.moe.router_pre_softmax == model.moe.router_pre_softmax);
    CHECK(back.model.moe.shared_expert_gate == model.moe.shared_expert_gate);
    CHECK(back.model.moe.aux_loss_coeff == model.moe.aux_loss_coeff);
    CHECK(back.model.qk_layernorm == model.qk_layernorm);
    // A megaplan checkpoint of tp 2 x pp 2 (every expert on each rank, split over tp), read whole.
    exec::write_checkpoint_weights(scratch.file("megaplan"), back.model,
                                   megaplan::test::layout(2, 2, 1, 1, megaplan::ScheduleKind::kOneFOneB), back.tensors,
                                   7);
    check_equal(exec::read_checkpoint_weights(scratch.file("megaplan")).tensors, tensors);
  }
  // Where transformers reads an expert: Mixtral's w1 is the gate, w3 the up projection, w2 down.
  const megaplan::ModelSpec model = four_layer_mixtral();
  const megaplan::test::ScratchDirectory scratch;
  const std::map<std::string, exec::WholeTensor> tensors = random_tensors(model);
  exec::write_hf_checkpoint(scratch.file("hf"), model, "mixtral", tensors, exec::SafetensorsDtype::kF32);
  const exec::SafetensorsHeader header = exec::read_safetensors_header(scratch.file("hf/model.safetensors"), "test");
  const exec::WholeTensor& fc1 = tensors.at("decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight");
  const exec::WholeTensor w3 =
      exec::read_safetensors_tensor(header, "model.layers.2.block_sparse_moe.experts.3.w3.weight", "test");
  CHECK(w3.shape == std::vector<int64_t>{16, 32});
  CHECK(std::equal(w3.values.begin(), w3.values.end(), fc1.values.begin() + 16 * 32));  // fc1 is [gate; up]
  CHECK(header.tensors.count("model.layers.0.block_sparse_moe.gate.weight") == 1);
  CHECK(header.tensors.count("model.layers.0.mlp.gate_proj.weight") == 0);
  // Types that cannot hold the model are refused naming why.
  CHECK_THROWS_WITH(exec::hf_model_type(model, "llama"),
                    Catch::Matchers::Contains("--model-type: llama has no experts; this model has 4"));
  CHECK_THROWS_WITH(exec::hf_model_type(four_layer_qwen2_moe(), "mixtral"),
                    Catch::Matchers::Contains("mixtral has experts in every layer and no shared expert"));
  megaplan::ModelSpec capacity = model;
  capacity.moe.expert_capacity_factor = 1.0;
  CHECK_THROWS_WITH(exec::hf_model_type(capacity, ""), Catch::Matchers::Contains("mixtral drops no token"));
  CHECK_THROWS_WITH(exec::hf_model_type(megaplan::test::four_layer_llama(), "qwen2_moe"),
                    Catch::Matchers::Contains("qwen2_moe has experts; this model has none"));
  // The query and key norms are Qwen3's alone, and Qwen3's models have them.
  CHECK_THROWS_WITH(exec::hf_model_type(megaplan::test::four_layer_qwen3(), "llama"),
                    Catch::Matchers::Contains("llama has no query and key norms; this model has them"));
  CHECK_THROWS_WITH(exec::hf_model_type(megaplan::test::four_layer_llama(), "qwen3"),
                    Catch::Matchers::Contains("qwen3 normalises each query and key head; this model does not"));
  megaplan::ModelSpec shared = megaplan::test::four_layer_qwen3_moe();
  shared.moe.shared_expert_intermediate_size = 8;
  shared.moe.shared_expert_gate = true;
  CHECK_THROWS_WITH(exec::hf_model_type(shared, "qwen3_moe"),
                    Catch::Matchers::Contains("qwen3_moe has no shared expert"));
  // Qwen3's norms where transformers reads them.
  const megaplan::ModelSpec qwen3 = megaplan::test::four_layer_qwen3_moe();
  const std::map<std::string, exec::WholeTensor> qwen3_tensors = random_tensors(qwen3);
  exec::write_hf_checkpoint(scratch.file("qwen3"), qwen3, "qwen3_moe", qwen3_tensors, exec::SafetensorsDtype::kF32);
  const exec::SafetensorsHeader qwen3_header =
      exec::read_safetensors_header(scratch.file("qwen3/model.safetensors"), "test");
  const exec::WholeTensor k_norm =
      exec::read_safetensors_tensor(qwen3_header, "model.layers.1.self_attn.k_norm.weight", "test");
  CHECK(k_norm.shape == std::vector<int64_t>{16});
  CHECK(k_norm.values == qwen3_tensors.at("decoder.layers.1.self_attention.k_layernorm.weight").values);
  CHECK(qwen3_header.tensors.count("model.layers.3.mlp.experts.3.down_proj.weight") == 1);
  CHECK(qwen3_header.tensors.count("model.layers.0.mlp.down_proj.weight") == 1);  // mlp_only_layers [0]
}

TEST_CASE("a Hugging Face weight that is not finite is refused naming the tensor", "[convert]") {
  // Issue 42: convert --to megaplan took NaN weights with exit 0.
  const megaplan::ModelSpec model = megaplan::test::four_layer_llama();
  const megaplan::test::ScratchDirectory scratch;
  std::map<std::string, exec::WholeTensor> tensors = random_tensors(model);
  tensors.at("decoder.layers.1.mlp.linear_fc2.weight").values[7] = std::numeric_limits<float>::quiet_NaN();
  exec::write_hf_checkpoint(scratch.file("hf"), model, "llama", tensors, exec::SafetensorsDtype::kF32);
  CHECK_THROWS_WITH(exec::read_hf_checkpoint(scratch.file("hf")),
                    Catch::Matchers::Contains("tensor model.layers.1.mlp.down_proj.weight holds NaN at element 7: "
                                              "weights must be finite"));
}

TEST_CASE("Hugging Face's tensors are where transformers reads them", "[convert]") {
  // 4 heads of 8 in 2 query groups: Megatron's fused rows per group are [q0, q1, k, v] (8 rows each).
  const megaplan::ModelSpec model = megaplan::test::four_layer_llama();
  const megaplan::test::ScratchDirectory scratch;
  const std::map<std::string, exec::WholeTensor> tensors = random_tensors(model);
  exec::write_hf_checkpoint(scratch.file("hf"), model, "llama", tensors, exec::SafetensorsDtype::kF32);
  const exec::SafetensorsHeader header = exec::read_safetensors_header(scratch.file("hf/model.safetensors"), "test");
  const exec::WholeTensor& qkv = tensors.at("decoder.layers.1.self_attention.linear_qkv.weight");
  const auto row = [&](const exec::WholeTensor& t, int64_t r) {
    return std::vector<float>(t.values.begin() + r * t.shape[1], t.values.begin() + (r + 1) * t.shape[1]);
  };
  const exec::WholeTensor q = exec::read_safetensors_tensor(header, "model.layers.1.self_attn.q_proj.weight", "test");
  const exec::WholeTensor k = exec::read_safetensors_tensor(header, "model.layers.1.self_attn.k_proj.weight", "test");
  const exec::WholeTensor v = exec::read_safetensors_tensor(header, "model.layers.1.self_attn.v_proj.weight", "test");
  CHECK(q.shape == std::vector<int64_t>{32, 32});
  CHECK(k.shape == std::vector<int64_t>{16, 32});
  CHECK(row(q, 8 * 2) == row(qkv, 8 * 4));      // head 2 is group 1's first query
  CHECK(row(k, 8) == row(qkv, 8 * 4 + 8 * 2));  // group 1's key
  CHECK(row(v, 15) == row(qkv, 8 * 8 - 1));     // group 1's value's last row
  const exec::WholeTensor& fc1 = tensors.at("decoder.layers.0.mlp.linear_fc1.weight");
  const exec::WholeTensor up = exec::read_safetensors_tensor(header, "model.layers.0.mlp.up_proj.weight", "test");
  CHECK(row(up, 0) == row(fc1, fc1.shape[0] / 2));     // fc1 is [gate; up]
  CHECK(header.tensors.count("lm_head.weight") == 1);  // untied
  CHECK(header.metadata.at("format") == "pt");
  // GPT-2's Conv1D holds [in, out] with the fused QKV's outputs [queries | keys | values].
  megaplan::ModelSpec gpt = megaplan::test::four_layer_gpt();
  const std::map<std::string, exec::WholeTensor> gpt_tensors = random_tensors(gpt);
  exec::write_hf_checkpoint(scratch.file("gpt2"), gpt, "gpt2", gpt_tensors, exec::SafetensorsDtype::kBF16);
  const exec::SafetensorsHeader gpt_header =
      exec::read_safetensors_header(scratch.file("gpt2/model.safetensors"), "test");
  CHECK(gpt_header.tensors.at("transformer.h.0.attn.c_attn.weight").dtype == exec::SafetensorsDtype::kBF16);
  CHECK(gpt_header.tensors.count("lm_head.weight") == 0);  // tied
  const exec::WholeTensor c_attn =
      exec::read_safetensors_tensor(gpt_header, "transformer.h.0.attn.c_attn.weight", "test");
  const exec::WholeTensor& fused = gpt_tensors.at("decoder.layers.0.self_attention.linear_qkv.weight");
  CHECK(c_attn.shape == std::vector<int64_t>{32, 96});
  // Output column 32 + 16 (the key of head 1, dim 0) is Megatron's row (1 * 3 + 1) * 16, input 5;
  // bf16 rounds it to 8 significant bits.
  CHECK(c_attn.values[5 * 96 + 48] == Approx(fused.values[(4 * 16) * 32 + 5]).epsilon(1e-2));
}

TEST_CASE("a safetensors file that breaks the format is refused with the file and the rule", "[convert]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string path = scratch.file("bad.safetensors");
  const auto error_of = [&] {
    try {
      (void)exec::read_safetensors_header(path, "--load");
    } catch (const megaplan::SpecError& error) {
      CHECK(error.field() == "--load");
      return error.rule();
    }
    return std::string("no error");
  };
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_raw(path, good, 8, good.size());
  CHECK(error_of() == "no error");
  write_raw(path, good, 8, 1000);
  CHECK(error_of() == path + ": its header length, 1000 bytes, runs past the file's " +
                          std::to_string(8 + good.size() + 8) + " bytes");
  write_raw(path, "[1, 2", 8, 5);
  CHECK(error_of() == path + ": its header is not a JSON object");
  const std::string past = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  write_raw(path, past, 8, past.size());
  CHECK(error_of() == path + ": tensor \"a\" has data_offsets [0, 16], past the 8 bytes of data");
  const std::string dtype = R"({"a":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})";
  write_raw(path, dtype, 8, dtype.size());
  CHECK(error_of() == path + ": tensor \"a\" has dtype \"I8\", which megaplan does not read (F32, BF16, F16)");
  const std::string mismatch = R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})";
  write_raw(path, mismatch, 8, mismatch.size());
  CHECK(error_of() == path + ": tensor \"a\" holds 8 bytes, but its shape of BF16 needs 4");
  const std::string overlap =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  write_raw(path, overlap, 8, overlap.size());
  CHECK(error_of() == path + ": its tensors overlap at byte 4 of the data");
  write_raw(path, good, 12, good.size());
  CHECK(error_of() == path + ": its tensors cover 8 of its 12 bytes of data");
  std::ofstream(path) << "abc";
  CHECK(error_of() == path + ": is 3 bytes, shorter than a safetensors header's length");
}

TEST_CASE("F16 tensors widen exactly: normals, subnormals, signed zeros, infinities", "[convert]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string path = scratch.file("half.safetensors");
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x83ff, 0x8000, 0x7c00, 0xfc00, 0x3555};
  const std::string header = R"({"h":{"dtype":"F16","shape":[9],"data_offsets":[0,18]}})";
  {
    std::ofstream file(path, std::ios::binary);
    for (int i = 0; i < 8; ++i) file.put(static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i)));
    file << header;
    for (const uint16_t half : halves) file.put(static_cast<char>(half & 0xff)).put(static_cast<char>(half >> 8));
  }
  const exec::WholeTensor tensor =
      exec::read_safetensors_tensor(exec::read_safetensors_header(path, "--load"), "h", "--load");
  const float subnormal = std::ldexp(1.0f, -24);
  CHECK(tensor.values[0] == 1.0f);
  CHECK(tensor.values[1] == -2.0f);
  CHECK(tensor.values[2] == 65504.0f);           // the largest half
  CHECK(tensor.values[3] == subnormal);          // the smallest
  CHECK(tensor.values[4] == -1023 * subnormal);  // the largest subnormal, negative
  CHECK((tensor.values[5] == 0.0f && std::signbit(tensor.values[5])));
  CHECK((std::isinf(tensor.values[6]) && tensor.values[6] > 0));
  CHECK((std::isinf(tensor.values[7]) && tensor.values[7] < 0));
  CHECK(tensor.values[8] == 0.333251953125f);  // 0x3555, the half nearest 1/3
}

namespace {

const std::string kData = std::string(MEGAPLAN_TEST_DATA_DIR) + "/";

exec::TokenizerOptions tokenizer_named(const std::string& kind) {
  exec::TokenizerOptions tokenizer;
  tokenizer.kind = kind;
  if (kind == "hf") tokenizer.tokenizer_file = kData + "hf_tiny/llama3-style/tokenizer.json";
  if (kind == "sentencepiece") tokenizer.tokenizer_model = kData + "sentencepiece_tiny/tiny.model";
  if (kind == "gpt2") {
    tokenizer.vocab_file = kData + "gpt2_tiny/vocab.json";
    tokenizer.merge_file = kData + "gpt2_tiny/merges.txt";
  }
  return tokenizer;
}

}  // namespace

TEST_CASE("an export holds the true vocabulary, the tokenizer the run trained with and its special ids", "[convert]") {
  const megaplan::test::ScratchDirectory scratch;
  // The llama3-style fixture's 266 ids (263 in its vocabulary, 3 added tokens); trained at tp 2,
  // whose padding (to a multiple of 256) gives the vocabulary's tensors 512 rows.
  megaplan::ModelSpec model = megaplan::test::four_layer_llama();
  model.vocab_size = 266;
  model.make_vocab_size_divisible_by = 128;
  exec::TrainOptions options;
  options.train_iters = 2;
  options.log_interval = 1;
  options.eval_iters = 0;
  options.split = "1,0,0";
  options.data_path = megaplan::test::sentence_corpus(scratch);
  options.save = scratch.file("checkpoints");
  options.tokenizer = tokenizer_named("hf");
  const auto cpu = [](int64_t) -> std::unique_ptr<exec::Backend> { return std::make_unique<exec::CpuBackend>(); };
  (void)megaplan::test::train_logged(model, megaplan::test::layout(2, 1, 1, 1, megaplan::ScheduleKind::kOneFOneB),
                                     options, scratch, "trained", cpu);
  const exec::CheckpointWeights weights = exec::read_checkpoint_weights(*options.save);
  CHECK(weights.tensors.at(megaplan::kWordEmbeddings).shape == std::vector<int64_t>{266, 32});
  CHECK(weights.tensors.at(megaplan::kOutputWeight).shape == std::vector<int64_t>{266, 32});
  REQUIRE(weights.tokenizer);
  CHECK(weights.tokenizer->tokenizer_file == options.tokenizer->tokenizer_file);

  // Its tokenizer_config.json names <|begin_of_text|> (263) and <|eot_id|> (265).
  const exec::HfTokenizerExport tokenizer = exec::hf_tokenizer_export(weights.tokenizer, model.vocab_size);
  CHECK(tokenizer.bos_token_id == 263);
  CHECK(tokenizer.eos_token_id == 265);
  INFO(tokenizer.note);
  CHECK(tokenizer.note.find("tokenizer: hf (" + options.tokenizer->tokenizer_file +
                            "): copied tokenizer.json, tokenizer_config.json; bos_token_id 263; eos_token_id 265") ==
        0);
  const int64_t written = exec::write_hf_checkpoint(scratch.file("hf"), weights.model, "llama", weights.tensors,
                                                    exec::SafetensorsDtype::kF32, tokenizer);
  const exec::SafetensorsHeader header = exec::read_safetensors_header(scratch.file("hf/model.safetensors"), "test");
  CHECK(written == static_cast<int64_t>(header.tensors.size()));
  CHECK(written == 4 * 9 + 3);  // per layer 2 norms, q, k, v, o, gate, up, down; embedding, final norm, lm_head
  CHECK(header.tensors.at("model.embed_tokens.weight").shape == std::vector<int64_t>{266, 32});
  CHECK(header.tensors.at("lm_head.weight").shape == std::vector<int64_t>{266, 32});
  const nlohmann::json config = nlohmann::json::parse(megaplan::read_text_file(scratch.file("hf/config.json")));
  CHECK(config.at("vocab_size") == 266);
  CHECK(config.at("bos_token_id") == 263);
  CHECK(config.at("eos_token_id") == 265);
  CHECK(megaplan::read_file_contents(scratch.file("hf/tokenizer.json")) ==
        megaplan::read_file_contents(options.tokenizer->tokenizer_file));
  CHECK(std::filesystem::exists(scratch.file("hf/tokenizer_config.json")));
  check_equal(exec::read_hf_checkpoint(scratch.file("hf")).tensors, weights.tensors);

  // Without a recorded tokenizer: no special ids, no files, and the note says why.
  const exec::HfTokenizerExport unknown = exec::hf_tokenizer_export(std::nullopt, model.vocab_size);
  CHECK_FALSE(unknown.bos_token_id);
  CHECK_FALSE(unknown.eos_token_id);
  CHECK(unknown.files.empty());
  CHECK(unknown.note.find("tokenizer: unknown (the checkpoint records none") == 0);
  (void)exec::write_hf_checkpoint(scratch.file("plain"), weights.model, "llama", weights.tensors,
                                  exec::SafetensorsDtype::kF32, unknown);
  const nlohmann::json plain = nlohmann::json::parse(megaplan::read_text_file(scratch.file("plain/config.json")));
  CHECK_FALSE(plain.contains("bos_token_id"));
  CHECK_FALSE(plain.contains("eos_token_id"));
  CHECK_FALSE(std::filesystem::exists(scratch.file("plain/tokenizer.json")));
}

TEST_CASE("each tokenizer kind exports its files and the special ids it defines", "[convert]") {
  // GPT-2's <|endoftext|> (267 in the fixture) begins and ends text, as transformers' gpt2 says.
  const exec::HfTokenizerExport gpt2 = exec::hf_tokenizer_export(tokenizer_named("gpt2"), 268);
  CHECK(gpt2.bos_token_id == 267);
  CHECK(gpt2.eos_token_id == 267);
  REQUIRE(gpt2.files.size() == 2);
  CHECK(gpt2.files[0].second == "vocab.json");
  CHECK(gpt2.files[1].second == "merges.txt");
  // SentencePiece's model defines both (spm_train's defaults: <s> 1, </s> 2).
  const exec::HfTokenizerExport sentencepiece = exec::hf_tokenizer_export(tokenizer_named("sentencepiece"), 500);
  CHECK(sentencepiece.bos_token_id == 1);
  CHECK(sentencepiece.eos_token_id == 2);
  REQUIRE(sentencepiece.files.size() == 1);
  CHECK(sentencepiece.files[0].second == "tokenizer.model");
  // The byte tokenizer ends documents with 256 and has nothing transformers reads.
  const exec::HfTokenizerExport bytes = exec::hf_tokenizer_export(tokenizer_named("byte"), 257);
  CHECK_FALSE(bytes.bos_token_id);
  CHECK(bytes.eos_token_id == 256);
  CHECK(bytes.files.empty());
  CHECK(bytes.note ==
        "tokenizer: byte: no files copied; eos_token_id 256; transformers has no byte tokenizer to copy; "
        "it names no beginning-of-text token");
  // An id past the model's vocabulary is left out, and said.
  const exec::HfTokenizerExport small = exec::hf_tokenizer_export(tokenizer_named("hf"), 264);
  CHECK(small.bos_token_id == 263);
  CHECK_FALSE(small.eos_token_id);
  CHECK(small.note.find("its id 265 lies outside the vocabulary of 264") != std::string::npos);
  // A file gone since training: nothing exported from it, and the note names it.
  exec::TokenizerOptions gone = tokenizer_named("hf");
  gone.tokenizer_file = "/nonexistent/tokenizer.json";
  const exec::HfTokenizerExport missing = exec::hf_tokenizer_export(gone, 266);
  CHECK_FALSE(missing.eos_token_id);
  CHECK(missing.files.empty());
  CHECK(missing.note.find("tokenizer: hf (/nonexistent/tokenizer.json) cannot be read now (") == 0);
}
