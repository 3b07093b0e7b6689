// `megaplan convert`: checkpoints between megaplan's format and Hugging Face's.
//   --to hf --load CKPT --save HF_DIR [--dtype fp32|bf16] [--model-type llama|mistral|qwen2|gpt2]
//     the newest checkpoint under CKPT (any layout), its tensors joined, as config.json and
//     model.safetensors (executor/io/hf_checkpoint.h);
//   --to megaplan --load HF_DIR --save CKPT [--tp N --pp N --vpp N --schedule S ...] [--seed S]
//     a Hugging Face directory as a megaplan checkpoint laid out for that plan, weights only:
//     `train --load CKPT` with the same model then starts at iteration 1 with a fresh optimizer
//     (Megatron's --finetune).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "core/job_options.h"

namespace megaplan::exec {

struct ConversionRequest {
  std::string to;  // "hf" or "megaplan"
  std::string load, save;
  std::string dtype = "fp32";
  std::string model_type;  // default: from the architecture
  PlanOptions plan;        // --to megaplan: the layout to write
  uint64_t seed = 1234;    // --to megaplan: the data order a run from the checkpoint draws
};

// Throws SpecError naming the flag; says what it wrote on `out`.
void convert_checkpoint(const ConversionRequest& request, std::ostream& out);

}  // namespace megaplan::exec
