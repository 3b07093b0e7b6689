// `megaplan schedule`: generates a pipeline schedule (gpipe, 1f1b, interleaved, zb-h1, zbv,
// dualpipev), optionally lowered with sends, receives, REDUCE_GRAD and OPTIM, and prints it as a
// rank-by-rank listing with per-rank facts, as torch's CSV, or as JSON. With --import it reads a
// torch CSV instead; --check then only reports whether the schedule would run (no deadlock,
// matched messages, every F and backward once).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace megaplan::cli {

struct ScheduleOptions {
  std::string kind;            // required unless import_path is set
  int64_t pp = 0;              // required unless import_path is set
  int64_t microbatches = 0;    // required unless import_path is set
  std::optional<int64_t> vpp;  // default: 2 for zbv and dualpipev, else 1
  int64_t group_size = 0;      // interleaved only; 0 means pp
  bool lowered = false;
  std::string format = "text";  // text, csv or json
  std::string import_path;
  bool check = false;              // with import_path: print a verdict, not the schedule
  std::optional<std::string> out;  // write the output here (atomically) instead of `out`
};

// Throws SpecError for bad flags or a bad file, ScheduleError (with the marked grid) for a
// schedule that would hang or is incomplete. Returns the exit code (0).
int run_schedule(const ScheduleOptions& options, std::ostream& out);

}  // namespace megaplan::cli
