// `megaplan profile`'s parts that run without a GPU: the kernel timings taken through the CPU
// backend on a tiny grid become a profile the simulator loads, whose lookups return the measured
// times at the measured points; and a bad spread is refused with the field named. Collectives timed
// over ranks as threads become link tables the same way.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/kernel_list.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/runtime/collective_profiler.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/runtime/kernel_profiler.h"
#include "simulator/profile.h"
#include "simulator/profile_writer.h"

namespace {

using megaplan::DType;
using megaplan::GemmEpilogue;
using megaplan::GemmLayout;
using megaplan::KernelKind;

megaplan::exec::ProfileGrid tiny_grid() {
  using megaplan::exec::ProfileSequence;
  const megaplan::Kernel forward = megaplan::gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, 8, 12, 16);
  const megaplan::Kernel norm = megaplan::row_kernel(KernelKind::kNormForward, 64, 16, true);
  megaplan::exec::ProfileGrid grid;
  // A training-order sequence (the forward GEMM listed twice, as the next layer's is), then kernels
  // alone; the forward GEMM and the norm appear in two sequences.
  grid.sequences = {
      ProfileSequence{
          {norm, forward, megaplan::gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kBiasGradient, 16, 8, 8),
           megaplan::attention_kernel(KernelKind::kAttentionForward, 1, 16, 2, 4),
           megaplan::attention_kernel(KernelKind::kAttentionBackward, 1, 16, 2, 4), forward},
          {}},
      // Grouped: two query heads share one key-value head.
      ProfileSequence{{megaplan::attention_kernel(KernelKind::kAttentionForward, 1, 16, 2, 4, 1),
                       megaplan::attention_kernel(KernelKind::kAttentionBackward, 1, 16, 2, 4, 1)},
                      {}},
      // A ring's unmasked block of 8 queries against 8 keys.
      ProfileSequence{
          {megaplan::attention_block_kernel(KernelKind::kAttentionBlockForward, 1, 8, 2, 4, 2, false, false),
           megaplan::attention_block_kernel(KernelKind::kAttentionBlockBackward, 1, 8, 2, 4, 2, false, false)},
          {}},
      ProfileSequence{{forward}, {}}, ProfileSequence{{norm}, {}},
      ProfileSequence{{megaplan::flat_kernel(KernelKind::kAdamw, 4096)}, {}}};
  megaplan::Kernel fp16 = forward;
  fp16.precision = DType::kFloat16;
  grid.sequences.push_back({{fp16}, {}});                             // the CPU backend has no fp16 GEMMs: skipped
  for (auto& sequence : grid.sequences) sequence.warmup_seconds = 0;  // one pass
  grid.min_repetitions = 3;
  grid.max_repetitions = 3;
  return grid;
}

}  // namespace

