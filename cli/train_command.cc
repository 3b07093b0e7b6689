#include "cli/train_command.h"

#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json_io.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/runtime/cuda_backend.h"

namespace megaplan::cli {

int run_train(const TrainCommandOptions& options, std::ostream& out) {
  exec::TrainOptions train = options.train;
  train.learning_rate.style = exec::parse_decay_style(options.lr_decay_style);
  ModelSpec model;
  if (options.plan_file) {
    const JobSpec job = job_spec_from_json(read_json_file(*options.plan_file), *options.plan_file);
    validate_job(job);
    if (job.plan.world_size() != 1) {
      throw SpecError("--plan", *options.plan_file + " lays the model over " + std::to_string(job.plan.world_size()) +
                                    " GPUs; this trainer runs one (tensor, pipeline and data parallelism come with "
                                    "the next executor issue)");
    }
    model = job.model;
    train.micro_batch_size = job.plan.micro_batch_size;
    train.global_batch_size = job.plan.global_batch_size;
  } else {
    model = resolve_model(options.model);
  }
  if (options.device != "cpu" && options.device != "cuda") {
    throw SpecError("--device", "must be cpu or cuda, got \"" + options.device + "\"");
  }
  std::unique_ptr<exec::Backend> backend;
  if (options.device == "cuda") {
    backend = exec::make_cuda_backend();
    train.peak_flops_per_s = exec::cuda_dense_bf16_peak_flops();
  } else {
    backend = std::make_unique<exec::CpuBackend>();
  }
  exec::train(model, train, *backend, out);
  return 0;
}

void setup_train_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<TrainCommandOptions>();
  CLI::App* command = app.add_subcommand("train", "Train a GPT (Megatron-LM's flags) on Megatron's indexed data");
  add_model_options(*command, options->model);
  exec::TrainOptions& t = options->train;
  command->add_option("--plan", options->plan_file, "Job file (search --out): model, micro and global batch");
  command->add_option("--device", options->device, "cpu or cuda")->capture_default_str();
  command->add_option("--data-path", t.data_path, "PREFIX of PREFIX.bin and PREFIX.idx")->required();
  command->add_option("--split", t.split, "Train, validation, test weights over documents")->capture_default_str();
  command->add_option("--train-iters", t.train_iters, "Iterations to train")->required();
  command->add_option("--exit-interval", t.exit_interval, "Stop (after a save) at a multiple of this");
  command->add_option("--mbs,--micro-batch-size", t.micro_batch_size, "Micro-batch size")->capture_default_str();
  command->add_option("--gbs,--global-batch-size", t.global_batch_size, "Global batch size")->capture_default_str();
  command->add_option("--lr", t.learning_rate.max_lr, "Peak learning rate")->capture_default_str();
  command->add_option("--min-lr", t.learning_rate.min_lr, "Learning rate after decay")->capture_default_str();
  command->add_option("--lr-warmup-iters", t.learning_rate.warmup_iterations, "Linear warm-up iterations");
  command->add_option("--lr-decay-iters", t.learning_rate.decay_iterations, "Decay iterations (default --train-iters)");
  command->add_option("--lr-decay-style", options->lr_decay_style, "constant, linear or cosine")->capture_default_str();
  command->add_option("--weight-decay", t.weight_decay, "AdamW weight decay (not on biases and norms)")->capture_default_str();
  command->add_option("--adam-beta1", t.adam_beta1, "Adam beta1")->capture_default_str();
  command->add_option("--adam-beta2", t.adam_beta2, "Adam beta2")->capture_default_str();
  command->add_option("--adam-eps", t.adam_eps, "Adam epsilon")->capture_default_str();
  command->add_option("--clip-grad", t.clip_grad, "Global gradient-norm clip (0: off)")->capture_default_str();
  command->add_option("--seed", t.seed, "Initialisation and data order")->capture_default_str();
  command->add_option("--eval-interval", t.eval_interval, "Iterations between validations")->capture_default_str();
  command->add_option("--eval-iters", t.eval_iters, "Global batches per validation")->capture_default_str();
  command->add_option("--log-interval", t.log_interval, "Iterations between log lines")->capture_default_str();
  command->add_option("--log-file", t.log_file, "Append one JSON object per logged iteration");
  command->add_option("--save", t.save, "Checkpoint directory");
  command->add_option("--save-interval", t.save_interval, "Iterations between checkpoints");
  command->add_option("--load", t.load, "Resume from the newest checkpoint here");
  command->callback([options, command, &context] {
    if (options->plan_file) {
      for (const CLI::Option* option : command->get_options()) {
        if (option->count() > 0 && option->get_group().rfind("Model", 0) == 0) {
          throw SpecError("--plan", "cannot be combined with " + option->get_name() + ": the job file holds the model");
        }
      }
    }
    context.exit_code = run_train(*options, context.out);
  });
}

}  // namespace megaplan::cli
