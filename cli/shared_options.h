// Option groups shared by subcommands: model flags, cluster flags and plan flags, defined once
// with Megatron-LM's flag names (and short aliases), bound to core's option structs
// (core/job_options.h, which maps them onto core's specs).
#pragma once

#include "core/job_options.h"

namespace CLI {
class App;
}

namespace megaplan::cli {

void add_model_options(CLI::App& command, ModelOptions& options);
void add_cluster_options(CLI::App& command, ClusterOptions& options);
void add_plan_options(CLI::App& command, PlanOptions& options);
// The flags under `group` ("Implementation (Megatron-LM flags)"), for plan options and search.
void add_implementation_options(CLI::App& command, ImplementationFlags& flags);

// The model, cluster, plan and implementation flags given on `command`. Call from the command's
// callback.
GivenFlags given_flags(const CLI::App& command);

}  // namespace megaplan::cli