TEST_CASE("kernel timings from a backend become a profile the simulator looks up", "[cli][profile]") {
  megaplan::exec::CpuBackend backend;
  int64_t last_done = 0, last_total = 0;
  const megaplan::MeasuredTables tables =
      megaplan::exec::measure_kernels(backend, tiny_grid(), [&](int64_t done, int64_t total) {
        CHECK(done == last_done + 1);
        last_done = done;
        last_total = total;
      });
  CHECK(last_done == 7);  // one step per sequence, the skipped one too
  CHECK(last_total == 7);
  CHECK(tables.mark_seconds >= 0);
  REQUIRE(tables.attention.size() == 3);  // by GQA ratio too, and the ring's block apart
  CHECK(tables.attention[0].at("batch_heads") == 2);
  CHECK(tables.attention[0].at("gqa_ratio") == 1);
  CHECK(tables.attention[1].at("gqa_ratio") == 2);
  CHECK(!tables.attention[1].contains("ring_block"));
  CHECK(tables.attention[2].at("ring_block") == true);
  CHECK(tables.attention[2].at("causal") == false);
  CHECK(tables.attention[2].at("seq") == 8);
  REQUIRE(tables.gemm.size() == 2);  // one entry per kernel, from every sequence it ran in
  CHECK(tables.gemm[0].at("layout") == "forward");
  CHECK(tables.gemm[0].at("dtype") == "fp32");  // the CPU backend computes in fp32
  CHECK(tables.gemm[1].at("layout") == "weight_gradient");
  CHECK(tables.gemm[1].at("epilogue") == "bias_gradient");
  REQUIRE(tables.kernels.size() == 2);
  CHECK(tables.kernels[0].at("kernel") == "add_norm_forward");
  // AdamW moves 7 fp32 words and writes the compute copy (fp32 here) per parameter.
  CHECK(tables.kernels[1].at("kernel") == "adamw");
  CHECK(tables.kernels[1].at("bytes") == 4096 * (7 * 4 + 4));

  const megaplan::GpuSpec gpu = megaplan::cluster_preset("h100-x1").gpu;
  const nlohmann::json json =
      megaplan::sim::measured_profile_json(gpu, tables, "measured: test", {{"device", "the CPU backend"}});
  const megaplan::sim::Profile profile = megaplan::sim::Profile::from_json(json, "test.json");
  CHECK(profile.gpu_name() == gpu.name);
  megaplan::sim::CostSources sources;
  CHECK(profile.gemm_seconds(8, 12, 16, DType::kFloat32, sources) == tables.gemm[0].at("seconds").get<double>());
  CHECK(profile.attention_forward_seconds(2, 16, 4, true, 1, false, sources) ==
        tables.attention[0].at("forward_s").get<double>());
  CHECK(profile.attention_backward_seconds(2, 16, 4, true, 2, false, sources) ==
        tables.attention[1].at("backward_s").get<double>());
  CHECK(profile.gemm_seconds(GemmLayout::kWeightGradient, GemmEpilogue::kBiasGradient, 16, 8, 8, DType::kFloat32,
                             sources) == tables.gemm[1].at("seconds").get<double>());
  CHECK(profile.memory_kernel_seconds("adamw", 4096 * 32, sources) ==
        Approx(tables.kernels[1].at("seconds").get<double>()));
  CHECK(profile.kernel_seconds(
            megaplan::attention_block_kernel(KernelKind::kAttentionBlockBackward, 1, 8, 2, 4, 2, false, false),
            sources) == tables.attention[2].at("backward_s").get<double>());
  CHECK(sources.table == 6);
  CHECK(sources.fallback == 0);
  // No bf16 entries: bf16 GEMMs take the datasheet roofline.
  (void)profile.gemm_seconds(8, 12, 16, DType::kBFloat16, sources);
  CHECK(sources.fallback == 1);

  nlohmann::json bad = json;
  bad["gemm"][1]["spread"] = -0.5;
  CHECK_THROWS_WITH(megaplan::sim::Profile::from_json(bad, "bad.json"),
                    Catch::Matchers::Contains("bad.json: gemm[1]: spread: must be a number >= 0"));
  bad = json;
  bad["provenance"] = "a string";
  CHECK_THROWS_WITH(megaplan::sim::Profile::from_json(bad, "bad.json"),
                    Catch::Matchers::Contains("bad.json: provenance: must be an object"));
}

TEST_CASE("the full profile grid times attention at the ratios it names, at half-octave batch-heads",
          "[cli][profile]") {
  std::set<int64_t> ratios, batch_heads;
  for (const auto& sequence : megaplan::exec::profile_grid(false).sequences) {
    if (sequence.kernels.size() != 2 || sequence.kernels[0].kind != KernelKind::kAttentionForward) continue;
    ratios.insert(megaplan::gqa_ratio(sequence.kernels[0]));
    batch_heads.insert(sequence.kernels[0].batch * sequence.kernels[0].heads);
  }
  // 12 batch-heads in groups of 8 would have been timed as one 12:1 kernel, a table of its own.
  CHECK(ratios == std::set<int64_t>{1, 4, 8});
  CHECK(batch_heads == std::set<int64_t>{8, 12, 16, 24, 32, 48, 64, 96, 128});
}

TEST_CASE("the profile grid times every MoE kernel class the lists use", "[cli][profile]") {
  std::set<std::string> classes;
  for (const auto& sequence : megaplan::exec::profile_grid(true).sequences) {
    for (const megaplan::Kernel& kernel : sequence.kernels) classes.insert(megaplan::memory_kernel_class(kernel));
  }
  for (const char* name : {"moe_top_k", "moe_top_k_backward", "moe_dispatch", "moe_permute", "moe_permute_backward",
                           "moe_combine", "moe_combine_backward", "moe_aux_counts", "moe_switch_loss",
                           "moe_switch_loss_gradient", "moe_sequence_aux_loss", "moe_sequence_aux_loss_gradient",
                           "moe_z_loss", "moe_z_loss_gradient", "sigmoid_gated_add", "sigmoid_gated_add_backward",
                           "moe_update_expert_bias"}) {
    INFO(name);
    CHECK(classes.count(name) == 1);
  }
}

