// `megaplan devices`: lists the GPUs and the CUDA, cuBLAS, cuBLASLt and NCCL versions this process
// can use, and with --probe proves that this build runs a kernel and cuBLASLt on each GPU.
// Flag mapping; the outputs are executor/gpu_inventory_report.h's.
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "executor/gpu_inventory_report.h"

namespace megaplan::cli {
namespace {

struct DevicesOptions {
  bool json = false;   // one JSON object instead of the text table
  bool probe = false;  // run probe_device on every GPU and report the outcome per GPU
};

// Writes the inventory to `out`. Returns the exit code: 0, or 1 when --probe found a GPU that
// failed (the table says which and why). Throws SpecError (field "gpu") when no GPU is usable or
// the build has no CUDA: that is one line for the error boundary, not a table.
int run_devices(const DevicesOptions& options, std::ostream& out) {
  const GpuInventory inventory = query_gpu_inventory();
  const std::vector<ProbeOutcome> probes = options.probe ? probe_devices(inventory) : std::vector<ProbeOutcome>{};
  if (options.json) {
    out << gpu_inventory_json(inventory, probes).dump(2) << '\n';
  } else {
    write_gpu_inventory_text(inventory, probes, out);
  }
  for (const ProbeOutcome& outcome : probes) {
    if (!outcome.error.empty()) return 1;
  }
  return 0;
}

}  // namespace

void setup_devices_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<DevicesOptions>();
  CLI::App* command =
      app.add_subcommand("devices", "List the GPUs, CUDA, cuBLAS and NCCL versions this process can use");
  command->add_flag("--json", options->json, "Print one JSON object instead of a table");
  command->add_flag("--probe", options->probe,
                    "Run a kernel and a cuBLASLt GEMM on every GPU and report whether each worked");
  command->callback([options, &context] { context.exit_code = run_devices(*options, context.out); });
}

}  // namespace megaplan::cli
