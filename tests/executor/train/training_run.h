// One training run for the equivalence tests: trains with its log file in the scratch directory
// and returns what the tests compare (the logged losses, the summary and the printed log).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "executor/train/trainer.h"
#include "tests/executor/train/training_fixtures.h"

namespace megaplan::test {

struct Outcome {
  std::vector<double> losses;          // as logged, one per iteration this run trained
  std::vector<double> gradient_norms;  // likewise
  exec::TrainSummary summary;
  std::string out;
};

// Validates `plan` first (a bad test layout fails here, not inside the ranks); the log file is
// scratch/name.jsonl.
inline Outcome train_logged(const ModelSpec& model, const ParallelPlan& plan, exec::TrainOptions options,
                            const ScratchDirectory& scratch, const std::string& name,
                            const exec::BackendFactory& backends,
                            const exec::InProcessMemoryFactory& memory = exec::make_in_process_cpu_memory) {
  validate_plan(model, plan);
  options.log_file = scratch.file(name + ".jsonl");
  std::ostringstream out;
  Outcome outcome;
  outcome.summary = exec::train(model, plan, options, backends, out, memory);
  outcome.losses = logged_losses(*options.log_file);
  outcome.gradient_norms = logged_iteration_values(*options.log_file, "grad_norm");
  outcome.out = out.str();
  return outcome;
}

}  // namespace megaplan::test
