// `megaplan train`: flag mapping, the trace and the report; the run is
// executor/train/training_run.h's.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/data_command.h"
#include "cli/pasted_arguments.h"
#include "cli/report_command.h"
#include "cli/shared_options.h"
#include "core/error.h"
#include "core/notes.h"
#include "executor/data/data_blend.h"
#include "executor/io/staged_file.h"
#include "executor/train/training_run.h"
#include "reports/chrome_trace.h"
#include "simulator/profile_choice.h"
#include "simulator/simulate_plan.h"

namespace megaplan::cli {

namespace {

// The plan's report, simulated on the report's cluster, with this run's last iteration as the
// measured timeline.
void write_training_report(const exec::TrainRequest& options, const exec::PreparedTraining& run,
                           const exec::TrainSummary& summary, std::ostream& out) {
  const JobSpec job{run.model, *run.report_cluster, run.plan};
  validate_job(job);
  const sim::Profile profile = sim::choose_profile(std::nullopt, job.cluster.gpu);
  PlanReport report = plan_report(job, profile, sim::simulate_plan(job, profile, /*record_timeline=*/true));
  report.measured = summary.timeline;
  report.measured_source =
      "iteration " + std::to_string(summary.last_iteration) + " of this run (" + options.device + ")";
  write_report(report, *options.report, out);
}

int run_train(const exec::TrainRequest& options, std::ostream& out) {
  const exec::PreparedTraining run = exec::prepare_training(options);
  flush_notes(std::cerr);  // what was chosen for the run, before it starts
  const exec::TrainSummary summary = exec::run_training(run, out);
  // Every rank timed its actions (a launched pipeline's are gathered); rank 0 writes them.
  if (options.trace && run.launch.rank == 0) {
    exec::write_file_atomically(
        *options.trace,
        timeline_to_chrome_trace(summary.timeline, JobSpec{run.model, ClusterSpec{}, run.plan}).dump() + "\n");
    out << "wrote the measured timeline of iteration " << summary.last_iteration << " to " << *options.trace << "\n";
  }
  if (options.report && run.launch.rank == 0) write_training_report(options, run, summary, out);
  return 0;
}

}  // namespace

void setup_train_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<exec::TrainRequest>();
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
  command->add_option("--data-cache-path", t.data_cache_path,
                      "Folder of the sample indexes, built once and reused by later runs and every rank (default: "
                      "beside each dataset, PREFIX/cache/GPTDataset_indices, as Megatron-LM)");
  command->add_option("--num-dataset-builder-threads", t.dataset_builder_threads,
                      "Threads building a sample index (default: every core)");
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
  command->add_flag("--async-save", t.async_save,
                    "Write each checkpoint in the background while training goes on (published at the next save or "
                    "the end)");
  command->add_option("--checkpoint-threads", t.checkpoint_threads,
                      "Threads writing, reading and checksumming checkpoints (default: min(8, cores))");
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
    context.exit_code = run_train(*options, context.out);
  });
}

}  // namespace megaplan::cli
