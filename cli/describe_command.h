// `megaplan describe`: resolve and validate one job (model, GPUs, plan) and print what it
// implies: padded vocabulary, parameters per pipeline rank and per GPU, FLOPs per iteration.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/shared_options.h"

namespace megaplan::cli {

struct DescribeOptions {
  ModelOptions model;
  ClusterOptions cluster;
  PlanOptions plan;
  std::optional<std::string> plan_file;  // a job JSON (as --out writes it) instead of flags
  GivenFlags given;                      // job flags given beside --plan: they override it (given_flags)
  std::optional<std::string> out;        // write the resolved job JSON here
  bool json = false;
};

int run_describe(const DescribeOptions& options, std::ostream& out);

}  // namespace megaplan::cli
