// `megaplan convert`: flag mapping; the conversion is executor/io/checkpoint_conversion.h's.
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/shared_options.h"
#include "executor/io/checkpoint_conversion.h"

namespace megaplan::cli {

void setup_convert_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<exec::ConversionRequest>();
  CLI::App* command = app.add_subcommand(
      "convert", "Convert a megaplan checkpoint to a Hugging Face directory (config.json, safetensors), or back");
  command->add_option("--to", options->to, "hf or megaplan")->required();
  command->add_option("--load", options->load, "The checkpoint directory (--to hf) or Hugging Face directory")
      ->required();
  command->add_option("--save", options->save, "Where to write; must not exist or be empty")->required();
  command->add_option("--dtype", options->dtype, "--to hf: fp32 (every bit kept) or bf16")->capture_default_str();
  command->add_option("--model-type", options->model_type,
                      "--to hf: llama, mistral, qwen2 or gpt2 (default: from the architecture)");
  command->add_option("--seed", options->seed, "--to megaplan: the data order training from it draws")
      ->capture_default_str();
  add_plan_options(*command, options->plan);
  command->callback([options, &context] { exec::convert_checkpoint(*options, context.out); });
}

}  // namespace megaplan::cli
