// `megaplan profile [--out FILE] [--quick]`: times the executor's own kernels on GPU 0 through the
// CUDA backend (executor/runtime/kernel_profiler.h) and writes a measured megaplan-profile/1 file
// (profiles/README.md) for `simulate --profile` and `search --profile`: the GPU's datasheet rates
// and roofline for what the tables do not cover, the measured GEMM, attention and element-wise
// tables, and the provenance (device, SMs, memory clock, driver, CUDA, cuBLAS, NCCL, megaplan,
// date, command). Without a usable GPU it says so and exits 2. With --import-nccl-tests FILE... it
// times nothing: the files' collectives and send/receive times join their GPU's profile
// (simulator/nccl_tests.h), which needs no GPU here. Where two GPUs or more are visible it also
// times NCCL's collectives and send/receive over them, and compute beside each
// (executor/runtime/collective_profiler.h); --links-only times just those and adds them to a
// profile of the GPU (--profile FILE, else the built-in one). With --transfer-to GPU it times nothing either:
// a measured profile (--profile FILE, else the built-in one simulate would transfer) becomes a
// transferred profile of that GPU (simulator/profile_transfer.h).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "executor/runtime/collective_profiler.h"
#include "executor/runtime/kernel_profiler.h"

namespace megaplan::cli {

struct ProfileOptions {
  std::optional<std::string> out;  // default: the JSON on stdout
  bool quick = false;
  // --links-only: time no kernels, only the links (two GPUs or more), added to --profile or the
  // GPU's built-in measured profile.
  bool links_only = false;
  // --import-nccl-tests: nccl-tests outputs measured elsewhere, added to a profile of their GPU
  // (--profile FILE, else its built-in measured profile, else its datasheet) instead of timing here.
  std::vector<std::string> nccl_tests;
  std::optional<std::string> profile;
  std::optional<std::string> transfer_to;  // a preset GPU's name (A100-SXM4-80GB, ...)
};

int run_profile(const ProfileOptions& options, std::ostream& out);

// The profile file: `gpu`'s datasheet device rates and roofline, the measured tables, `source`
// and `provenance`. Checked by loading it as the simulator would (a failure is a bug here).
nlohmann::json measured_profile_json(const GpuSpec& gpu, const exec::MeasuredTables& tables, const std::string& source,
                                     const nlohmann::json& provenance);

// `profile` with the link tables measured on one host's GPUs (link "nvlink"): collectives as
// nccl-tests' bus bandwidth, send/receive pairs in seconds (replacing the entries of the same op,
// group size and link, as --import-nccl-tests does) and the `overlap` table, each op's compute
// slowdown (beside / alone - 1, at least 0).
nlohmann::json with_measured_links(nlohmann::json profile, const exec::CommTimings& timings, const std::string& device);

}  // namespace megaplan::cli
