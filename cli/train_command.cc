#include "cli/train_command.h"

#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/data_command.h"
#include "cli/pasted_arguments.h"
#include "cli/report_command.h"
#include "core/device_gpu.h"
#include "core/error.h"
#include "core/json_io.h"
#include "core/notes.h"
#include "executor/comm/in_process_gpu_memory.h"
#include "executor/comm/launch_environment.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/vocabulary.h"
#include "executor/gpu_inventory.h"
#include "executor/io/staged_file.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/runtime/cuda_backend.h"
#include "executor/train/launched_training.h"
#include "executor/train/stop_signal.h"
#include "reports/chrome_trace.h"
#include "simulator/profile_choice.h"
#include "simulator/simulate_plan.h"

namespace megaplan::cli {

namespace {

// Every rank of the plan in this process: on the CPU, or as threads sharing GPU 0 (exact, and
// slow, since their work runs on one stream).
exec::TrainSummary train_in_process(const ModelSpec& model, const ParallelPlan& plan, const exec::TrainOptions& train,
                                    const std::string& device, std::ostream& out) {
  exec::BackendFactory make_backend;
  exec::InProcessMemoryFactory make_memory = exec::make_in_process_cpu_memory;
  if (device == "cuda") {
    const DType precision = plan.options.precision;
    make_backend = [precision](int64_t) { return exec::make_cuda_backend(precision); };
    make_memory = exec::make_in_process_gpu_memory;
  } else {
    make_backend = [](int64_t) -> std::unique_ptr<exec::Backend> { return std::make_unique<exec::CpuBackend>(); };
  }
  return exec::train(model, plan, train, make_backend, out, make_memory);
}

// Whether the tokenizer flags name a tokenizer (else the vocabulary comes from --vocab-size, the
// job file or the data).
bool tokenizer_named(const exec::TokenizerOptions& t) {
  return !t.kind.empty() || !t.megatron_type.empty() || !t.vocab_file.empty() || !t.merge_file.empty() ||
         !t.tokenizer_file.empty() || !t.tokenizer_model.empty();
}

// The vocabulary to train (executor/data/vocabulary.h), and the line that says where it came from.
exec::Vocabulary chosen_vocabulary(const TrainCommandOptions& options, const ModelSpec& model) {
  std::optional<exec::Vocabulary> given;
  if (options.plan_file) given = exec::Vocabulary{model.vocab_size, "the job file " + *options.plan_file};
  if (options.model.vocab_size) given = exec::Vocabulary{*options.model.vocab_size, "--vocab-size"};
  return exec::training_vocabulary(given,
                                   tokenizer_named(options.tokenizer) ? std::optional(options.tokenizer) : std::nullopt,
                                   options.train.data_path);
}

// The GPUs the report's simulation assumes: --cluster (its first plan.world_size() GPUs), else the
// job file's cluster, else as many of the GPU this process trains on as the plan has ranks.
ClusterSpec report_cluster(const TrainCommandOptions& options, const ParallelPlan& plan,
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

// The plan's report, simulated on `cluster`, with this run's last iteration as the measured timeline.
void write_training_report(const TrainCommandOptions& options, const ModelSpec& model, const ParallelPlan& plan,
                           const ClusterSpec& cluster, const exec::TrainSummary& summary, std::ostream& out) {
  const JobSpec job{model, cluster, plan};
  validate_job(job);
  const sim::Profile profile = sim::choose_profile(std::nullopt, cluster.gpu);
  PlanReport report = plan_report(job, profile, sim::simulate_plan(job, profile, /*record_timeline=*/true));
  report.measured = summary.timeline;
  report.measured_source =
      "iteration " + std::to_string(summary.last_iteration) + " of this run (" + options.device + ")";
  write_report(report, *options.report, out);
}

}  // namespace

int run_train(const TrainCommandOptions& options, std::ostream& out) {
  exec::TrainOptions train = options.train;
  train.learning_rate.style = exec::parse_decay_style(options.lr_decay_style);
  if (!options.rampup_batch_size.empty()) {
    const std::vector<int64_t>& ramp = options.rampup_batch_size;
    train.rampup = BatchRampup{ramp[0], ramp[1], ramp[2]};
  }
  if (options.device != "cpu" && options.device != "cuda") {
    throw SpecError("--device", "must be cpu or cuda, got \"" + options.device + "\"");
  }
  const exec::LaunchEnvironment launch = exec::detect_launch_environment();
  ModelSpec model;
  ParallelPlan plan;
  std::optional<ClusterSpec> job_cluster;
  std::optional<exec::Vocabulary> custom_vocabulary;  // a model of Megatron's flags alone: chosen before the model
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
  (void)exec::checked_train_options(train);
  exec::StageChunk::refuse_unsupported(model, plan);
  // Read once: the data's scan or the tokenizer's files (a custom model's was read above).
  const exec::Vocabulary vocabulary = custom_vocabulary ? *custom_vocabulary : chosen_vocabulary(options, model);
  // Recorded in the checkpoints, for `megaplan convert --to hf`.
  if (tokenizer_named(options.tokenizer)) train.tokenizer = exec::resolve_tokenizer(options.tokenizer);
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
  flush_notes(std::cerr);  // what was chosen for the run, before it starts
  if (train.exit_signal_handler) exec::install_stop_signal_handlers();
  // Under a launcher with --device cuda, this process trains its own rank over NCCL (world size 1
  // included, so a launched run always takes the path its larger runs take).
  const bool launched = launch.launcher != "none" && options.device == "cuda";
  // Every rank times its actions (a launched pipeline's are gathered); rank 0 writes them.
  train.record_timeline = options.trace || options.report;
  const bool writes_trace = options.trace && launch.rank == 0;
  if (options.device == "cuda") train.peak_flops_per_s = exec::cuda_dense_bf16_peak_flops();
  exec::TrainSummary summary;
  if (launched) {
    summary = exec::train_launched(model, plan, train, launch, out);
  } else {
    summary = train_in_process(model, plan, train, options.device, out);
  }
  if (writes_trace) {
    exec::write_file_atomically(
        *options.trace, timeline_to_chrome_trace(summary.timeline, JobSpec{model, ClusterSpec{}, plan}).dump() + "\n");
    out << "wrote the measured timeline of iteration " << summary.last_iteration << " to " << *options.trace << "\n";
  }
  if (options.report && launch.rank == 0) write_training_report(options, model, plan, *cluster, summary, out);
  return 0;
}

void setup_train_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<TrainCommandOptions>();
  CLI::App* command = app.add_subcommand("train", "Train a GPT (Megatron-LM's flags) on Megatron's indexed data");
  add_model_options(*command, options->model);
  add_plan_options(*command, options->plan);
  exec::TrainOptions& t = options->train;
  command->add_option("--plan", options->plan_file, "Job file (search --out): the model and the parallel plan");
  command->add_option("--trace", options->trace,
                      "Write the last iteration's measured timeline (every pipeline rank; under a launcher, rank 0's) "
                      "as a Chrome trace here");
  command->add_option(
      "--report", options->report,
      "Write the plan's HTML report here, the last iteration's measured timeline against the simulated one");
  command->add_option(
      "--cluster", options->cluster,
      "With --report: the GPUs to simulate on (preset or .json; default: the job file's, else this GPU)");
  command->add_option("--pipeline-schedule-csv", t.pipeline_schedule_csv,
                      "Run this compute-only torch schedule CSV instead of the plan's schedule");
  command->add_option("--world-size", options->world_size,
                      "Ranks (GPUs) of the run (default: the job's, the launcher's, or 1)");
  command
      ->add_option("--distributed-timeout-minutes", t.distributed_timeout_minutes,
                   "A rank that waits longer than this on another ends the run")
      ->capture_default_str();
  command->add_option("--ddp-bucket-size", t.ddp_bucket_size,
                      "Parameters per gradient bucket (default: Megatron's, max(40M, 1M x dp))");
  command->add_option("--device", options->device, "cpu or cuda")->capture_default_str();
  // Each --data-path replaces the one before, as argparse takes a repeated flag's last value.
  command
      ->add_option_function<std::vector<std::string>>(
          "--data-path",
          [options](const std::vector<std::string>& words) {
            options->train.data_path = exec::parse_data_blend(words);
          },
          "PREFIX of PREFIX.bin and PREFIX.idx; or Megatron's blends: PREFIX PREFIX ... (in proportion to their "
          "samples) or WEIGHT PREFIX WEIGHT PREFIX ...")
      ->trigger_on_parse()
      ->required();
  // Without --vocab-size, the vocabulary comes from the tokenizer named here, else from the data.
  options->tokenizer.kind.clear();
  add_tokenizer_options(*command, options->tokenizer);
  command->add_option("--split", t.split, "Train, validation, test weights over documents")->capture_default_str();
  command->add_option("--train-iters", t.train_iters, "Iterations to train (or --train-samples)");
  command->add_option(
      "--train-samples", t.train_samples,
      "Samples to train, Megatron's sample-based form: --train-samples / --global-batch-size iterations, "
      "the learning rate's lengths in samples");
  command
      ->add_option("--rampup-batch-size", options->rampup_batch_size,
                   "START INCREMENT SAMPLES: the global batch grows from START by INCREMENT in equal steps over "
                   "SAMPLES consumed samples (Megatron's ramp; --train-iters counts its iterations)")
      ->expected(3);
  command->add_option("--exit-interval", t.exit_interval, "Stop (after a save) at a multiple of this");
  command->add_flag("--exit-signal-handler", t.exit_signal_handler,
                    "On SIGTERM save and exit cleanly at the iteration's end; on SIGINT stop there without saving");
  command->add_option("--lr", t.learning_rate.max_lr, "Peak learning rate")->capture_default_str();
  command->add_option("--min-lr", t.learning_rate.min_lr, "Learning rate after decay")->capture_default_str();
  command->add_option("--lr-warmup-iters", t.learning_rate.warmup_iterations, "Linear warm-up iterations");
  command->add_option("--lr-decay-iters", t.learning_rate.decay_iterations, "Decay iterations (default --train-iters)");
  command->add_option("--lr-warmup-samples", t.learning_rate.warmup_samples,
                      "Linear warm-up samples (with --train-samples)");
  command->add_option("--lr-decay-samples", t.learning_rate.decay_samples,
                      "Decay samples (with --train-samples; default --train-samples)");
  command->add_option("--lr-warmup-fraction", t.learning_rate.warmup_fraction, "Warm-up as a share of the decay");
  command->add_option("--lr-decay-style", options->lr_decay_style, "constant, linear or cosine")->capture_default_str();
  command->add_option("--weight-decay", t.weight_decay, "AdamW weight decay (not on biases and norms)")
      ->capture_default_str();
  command->add_option("--adam-beta1", t.adam_beta1, "Adam beta1")->capture_default_str();
  command->add_option("--adam-beta2", t.adam_beta2, "Adam beta2")->capture_default_str();
  command->add_option("--adam-eps", t.adam_eps, "Adam epsilon")->capture_default_str();
  command->add_option("--clip-grad", t.clip_grad, "Global gradient-norm clip (0: off)")->capture_default_str();
  // Megatron's loss scaler (executor/train/loss_scaler.h): dynamic under --fp16, fixed with --loss-scale.
  command->add_option("--loss-scale", t.loss_scaling.constant,
                      "A fixed loss scale (any precision); without it --fp16 scales dynamically");
  command->add_option("--initial-loss-scale", t.loss_scaling.initial, "The dynamic loss scale's start")
      ->capture_default_str();
  command->add_option("--min-loss-scale", t.loss_scaling.minimum, "The dynamic loss scale's floor")
      ->capture_default_str();
  command
      ->add_option("--loss-scale-window", t.loss_scaling.window,
                   "Iterations without overflow before the dynamic loss scale doubles")
      ->capture_default_str();
  command
      ->add_option("--hysteresis", t.loss_scaling.hysteresis, "Overflows allowed before the dynamic loss scale halves")
      ->capture_default_str();
  command->add_option("--seed", t.seed, "Initialisation and data order")->capture_default_str();
  command
      ->add_option("--init-method-std", t.init_method_std,
                   "Standard deviation of the weights' normal initialisation (the output projections' divided by "
                   "sqrt(2 x layers))")
      ->capture_default_str();
  command->add_option("--eval-interval", t.eval_interval, "Iterations between validations")->capture_default_str();
  command->add_option("--eval-iters", t.eval_iters, "Global batches per validation")->capture_default_str();
  command->add_option("--log-interval", t.log_interval, "Iterations between log lines")->capture_default_str();
  command->add_option("--log-file", t.log_file, "Append one JSON object per logged iteration");
  command->add_option("--save", t.save, "Checkpoint directory");
  command->add_option("--save-interval,--persistent-save-interval", t.save_interval, "Iterations between checkpoints");
  command->add_option("--load", t.load, "Resume from the newest checkpoint here");
  accept_megatron_arguments(*command);
  command->callback([options, command, &context] {
    options->given = given_flags(*command);
    // The job file's model states the vocabulary (--vocab-size overrides it); a tokenizer beside
    // it would be ignored.
    for (const CLI::Option* option : command->get_options()) {
      if (options->plan_file && option->get_group() == "Tokenizer" && option->count() > 0) {
        throw SpecError("--plan", "cannot be combined with " + option->get_name() +
                                      ": the job file's model states the vocabulary (--vocab-size overrides it)");
      }
    }
    (void)read_pasted_arguments(*command, Computes::kRun);  // train reads its own tokenizer flags for the vocabulary
    // Not the other commands' default model: a run trains what it is told to.
    if (!options->plan_file && !options->model.model && !model_flags_given(options->model)) {
      throw SpecError("--model",
                      "train needs a model: a preset (megaplan presets), a model .json or a Hugging Face "
                      "config.json, Megatron's model flags (--num-layers, --hidden-size, ...), or a job "
                      "file (--plan)");
    }
    context.exit_code = run_train(*options, context.out);
  });
}

}  // namespace megaplan::cli
