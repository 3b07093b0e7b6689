// search --emit's outputs, the picked plan as: megatron (Megatron-LM's arguments), torchtitan (a config
// module for torchtitan.train) or launch (torchrun, srun, mpirun and megaplan launch lines of megaplan train on
// the job file). `job_file` is the job file --out writes, if given.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"

namespace megaplan {

// Throws SpecError("--emit") for another name, and for launch under another implementation than
// megaplan's (`implementation`, as --implementation names it).
void check_emit(const std::string& emit, const std::string& implementation);

// The emitted plan under its key of search --json.
void add_emitted_json(nlohmann::json& json, const std::string& emit, const JobSpec& job,
                      const std::optional<std::string>& job_file);

// The emitted plan after search's text; `picked` names the plan ("#1").
void write_emitted_text(const std::string& emit, const JobSpec& job, const std::string& picked,
                        const std::optional<std::string>& job_file, std::ostream& out);

}  // namespace megaplan