TEST_CASE("the profile grid times each cell's microbatch in training order and other kernels alone", "[cli][profile]") {
  const megaplan::exec::ProfileGrid grid = megaplan::exec::profile_grid(true);
  REQUIRE(grid.sequences.size() > 6);
  // Cells: 2 token counts x 3 widths, no tensor-parallel shards; the first is 2048 tokens of width 768.
  const std::vector<megaplan::Kernel>& cell = grid.sequences[0].kernels;
  CHECK(cell.front().kind == KernelKind::kEmbeddingForward);
  CHECK(cell.back().kind == KernelKind::kEmbeddingBackward);
  CHECK(cell.front().rows == 2048);
  CHECK(grid.sequences[0].table.seq == 1024);
  CHECK(grid.sequences[0].warmup_seconds > grid.sequences.back().warmup_seconds);  // cells settle longer
  const auto position = [&](KernelKind kind) {
    return std::find_if(cell.begin(), cell.end(), [&](const megaplan::Kernel& k) { return k.kind == kind; }) -
           cell.begin();
  };
  CHECK(position(KernelKind::kAttentionForward) < position(KernelKind::kCrossEntropyForward));
  CHECK(std::count_if(cell.begin(), cell.end(), [](const megaplan::Kernel& k) {
          return k.kind == KernelKind::kAttentionForward;
        }) == 12);  // GPT-2's twelve layers
  CHECK(position(KernelKind::kCrossEntropyBackward) < position(KernelKind::kAttentionBackward));
  // The same microbatch with Megatron's fp16 GEMMs follows.
  std::vector<megaplan::Kernel> fp16 = grid.sequences[1].kernels;
  REQUIRE(fp16.size() == cell.size());
  for (std::size_t i = 0; i < fp16.size(); ++i) {
    CHECK(fp16[i].precision == (cell[i].kind == KernelKind::kGemm ? DType::kFloat16 : DType::kBFloat16));
    fp16[i].precision = cell[i].precision;
  }
  CHECK(fp16 == cell);
  // Width 2048 has heads of 128 over 2048-token sequences.
  const std::vector<megaplan::Kernel>& wide = grid.sequences[2].kernels;
  const auto attention = std::find_if(
      wide.begin(), wide.end(), [](const megaplan::Kernel& k) { return k.kind == KernelKind::kAttentionForward; });
  REQUIRE(attention != wide.end());
  CHECK(attention->head_dim == 128);
  CHECK(attention->seq == 2048);
  // A kernel timed in a cell is not timed alone again.
  std::set<std::string> in_cells;
  for (const auto& sequence : grid.sequences) {
    if (sequence.kernels.size() < 3) break;  // the cells come first
    for (const megaplan::Kernel& k : sequence.kernels) in_cells.insert(megaplan::describe(k));
  }
  int alone = 0;
  for (const auto& sequence : grid.sequences) {
    if (sequence.kernels.size() != 1) continue;
    ++alone;
    INFO(megaplan::describe(sequence.kernels[0]));
    CHECK(in_cells.count(megaplan::describe(sequence.kernels[0])) == 0);
  }
  CHECK(alone > 0);
  // The ring's kernels around its blocks, alone (the cells run at cp 1).
  std::set<KernelKind> ring_kinds;
  for (const auto& sequence : grid.sequences) {
    if (sequence.kernels.size() == 1) ring_kinds.insert(sequence.kernels[0].kind);
  }
  for (const KernelKind kind :
       {KernelKind::kPackKeyValues, KernelKind::kUnpackKeyValueGradients, KernelKind::kZero, KernelKind::kConvert}) {
    CHECK(ring_kinds.count(kind) == 1);
  }
  // A Llama cell: RMSNorm, SwiGLU and the rotary embedding in training order, grouped attention.
  const auto llama = std::find_if(grid.sequences.begin(), grid.sequences.end(), [](const auto& sequence) {
    return std::any_of(sequence.kernels.begin(), sequence.kernels.end(),
                       [](const megaplan::Kernel& k) { return k.kind == KernelKind::kSwigluForward; });
  });
  REQUIRE(llama != grid.sequences.end());
  std::set<KernelKind> kinds;
  for (const megaplan::Kernel& k : llama->kernels) {
    kinds.insert(k.kind);
    if (k.kind == KernelKind::kAttentionForward) CHECK(megaplan::gqa_ratio(k) == 4);
  }
  for (const KernelKind kind : {KernelKind::kRmsNormForward, KernelKind::kRmsNormBackward, KernelKind::kSwigluBackward,
                                KernelKind::kRotary, KernelKind::kAttentionBackward}) {
    CHECK(kinds.count(kind) == 1);
  }
  CHECK(llama->table.vocabulary == 128256);
  // The attention grid, multi-head and grouped.
  std::set<int64_t> ratios;
  for (const auto& sequence : grid.sequences) {
    if (sequence.kernels.size() == 2 && sequence.kernels[0].kind == KernelKind::kAttentionForward) {
      ratios.insert(megaplan::gqa_ratio(sequence.kernels[0]));
    }
  }
  CHECK(ratios == std::set<int64_t>{1, 4});
  // The ring's blocks, on the diagonal and unmasked, forward then backward.
  std::set<std::pair<int64_t, bool>> blocks;
  for (const auto& sequence : grid.sequences) {
    if (sequence.kernels.size() == 2 && sequence.kernels[0].kind == KernelKind::kAttentionBlockForward) {
      CHECK(sequence.kernels[1].kind == KernelKind::kAttentionBlockBackward);
      blocks.emplace(sequence.kernels[0].seq, sequence.kernels[0].diagonal);
    }
  }
  CHECK(blocks == std::set<std::pair<int64_t, bool>>{
                      {128, false}, {128, true}, {1024, false}, {1024, true}, {4096, false}, {4096, true}});
}

