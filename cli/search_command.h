// `megaplan search`: every legal layout of a model on a cluster at a global batch size, pruned by
// the memory model and ranked by simulated iteration time; a table, JSON, the best plan as a job
// file, Megatron-LM's arguments for it, and why it beats the runner-up.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/shared_options.h"

namespace megaplan::cli {

struct SearchCommandOptions {
  ModelOptions model;
  ClusterOptions cluster;
  bool cluster_given = false;  // without --cluster and --gpus: the embedded default, 1024 A100-80GB
  int64_t global_batch_size = 1536;
  // Lists (a pin is a list of one); empty leaves the dimension free.
  std::vector<int64_t> tensor_parallel, pipeline_parallel, context_parallel, virtual_pipeline, layers_per_virtual_stage,
      micro_batch;
  std::vector<std::string> recompute, schedules;
  bool recompute_activations = false;  // Megatron's alias: selective recomputation pinned
  bool sequence_parallel = false, no_sequence_parallel = false;
  bool distributed_optimizer = false, no_distributed_optimizer = false;
  bool allow_cross_node_tensor_parallel = false;
  ImplementationFlags implementation;
  int64_t top = 10;
  double memory_fraction = 0.9;
  int64_t threads = 0;
  std::optional<std::string> profile;
  std::optional<std::string> out;     // the picked plan (the best by default) as a job file (atomically)
  bool compare = false;               // --compare: every candidate costed, fitting or not, no pruning
  int64_t pick = 1;                   // --pick K: the ranked plan --out, --report and --emit take (1-based)
  std::optional<std::string> report;  // the best plan's HTML report, the ranked plans beside it
  std::optional<std::string> emit;    // "megatron" or "launch"
  bool explain = false;
  bool json = false;
};

int run_search(const SearchCommandOptions& options, std::ostream& out);

}  // namespace megaplan::cli
