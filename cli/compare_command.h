// `megaplan compare --simulated S.json --measured M.json`: a simulated timeline (`simulate
// --trace`) against a measured one (`train --trace`) of the same plan: per pipeline rank and action
// kind, the predicted and measured time per action and the error, each rank's span, the iteration
// time's error, and whether each rank ran its compute actions in the simulated order. `--json`
// prints the same as JSON.
#pragma once

#include <ostream>
#include <string>

namespace megaplan::cli {

struct CompareOptions {
  std::string simulated;  // Chrome trace files, as megaplan writes them
  std::string measured;
  bool json = false;
};

int run_compare(const CompareOptions& options, std::ostream& out);

}  // namespace megaplan::cli
