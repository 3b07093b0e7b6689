#include "executor/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "core/batch_rampup.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "core/executor_memory.h"
#include "core/formulas.h"
#include "core/input_limits.h"
#include "core/pipeline_layout.h"
#include "core/schedule/dependencies.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/validation.h"
#include "core/units.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/data/blended_samples.h"
#include "executor/data/indexed_dataset.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/host_memory.h"
#include "executor/runtime/interpreter.h"
#include "executor/train/checkpoint.h"
#include "executor/train/host_values.h"
#include "executor/train/optimizer.h"
#include "executor/train/parallel_groups.h"
#include "executor/train/stop_signal.h"

namespace megaplan::exec {

TrainOptions checked_train_options(const TrainOptions& options_in) {
  TrainOptions options = options_in;
  // Megatron's two forms: iteration-based (--train-iters) or sample-based (--train-samples, the
  // iterations then set by the caller from the plan's global batch); the decay defaults to the run.
  if (options.train_samples > 0) {
    if (options.learning_rate.warmup_iterations > 0 || options.learning_rate.decay_iterations > 0) {
      throw SpecError(options.learning_rate.warmup_iterations > 0 ? "--lr-warmup-iters" : "--lr-decay-iters",
                      "is iteration-based and cannot be combined with --train-samples (Megatron's rule)");
    }
    if (options.learning_rate.decay_samples == 0) options.learning_rate.decay_samples = options.train_samples;
  } else {
    if (options.learning_rate.warmup_samples > 0 || options.learning_rate.decay_samples > 0) {
      throw SpecError(options.learning_rate.warmup_samples > 0 ? "--lr-warmup-samples" : "--lr-decay-samples",
                      "is sample-based and needs --train-samples instead of --train-iters (Megatron's rule)");
    }
    if (options.learning_rate.decay_iterations == 0) options.learning_rate.decay_iterations = options.train_iters;
  }
  const auto positive = [](int64_t value, const char* flag) {
    if (value <= 0) throw SpecError(flag, "must be a positive integer, got " + std::to_string(value));
  };
  positive(options.train_iters, "--train-iters");
  positive(options.log_interval, "--log-interval");
  positive(options.eval_interval, "--eval-interval");
  positive(options.distributed_timeout_minutes, "--distributed-timeout-minutes");
  if (options.eval_iters < 0) throw SpecError("--eval-iters", "must be non-negative");
  if (options.exit_interval < 0) throw SpecError("--exit-interval", "must be non-negative");
  if (options.save_interval < 0) throw SpecError("--save-interval", "must be non-negative");
  if (options.save_interval > 0 && !options.save) throw SpecError("--save-interval", "needs --save DIR");
  if (options.async_save && !options.save) throw SpecError("--async-save", "needs --save DIR");
  // The index cache locks its folder while it builds, and a run holds --save's lock throughout.
  if (options.save && options.data_cache_path && same_directory(*options.save, *options.data_cache_path)) {
    throw SpecError("--data-cache-path", "is the --save folder, which the run holds locked: give each its own");
  }
  positive(options.checkpoint_threads, "--checkpoint-threads");
  if (!(options.clip_grad >= 0) || !std::isfinite(options.clip_grad)) {
    throw SpecError("--clip-grad", "must be a finite non-negative number");
  }
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay)) {
    throw SpecError("--weight-decay", "must be a finite non-negative number");
  }
  // Adam's moments decay by beta each step: 1 would never forget, above 1 diverge.
  if (!(options.adam_beta1 >= 0 && options.adam_beta1 < 1)) throw SpecError("--adam-beta1", "must lie in [0, 1)");
  if (!(options.adam_beta2 >= 0 && options.adam_beta2 < 1)) throw SpecError("--adam-beta2", "must lie in [0, 1)");
  if (!(options.adam_eps > 0) || !std::isfinite(options.adam_eps)) {
    throw SpecError("--adam-eps", "must be a finite positive number");
  }
  if (!(options.init_method_std > 0) || !std::isfinite(options.init_method_std)) {
    throw SpecError("--init-method-std", "must be a finite positive number");
  }
  if (options.ddp_bucket_size < 0) throw SpecError("--ddp-bucket-size", "must be non-negative (0: Megatron's default)");
  if (options.data_path.empty()) throw SpecError("--data-path", "is required");
  if (options.dataset_builder_threads) {
    if (*options.dataset_builder_threads < 1) {
      throw SpecError("--num-dataset-builder-threads",
                      "must be at least 1, got " + std::to_string(*options.dataset_builder_threads));
    }
    require_at_most(*options.dataset_builder_threads, kMaxThreads, "--num-dataset-builder-threads");
  }
  options.learning_rate.validate();
  options.loss_scaling.validate();
  return options;
}

