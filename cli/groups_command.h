// `megaplan groups`: prints the rank groups Megatron-LM builds for a layout (tp, pp, dp, cp, ep and
// their combinations, embedding groups), as a text table or as JSON.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace megaplan::cli {

struct GroupsOptions {
  int64_t world_size = 0;  // required on the command line
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t cp = 1;
  int64_t ep = 1;
  int64_t etp = 0;  // 0: tp
  std::string order = "tp-cp-ep-dp-pp";
  bool json = false;
};

// Writes the groups of every kind to `out`: with options.json one JSON object keyed by kind, each a
// list of rank lists; otherwise a header line and one line per kind. Returns the exit code (0).
// Bad sizes or order throw SpecError naming the flag.
int run_groups(const GroupsOptions& options, std::ostream& out);

}  // namespace megaplan::cli
