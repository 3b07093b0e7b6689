// Implementation options: each implementation's defaults, Megatron's conditions on its flags, the
// refusal of what megaplan's executor does not run, and the JSON mapping.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/implementation_options.h"
#include "core/model_presets.h"
#include "core/parallel_plan.h"

using megaplan::DType;
using megaplan::Implementation;
using megaplan::ImplementationOptions;
using megaplan::ParallelPlan;

namespace {

ParallelPlan plan_of(Implementation implementation) {
  ParallelPlan plan;
  plan.tensor_parallel_size = 2;
  plan.data_parallel_size = 2;
  plan.micro_batch_size = 1;
  plan.global_batch_size = 2;
  plan.implementation = implementation;
  plan.options = megaplan::default_implementation_options(implementation);
  return plan;
}

std::string error_of(const ParallelPlan& plan) {
  try {
    megaplan::validate_plan(megaplan::model_preset("gpt-1.3b"), plan);
  } catch (const megaplan::SpecError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("each implementation's defaults are Megatron-LM's for that code", "[implementation]") {
  const ImplementationOptions megaplan = megaplan::default_implementation_options(Implementation::kMegaplan);
  CHECK(megaplan.precision == DType::kBFloat16);
  CHECK(megaplan::fused_attention(megaplan));
  CHECK(megaplan.attention_dropout == 0);
  CHECK(megaplan.overlap_grad_reduce);

  const ImplementationOptions core = megaplan::default_implementation_options(Implementation::kMegatronCore);
  CHECK(core.transformer_impl == megaplan::TransformerImpl::kTransformerEngine);
  CHECK(core.attention_dropout == 0.1);
  CHECK(core.hidden_dropout == 0.1);
  CHECK((core.overlap_grad_reduce && core.overlap_param_gather && core.tp_comm_overlap));
  CHECK(megaplan::main_gradient_bytes(core) == 4);

  const ImplementationOptions local = megaplan::default_implementation_options(Implementation::kMegatronLocal);
  CHECK(local.precision == DType::kFloat16);
  CHECK_FALSE(megaplan::fused_attention(local));
  CHECK_FALSE(local.masked_softmax_fusion);
  CHECK((local.bias_gelu_fusion && local.bias_dropout_fusion));
  CHECK_FALSE(local.gradient_accumulation_fusion);
  CHECK_FALSE(local.overlap_grad_reduce);
  CHECK(megaplan::main_gradient_bytes(local) == 2);
  ImplementationOptions bf16 = local;
  bf16.precision = DType::kBFloat16;  // Megatron accumulates bf16 training's gradients in fp32
  CHECK(megaplan::main_gradient_bytes(bf16) == 4);
}

TEST_CASE("overlaps take effect only where Megatron allows them", "[implementation]") {
  ParallelPlan plan = plan_of(Implementation::kMegatronCore);
  CHECK_FALSE(megaplan::overlaps_tensor_parallel_communication(plan));  // no sequence parallelism
  CHECK_FALSE(megaplan::overlaps_parameter_gather(plan));               // no distributed optimizer
  plan.sequence_parallel = true;
  plan.use_distributed_optimizer = true;
  CHECK(megaplan::overlaps_tensor_parallel_communication(plan));
  CHECK(megaplan::overlaps_parameter_gather(plan));
  CHECK_FALSE(megaplan::scatters_pipeline_transfers(plan));
  ParallelPlan local = plan_of(Implementation::kMegatronLocal);
  CHECK(megaplan::scatters_pipeline_transfers(local));
  local.sequence_parallel = true;  // the activation is already split over tp
  CHECK_FALSE(megaplan::scatters_pipeline_transfers(local));
  CHECK(megaplan::describe_implementation(local) ==
        "megatron-local: fp16 with fp16 main gradients; local layers, unfused attention; dropout 0.1 attention, 0.1 "
        "hidden; fused: bias-GELU, bias-dropout-add; overlapped: none");
}

TEST_CASE("options megaplan's executor does not run are refused, naming the flag", "[implementation]") {
  ParallelPlan plan = plan_of(Implementation::kMegaplan);
  CHECK(error_of(plan).empty());
  plan.options.overlap_grad_reduce = false;  // the executor runs either
  plan.options.overlap_param_gather = true;
  CHECK(error_of(plan).empty());
  plan.options.precision = DType::kFloat16;  // with its loss scaler
  CHECK(error_of(plan).empty());
  plan = plan_of(Implementation::kMegaplan);
  plan.options.hidden_dropout = 0.1;  // with its counter-based masks
  plan.options.attention_dropout = 0.1;
  CHECK(error_of(plan).empty());
  plan = plan_of(Implementation::kMegaplan);
  plan.options.masked_softmax_fusion = false;
  CHECK_THAT(error_of(plan), Catch::Matchers::StartsWith("--no-masked-softmax-fusion: megaplan's executor"));

  plan = plan_of(Implementation::kMegatronCore);
  plan.options.attention_dropout = 1;
  CHECK(error_of(plan) == "--attention-dropout: must be a dropout probability in [0, 1), got 1.000000");
  plan = plan_of(Implementation::kMegatronLocal);
  plan.tensor_parallel_size = 1;
  plan.context_parallel_size = 2;
  CHECK_THAT(error_of(plan), Catch::Matchers::StartsWith("--context-parallel-size: needs --transformer-impl "
                                                         "transformer_engine"));
}

TEST_CASE("implementation options round-trip through the plan's JSON; absent keys keep the defaults",
          "[implementation]") {
  ParallelPlan plan = plan_of(Implementation::kMegatronLocal);
  plan.options.hidden_dropout = 0;
  plan.options.tp_comm_overlap = true;
  const ParallelPlan read = megaplan::parallel_plan_from_json(megaplan::parallel_plan_to_json(plan), "p.json");
  CHECK(read.implementation == Implementation::kMegatronLocal);
  CHECK(read.options == plan.options);

  nlohmann::json json = megaplan::parallel_plan_to_json(plan);
  json["implementation_options"] = {{"precision", "bf16"}};
  const ParallelPlan partial = megaplan::parallel_plan_from_json(json, "p.json");
  ImplementationOptions expected = megaplan::default_implementation_options(Implementation::kMegatronLocal);
  expected.precision = DType::kBFloat16;
  CHECK(partial.options == expected);
  json.erase("implementation_options");
  CHECK(megaplan::parallel_plan_from_json(json, "p.json").options ==
        megaplan::default_implementation_options(Implementation::kMegatronLocal));

  const auto error = [&](const nlohmann::json& options) {
    nlohmann::json bad = megaplan::parallel_plan_to_json(plan);
    bad["implementation_options"] = options;
    try {
      megaplan::parallel_plan_from_json(bad, "p.json");
    } catch (const megaplan::SpecError& caught) {
      return std::string(caught.what());
    }
    return std::string();
  };
  CHECK(error({{"precision", "fp8"}}) ==
        "p.json: implementation_options: precision: must be one of bf16, fp16; got \"fp8\"");
  CHECK(error({{"hidden_dropout", -0.5}}) ==
        "p.json: implementation_options: hidden_dropout: must be a dropout probability in [0, 1), got -0.500000");
  CHECK(error({{"fused_everything", true}}) == "p.json: implementation_options: fused_everything: unknown field");
}

TEST_CASE("legacy Megatron's --DDP-impl torch: overlapped in 25 MB buckets, fp16 gradients only", "[implementation]") {
  ParallelPlan plan = plan_of(Implementation::kMegatronLocal);  // dp 2
  CHECK_FALSE(megaplan::overlaps_gradient_reduction(plan));     // local DDP reduces after the backward
  CHECK(megaplan::gradient_bucket_parameters(plan) == 40'000'000);
  plan.options.ddp_impl = megaplan::DdpImpl::kTorch;
  CHECK(error_of(plan).empty());
  CHECK(megaplan::overlaps_gradient_reduction(plan));
  CHECK(megaplan::gradient_bucket_parameters(plan) == (25 << 20) / 2);  // fp16 gradients
  CHECK_THAT(megaplan::describe_implementation(plan), Catch::Matchers::EndsWith("; PyTorch DDP"));
  plan.data_parallel_size = 1;
  CHECK_FALSE(megaplan::overlaps_gradient_reduction(plan));  // nothing to reduce
  plan.data_parallel_size = 2;

  ParallelPlan bf16 = plan;
  bf16.options.precision = DType::kBFloat16;
  CHECK_THAT(error_of(bf16), Catch::Matchers::StartsWith("--DDP-impl: torch cannot accumulate gradients in fp32"));
  ParallelPlan fused = plan;
  fused.options.gradient_accumulation_fusion = true;
  CHECK_THAT(error_of(fused), Catch::Matchers::StartsWith("--DDP-impl: torch cannot fuse gradient accumulation"));
  ParallelPlan sharded = plan;
  sharded.use_distributed_optimizer = true;
  CHECK_THAT(error_of(sharded),
             Catch::Matchers::StartsWith("--DDP-impl: torch cannot run --use-distributed-optimizer"));
  ParallelPlan core = plan_of(Implementation::kMegatronCore);
  core.options.ddp_impl = megaplan::DdpImpl::kTorch;
  CHECK(error_of(core) == "--DDP-impl: torch is legacy Megatron's (--implementation megatron-local)");
  const ParallelPlan read = megaplan::parallel_plan_from_json(megaplan::parallel_plan_to_json(plan), "p.json");
  CHECK(read.options.ddp_impl == megaplan::DdpImpl::kTorch);
}