namespace {

// The group the rank's routed experts are cut over, as StageChunk takes it: unset where it is the
// tp group, else its own (null at etp 1: whole experts).
std::optional<Comm*> expert_tensor_parallel(const ParallelGroups& groups, const ParallelPlan& plan) {
  if (plan.expert_tensor_parallel() == plan.tensor_parallel_size) return std::nullopt;
  return groups.expert_tensor_parallel.get();
}

std::string format_double(double value) {
  std::ostringstream text;
  text.precision(6);
  text << value;
  return text.str();
}

PipelineSchedule checked_schedule(const ParallelPlan& plan, const TrainOptions& options) {
  PipelineSchedule schedule =
      lower_schedule(options.pipeline_schedule_csv
                         ? read_plan_schedule_csv(*options.pipeline_schedule_csv, plan, "--pipeline-schedule-csv")
                         : generate_plan_schedule(plan));
  validate_schedule(schedule);
  return schedule;
}

// What every rank reads and nobody changes: the plan's schedule and the data.
struct Run {
  const ModelSpec& model;
  const ParallelPlan& plan;
  const TrainOptions& options;
  const PipelineSchedule& schedule;  // the plan's, lowered and validated
  const BlendedSamples& train_samples;
  const BlendedSamples* valid_samples;
  std::string data_log;  // how the sample indexes were found or built, for rank 0's log
};

// Megatron's sampler: a global batch is its size's consecutive samples; microbatch m of
// data-parallel rank r takes mbs of them from (m x dp + r) x mbs on.
int64_t microbatch_first_sample(int64_t batch_start, int64_t microbatch, int64_t dp_rank, const ParallelPlan& plan) {
  return batch_start + (microbatch * plan.data_parallel_size + dp_rank) * plan.micro_batch_size;
}

void read_microbatch(const BlendedSamples& samples, int64_t batch_start, int64_t microbatch, int64_t dp_rank,
                     const ParallelPlan& plan, int64_t seq, MicrobatchTokens& out) {
  const int64_t mbs = plan.micro_batch_size;
  const int64_t first = microbatch_first_sample(batch_start, microbatch, dp_rank, plan);
  out.tokens.resize(static_cast<std::size_t>(mbs * (seq + 1)));
  out.loss_mask.assign(static_cast<std::size_t>(mbs * seq), 1.0f);
  for (int64_t i = 0; i < mbs; ++i) {
    samples.sample((first + i) % samples.size(), out.tokens.data() + i * (seq + 1));
  }
}

// The bytes a rank allocates at most (core/executor_memory.h), for what this backend stores.
int64_t predicted_rank_bytes(const Run& run, int64_t pipeline_rank, const Backend& backend) {
  return executor_memory_per_pipeline_rank(run.model, run.plan, run.schedule, executor_precision(backend),
                                           run.options.ddp_bucket_size,
                                           run.options.eval_iters > 0)[static_cast<std::size_t>(pipeline_rank)]
      .total_bytes;
}

// One tensor-parallel shard of a final weight (keep_final_weights), joined with the others' later.
struct WeightShard {
  TensorCut cut;
  std::vector<int64_t> global_shape;
  std::vector<float> values;
};

class RankTrainer {
 public:
  RankTrainer(const Run& run, Backend& backend, ParallelGroups& groups, std::ostream* out)
      : run_(run), backend_(backend), groups_(groups), out_(out) {
    const int64_t needed = predicted_rank_bytes(run, groups.pipeline_rank, backend);
    if (const int64_t available = backend.available_bytes(); needed > available) {
      // The flags that shrink it: the micro-batch (activations), recomputation, more pipeline stages.
      throw SpecError("--micro-batch-size",
                      run.model.name + " with micro-batch size " + std::to_string(run.plan.micro_batch_size) +
                          " needs " + format_gib(static_cast<double>(needed)) + " on pipeline rank " +
                          std::to_string(groups.pipeline_rank) + " (" + backend.name() +
                          ": weights, gradients, optimizer state and the schedule's in-flight activations) but " +
                          format_gib(static_cast<double>(available)) +
                          " are available; lower it, or add --recompute-granularity, --pipeline-model-parallel-size "
                          "or --use-distributed-optimizer");
    }
    Parameter* embedding = nullptr;  // stage 0's, when this rank holds it: a V's last stage reads it
    for (const int64_t stage : stages_of_pipeline_rank(groups.pipeline_rank, run.plan)) {
      chunks_.push_back(std::make_unique<StageChunk>(
          run.model, run.plan, stage, backend, Initialisation{run.options.seed, run.options.init_method_std}, embedding,
          groups.tensor_parallel.get(), static_cast<std::size_t>(run.options.ddp_bucket_size),
          groups.context_parallel.get(), groups.expert_parallel.get(), expert_tensor_parallel(groups, run.plan)));
      if (chunks_.back()->first_stage()) embedding = chunks_.back()->word_embedding();
      by_stage_[stage] = chunks_.back().get();
    }
    std::vector<StageChunk*> ordered;
    for (auto& chunk : chunks_) ordered.push_back(chunk.get());
    OptimizerSettings settings;
    settings.weight_decay = run.options.weight_decay;
    settings.beta1 = run.options.adam_beta1;
    settings.beta2 = run.options.adam_beta2;
    settings.eps = run.options.adam_eps;
    settings.clip_grad = run.options.clip_grad;
    settings.overlap_grad_reduce = run.plan.options.overlap_grad_reduce;
    settings.overlap_param_gather = overlaps_parameter_gather(run.plan);
    settings.microbatches = run.plan.num_microbatches();
    settings.expert_bias_update_rate = run.model.moe.router_bias_update_rate;
    OptimizerGroups optimizer_groups;
    optimizer_groups.data_parallel = groups.data_parallel.get();
    optimizer_groups.model_parallel = groups.model_parallel.get();
    optimizer_groups.embedding = groups.embedding.get();
    optimizer_groups.experts_apart = groups.experts_apart;
    optimizer_groups.expert_parallel = groups.expert_parallel.get();
    optimizer_groups.expert_data_parallel = groups.expert_data_parallel.get();
    optimizer_groups.experts_cut_apart = run.plan.expert_tensor_parallel() != run.plan.tensor_parallel_size;
    optimizer_groups.expert_tensor_parallel = groups.expert_tensor_parallel.get();
    optimizer_groups.pipeline = groups.pipeline.get();
    optimizer_groups.tensor_parallel = groups.tensor_parallel.get();
    optimizer_ =
        std::make_unique<Optimizer>(ordered, optimizer_groups, run.plan.use_distributed_optimizer, settings, backend);
    interpreter_ = std::make_unique<Interpreter>(run.schedule, groups.pipeline_rank, by_stage_, groups.pipeline.get(),
                                                 run.plan.data_parallel_size, *optimizer_, backend);
    // The backend computes in the plan's precision (the CPU backend in fp32 under either).
    const DType type = backend.activation_type();
    if (type != DType::kFloat32 && (type == DType::kFloat16) != (run.plan.options.precision == DType::kFloat16)) {
      throw std::logic_error("train: a " + std::string(to_string(type)) + " backend for a " +
                             to_string(run.plan.options.precision) + " plan");
    }
    if (run.plan.options.precision == DType::kFloat16 || run.options.loss_scaling.constant) {
      loss_scaler_.emplace(run.options.loss_scaling);
    }
  }

