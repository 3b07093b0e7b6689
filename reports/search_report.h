// `megaplan search`'s outputs: the ranked plans as JSON (what `report --search` reads back) and as
// text (the counts, the ranking, the picked plan's code and profile, and --explain's comparison).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "planner/search.h"
#include "planner/search_space.h"
#include "simulator/profile.h"

namespace megaplan {

// One search as it ran: the job (its plan the picked one), the batch, how many plans were asked
// for, its wall time and threads, and the profile that costed it.
struct SearchRun {
  const JobSpec& job;
  int64_t global_batch_size = 0;
  int64_t top = 0;
  double seconds = 0;
  int64_t threads = 0;
  const sim::Profile& profile;
};

nlohmann::json search_json(const SearchRun& run, const planner::SearchResult& result,
                           const planner::SearchSpace& space);

// A plan of search_json's "plans" or "over_memory", read back (`report --search`) and checked by
// the rules the planner enforces for `model` on `gpus` GPUs: a valid layout of that world, and
// measures a simulation can give (a positive, finite iteration time and peak memory, terms and
// rates finite and non-negative, MFU at most 1). Throws SpecError("--search", "WHERE: ...").
ParallelPlan read_search_plan(const nlohmann::json& entry, const std::string& where, const ModelSpec& model,
                              int64_t gpus);

struct SearchTextOptions {
  bool compare = false;  // every candidate costed: the table alone
  bool explain = false;  // #1 against the best layout that differs in more than a switch
  std::string picked;    // "#1": the plan the code line describes
};
void write_search_text(const SearchRun& run, const planner::SearchResult& result, const SearchTextOptions& options,
                       std::ostream& out);

}  // namespace megaplan
