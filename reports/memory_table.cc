#include "reports/memory_table.h"

#include "core/text_table.h"
#include "core/units.h"

namespace megaplan {

std::string memory_table(const std::vector<PipelineRankMemory>& memory) {
  const auto gib = [](int64_t bytes) { return gib_number(static_cast<double>(bytes)); };
  TextTable table(
      {"rank", "weights", "gradients", "optimizer", "activations", "transient", "allocator", "reserve", "total GiB"});
  for (const PipelineRankMemory& rank : memory) {
    table.add_row({std::to_string(rank.pipeline_rank), gib(rank.weight_bytes), gib(rank.gradient_bytes),
                   gib(rank.optimizer_bytes), gib(rank.activation_bytes), gib(rank.transient_bytes),
                   gib(rank.allocator_overhead_bytes), gib(rank.runtime_reserve_bytes), gib(rank.total_bytes)});
  }
  return table.render();
}

}  // namespace megaplan
