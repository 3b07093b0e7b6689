// A plan as the Megatron-LM command-line arguments that run it.
#pragma once

#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

// The model in pretrain_gpt.py's flags ("--num-layers 96", "--swiglu", ...), one argument (with
// its value) per entry, defaults written out (the FFN width, the position table) so the list does
// not depend on Megatron's defaults; the vocabulary is the tokenizer's (a note in megatron_arguments).
std::vector<std::string> megatron_model_arguments(const ModelSpec& model);

// The model's arguments, then "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 16",
// ... in pretrain_gpt.py's spelling: the layout, then the implementation options the simulation
// assumed (precision, transformer implementation, dropout, the fusions and overlaps that take
// effect). Notes ("# ...") come last: where the vocabulary comes from, and for a schedule Megatron-LM
// lacks (zero-bubble, V; torch.distributed.pipelining and torchtitan have them) torchtitan's setting.
std::vector<std::string> megatron_arguments(const ModelSpec& model, const ParallelPlan& plan);

// The arguments as text: the flags on one line, then each note on its own line.
std::string format_megatron_arguments(const std::vector<std::string>& arguments);

}  // namespace megaplan::planner