  TrainSummary train();
  // With keep_final_weights, on the first data-parallel replica: the rank's part of every parameter.
  std::map<std::string, WeightShard>& final_shards() { return final_shards_; }

 private:
  std::map<std::string, WeightShard> final_shards_;
  // The sum over the pipeline's stages and the data-parallel replicas (each rank adds its part).
  double sum_over_model(double value) {
    if (groups_.pipeline) value = sum_over(*groups_.pipeline, backend_, value);
    if (groups_.data_parallel) value = sum_over(*groups_.data_parallel, backend_, value);
    return value;
  }
  // The same for a list, element by element: one gather per group.
  std::vector<double> sum_list_over_model(std::vector<double> values) {
    for (Comm* group : {groups_.pipeline.get(), groups_.data_parallel.get()}) {
      if (!group) continue;
      std::vector<double> sum(values.size(), 0.0);
      for (const std::vector<double>& part : all_gather_lists(*group, backend_, values)) {
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      values = std::move(sum);
    }
    return values;
  }
  // The strongest stop signal any rank has received: every rank stops after the same iteration.
  StopSignal agreed_stop_signal() {
    double strongest = static_cast<double>(received_stop_signal());
    if (groups_.world) {
      for (const double part : all_gather_doubles(*groups_.world, backend_, strongest))
        strongest = std::max(strongest, part);
    }
    return static_cast<StopSignal>(static_cast<int>(strongest));
  }
  double evaluate(int64_t iteration);
  // Throws SpecError("--load" or "--seed") unless this run can go on from a loaded state.
  void check_resumable(const TrainingState& loaded) const;
  // The interval's iterations and the updates among them: under loss scaling Megatron averages
  // the loss over the updates only and counts the skipped iterations.
  struct Interval {
    int64_t iterations = 0, updates = 0, samples = 0;
    double loss_all = 0, loss_updated = 0;  // summed over all its iterations, over its updates
    RouterLosses router;                    // each iteration's mean over MoE layers and microbatches, summed
  };
  // A log line for the interval ending at `iteration`, trained in `seconds`.
  void log(int64_t iteration, const Interval& interval, double lr, double gradient_norm, int64_t global_batch,
           double seconds);

  const Run& run_;
  Backend& backend_;
  ParallelGroups& groups_;
  std::ostream* out_;  // rank 0's; null on the others
  std::vector<std::unique_ptr<StageChunk>> chunks_;
  std::map<int64_t, StageChunk*> by_stage_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Interpreter> interpreter_;
  std::optional<LossScaler> loss_scaler_;  // under --fp16 or --loss-scale
  // The schedule of a --rampup-batch-size step below the plan's batch: each rank lowers its own
  // copy when the ramp reaches it (checked before training: ramp_plan), one step at a time.
  std::optional<PipelineSchedule> ramp_schedule_;
  int64_t ramp_batch_ = 0;  // ramp_schedule_'s global batch
  // The schedule of an iteration of `global_batch` samples, set on the interpreter and optimizer.
  void use_global_batch(int64_t global_batch);
  // What checkpoints read and write of this rank.
  CheckpointRank checkpoint_rank() {
    std::vector<StageChunk*> chunks;
    for (auto& chunk : chunks_) chunks.push_back(chunk.get());
    return {run_.model, run_.plan, groups_, std::move(chunks), *optimizer_, backend_, run_.options.checkpoint_threads};
  }
  // Publishes the --async-save being written, once written (every rank at the same point).
  void finish_checkpoint() {
    if (const std::optional<int64_t> saved = checkpoint_saver_.finish(checkpoint_rank()); saved && out_) {
      *out_ << "saved " << *run_.options.save << " at iteration " << *saved << "\n";
      log_save_times();
    }
  }
  // What rank 0's part of the last save took: the speed bench/checkpoint_speed.sh reports.
  void log_save_times() {
    const CheckpointSaver::Times& times = checkpoint_saver_.last_save();
    const double seconds = run_.options.async_save ? times.write_seconds : times.snapshot_seconds + times.write_seconds;
    const double gigabytes = static_cast<double>(times.bytes) / 1e9;
    *out_ << "checkpoint save: " << format_double(gigabytes) << " GB in " << format_double(seconds) << " s ("
          << format_double(seconds > 0 ? gigabytes / seconds : 0) << " GB/s, " << run_.options.checkpoint_threads
          << " threads" << (run_.options.async_save ? ", in the background" : "") << ")\n";
  }
  CheckpointSaver checkpoint_saver_{run_.options.async_save, backend_};
  std::optional<std::ofstream> log_file_;
};

// The RECV_F a forward of `stage` waits for by core's dependency rule, or nothing where its input
// is the previous stage's output on the same rank (or the tokens).
std::optional<Action> forward_receive(const ScheduleShape& shape, int64_t stage, int64_t microbatch) {
  std::optional<Action> receive;
  for_each_dependency(forward(stage, microbatch), shape, /*lowered=*/true, [&](const Action& needed) {
    if (needed.kind == ActionKind::kRecvForward) receive = needed;
  });
  return receive;
}

double RankTrainer::evaluate(int64_t iteration) {
  // Forward only, microbatch by microbatch through the stages in order: each rank runs the stages
  // it holds and passes activations on (buffered sends: no rank waits on a later one).
  const ParallelPlan& plan = run_.plan;
  const int64_t microbatches = plan.num_microbatches();
  const int64_t seq = run_.model.seq_length;
  const int64_t first = (iteration / run_.options.eval_interval - 1) * run_.options.eval_iters * plan.global_batch_size;
  const ScheduleShape& shape = run_.schedule.shape;
  const std::size_t message = chunks_.front()->message_size();
  const DType type = backend_.activation_type();
  Activation buffers[2] = {backend_.allocate_activation(message), backend_.allocate_activation(message)};
  double total = 0;
  MicrobatchTokens data;
  for (int64_t e = 0; e < run_.options.eval_iters; ++e) {
    for (int64_t m = 0; m < microbatches; ++m) {
      read_microbatch(*run_.valid_samples, first + e * plan.global_batch_size, m, groups_.data_parallel_rank, plan, seq,
                      data);
      int current = 0;  // buffers[current] holds the input of the next stage run here
      for (int64_t stage = 0; stage < shape.num_stages; ++stage) {
        if (shape.rank_of_stage(stage) != groups_.pipeline_rank) continue;
        if (const std::optional<Action> receive = forward_receive(shape, stage, m)) {
          groups_.pipeline->recv(buffers[current], message, type, shape.rank_of_stage(message_peer_stage(*receive)))
              ->wait();
        }
        StageChunk& chunk = *by_stage_.at(stage);
        const double loss = chunk.evaluate(&data, buffers[current], buffers[1 - current]);
        current = 1 - current;
        if (chunk.last_stage()) {
          total += loss;
        } else if (forward_receive(shape, stage + 1, m)) {
          groups_.pipeline->send(buffers[current], message, type, shape.rank_of_stage(stage + 1))->wait();
        }
      }
    }
  }
  for (Activation buffer : buffers) backend_.release(buffer);
  return sum_over_model(total) / static_cast<double>(run_.options.eval_iters * microbatches * plan.data_parallel_size);
}

void RankTrainer::check_resumable(const TrainingState& loaded) const {
  const TrainOptions& options = run_.options;
  if (loaded.seed != options.seed) {
    throw SpecError("--seed", std::to_string(options.seed) + " differs from the checkpoint's " +
                                  std::to_string(loaded.seed) + ": the data order would change");
  }
  if (loaded.iteration > options.train_iters) {
    throw SpecError("--load", *options.load + " is at iteration " + std::to_string(loaded.iteration) +
                                  ", past --train-iters " + std::to_string(options.train_iters) +
                                  ": nothing to train (raise --train-iters to go on)");
  }
  // The samples this run's data index holds (its --train-iters at its batch): a checkpoint past
  // them would wrap around and train on data it has seen.
  const int64_t samples = run_.train_samples.size();
  if (loaded.consumed_samples > samples) {
    throw SpecError("--load", *options.load + " has consumed " + std::to_string(loaded.consumed_samples) +
                                  " samples, more than the " + std::to_string(samples) + " that --train-iters " +
                                  std::to_string(options.train_iters) + " at this batch draw");
  }
}

void RankTrainer::use_global_batch(int64_t global_batch) {
  const PipelineSchedule* schedule = &run_.schedule;
  if (global_batch != run_.plan.global_batch_size) {
    if (ramp_batch_ != global_batch) {
      ParallelPlan step = run_.plan;
      step.global_batch_size = global_batch;
      ramp_schedule_ = checked_schedule(step, run_.options);
      ramp_batch_ = global_batch;
    }
    schedule = &*ramp_schedule_;
  }
  interpreter_->use_schedule(*schedule);
  optimizer_->set_microbatches(schedule->shape.microbatches);
}

void RankTrainer::log(int64_t iteration, const Interval& interval, double lr, double gradient_norm,
                      int64_t global_batch, double seconds) {
  const int64_t samples = interval.samples, iterations = interval.iterations;
  // An interval of skipped iterations only still says its losses (Megatron would print 0).
  const double loss = interval.updates > 0 ? interval.loss_updated / static_cast<double>(interval.updates)
                                           : interval.loss_all / static_cast<double>(interval.iterations);
  const double tokens_per_s = static_cast<double>(samples * run_.model.seq_length) / seconds;
  const double flops = model_flops(run_.model, samples, padded_vocab_size(run_.model, run_.plan.tensor_parallel_size));
  const double tflops = flops / seconds / 1e12 / static_cast<double>(run_.plan.world_size());
  nlohmann::json record = {
      {"iteration", iteration},
      {"loss", loss},
      {"lr", lr},
      {"grad_norm", gradient_norm},
      {"tokens_per_s", tokens_per_s},
      {"model_tflops_per_gpu", tflops},
      {"mfu", run_.options.peak_flops_per_s > 0 ? tflops * 1e12 / run_.options.peak_flops_per_s : 0.0},
      {"peak_memory_bytes", backend_.peak_bytes()}};
  // At this interval's pace, the iterations still to run.
  const double eta_s =
      seconds / static_cast<double>(iterations) * static_cast<double>(run_.options.train_iters - iteration);
  record["eta_s"] = eta_s;
  record["global_batch_size"] = global_batch;
  *out_ << "iteration " << iteration << "/" << run_.options.train_iters << " | loss " << format_double(loss) << " | lr "
        << format_double(lr) << " | grad norm " << format_double(gradient_norm) << " | " << format_double(tokens_per_s)
        << " tokens/s | " << format_double(tflops) << " model TFLOP/s per GPU | ETA " << format_duration(eta_s);
  if (run_.options.rampup) *out_ << " | global batch " << global_batch;
  // The router losses Megatron logs, where the run applies them: over the interval's iterations.
  const MoeSpec& moe = run_.model.moe;
  const auto router_loss = [&](const char* name, double sum) {
    const double value = sum / static_cast<double>(iterations);
    *out_ << " | " << name << " " << format_double(value);
    record[name] = value;
  };
  if (moe.enabled() && moe.aux_loss_coeff > 0 && moe.load_balancing != LoadBalancing::kNone) {
    router_loss(moe.load_balancing == LoadBalancing::kSeqAuxLoss ? "seq_load_balancing_loss" : "load_balancing_loss",
                interval.router.balancing);
  }
  if (moe.enabled() && moe.z_loss_coeff > 0) router_loss("z_loss", interval.router.z);
  // The experts' load (moe_mlp.h): the busiest expert's tokens over the mean, 1 when balanced.
  if (moe.enabled()) {
    // Over the MoE layers on the log line; each layer's, by its index, in the log file (Megatron's
    // per-layer logging).
    double over_layers = 0;
    nlohmann::json by_layer = nlohmann::json::object();
    for (const auto& [layer, sum] : interval.router.expert_load_by_layer) {
      over_layers += sum / static_cast<double>(interval.router.expert_load_by_layer.size());
      by_layer[std::to_string(layer)] = sum / static_cast<double>(iterations);
    }
    router_loss("tokens_per_expert_max_mean", over_layers);
    record["tokens_per_expert_max_mean_by_layer"] = by_layer;
  }
  if (loss_scaler_) {
    const int64_t skipped = interval.iterations - interval.updates;
    *out_ << " | loss scale " << format_double(loss_scaler_->scale()) << " | number of skipped iterations " << skipped;
    record["loss_scale"] = loss_scaler_->scale();
    record["skipped_iterations"] = skipped;
  }
  *out_ << "\n";
  if (log_file_) *log_file_ << record.dump() << "\n" << std::flush;
}

TrainSummary RankTrainer::train() {
  const TrainOptions& options = run_.options;
  const ParallelPlan& plan = run_.plan;
  TrainingState state;
  state.seed = options.seed;
  state.tokenizer = options.tokenizer;
  // The checkpoint and the log file first: a run refused for either prints nothing on stdout.
  std::ostringstream loaded_log;
  if (options.load) {
    const auto load_start = std::chrono::steady_clock::now();
    CheckpointLoadCounts counts;
    if (const std::optional<TrainingState> loaded = load_checkpoint(*options.load, checkpoint_rank(), &counts)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
      check_resumable(*loaded);
      state = *loaded;
      if (options.tokenizer) state.tokenizer = options.tokenizer;  // the run's word over the checkpoint's
      if (out_) {
        for (const std::string& skipped : counts.incomplete) {
          loaded_log << "passed over incomplete " << *options.load << "/" << skipped << "\n";
        }
        loaded_log << "loaded " << *options.load << " at iteration " << state.iteration << "\n";
        // Rank 0's part; the speed bench/checkpoint_speed.sh reports.
        const double gigabytes = static_cast<double>(counts.bytes) / 1e9;
        loaded_log << "checkpoint load: " << format_double(seconds) << " s (" << format_double(gigabytes) << " GB, "
                   << format_double(seconds > 0 ? gigabytes / seconds : 0) << " GB/s, " << options.checkpoint_threads
                   << " threads; " << counts.tensors_as_saved << " tensors as saved, " << counts.tensors_resharded
                   << " resharded)\n";
      }
    } else if (options.save && same_directory(*options.load, *options.save)) {
      if (out_) loaded_log << "no checkpoint in " << *options.load << " yet: starting from scratch\n";
    } else {
      throw SpecError("--load", *options.load +
                                    " holds no checkpoint (no latest_checkpointed_iteration.txt); to start "
                                    "from scratch and resume from it later, give the same directory to "
                                    "--save (Megatron's resume-or-start idiom)");
    }
  }
  // Every rank loaded before anything is announced or written: a rank refused (its own shard or
  // replica damaged) aborts the others here.
  if (options.load && groups_.world) groups_.world->barrier();
  if (out_ && options.log_file) {
    log_file_.emplace(*options.log_file, std::ios::app);
    if (!*log_file_) throw SpecError("--log-file", *options.log_file + ": cannot open for appending");
  }
  if (out_ && !options.vocabulary_note.empty()) *out_ << options.vocabulary_note << "\n";
  if (out_) *out_ << run_.data_log;
  if (out_) {
    // What the run is, once, before it starts (Megatron prints its arguments and sizes).
    const int64_t seq = run_.model.seq_length;
    const int64_t samples = samples_of_iterations(options.rampup, plan.global_batch_size, options.train_iters);
    *out_ << "training " << run_.model.name << ", "
          << format_count(static_cast<double>(total_parameters(run_.model, plan.tensor_parallel_size)))
          << " parameters, on " << plan.world_size() << " rank(s): " << describe_plan(plan) << "; "
          << format_count(static_cast<double>(plan.global_batch_size * seq)) << " tokens per iteration";
    if (options.rampup) {
      *out_ << " after a ramp: a global batch of " << options.rampup->start << ", " << options.rampup->increment
            << " more per step over " << options.rampup->samples << " samples";
    }
    *out_ << ", " << options.train_iters << " iterations (" << format_count(static_cast<double>(samples * seq))
          << " tokens, " << run_.train_samples.epochs() << " epoch(s) of the training split)\n";
    // A blend says what it draws from each dataset, as Megatron-LM logs its blend.
    const std::vector<int64_t> shares = run_.train_samples.samples_per_dataset();
    if (shares.size() > 1) {
      const DataBlend& data = options.data_path;
      *out_ << "training data: " << shares.size() << " datasets blended "
            << (data.weighted() ? "by weight" : "by the samples each holds (no weights given)") << ":";
      for (std::size_t d = 0; d < shares.size(); ++d) {
        *out_ << (d == 0 ? " " : ", ") << data.prefixes[d] << " " << shares[d] << " samples";
        if (data.weighted()) *out_ << " (weight " << format_double(data.weights[d]) << ")";
      }
      *out_ << "\n";
    }
  }
  if (out_) *out_ << loaded_log.str();

  const int64_t seq = run_.model.seq_length;
  TrainSummary summary;
  summary.first_iteration = state.iteration + 1;
  std::map<int64_t, MicrobatchTokens> data;  // this iteration's microbatches, read when first asked
  if (loss_scaler_ && state.loss_scaler) loss_scaler_->restore(*state.loss_scaler);
  auto window_start = std::chrono::steady_clock::now();
  Interval window;  // Megatron prints the interval's average loss
  while (state.iteration < options.train_iters) {
    const int64_t iteration = state.iteration + 1;
    const int64_t global_batch = rampup_global_batch(options.rampup, plan.global_batch_size, state.consumed_samples);
    // Megatron's scheduler: an update runs at the rate of the samples consumed by the updates before
    // it (the first at the schedule's start: 0 under a warm-up), and it advances only on updates,
    // so the skipped iterations' samples do not count.
    const double lr = options.learning_rate.at(state.consumed_samples - state.skipped_samples, plan.global_batch_size);
    if (options.rampup) use_global_batch(global_batch);
    const int64_t microbatches = global_batch / (plan.micro_batch_size * plan.data_parallel_size);
    data.clear();
    const auto microbatch = [&](int64_t m) -> const MicrobatchTokens& {
      auto found = data.find(m);
      if (found == data.end()) {
        found = data.emplace(m, MicrobatchTokens{}).first;
        read_microbatch(run_.train_samples, state.consumed_samples, m, groups_.data_parallel_rank, plan, seq,
                        found->second);
      }
      return found->second;
    };
    // Each iteration replaces the last one's timeline: the run's last iteration is the one kept.
    const bool traced = options.record_timeline && groups_.replica_rank == 0 && groups_.tensor_parallel_rank == 0;
    if (traced) summary.timeline = Timeline{"measured (" + backend_.name() + ")", {}, {}};
    IterationStep step;
    step.iteration = iteration;
    step.update = iteration - state.skipped_iterations;
    step.lr = lr;
    step.first_sample = [&](int64_t m) {
      return microbatch_first_sample(state.consumed_samples, m, groups_.data_parallel_rank, plan);
    };
    if (loss_scaler_) {
      step.loss_scale = loss_scaler_->scale();
      step.skip_overflow = true;
    }
    const IterationResult result = interpreter_->run(step, microbatch, traced ? &summary.timeline : nullptr);
    const double loss = sum_over_model(result.loss_sum) / static_cast<double>(microbatches * plan.data_parallel_size);
    if (const int64_t moe_layers = run_.model.moe.moe_layers(0, run_.model.num_layers); moe_layers > 0) {
      // Megatron's: each loss's mean over the MoE layers, the microbatches and the replicas; the
      // experts' load each layer's over the microbatches and replicas. One list: the two losses,
      // then the load of every layer (0 off this rank's stages), summed over the model's ranks.
      const RouterLosses& router = result.router_losses;
      std::vector<double> sums(2 + static_cast<std::size_t>(run_.model.num_layers), 0.0);
      sums[0] = router.balancing;
      sums[1] = router.z;
      for (const auto& [layer, load] : router.expert_load_by_layer) sums[2 + static_cast<std::size_t>(layer)] = load;
      sums = sum_list_over_model(std::move(sums));
      const auto replicas = static_cast<double>(microbatches * plan.data_parallel_size);
      window.router.balancing += sums[0] / (replicas * static_cast<double>(moe_layers));
      window.router.z += sums[1] / (replicas * static_cast<double>(moe_layers));
      for (int64_t layer = 0; layer < run_.model.num_layers; ++layer) {
        if (run_.model.moe.moe_layer(layer)) {
          window.router.expert_load_by_layer[layer] += sums[2 + static_cast<std::size_t>(layer)] / replicas;
        }
      }
    }
    state.iteration = iteration;
    state.consumed_samples += global_batch;
    if (result.skipped) {
      ++state.skipped_iterations;
      state.skipped_samples += global_batch;
      ++summary.skipped_iterations;
    }
    if (loss_scaler_) {
      loss_scaler_->update(result.skipped);
      state.loss_scaler = loss_scaler_->state();
    }
    ++window.iterations;
    window.samples += global_batch;
    window.loss_all += loss;
    if (!result.skipped) {
      ++window.updates;
      window.loss_updated += loss;
    }
    summary.last_iteration = iteration;
    summary.last_loss = loss;
    summary.last_gradient_norm = result.gradient_norm;

    if (iteration % options.log_interval == 0 || iteration == options.train_iters) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      if (out_) log(iteration, window, lr, result.gradient_norm, global_batch, seconds);
      window_start = std::chrono::steady_clock::now();
      window = Interval{};
    }
    if (run_.valid_samples && iteration % options.eval_interval == 0) {
      optimizer_->finish_parameter_gathers();
      const double validation = evaluate(iteration);
      if (out_) {
        // Megatron's perplexity: exp of the loss, capped at exp(20).
        const double perplexity = std::exp(std::min(validation, 20.0));
        *out_ << "validation loss at iteration " << iteration << ": " << format_double(validation) << " | perplexity "
              << format_double(perplexity) << "\n";
        if (log_file_) {
          *log_file_ << nlohmann::json{{"iteration", iteration},
                                       {"validation_loss", validation},
                                       {"validation_perplexity", perplexity}}
                            .dump()
                     << "\n"
                     << std::flush;
        }
      }
    }
    const bool exiting = options.exit_interval > 0 && iteration % options.exit_interval == 0;
    const StopSignal stop = options.exit_signal_handler ? agreed_stop_signal() : StopSignal::kNone;
    if (options.save && ((options.save_interval > 0 && iteration % options.save_interval == 0) || exiting ||
                         stop == StopSignal::kTerminate || iteration == options.train_iters)) {
      optimizer_->finish_parameter_gathers();
      finish_checkpoint();
      checkpoint_saver_.save(*options.save, state, checkpoint_rank());
      if (out_ && options.async_save) {
        *out_ << "saving " << *options.save << " at iteration " << iteration << " in the background (training paused "
              << format_double(checkpoint_saver_.last_snapshot_seconds()) << " s for the snapshot)\n";
      } else if (out_) {
        *out_ << "saved " << *options.save << " at iteration " << iteration << "\n";
        log_save_times();
      }
    }
    if (stop != StopSignal::kNone) {
      if (out_) {
        *out_ << "received " << signal_name(stop) << ": stopping at iteration " << iteration
              << (stop == StopSignal::kTerminate && options.save ? " after the save" : " without saving") << "\n";
      }
      break;
    }
    if (exiting) {
      if (out_) *out_ << "exiting at iteration " << iteration << " (--exit-interval " << options.exit_interval << ")\n";
      break;
    }
  }
  optimizer_->finish_parameter_gathers();
  finish_checkpoint();
  if (options.keep_final_weights) {
    for (auto& chunk : chunks_) {
      for (const Parameter& p : chunk->parameters()) {
        if (!writes_parameter(groups_, p)) continue;
        WeightShard& shard = final_shards_[p.name];
        shard.cut = tensor_cut(p);
        shard.global_shape = p.global_shape;
        shard.values.resize(p.size);
        backend_.download(shard.values.data(), p.value, p.size);
      }
    }
  }
  return summary;
}

// One rank whose summary is its own: the world's only rank, or one of a world of processes (its
// final weights are its parts). `out`: the log, rank 0's only (null elsewhere).
TrainSummary train_alone(const Run& run, Backend& backend, ParallelGroups& groups, std::ostream* out) {
  RankTrainer trainer(run, backend, groups, out);
  TrainSummary summary = trainer.train();
  for (auto& [name, shard] : trainer.final_shards()) summary.final_weights[name] = std::move(shard.values);
  return summary;
}

// The samples the run draws for training and for validation: each index holds them all, so each
// is bounded (core/input_limits.h) before it is built.
int64_t training_samples(const ParallelPlan& plan, const TrainOptions& options) {
  const int64_t samples = samples_of_iterations(options.rampup, plan.global_batch_size, options.train_iters);
  require_at_most(samples, kMaxTrainingSamples, "--train-iters (x --global-batch-size: training samples)");
  return samples;
}

int64_t validation_samples(const ParallelPlan& plan, const TrainOptions& options) {
  const int64_t evaluations = options.train_iters / options.eval_interval + 1;
  const int64_t samples = checked_multiply(checked_multiply(evaluations, options.eval_iters, "--eval-iters"),
                                           plan.global_batch_size, "--eval-iters");
  require_at_most(samples, kMaxTrainingSamples,
                  "--eval-iters (x --global-batch-size x evaluations: validation samples)");
  return samples;
}

// What a checkpoint of the model takes on disk: every parameter's fp32 value and two Adam moments.
int64_t checkpoint_bytes(const ModelSpec& model, const ParallelPlan& plan) {
  constexpr int64_t kBytesPerParameter = 3 * sizeof(float);
  return kBytesPerParameter * total_parameters(model, plan.tensor_parallel_size);
}

// A --rampup-batch-size the plan can run at every step: each batch's microbatches fit its schedule.
void check_ramp(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options) {
  if (!options.rampup) return;
  if (options.pipeline_schedule_csv) {
    throw SpecError("--rampup-batch-size",
                    "cannot be combined with --pipeline-schedule-csv: the CSV fixes every "
                    "iteration's microbatches");
  }
  validate_batch_rampup(*options.rampup, plan);
  for (const int64_t batch : rampup_global_batches(options.rampup, plan.global_batch_size)) {
    ParallelPlan step = plan;
    step.global_batch_size = batch;
    try {
      validate_plan(model, step);
    } catch (const SpecError& error) {
      throw SpecError("--rampup-batch-size", "the ramp's global batch " + std::to_string(batch) + " (" +
                                                 std::to_string(step.num_microbatches()) +
                                                 " microbatches) cannot run this plan: " + error.what());
    }
  }
}

// Where the run's sample indexes are cached, who builds them, and where that is said.
IndexCache index_cache(const TrainOptions& options, std::ostream& log) {
  const int64_t threads = options.dataset_builder_threads.value_or(
      std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency())));
  return IndexCache{options.data_cache_path, threads, &log};
}

