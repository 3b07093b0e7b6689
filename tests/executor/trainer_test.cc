// The CPU trainer end to end on a generated corpus: a tiny GPT's loss falls by at least 30% in 40
// iterations, and a run stopped by --exit-interval with --save and resumed with --load logs
// exactly the losses of an uninterrupted run.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/model_spec.h"
#include "executor/data/prepare.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/trainer.h"

namespace {

class Scratch {
 public:
  Scratch() {
    char pattern[] = "/tmp/megaplan-train-XXXXXX";
    path_ = ::mkdtemp(pattern);
  }
  ~Scratch() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Sentences from a small grammar: text with structure a model can learn quickly.
std::string generated_text(std::mt19937& generator, int sentences) {
  const std::vector<std::string> subjects = {"the cat", "a dog", "my friend", "the old man", "a small bird"};
  const std::vector<std::string> verbs = {"sat on", "ran to", "looked at", "jumped over", "walked past"};
  const std::vector<std::string> objects = {"the mat", "the park", "a red car", "the river", "an open door"};
  std::string text;
  for (int i = 0; i < sentences; ++i) {
    text += subjects[generator() % subjects.size()] + " " + verbs[generator() % verbs.size()] + " " +
            objects[generator() % objects.size()] + ". ";
  }
  return text;
}

megaplan::ModelSpec tiny_gpt() {
  megaplan::ModelSpec model;
  model.name = "tiny-gpt";
  model.num_layers = 2;
  model.hidden_size = 64;
  model.num_attention_heads = 4;
  model.seq_length = 32;
  model.vocab_size = 257;  // bytes and the end-of-document token
  model.make_vocab_size_divisible_by = 64;
  return model;
}

std::vector<double> logged_losses(const std::string& path) {
  std::vector<double> losses;
  std::ifstream log(path);
  std::string line;
  while (std::getline(log, line)) losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return losses;
}

}  // namespace

TEST_CASE("a tiny GPT trains on the CPU backend and resumes exactly", "[train]") {
  const Scratch scratch;
  std::mt19937 generator(3);
  for (int d = 0; d < 40; ++d) {
    std::ofstream(scratch.file("doc" + std::to_string(d) + ".txt")) << generated_text(generator, 20);
  }
  megaplan::exec::PrepareOptions prepare;
  for (int d = 0; d < 40; ++d) prepare.inputs.push_back(scratch.file("doc" + std::to_string(d) + ".txt"));
  prepare.output_prefix = scratch.file("corpus");
  prepare.append_end_of_document = true;
  megaplan::exec::prepare_dataset(prepare, megaplan::exec::ByteTokenizer());

  megaplan::exec::TrainOptions options;
  options.train_iters = 40;
  options.micro_batch_size = 4;
  options.global_batch_size = 8;
  options.learning_rate.max_lr = 3e-3;
  options.learning_rate.min_lr = 3e-4;
  options.learning_rate.warmup_iterations = 4;
  options.learning_rate.style = megaplan::exec::DecayStyle::kCosine;
  options.log_interval = 1;
  options.eval_interval = 20;
  options.eval_iters = 1;
  options.split = "9,1,0";
  options.data_path = prepare.output_prefix;
  std::ostringstream out;

  options.log_file = scratch.file("whole.jsonl");
  {
    megaplan::exec::CpuBackend backend;
    megaplan::exec::train(tiny_gpt(), options, backend, out);
  }
  const std::vector<double> whole = logged_losses(*options.log_file);
  REQUIRE(whole.size() == 40);
  double last_five = 0;
  for (std::size_t i = 35; i < 40; ++i) last_five += whole[i] / 5;
  INFO("first loss " << whole.front() << ", mean of the last five " << last_five);
  CHECK(last_five <= 0.7 * whole.front());

  options.log_file = scratch.file("parts.jsonl");
  options.save = scratch.file("checkpoints");
  options.exit_interval = 20;
  {
    megaplan::exec::CpuBackend backend;
    CHECK(megaplan::exec::train(tiny_gpt(), options, backend, out).last_iteration == 20);
  }
  CHECK(std::filesystem::exists(scratch.file("checkpoints/iter_0000020/model.bin")));
  options.exit_interval = 0;
  options.load = options.save;
  {
    megaplan::exec::CpuBackend backend;
    const megaplan::exec::TrainSummary resumed = megaplan::exec::train(tiny_gpt(), options, backend, out);
    CHECK(resumed.first_iteration == 21);
    CHECK(resumed.last_iteration == 40);
  }
  const std::vector<double> parts = logged_losses(*options.log_file);
  REQUIRE(parts.size() == 40);
  for (std::size_t i = 0; i < 40; ++i) {
    INFO("iteration " << i + 1);
    CHECK(parts[i] == whole[i]);  // bit for bit
  }
}
