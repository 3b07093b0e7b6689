// The training loop with Megatron-LM's flag names: it walks rank 0's lowered schedule from
// core/schedule each iteration (with pp = 1: F and B per microbatch, REDUCE_GRAD, OPTIM) on the
// GPT model, clips the global gradient norm, steps AdamW on the learning-rate schedule, evaluates,
// logs, and saves and resumes checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "core/model_spec.h"
#include "executor/runtime/backend.h"
#include "executor/train/learning_rate.h"

namespace megaplan::exec {

struct TrainOptions {
  int64_t train_iters = 0;       // --train-iters
  int64_t exit_interval = 0;     // --exit-interval: stop (after saving) at a multiple of it; 0 never
  int64_t micro_batch_size = 1;  // --micro-batch-size
  int64_t global_batch_size = 1; // --global-batch-size
  LearningRateSchedule learning_rate;
  double weight_decay = 0.01;    // --weight-decay (not on biases and norms)
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;        // --clip-grad (0: no clipping)
  uint64_t seed = 1234;          // --seed
  int64_t eval_interval = 1000;  // --eval-interval
  int64_t eval_iters = 100;      // --eval-iters
  int64_t log_interval = 100;    // --log-interval
  std::string data_path;         // --data-path PREFIX
  std::string split = "969,30,1";  // --split (Megatron's default)
  std::optional<std::string> log_file;  // --log-file: one JSON object per logged iteration, appended
  std::optional<std::string> save;      // --save DIR
  int64_t save_interval = 0;            // --save-interval
  std::optional<std::string> load;      // --load DIR
  double peak_flops_per_s = 0;          // the device's dense peak, for MFU (0: not reported)
};

struct TrainSummary {
  int64_t first_iteration = 0;  // the first iteration this run trained (after a --load, the next)
  int64_t last_iteration = 0;
  double last_loss = 0;
};

// Throws SpecError naming the flag for bad options, data or checkpoints.
TrainSummary train(const ModelSpec& model, const TrainOptions& options, Backend& backend, std::ostream& out);

}  // namespace megaplan::exec
