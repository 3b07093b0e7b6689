// `megaplan groups`' text output: a header line with the sizes and the order, then one line per
// group kind, each group's ranks in brackets (the JSON is core's rank_groups_to_json).
#pragma once

#include <ostream>

#include "core/rank_groups.h"

namespace megaplan {

void write_rank_groups_text(const RankGroups& groups, std::ostream& out);

}  // namespace megaplan