// What every rank of a run shares, built and checked before any rank starts (a schedule that would
// hang is refused here). Not movable: the samples refer to the datasets. Both sample counts are
// bounded before either index is built.
// The process of global rank 0 (`holds_rank_zero`) locks the --save folder for the run.
struct PreparedRun {
  PreparedRun(const ModelSpec& model_in, const ParallelPlan& plan_in, const TrainOptions& options_in,
              bool holds_rank_zero)
      : model(model_in),
        plan(plan_in),
        options(checked_train_options(options_in)),
        schedule((StageChunk::refuse_unsupported(model, plan), check_ramp(model, plan, options),
                  check_checkpoint_directories(options.load, options.save, checkpoint_bytes(model, plan)),
                  checked_schedule(plan, options))),
        save_lock(holds_rank_zero ? options.save : std::nullopt),
        datasets(open_datasets(options.data_path)),
        train_count(training_samples(plan, options)),
        valid_count(options.eval_iters > 0 && any_documents_in_split(datasets, options.split, 1)
                        ? validation_samples(plan, options)
                        : 0),
        train_samples(options.data_path, datasets, options.split, 0, model.seq_length, train_count, options.seed,
                      index_cache(options, data_log)) {
    if (valid_count > 0) {
      valid_samples.emplace(options.data_path, datasets, options.split, 1, model.seq_length, valid_count,
                            options.seed + 1, index_cache(options, data_log));
    }
  }
  PreparedRun(const PreparedRun&) = delete;
  PreparedRun& operator=(const PreparedRun&) = delete;
  Run run() const {
    return Run{model,         plan, options, schedule, train_samples, valid_samples ? &*valid_samples : nullptr,
               data_log.str()};
  }

