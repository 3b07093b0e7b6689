// `megaplan train`: trains a GPT for real with Megatron-LM's flag names and any parallel plan
// (plan flags or a job file), on the CPU backend (--device cpu) or on GPUs. A world of several
// ranks runs as threads of this process (in-process communicators), or, started by a launcher with
// --device cuda, as one process per GPU over NCCL (executor/train/launched_training.h).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/shared_options.h"
#include "executor/data/tokenizer.h"
#include "executor/train/trainer.h"

namespace megaplan::cli {

struct TrainCommandOptions {
  ModelOptions model;
  PlanOptions plan;
  std::optional<int64_t> world_size;     // --world-size (default: the job file's, the launcher's, or 1)
  std::optional<std::string> plan_file;  // a job file (search --out, describe --out): its model and plan
  GivenFlags given;                      // model and plan flags given beside --plan: they override it
  std::optional<std::string> trace;      // --trace FILE: the last iteration's measured timeline
  // --report FILE: the plan's HTML report with the last iteration's measured timeline against the
  // simulated one, simulated on --cluster (else the job file's cluster, else this GPU's).
  std::optional<std::string> report;
  std::optional<std::string> cluster;
  std::string device = "cuda";
  std::string lr_decay_style = "linear";
  std::vector<int64_t> rampup_batch_size;  // --rampup-batch-size START INCREMENT SAMPLES
  exec::TrainOptions train;
  // The tokenizer flags: none named (kind empty, no file) leaves the vocabulary to --vocab-size,
  // the job file or the data (executor/data/vocabulary.h).
  exec::TokenizerOptions tokenizer;
};

int run_train(const TrainCommandOptions& options, std::ostream& out);

}  // namespace megaplan::cli
