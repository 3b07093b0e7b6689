// The training loop with Megatron-LM's flag names, for any plan: every rank builds the stage
// chunks core places on its pipeline rank and walks its lowered action list from core/schedule
// (Interpreter) each iteration; data-parallel ranks read Megatron's samples for their rank within
// each global batch; the loss is logged as Megatron logs it (the mean over microbatches and
// replicas) by rank 0; evaluation, per-rank checkpoints (resharded on load) and the learning-rate
// schedule follow Megatron. A world of several ranks runs as threads of this process on in-process
// communicators (the CPU backend, or several ranks sharing one device).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/batch_rampup.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/timeline.h"
#include "executor/comm/in_process_memory.h"
#include "executor/data/data_blend.h"
#include "executor/data/tokenizer.h"
#include "executor/io/parallel_tasks.h"
#include "executor/runtime/backend.h"
#include "executor/train/learning_rate.h"
#include "executor/train/loss_scaler.h"
#include "executor/train/parallel_groups.h"

namespace megaplan::exec {

struct TrainOptions {
  int64_t train_iters = 0;  // --train-iters (with --train-samples: train_samples / the global batch, set by the caller)
  int64_t train_samples = 0;  // --train-samples: sample-based training, Megatron's other form (0: iteration-based)
  int64_t exit_interval = 0;  // --exit-interval: stop (after saving) at a multiple of it; 0 never
  // --exit-signal-handler: at each iteration's end, stop on SIGTERM after a save, on SIGINT without
  // one (executor/train/stop_signal.h; the caller installs the handlers).
  bool exit_signal_handler = false;
  LearningRateSchedule learning_rate;
  double weight_decay = 0.01;  // --weight-decay (not on biases and norms)
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // --clip-grad (0: no clipping)
  // --loss-scale, --initial-loss-scale, --min-loss-scale, --loss-scale-window, --hysteresis: a
  // scaler runs under the plan's --fp16 (dynamic unless --loss-scale) or wherever --loss-scale is given.
  LossScalerSettings loss_scaling;
  uint64_t seed = 1234;                 // --seed
  double init_method_std = 0.02;        // --init-method-std: the weights' normal deviation
  int64_t eval_interval = 1000;         // --eval-interval
  int64_t eval_iters = 100;             // --eval-iters
  int64_t log_interval = 100;           // --log-interval
  DataBlend data_path;                  // --data-path: PREFIX, or Megatron's blend (executor/data/data_blend.h)
  std::string split = "969,30,1";       // --split (Megatron's default)
  std::optional<std::string> log_file;  // --log-file: one JSON object per logged iteration, appended
  std::optional<std::string> save;      // --save DIR
  int64_t save_interval = 0;            // --save-interval
  // --async-save: each save's files are written by a thread while training goes on, and published
  // at the next save or the end of the run (CheckpointSaver, executor/train/checkpoint.h).
  bool async_save = false;
  // --checkpoint-threads: the threads a save or load writes, reads and checksums with.
  int64_t checkpoint_threads = default_checkpoint_threads();
  std::optional<std::string> load;  // --load DIR
  // --data-cache-path: where the sample indexes are cached (none: beside each dataset, as Megatron
  // caches them; executor/data/index_cache.h).
  std::optional<std::string> data_cache_path;
  // --num-dataset-builder-threads: threads building a sample index (none: every core).
  std::optional<int64_t> dataset_builder_threads;
  // The tokenizer the data was prepared with (train's tokenizer flags), when the run names one:
  // recorded in its checkpoints for `megaplan convert --to hf`; without it a resumed run keeps the
  // loaded checkpoint's.
  std::optional<TokenizerOptions> tokenizer;
  double peak_flops_per_s = 0;               // the device's dense peak, for MFU (0: not reported)
  int64_t distributed_timeout_minutes = 10;  // --distributed-timeout-minutes: a rank that waits longer ends the run
  int64_t ddp_bucket_size = 0;      // --ddp-bucket-size: parameters per gradient bucket (0: Megatron's default)
  bool keep_final_weights = false;  // fill TrainSummary::final_weights (tests comparing layouts)
  bool record_timeline = false;     // fill TrainSummary::timeline (--trace)
  // Where the model's vocabulary came from ("vocabulary 50257 from --vocab-size"), said by rank 0
  // before its first iteration, once every check has passed; empty: not said.
  std::string vocabulary_note;
  // --pipeline-schedule-csv: a compute-only torch schedule CSV (torchtitan's
  // pipeline_parallel_schedule_csv) to run instead of the plan's generated schedule; it must have
  // the plan's pp, stages, placement and microbatches, and is lowered and validated before any rank starts.
  std::optional<std::string> pipeline_schedule_csv;
  // --rampup-batch-size START INCREMENT SAMPLES (core/batch_rampup.h): each iteration runs the
  // plan's schedule at its step's microbatches; --train-iters counts these iterations (Megatron-LM
  // asks for --train-samples with a ramp, and counts train_samples / --global-batch-size iterations).
  std::optional<BatchRampup> rampup;
};

struct TrainSummary {
  int64_t first_iteration = 0;  // the first iteration this run trained (after a --load, the next)
  int64_t last_iteration = 0;
  double last_loss = 0;
  double last_gradient_norm = 0;
  int64_t skipped_iterations = 0;  // by this run, for overflowing gradients under loss scaling
  // With keep_final_weights: every parameter's fp32 master value at the end, by Megatron name, as
  // the first data-parallel replica holds it (a stage's tied output copy under "output_layer.weight").
  std::map<std::string, std::vector<float>> final_weights;
  // With record_timeline: the last iteration's actions on every pipeline rank (as the first tensor-
  // and data-parallel rank of each ran them), timed from that iteration's start on each rank.
  Timeline timeline;
};

// The options with their defaults filled in (--lr-decay-iters: --train-iters). Throws SpecError
// naming the flag of the first option out of range: what train() checks first, and a launched rank
// before it joins its world.
TrainOptions checked_train_options(const TrainOptions& options);

// The backend of one rank (ranks run on threads: each has its own).
using BackendFactory = std::function<std::unique_ptr<Backend>(int64_t rank)>;
// Where a world of several ranks keeps and moves its messages: the memory the backends allocate
// (host memory for the CPU backend, make_in_process_gpu_memory() for the CUDA backend, whose ranks
// then share GPU 0). Called once per run of several ranks.
using InProcessMemoryFactory = std::function<std::unique_ptr<InProcessMemory>()>;

// Trains `plan` (every rank of its world, as threads when there are several). Throws SpecError
// naming the flag for bad options, data or checkpoints; a failure on any rank ends every rank and
// is rethrown here. REQUIRES: validate_plan(model, plan) passed; make_memory's memory is where
// make_backend's backends allocate.
TrainSummary train(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options,
                   const BackendFactory& make_backend, std::ostream& out,
                   const InProcessMemoryFactory& make_memory = make_in_process_cpu_memory);

// Trains rank `rank` of `plan` in this process while the other ranks run in their own processes
// (NCCL, one process per GPU): `make_comm` builds its communicators. Rank 0 writes the log to
// `out`. The summary's final_weights hold this rank's part only; with record_timeline (set on
// every rank) the ranks of the traced pipeline gather their timelines, so that rank 0's holds
// every pipeline rank's, as train()'s does.
TrainSummary train_rank(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options, int64_t rank,
                        Backend& backend, const CommFactory& make_comm, std::ostream& out);

}  // namespace megaplan::exec
