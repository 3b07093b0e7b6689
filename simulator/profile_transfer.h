// Profiles for GPUs nobody measured: a measured GPU's tables carried over to another GPU's
// datasheet. What transfers is efficiency, not time: the target is assumed to reach the same
// fraction of its own datasheet peak at each shape as the measured GPU reached of its own.
//
// - GEMM and attention times scale by the ratio of the two dense bf16 peaks, corrected for wave
//   quantisation: a product tiles its output in 128 x 128 tiles (attention: 128 query rows per
//   head and sequence), and a GPU of S SMs runs ceil(tiles / S) waves, so the fraction of a last
//   wave that idles differs with S.
// - Memory-bound times scale by the ratio of the two HBM bandwidths.
// - Each time's first `kernel_launch_s` (the measured launch gap) is latency and does not scale.
// - Collective, p2p and overlap tables belong to the measured machine's links: they are dropped, and the
//   link model (the roofline's link fallback) costs links instead.
// The result says so: kind "transferred", `transferred_from` naming the measured GPU, its scales,
// and an uncertainty: the error measured when transferring between the H100 and H200 (one die,
// other memory) for GPUs of the same SM count and peak; the datasheet profiles' otherwise (not
// validated across architectures).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "simulator/profile.h"

namespace megaplan::sim {

// The largest iteration error seen when the H100's measured profile costed the H200's runs and
// the H200's the H100's (docs/results.md), rounded up.
inline constexpr double kSameDieTransferUncertainty = 0.04;

// The profile JSON (schema megaplan-profile/1) of `to` from `measured`, a measured profile of
// `from` read from `origin`. Throws SpecError naming `origin` when `measured` is not a profile of
// `from` or holds no measured table.
nlohmann::json transfer_profile(const nlohmann::json& measured, const std::string& origin, const GpuSpec& from,
                                const GpuSpec& to);

// The GPU whose built-in measured profile stands in for `to`'s: the measured GPU with the same SM
// count and peak if there is one, else the one whose peak is nearest. nullopt when none is built
// in or `to` has one of its own.
std::optional<GpuSpec> builtin_transfer_source(const GpuSpec& to);

// That GPU's built-in measured profile transferred to `to` (nullopt as above).
std::optional<Profile> builtin_transferred_profile(const GpuSpec& to);

}  // namespace megaplan::sim