namespace {

// Four ranks as threads over the in-process communicator, on the CPU backend: group sizes 2 and 4,
// two sizes, a small GEMM beside.
megaplan::exec::CollectiveGrid tiny_collective_grid() {
  megaplan::exec::CollectiveGrid grid;
  grid.group_sizes = {2, 4};
  grid.bytes = {4096, 65536};
  grid.compute = {megaplan::gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, 32, 32, 32)};
  grid.overlap_bytes = 4096;
  grid.min_repetitions = 3;
  grid.max_repetitions = 3;
  return grid;
}

std::vector<megaplan::CommTimings> measure_on_threads(const megaplan::exec::CollectiveGrid& grid,
                                                      std::vector<std::pair<int64_t, int64_t>>& progress) {
  constexpr int64_t kRanks = 4;
  megaplan::exec::InProcessWorld world(kRanks, std::chrono::seconds(60));
  std::vector<megaplan::CommTimings> timings(kRanks);
  std::mutex progress_mutex;
  megaplan::exec::run_rank_threads(world, kRanks, [&](int64_t rank) {
    megaplan::exec::CpuBackend backend;
    const megaplan::exec::GroupMaker make_group = [&](const std::vector<int64_t>& ranks, const std::string& label) {
      const bool member = std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
      return member ? world.group(rank, ranks, label) : nullptr;
    };
    timings[static_cast<std::size_t>(rank)] =
        megaplan::exec::measure_collectives(backend, rank, kRanks, make_group, grid, [&](int64_t done, int64_t total) {
          if (rank != 0) return;
          const std::lock_guard<std::mutex> lock(progress_mutex);
          progress.emplace_back(done, total);
        });
  });
  return timings;
}

}  // namespace

