// Megatron-LM's training arguments, every one of them, with what each does to a run and whether
// megaplan honours it: the one table the commands consult for any flag they do not define
// themselves, so nothing a Megatron user pastes is silently dropped.
//
// The rows are Megatron-LM core_r0.20.0's megatron/training/arguments.py (commit d98e8a6,
// 2026-08-22) as tools/megatron_arguments.py lists them (tests/data/megatron_arguments.tsv), each
// alias spelling a row of its own. A command meets a flag in one of three ways:
//   - it defines the flag itself (CLI11 parses it): honoured rows are defined by every command
//     they matter to (tests/cli/megatron_argument_table_test.cc checks this);
//   - the flag's row says it changes what this command computes (the run for `train`, the
//     iteration's cost for `simulate`, `search` and `describe`) and megaplan does not implement
//     it: refused in one line with the row's reason;
//   - anything else a Megatron script may hold (logging, a training flag given to a costing
//     command) is accepted and named once in a note.
// A word that is no Megatron-LM argument is refused with a did-you-mean.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace megaplan {

inline constexpr std::string_view kMegatronArgumentsVersion = "Megatron-LM core_r0.20.0 (d98e8a6)";

// How many values argparse takes after the flag.
enum class ArgumentArity { kSwitch, kOne, kList, kThree };

// What the flag changes when Megatron-LM runs with it.
enum class ArgumentEffect {
  kRunAndCost,  // the model, the layout, the arithmetic: both what is trained and how long it takes
  kRun,         // what is trained, not an iteration's time (learning rate, data, checkpoints)
  kCost,        // an iteration's time, not what is trained (overlaps, fusions, bucket sizes)
  kNothing,     // neither (logging, profiling, launcher services)
};

enum class ArgumentSupport {
  kHonoured,  // megaplan implements it: a flag of every command it matters to
  kCosmetic,  // accepted: no effect (with accepted_values, only those values)
  kRefused,   // not implemented: refused where it matters, with the reason
};

struct MegatronArgument {
  std::string_view flag;  // "--tensor-model-parallel-size"
  ArgumentArity arity;
  ArgumentEffect effect;
  ArgumentSupport support;
  // kRefused: why, as a clause ("FP8/FP4 training is not built yet (issue 41)"); kCosmetic with
  // accepted_values: what megaplan does instead.
  std::string_view reason;
  // kCosmetic only: the values megaplan's run already has, '|'-separated ("nccl"); empty: any.
  std::string_view accepted_values = {};
};

// Every row, in arguments.py's order.
std::span<const MegatronArgument> megatron_arguments();

// The row of `flag` ("--lr"), or nullptr when Megatron-LM has no such argument.
const MegatronArgument* find_megatron_argument(std::string_view flag);

// The flag a user most likely meant by `flag`, among Megatron-LM's arguments and `own_flags`:
// other tools' spellings of Megatron's flags (--tensor-parallel-size, --seq-len, --num-gpus) by a
// table, else the nearest by edit distance when it is close for the flag's length.
std::optional<std::string> nearest_megatron_flag(std::string_view flag, std::span<const std::string> own_flags);

// Whether `value` is one of the row's accepted values (always for rows without any).
bool accepts_value(const MegatronArgument& argument, std::string_view value);

}  // namespace megaplan
