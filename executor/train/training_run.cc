#include "executor/train/training_run.h"

#include <memory>

#include "core/device_gpu.h"
#include "core/error.h"
#include "executor/comm/in_process_gpu_memory.h"
#include "executor/data/data_blend.h"
#include "executor/data/vocabulary.h"
#include "executor/gpu_inventory.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/runtime/cuda_backend.h"
#include "executor/train/launched_training.h"
#include "executor/train/learning_rate.h"
#include "executor/train/stop_signal.h"

namespace megaplan::exec {

namespace {

// Every rank of the plan in this process: on the CPU, or as threads sharing GPU 0 (exact, and
// slow, since their work runs on one stream).
TrainSummary train_in_process(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& train,
                              const std::string& device, std::ostream& out) {
  BackendFactory make_backend;
  InProcessMemoryFactory make_memory = make_in_process_cpu_memory;
  if (device == "cuda") {
    const DType precision = plan.options.precision;
    make_backend = [precision](int64_t) { return make_cuda_backend(precision); };
    make_memory = make_in_process_gpu_memory;
  } else {
    make_backend = [](int64_t) -> std::unique_ptr<Backend> { return std::make_unique<CpuBackend>(); };
  }
  return exec::train(model, plan, train, make_backend, out, make_memory);
}

// Whether the tokenizer flags name a tokenizer (else the vocabulary comes from --vocab-size, the
// job file or the data).
bool tokenizer_named(const TokenizerOptions& t) {
  return !t.kind.empty() || !t.megatron_type.empty() || !t.vocab_file.empty() || !t.merge_file.empty() ||
         !t.tokenizer_file.empty() || !t.tokenizer_model.empty();
}

// The vocabulary to train (executor/data/vocabulary.h), and the line that says where it came from.
Vocabulary chosen_vocabulary(const TrainRequest& options, const ModelSpec& model) {
  std::optional<Vocabulary> given;
  if (options.plan_file) given = Vocabulary{model.vocab_size, "the job file " + *options.plan_file};
  if (options.model.vocab_size) given = Vocabulary{*options.model.vocab_size, "--vocab-size"};
  return training_vocabulary(given,
                             tokenizer_named(options.tokenizer) ? std::optional(options.tokenizer) : std::nullopt,
                             options.train.data_path);
}

// The GPUs the report's simulation assumes: --cluster (its first plan.world_size() GPUs), else the
// job file's cluster, else as many of the GPU this process trains on as the plan has ranks.
ClusterSpec report_cluster(const TrainRequest& options, const ParallelPlan& plan,
                           const std::optional<ClusterSpec>& job_cluster) {
  if (options.cluster) {
    ClusterOptions given;
    given.cluster = *options.cluster;
    given.gpus = plan.world_size();
    return resolve_cluster(given);
  }
  if (job_cluster) return *job_cluster;
  if (options.device == "cuda") {
    const GpuInventory inventory = query_gpu_inventory();
    if (!inventory.devices.empty()) {
      const std::optional<GpuSpec> gpu = gpu_preset_for_device(inventory.devices.front().name);
      for (const ClusterSpec& preset : gpu ? cluster_presets() : std::vector<ClusterSpec>{}) {
        if (preset.gpu.name != gpu->name || preset.total_gpus() < plan.world_size()) continue;
        ClusterOptions local;
        local.cluster = preset.name;
        local.gpus = plan.world_size();
        return resolve_cluster(local);
      }
    }
  }
  throw SpecError("--report",
                  "needs the GPUs to simulate the plan on: name them with --cluster (a preset or a cluster "
                  ".json), or train from a job file (--plan)");
}

}  // namespace

PreparedTraining prepare_training(const TrainRequest& options) {
  // Not the other commands' default model: a run trains what it is told to.
  if (!options.plan_file && !options.model.model && !model_flags_given(options.model)) {
    throw SpecError("--model",
                    "train needs a model: a preset (megaplan presets), a model .json or a Hugging Face "
                    "config.json, Megatron's model flags (--num-layers, --hidden-size, ...), or a job "
                    "file (--plan)");
  }
  TrainOptions train = options.train;
  train.learning_rate.style = parse_decay_style(options.lr_decay_style);
  if (!options.rampup_batch_size.empty()) {
    const std::vector<int64_t>& ramp = options.rampup_batch_size;
    train.rampup = BatchRampup{ramp[0], ramp[1], ramp[2]};
  }
  if (options.device != "cpu" && options.device != "cuda") {
    throw SpecError("--device", "must be cpu or cuda, got \"" + options.device + "\"");
  }
  const LaunchEnvironment launch = detect_launch_environment();
  ModelSpec model;
  ParallelPlan plan;
  std::optional<ClusterSpec> job_cluster;
  std::optional<Vocabulary> custom_vocabulary;  // a model of Megatron's flags alone: chosen before the model
  if (options.plan_file) {
    // The job file, with the model and plan flags given beside it overriding it.
    const JobSpec job = load_job(options.model, ClusterOptions{}, options.plan, options.plan_file, options.given);
    model = job.model;
    plan = job.plan;
    job_cluster = job.cluster;
    if (options.world_size && *options.world_size != plan.world_size()) {
      throw SpecError("--world-size", std::to_string(*options.world_size) + " differs from the " +
                                          std::to_string(plan.world_size()) + " GPUs " + *options.plan_file +
                                          " lays the model over");
    }
  } else {
    ModelOptions model_options = options.model;
    // A model of Megatron's flags alone takes its vocabulary from the tokenizer or the data, as
    // Megatron takes it from its tokenizer.
    if (!model_options.model && !model_options.vocab_size && model_flags_given(model_options)) {
      custom_vocabulary = chosen_vocabulary(options, ModelSpec{});
      model_options.vocab_size = custom_vocabulary->size;
    }
    model = resolve_model(model_options);
    validate_model_spec(model);
    const int64_t world = options.world_size.value_or(launch.world_size);
    if (world <= 0) throw SpecError("--world-size", "must be a positive integer, got " + std::to_string(world));
    plan = resolve_plan(model, world, options.plan, "--world-size");
    validate_plan(model, plan);
  }
  if (launch.launcher != "none") {
    if (launch.world_size != plan.world_size()) {
      throw SpecError("--world-size", "the plan has " + std::to_string(plan.world_size()) + " ranks but " +
                                          launch.launcher + " started " + std::to_string(launch.world_size));
    }
    if (launch.world_size > 1 && options.device == "cpu") {
      throw SpecError("--device", launch.launcher + " started " + std::to_string(launch.world_size) +
                                      " processes, but the CPU backend runs every rank as a thread of one process: "
                                      "start one process with --world-size " +
                                      std::to_string(launch.world_size) +
                                      ", or use --device cuda (one process per GPU over NCCL)");
    }
  }
  // Megatron's two forms of the run's length: --train-iters, or --train-samples over the plan's
  // global batch (its update_train_iters).
  if (train.train_samples < 0) throw SpecError("--train-samples", "must be a positive integer");
  if (train.train_samples > 0 && train.train_iters != 0) {
    throw SpecError("--train-samples",
                    "cannot be combined with --train-iters (Megatron's rule: one form or the other)");
  }
  if (train.train_samples == 0 && train.train_iters == 0) {
    throw SpecError("--train-iters", "required (or --train-samples, Megatron's sample-based form)");
  }
  if (train.train_samples > 0) {
    train.train_iters = train.train_samples / plan.global_batch_size;
    if (train.train_iters == 0) {
      throw SpecError("--train-samples", std::to_string(train.train_samples) + " is less than one global batch (" +
                                             std::to_string(plan.global_batch_size) + ")");
    }
  }
  // The flags are checked first (the trainer's checks too), with the model's own vocabulary; then
  // the data is opened for the vocabulary, which the trainer says once its checks pass.
  (void)checked_train_options(train);
  StageChunk::refuse_unsupported(model, plan);
  // Read once: the data's scan or the tokenizer's files (a custom model's was read above).
  const Vocabulary vocabulary = custom_vocabulary ? *custom_vocabulary : chosen_vocabulary(options, model);
  // Recorded in the checkpoints, for `megaplan convert --to hf`.
  if (tokenizer_named(options.tokenizer)) train.tokenizer = resolve_tokenizer(options.tokenizer);
  train.vocabulary_note = "vocabulary " + std::to_string(vocabulary.size) + " from " + vocabulary.source;
  if (vocabulary.size != model.vocab_size) {
    train.vocabulary_note += " (the model " + model.name + " states " + std::to_string(model.vocab_size) + ")";
    model.vocab_size = vocabulary.size;
    validate_model_spec(model);
    validate_plan(model, plan);
  }
  // The report compares the plan's own schedule; its cluster is settled before training starts.
  std::optional<ClusterSpec> cluster;
  if (options.report) {
    if (train.pipeline_schedule_csv) {
      throw SpecError("--report",
                      "compares a run with the plan's own schedule; it cannot be combined with "
                      "--pipeline-schedule-csv (use --trace and `megaplan compare`)");
    }
    cluster = report_cluster(options, plan, job_cluster);
  }
  // Every rank times its actions (a launched pipeline's are gathered); rank 0 writes them.
  train.record_timeline = options.trace || options.report;
  return {model, plan, train, launch, options.device, cluster};
}

TrainSummary run_training(const PreparedTraining& run, std::ostream& out) {
  TrainOptions train = run.train;
  if (train.exit_signal_handler) install_stop_signal_handlers();
  // Under a launcher with --device cuda, this process trains its own rank over NCCL (world size 1
  // included, so a launched run always takes the path its larger runs take).
  const bool launched = run.launch.launcher != "none" && run.device == "cuda";
  if (run.device == "cuda") train.peak_flops_per_s = cuda_dense_bf16_peak_flops();
  if (launched) return train_launched(run.model, run.plan, train, run.launch, out);
  return train_in_process(run.model, run.plan, train, run.device, out);
}

}  // namespace megaplan::exec