TEST_CASE("collective timings from ranks as threads become link tables the simulator looks up", "[cli][profile]") {
  using megaplan::CollectiveOp;
  std::vector<std::pair<int64_t, int64_t>> progress;
  const std::vector<megaplan::CommTimings> timings = measure_on_threads(tiny_collective_grid(), progress);
  const megaplan::CommTimings& measured = timings[0];
  // Rank 0 reports: four collectives (all-to-all among them) x two groups x two sizes; send/receive
  // at two sizes; compute beside each of the five.
  REQUIRE(measured.collectives.size() == 16);
  REQUIRE(measured.p2p.size() == 2);
  REQUIRE(measured.overlap.size() == 5);
  for (std::size_t rank = 1; rank < timings.size(); ++rank) {
    CHECK(timings[rank].collectives.empty());
    CHECK(timings[rank].overlap.empty());
  }
  std::set<std::tuple<CollectiveOp, int64_t, int64_t>> points;
  for (const auto& timing : measured.collectives) {
    CHECK(timing.seconds > 0);
    points.emplace(timing.op, timing.group_size, timing.bytes);
  }
  CHECK(points.size() == 16);
  for (const auto& beside : measured.overlap) {
    CHECK(beside.compute_alone_s > 0);
    CHECK(beside.compute_beside_s > 0);
    CHECK(beside.collective_alone_s > 0);
    CHECK(beside.collective_beside_s > 0);
    CHECK(beside.group_size == (beside.op == CollectiveOp::kSendRecv ? 2 : 4));
  }
  REQUIRE(!progress.empty());
  CHECK(progress.back().first == progress.back().second);
  CHECK(std::is_sorted(progress.begin(), progress.end()));

  // In the profile: the simulator's lookup at a measured point gives the measured time back.
  const megaplan::GpuSpec gpu = megaplan::cluster_preset("dgx-h100").gpu;
  const nlohmann::json profile_json = megaplan::sim::with_measured_links(
      megaplan::sim::measured_profile_json(gpu, {}, "test", nlohmann::json::object()), measured,
      "NVIDIA H100 80GB HBM3");
  const auto profile = megaplan::sim::Profile::from_json(profile_json, "measured");
  CHECK(profile.kind() == megaplan::sim::ProfileKind::kMeasured);
  megaplan::sim::CostSources sources;
  const megaplan::sim::LinkParams unused{1, 1};
  for (const auto& timing : measured.collectives) {
    CHECK(profile.collective_seconds(timing.op, timing.group_size, timing.bytes, megaplan::sim::LinkKind::kNvlink,
                                     unused, sources) == Approx(timing.seconds));
  }
  for (const auto& timing : measured.p2p) {
    CHECK(profile.p2p_seconds(timing.bytes, megaplan::sim::LinkKind::kNvlink, unused, sources) ==
          Approx(timing.seconds));
  }
  CHECK(sources.fallback == 0);
  CHECK(profile_json.at("overlap").size() == 5);
}

TEST_CASE("link tables: nccl-tests' bus bandwidth, p2p seconds and both slowdowns, at least 0", "[cli][profile]") {
  using megaplan::CollectiveOp;
  megaplan::CommTimings timings;
  timings.collectives = {{CollectiveOp::kAllReduce, 8, 1 << 20, 1e-4}, {CollectiveOp::kAllGather, 4, 1 << 20, 2e-5}};
  timings.p2p = {{CollectiveOp::kSendRecv, 2, 1 << 20, 5e-6}};
  timings.overlap = {{CollectiveOp::kAllReduce, 8, 1e-3, 1.25e-3, 2e-3, 3e-3},
                     {CollectiveOp::kSendRecv, 2, 1e-3, 0.99e-3, 1e-3, 0.9e-3}};
  const megaplan::GpuSpec gpu = megaplan::cluster_preset("dgx-h100").gpu;
  const nlohmann::json profile = megaplan::sim::with_measured_links(
      megaplan::sim::measured_profile_json(gpu, {}, "test", nlohmann::json::object()), timings,
      "NVIDIA H100 80GB HBM3");
  const nlohmann::json& collectives = profile.at("collectives");
  REQUIRE(collectives.size() == 2);
  for (const nlohmann::json& entry : collectives) {
    CHECK(entry.at("link") == "nvlink");
    CHECK(entry.at("bytes") == 1 << 20);
    if (entry.at("op") == "all_reduce") {
      CHECK(entry.at("group_size") == 8);
      CHECK(entry.at("bus_bandwidth_bytes_per_s").get<double>() == Approx((1 << 20) * 2 * 7.0 / 8 / 1e-4));
    } else {
      CHECK(entry.at("op") == "all_gather");
      CHECK(entry.at("bus_bandwidth_bytes_per_s").get<double>() == Approx((1 << 20) * 3.0 / 4 / 2e-5));
    }
  }
  CHECK(profile.at("p2p") == nlohmann::json::parse(R"([{"link": "nvlink", "bytes": 1048576, "seconds": 5e-6}])"));
  const nlohmann::json& overlap = profile.at("overlap");
  REQUIRE(overlap.size() == 2);
  CHECK(overlap[0].at("op") == "all_reduce");
  CHECK(overlap[0].at("compute_slowdown").get<double>() == Approx(0.25));
  CHECK(overlap[0].at("collective_slowdown").get<double>() == Approx(0.5));
  CHECK(overlap[1].at("op") == "send_recv");
  CHECK(overlap[1].at("compute_slowdown") == 0.0);  // faster beside is noise, not a speed-up
  CHECK(overlap[1].at("collective_slowdown") == 0.0);
}

