// `megaplan train`'s run from Megatron-LM's flags: the model and the plan resolved (plan flags, or a
// job file with the flags given beside it over it), Megatron's rules on the run's length and the
// launcher's world checked, the vocabulary chosen (executor/data/vocabulary.h); then the training
// on the CPU backend (device cpu) or on GPUs. A world of several ranks runs as threads of this
// process (in-process communicators), or, started by a launcher with device cuda, as one process
// per GPU over NCCL (executor/train/launched_training.h).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/job_options.h"
#include "executor/comm/launch_environment.h"
#include "executor/data/tokenizer.h"
#include "executor/train/trainer.h"

namespace megaplan::exec {

struct TrainRequest {
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
  TrainOptions train;
  // The tokenizer flags: none named (kind empty, no file) leaves the vocabulary to --vocab-size,
  // the job file or the data (executor/data/vocabulary.h).
  TokenizerOptions tokenizer;
};

// The run as it will start.
struct PreparedTraining {
  ModelSpec model;
  ParallelPlan plan;
  TrainOptions train;
  LaunchEnvironment launch;
  std::string device;
  std::optional<ClusterSpec> report_cluster;  // with --report: the GPUs its simulation assumes
};

// Everything checked before the run starts (the trainer's checks too); throws SpecError naming the
// flag.
PreparedTraining prepare_training(const TrainRequest& request);

// Trains: under a launcher with device cuda this process's rank over NCCL, else every rank here.
// The log goes to `out`.
TrainSummary run_training(const PreparedTraining& run, std::ostream& out);

}  // namespace megaplan::exec
