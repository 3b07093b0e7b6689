// `megaplan groups`' text output.
#include "reports/rank_groups_report.h"

#include <algorithm>
#include <string>

namespace megaplan {
namespace {

void write_group(const std::vector<int64_t>& group, std::ostream& out) {
  out << '[';
  for (size_t i = 0; i < group.size(); ++i) {
    if (i > 0) out << ", ";
    out << group[i];
  }
  out << ']';
}

}  // namespace

void write_rank_groups_text(const RankGroups& groups, std::ostream& out) {
  out << "Megatron rank groups for world " << groups.world_size << ": tp " << groups.tensor_parallel_size << ", pp "
      << groups.pipeline_parallel_size << ", cp " << groups.context_parallel_size << ", ep "
      << groups.expert_parallel_size;
  if (groups.expert_tensor_parallel_size != groups.tensor_parallel_size)
    out << ", etp " << groups.expert_tensor_parallel_size;
  out << ", dp " << groups.data_parallel_size << ", expert dp " << groups.expert_data_parallel_size << "; order";
  for (size_t i = 0; i < groups.order.size(); ++i) out << (i == 0 ? " " : "-") << groups.order[i];
  out << '\n';

  size_t name_width = 0;
  for (const auto& [kind, list] : groups.kinds) name_width = std::max(name_width, kind.size());
  for (const auto& [kind, list] : groups.kinds) {
    out << kind << std::string(name_width + 2 - kind.size(), ' ');
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out << ' ';
      write_group(list[i], out);
    }
    out << '\n';
  }
}

}  // namespace megaplan
