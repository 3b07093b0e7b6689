// `megaplan train`: trains a GPT for real with Megatron-LM's flag names, on the CPU backend
// (--device cpu) or, with the CUDA trainer, on a GPU.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/shared_options.h"
#include "executor/train/trainer.h"

namespace megaplan::cli {

struct TrainCommandOptions {
  ModelOptions model;
  std::optional<std::string> plan_file;  // a job file (search --out, describe --out): its model and plan
  std::string device = "cuda";
  std::string lr_decay_style = "linear";
  exec::TrainOptions train;
};

int run_train(const TrainCommandOptions& options, std::ostream& out);

}  // namespace megaplan::cli