TEST_CASE("links measured on a larger machine join a profile's smaller groups, replacing the sizes measured",
          "[cli][profile]") {
  // What `profile --links-only` does to the built-in profile: the two-GPU tables of an earlier
  // machine stay beside four-GPU ones; a group size measured again is replaced, not duplicated.
  using megaplan::CollectiveOp;
  const megaplan::GpuSpec gpu = megaplan::cluster_preset("dgx-h100").gpu;
  megaplan::CommTimings two;
  two.collectives = {{CollectiveOp::kAllReduce, 2, 1 << 20, 1e-4}};
  two.p2p = {{CollectiveOp::kSendRecv, 2, 1 << 20, 5e-6}};
  two.overlap = {{CollectiveOp::kAllReduce, 2, 1e-3, 1.2e-3, 1e-3, 1.5e-3}};
  const nlohmann::json before = megaplan::sim::with_measured_links(
      megaplan::sim::measured_profile_json(gpu, {}, "test", nlohmann::json::object()), two, "NVIDIA H100 80GB HBM3");
  megaplan::CommTimings four;
  four.collectives = {{CollectiveOp::kAllReduce, 2, 1 << 20, 2e-4}, {CollectiveOp::kAllReduce, 4, 1 << 20, 3e-4}};
  four.p2p = {{CollectiveOp::kSendRecv, 2, 1 << 20, 6e-6}};
  four.overlap = {{CollectiveOp::kAllReduce, 4, 1e-3, 1.3e-3, 1e-3, 1.6e-3}};
  const nlohmann::json after = megaplan::sim::with_measured_links(before, four, "NVIDIA H100 80GB HBM3");
  std::map<int64_t, double> bus;
  for (const nlohmann::json& entry : after.at("collectives")) {
    CHECK(
        bus.emplace(entry.at("group_size").get<int64_t>(), entry.at("bus_bandwidth_bytes_per_s").get<double>()).second);
  }
  REQUIRE(bus.size() == 2);
  CHECK(bus.at(2) == Approx((1 << 20) * 2 * 1.0 / 2 / 2e-4));  // the new two-GPU measurement
  CHECK(bus.at(4) == Approx((1 << 20) * 2 * 3.0 / 4 / 3e-4));
  REQUIRE(after.at("p2p").size() == 1);
  CHECK(after.at("p2p")[0].at("seconds") == 6e-6);
  const nlohmann::json& overlap = after.at("overlap");
  REQUIRE(overlap.size() == 2);
  std::map<int64_t, double> slowdown;
  for (const nlohmann::json& entry : overlap) {
    slowdown[entry.at("group_size").get<int64_t>()] = entry.at("compute_slowdown").get<double>();
  }
  CHECK(slowdown.at(2) == Approx(0.2));
  CHECK(slowdown.at(4) == Approx(0.3));
  (void)megaplan::sim::Profile::from_json(after, "merged");  // the simulator loads it
}

TEST_CASE("a collective grid the world cannot run is refused", "[cli][profile]") {
  megaplan::exec::CollectiveGrid grid = tiny_collective_grid();
  std::vector<std::pair<int64_t, int64_t>> progress;
  grid.group_sizes = {2, 8};
  CHECK_THROWS_WITH(measure_on_threads(grid, progress), "measure_collectives: group sizes must lie in 2 .. 4");
  grid = tiny_collective_grid();
  grid.bytes = {4098};
  CHECK_THROWS_WITH(measure_on_threads(grid, progress),
                    "measure_collectives: 4098 bytes is not a positive multiple of 2 x 4");
  CHECK_THROWS_WITH(megaplan::exec::collective_grid(true, 1), "collective_grid: needs two ranks or more");
  const megaplan::exec::CollectiveGrid full = megaplan::exec::collective_grid(false, 8);
  CHECK(full.group_sizes == std::vector<int64_t>{2, 4, 8});
  CHECK(full.bytes.front() == 65536);
  CHECK(full.bytes.back() == int64_t{1} << 30);
  CHECK(!full.compute.empty());
}
