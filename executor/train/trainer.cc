#include "executor/train/trainer.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/formulas.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/indexed_dataset.h"
#include "executor/model/gpt_model.h"
#include "executor/train/checkpoint.h"

namespace megaplan::exec {

namespace {

void validate(const TrainOptions& options) {
  const auto positive = [](int64_t value, const char* flag) {
    if (value <= 0) throw SpecError(flag, "must be a positive integer, got " + std::to_string(value));
  };
  positive(options.train_iters, "--train-iters");
  positive(options.micro_batch_size, "--micro-batch-size");
  positive(options.global_batch_size, "--global-batch-size");
  positive(options.log_interval, "--log-interval");
  positive(options.eval_interval, "--eval-interval");
  if (options.eval_iters < 0) throw SpecError("--eval-iters", "must be non-negative");
  if (options.global_batch_size % options.micro_batch_size != 0) {
    throw SpecError("--global-batch-size", std::to_string(options.global_batch_size) +
                                               " must be divisible by --micro-batch-size " +
                                               std::to_string(options.micro_batch_size) + " (one data-parallel rank)");
  }
  if (options.exit_interval < 0) throw SpecError("--exit-interval", "must be non-negative");
  if (options.save_interval < 0) throw SpecError("--save-interval", "must be non-negative");
  if (options.save_interval > 0 && !options.save) throw SpecError("--save-interval", "needs --save DIR");
  if (!(options.clip_grad >= 0)) throw SpecError("--clip-grad", "must be non-negative");
  if (options.data_path.empty()) throw SpecError("--data-path", "is required");
  options.learning_rate.validate();
}

// Rows of seq_length + 1 tokens for `count` samples starting at `first`, all-ones loss mask.
void batch_tokens(const GptSamples& samples, int64_t first, int64_t count, int64_t seq, std::vector<int64_t>& tokens,
                  std::vector<float>& mask) {
  tokens.resize(static_cast<std::size_t>(count * (seq + 1)));
  mask.assign(static_cast<std::size_t>(count * seq), 1.0f);
  for (int64_t i = 0; i < count; ++i) {
    samples.sample((first + i) % samples.size(), tokens.data() + i * (seq + 1));
  }
}

std::string format_double(double value) {
  std::ostringstream text;
  text.precision(6);
  text << value;
  return text.str();
}

// A non-finite loss or gradient stops training before the optimizer touches the weights (so no
// checkpoint of this step is ever written): the error names the step and the first parameter,
// in the model's order, whose gradient is not finite.
[[noreturn]] void refuse_non_finite(int64_t iteration, double loss, GptModel& gpt, Backend& backend) {
  std::string culprit = "no parameter gradient (the loss itself)";
  for (const Parameter& p : gpt.parameters()) {
    const OptimizerTensor one{p.value, p.gradient, p.first_moment, p.second_moment, p.compute, p.size, 0.0};
    if (!std::isfinite(backend.gradient_sum_of_squares({one}))) {
      culprit = "the gradient of " + p.name;
      break;
    }
  }
  throw SpecError("loss", "iteration " + std::to_string(iteration) + " is "  + format_double(loss) +
                                       " and the first non-finite tensor is " + culprit +
                                       "; stopped before the optimizer step, the last checkpoint is untouched");
}

}  // namespace

TrainSummary train(const ModelSpec& model, const TrainOptions& options_in, Backend& backend, std::ostream& out) {
  TrainOptions options = options_in;
  if (options.learning_rate.decay_iterations == 0) options.learning_rate.decay_iterations = options.train_iters;
  validate(options);
  const IndexedDataset dataset(options.data_path);
  const auto splits = split_documents(options.split, static_cast<int64_t>(dataset.num_documents()));
  const int64_t seq = model.seq_length;
  const int64_t gbs = options.global_batch_size;
  const GptSamples train_samples(dataset, splits[0], seq, options.train_iters * gbs, options.seed);
  const int64_t evaluations = options.train_iters / options.eval_interval + 1;
  const bool can_evaluate = splits[1].size() > 0 && options.eval_iters > 0;
  std::optional<GptSamples> valid_samples;
  if (can_evaluate) valid_samples.emplace(dataset, splits[1], seq, evaluations * options.eval_iters * gbs, options.seed + 1);

  GptModel gpt(model, options.micro_batch_size, backend, options.seed);
  TrainingState state;
  state.seed = options.seed;
  if (options.load) {
    if (const std::optional<TrainingState> loaded = load_checkpoint(*options.load, gpt.parameters(), backend)) {
      if (loaded->seed != options.seed) {
        throw SpecError("--seed", std::to_string(options.seed) + " differs from the checkpoint's " +
                                      std::to_string(loaded->seed) + ": the data order would change");
      }
      state = *loaded;
      gpt.refresh_compute_weights();
      out << "loaded " << *options.load << " at iteration " << state.iteration << "\n";
    } else {
      out << "no checkpoint in " << *options.load << ": starting from scratch\n";
    }
  }

  // Rank 0's lowered schedule: with pp = 1, F and B for each microbatch, then REDUCE_GRAD and OPTIM.
  const int64_t microbatches = gbs / options.micro_batch_size;
  const PipelineSchedule schedule = lower_schedule(generate_schedule(ScheduleKind::kOneFOneB, 1, 1, microbatches));
  const std::vector<Action>& actions = schedule.ranks.front();

  std::optional<std::ofstream> log;
  if (options.log_file) {
    log.emplace(*options.log_file, std::ios::app);
    if (!*log) throw SpecError("--log-file", *options.log_file + ": cannot open for appending");
  }
  const double flops_per_iteration = model_flops(model, gbs, padded_vocab_size(model, 1));
  TrainSummary summary;
  summary.first_iteration = state.iteration + 1;
  std::vector<int64_t> tokens;
  std::vector<float> mask;
  auto window_start = std::chrono::steady_clock::now();
  int64_t window_iterations = 0;
  while (state.iteration < options.train_iters) {
    const int64_t iteration = state.iteration + 1;
    double loss_sum = 0;
    double grad_norm = 0;
    const double lr = options.learning_rate.at(iteration);
    for (const Action& action : actions) {
      switch (action.kind) {
        case ActionKind::kForward:
          batch_tokens(train_samples, state.consumed_samples + action.microbatch * options.micro_batch_size,
                       options.micro_batch_size, seq, tokens, mask);
          loss_sum += gpt.forward(action.microbatch, tokens, mask);
          break;
        case ActionKind::kBackward:
          // The loss is the mean over microbatches, as Megatron divides each by their number.
          gpt.backward(action.microbatch, 1.0f / static_cast<float>(microbatches));
          break;
        case ActionKind::kReduceGrad:
          break;  // one data-parallel rank: nothing to reduce
        case ActionKind::kOptimizer: {
          const std::vector<OptimizerTensor> tensors = gpt.optimizer_tensors(options.weight_decay);
          grad_norm = std::sqrt(backend.gradient_sum_of_squares(tensors));
          const double loss = loss_sum / static_cast<double>(microbatches);
          if (!std::isfinite(loss) || !std::isfinite(grad_norm)) refuse_non_finite(iteration, loss, gpt, backend);
          const double clip = options.clip_grad > 0 && grad_norm > options.clip_grad
                                  ? options.clip_grad / (grad_norm + 1e-6)
                                  : 1.0;
          backend.adamw_step(tensors, {iteration, lr, options.adam_beta1, options.adam_beta2, options.adam_eps, clip});
          gpt.zero_gradients();
          break;
        }
        default:
          throw std::logic_error("trainer: a pp = 1 schedule holds only F, B, REDUCE_GRAD and OPTIM");
      }
    }
    state.iteration = iteration;
    state.consumed_samples += gbs;
    ++window_iterations;
    const double loss = loss_sum / static_cast<double>(microbatches);
    summary.last_iteration = iteration;
    summary.last_loss = loss;

    if (iteration % options.log_interval == 0 || iteration == options.train_iters) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count() /
          static_cast<double>(window_iterations);
      const double tokens_per_s = static_cast<double>(gbs * seq) / seconds;
      const double tflops = flops_per_iteration / seconds / 1e12;
      nlohmann::json record = {{"iteration", iteration},         {"loss", loss},
                               {"lr", lr},                       {"grad_norm", grad_norm},
                               {"tokens_per_s", tokens_per_s},   {"model_tflops_per_gpu", tflops},
                               {"mfu", options.peak_flops_per_s > 0 ? tflops * 1e12 / options.peak_flops_per_s : 0.0},
                               {"peak_memory_bytes", backend.peak_bytes()}};
      out << "iteration " << iteration << "/" << options.train_iters << " | loss " << format_double(loss) << " | lr "
          << format_double(lr) << " | grad norm " << format_double(grad_norm) << " | " << format_double(tokens_per_s)
          << " tokens/s | " << format_double(tflops) << " model TFLOP/s\n";
      if (log) *log << record.dump() << "\n" << std::flush;
      window_start = std::chrono::steady_clock::now();
      window_iterations = 0;
    }
    if (valid_samples && iteration % options.eval_interval == 0) {
      const int64_t first = (iteration / options.eval_interval - 1) * options.eval_iters * gbs;
      double total = 0;
      for (int64_t e = 0; e < options.eval_iters; ++e) {
        for (int64_t m = 0; m < microbatches; ++m) {
          batch_tokens(*valid_samples, first + e * gbs + m * options.micro_batch_size, options.micro_batch_size, seq,
                       tokens, mask);
          total += gpt.evaluate(tokens, mask);
        }
      }
      out << "validation loss at iteration " << iteration << ": "
          << format_double(total / static_cast<double>(options.eval_iters * microbatches)) << "\n";
    }
    const bool exiting = options.exit_interval > 0 && iteration % options.exit_interval == 0;
    if (options.save && ((options.save_interval > 0 && iteration % options.save_interval == 0) || exiting ||
                         iteration == options.train_iters)) {
      save_checkpoint(*options.save, state, gpt.parameters(), backend);
      out << "saved " << *options.save << " at iteration " << iteration << "\n";
    }
    if (exiting) {
      out << "exiting at iteration " << iteration << " (--exit-interval " << options.exit_interval << ")\n";
      break;
    }
  }
  return summary;
}

}  // namespace megaplan::exec