  const ModelSpec& model;
  const ParallelPlan& plan;
  TrainOptions options;
  PipelineSchedule schedule;
  SaveFolderLock save_lock;
  std::vector<std::unique_ptr<IndexedDataset>> datasets;  // one per --data-path prefix
  int64_t train_count;
  int64_t valid_count;          // 0: no validation
  std::ostringstream data_log;  // said by rank 0 when it starts, after every refusal has had its turn
  BlendedSamples train_samples;
  std::optional<BlendedSamples> valid_samples;
};

}  // namespace

TrainSummary train(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options,
                   const BackendFactory& make_backend, std::ostream& out, const InProcessMemoryFactory& make_memory) {
  const PreparedRun prepared(model, plan, options, true);
  // Every rank in this process: their images together are the whole checkpoint.
  if (prepared.options.async_save) check_async_save_memory(checkpoint_bytes(model, plan), host_available_bytes());
  const Run run = prepared.run();
  if (plan.world_size() == 1) {
    std::unique_ptr<Backend> backend = make_backend(0);
    ParallelGroups groups = make_parallel_groups(plan, 0, [](const GroupKind&) {
      return std::unique_ptr<Comm>();  // a world of one needs no communicator
    });
    return train_alone(run, *backend, groups, &out);
  }
  InProcessWorld world(plan.world_size(), std::chrono::minutes(prepared.options.distributed_timeout_minutes),
                       make_memory());
  TrainSummary summary;
  std::map<std::string, std::map<int64_t, WeightShard>> shards;  // by name, then shard index
  std::mutex summary_mutex;
  run_rank_threads(world, plan.world_size(), [&](int64_t rank) {
    std::unique_ptr<Backend> backend = make_backend(rank);
    ParallelGroups groups = make_parallel_groups(plan, rank, [&](const GroupKind& kind) -> std::unique_ptr<Comm> {
      if (!needs_communicator(kind)) return nullptr;
      return world.group(rank, kind.groups[static_cast<std::size_t>(kind.mine)], kind.label,
                         [compute = backend.get()] { return compute->compute_stream(); });
    });
    RankTrainer trainer(run, *backend, groups, rank == 0 ? &out : nullptr);
    TrainSummary mine = trainer.train();
    const std::lock_guard<std::mutex> lock(summary_mutex);
    for (auto& [name, shard] : trainer.final_shards()) shards[name].emplace(shard.cut.index, std::move(shard));
    summary.timeline.slices.insert(summary.timeline.slices.end(), mine.timeline.slices.begin(),
                                   mine.timeline.slices.end());
    if (rank == 0) {
      mine.timeline.slices = std::move(summary.timeline.slices);
      summary = std::move(mine);
    }
  });
  // Tensor-parallel shards joined into the tensors the single-rank run holds.
  for (auto& [name, parts] : shards) {
    std::vector<std::vector<float>> values;
    for (auto& [index, shard] : parts) values.push_back(std::move(shard.values));
    const WeightShard& first = parts.begin()->second;
    summary.final_weights[name] = reshard(values, first.cut, first.global_shape, TensorCut{});
  }
  return summary;
}

