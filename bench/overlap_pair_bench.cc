// Where issuing a DualPipeV OVERLAP_F_B on two streams helps: the pair's backward and forward
// issued one after the other on one stream, and through Backend::run_pair (the forward on a second
// stream), on one GPU with the CUDA backend. The chunks are pipeline rank 0's of a pp 2 DualPipeV
// plan (stage 0 with the embedding, stage 3 with the loss); the pair is stage 3's backward of one
// microbatch beside stage 0's forward of the next, as the steady phase runs them. Each way is timed
// between two backend marks (CUDA events on the rank's stream), interleaved, and the medians are
// printed as a table. Plain program: run it on a lent GPU (docs/results.md has the command).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/model_presets.h"
#include "core/parallel_plan.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cuda_backend.h"

namespace {

using megaplan::ModelSpec;
using megaplan::ParallelPlan;
using megaplan::exec::Activation;
using megaplan::exec::Backend;
using megaplan::exec::StageChunk;
using megaplan::exec::MicrobatchTokens;

MicrobatchTokens random_tokens(const ModelSpec& model, int64_t micro_batch, std::mt19937& generator) {
  MicrobatchTokens data;
  std::uniform_int_distribution<int64_t> token(0, model.vocab_size - 1);
  // seq + 1 tokens per sequence: the inputs and, shifted by one, the labels.
  data.tokens.resize(static_cast<std::size_t>(micro_batch * (model.seq_length + 1)));
  for (int64_t& id : data.tokens) id = token(generator);
  data.loss_mask.assign(static_cast<std::size_t>(micro_batch * model.seq_length), 1.0f);
  return data;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Row {
  double serial_ms, paired_ms;
};

Row time_pair(const std::string& name, int64_t micro_batch, int repetitions) {
  ModelSpec model = megaplan::model_preset(name);
  ParallelPlan plan;
  plan.pipeline_parallel_size = 2;
  plan.virtual_pipeline_parallel_size = 2;
  plan.schedule = megaplan::ScheduleKind::kDualPipeV;
  plan.micro_batch_size = micro_batch;
  plan.global_batch_size = 8 * micro_batch;
  megaplan::validate_plan(model, plan);
  std::unique_ptr<Backend> backend = megaplan::exec::make_cuda_backend();
  StageChunk first(model, plan, 0, *backend, {1234});
  StageChunk last(model, plan, 3, *backend, {1234}, first.word_embedding());
  std::mt19937 generator(7);
  const MicrobatchTokens data = random_tokens(model, micro_batch, generator);
  Activation output_gradient = backend->allocate_activation(first.message_size());
  Activation input_gradient = backend->allocate_activation(last.message_size());

  std::vector<double> serial, paired;
  for (int rep = 0; rep < repetitions + 2; ++rep) {  // the first two warm the caches and lanes up
    for (const bool overlap : {false, true}) {
      // Microbatch 0 through both chunks, so that the last stage's backward has its activations.
      first.forward(0, &data);
      backend->copy(first.output(0), first.message_size(), last.input_buffer(0));
      last.forward(0, &data);
      const auto backward = [&] { last.backward_input(0, nullptr, 1.0f, input_gradient, false); };
      const auto forward = [&] { first.forward(1, &data); };
      const auto from = backend->mark();
      if (overlap) {
        backend->run_pair(backward, forward);
      } else {
        backward();
        forward();
      }
      const auto to = backend->mark();
      const double seconds = backend->seconds_between(from, to);
      backend->release_marks();
      if (rep >= 2) (overlap ? paired : serial).push_back(seconds * 1e3);
      // Stage 0's two microbatches back, so that the next repetition starts empty.
      first.backward_input(1, output_gradient, 1.0f, nullptr, false);
      first.backward_input(0, output_gradient, 1.0f, nullptr, false);
    }
  }
  backend->synchronize();
  backend->release(output_gradient);
  backend->release(input_gradient);
  return {median(serial), median(paired)};
}

}  // namespace

int main() {
  try {
    struct Case {
      const char* model;
      int64_t micro_batch;
    };
    const Case cases[] = {{"gpt2-124m", 1}, {"gpt2-124m", 4}, {"gpt2-124m", 8}, {"gpt2-350m", 1},
                          {"gpt2-350m", 4}, {"gpt-1.3b", 1},  {"gpt-1.3b", 2}};
    std::printf("%-10s %4s %12s %12s %8s\n", "model", "mbs", "serial ms", "2 streams ms", "speedup");
    for (const Case& c : cases) {
      const Row row = time_pair(c.model, c.micro_batch, 10);
      std::printf("%-10s %4lld %12.3f %12.3f %8.3f\n", c.model, static_cast<long long>(c.micro_batch), row.serial_ms,
                  row.paired_ms, row.serial_ms / row.paired_ms);
      std::fflush(stdout);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "overlap_pair_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