namespace {

// A slice as doubles (every field is an integer or a time), and back.
constexpr std::size_t kSliceFields = 10;

void append_slice(const TimelineSlice& slice, std::vector<double>& out) {
  const Action& a = slice.action;
  out.insert(
      out.end(),
      {static_cast<double>(slice.pipeline_rank), static_cast<double>(slice.stream), static_cast<double>(a.kind),
       static_cast<double>(a.backward_kind), static_cast<double>(a.stage), static_cast<double>(a.microbatch),
       static_cast<double>(a.backward_stage), static_cast<double>(a.backward_microbatch), slice.start_s, slice.end_s});
}

TimelineSlice slice_at(const double* field) {
  TimelineSlice slice;
  slice.pipeline_rank = static_cast<int32_t>(field[0]);
  slice.stream = static_cast<TimelineStream>(field[1]);
  slice.action.kind = static_cast<ActionKind>(field[2]);
  slice.action.backward_kind = static_cast<ActionKind>(field[3]);
  slice.action.stage = static_cast<int32_t>(field[4]);
  slice.action.microbatch = static_cast<int32_t>(field[5]);
  slice.action.backward_stage = static_cast<int32_t>(field[6]);
  slice.action.backward_microbatch = static_cast<int32_t>(field[7]);
  slice.start_s = field[8];
  slice.end_s = field[9];
  return slice;
}

// The traced pipeline's timelines (its ranks are the first tensor- and data-parallel rank of each
// stage), every rank's slices gathered over the pipeline group, in pipeline-rank order: what the
// in-process run joins from its threads.
void gather_pipeline_timeline(Comm* pipeline, Backend& backend, Timeline& timeline) {
  if (!pipeline || pipeline->size() == 1) return;
  std::vector<double> mine;
  for (const TimelineSlice& slice : timeline.slices) append_slice(slice, mine);
  timeline.slices.clear();
  for (const std::vector<double>& list : all_gather_lists(*pipeline, backend, mine)) {
    for (std::size_t at = 0; at + kSliceFields <= list.size(); at += kSliceFields) {
      timeline.slices.push_back(slice_at(list.data() + at));
    }
  }
}

}  // namespace

TrainSummary train_rank(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options, int64_t rank,
                        Backend& backend, const CommFactory& make_comm, std::ostream& out) {
  const PreparedRun prepared(model, plan, options, rank == 0);
  const Run run = prepared.run();
  ParallelGroups groups = make_parallel_groups(plan, rank, make_comm);
  if (prepared.options.async_save) {
    check_async_save_memory(async_save_image_bytes(model, plan, groups), host_available_bytes());
  }
  TrainSummary summary = train_alone(run, backend, groups, rank == 0 ? &out : nullptr);
  if (options.record_timeline && groups.replica_rank == 0 && groups.tensor_parallel_rank == 0) {
    gather_pipeline_timeline(groups.pipeline.get(), backend, summary.timeline);
  }
  return summary;
}

}  // namespace megaplan::exec
