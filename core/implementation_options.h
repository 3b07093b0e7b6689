// Whose training code runs a plan, and what that code does beside the layout, in Megatron-LM's own
// flags: precision, the transformer and attention implementation, dropout, kernel fusions and
// communication overlap. The simulator builds its kernel lists (kernel_list.h), memory
// (memory_model.h) and overlaps (simulator/stage_costs) from them.
//
// Each implementation starts from its defaults and explicit flags override them:
// - megaplan: this project's executor. bf16 (or fp16 with a loss scaler under --fp16; gradients
//   and their reduction fp32 either way), its own layers with flash attention, no dropout unless
//   --hidden-dropout / --attention-dropout ask (masks from a counter-based generator: the same
//   under every layout; each branch's dropout fused into the norm's add, as bias-dropout-add),
//   GELU in fc1's GEMM epilogue, weight gradients accumulated in fp32 by the GEMM, gradient
//   reduction overlapped with the backward (its train command's --overlap-grad-reduce and
//   --overlap-param-gather are the two options it runs either way). A flag that contradicts the
//   rest is refused: it describes code megaplan does not run.
// - megatron-core: Megatron-LM with Transformer Engine as its current examples run it: bf16, fused
//   attention, Megatron's default dropout 0.1, every fusion, gradient-accumulation fusion,
//   --overlap-grad-reduce, --overlap-param-gather and --tp-comm-overlap (each where Megatron
//   allows it: with the distributed optimizer, with sequence parallelism).
// - megatron-local: Megatron-LM's legacy local path: fp16 with loss scaling and fp16 gradients,
//   unfused attention (--no-masked-softmax-fusion: the s x s scores, a masked fill and a softmax),
//   dropout 0.1 with its masks, bias-GELU and bias-dropout-add fusions, local DDP (each
//   microbatch's gradients added into the main-gradient buffer by a kernel of their own, reduced
//   after the whole backward; --DDP-impl torch: PyTorch's, overlapped in 25 MB buckets), pipeline
//   transfers scattered over tp and gathered on arrival.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"

namespace megaplan {

struct ModelSpec;

struct ParallelPlan;
enum class ScheduleKind;  // core/parallel_plan.h

enum class Implementation : uint8_t { kMegaplan, kMegatronCore, kMegatronLocal };
std::string to_string(Implementation implementation);  // "megaplan", "megatron-core", "megatron-local"
Implementation parse_implementation(const std::string& text, const std::string& field);

enum class TransformerImpl : uint8_t { kLocal, kTransformerEngine };
// Legacy Megatron's --DDP-impl: its own (local: contiguous main-gradient buffers) or PyTorch's
// DistributedDataParallel (gradients in the parameters' dtype, reduced in 25 MB buckets as the
// backward produces them).
enum class DdpImpl : uint8_t { kLocal, kTorch };
std::string to_string(TransformerImpl transformer_impl);  // "local", "transformer_engine"
std::string to_string(DdpImpl ddp_impl);                  // "local", "torch"
TransformerImpl parse_transformer_impl(const std::string& text, const std::string& field);
DdpImpl parse_ddp_impl(const std::string& text, const std::string& field);

struct ImplementationOptions {
  DType precision = DType::kBFloat16;                          // --bf16 / --fp16
  TransformerImpl transformer_impl = TransformerImpl::kLocal;  // --transformer-impl
  bool use_flash_attn = true;                                  // --use-flash-attn (local impl)
  double attention_dropout = 0;                                // --attention-dropout
  double hidden_dropout = 0;                                   // --hidden-dropout
  bool masked_softmax_fusion = true;                           // --no-masked-softmax-fusion
  bool bias_gelu_fusion = true;                                // --no-bias-gelu-fusion
  bool bias_dropout_fusion = true;                             // --no-bias-dropout-fusion
  bool gradient_accumulation_fusion = true;                    // --no-gradient-accumulation-fusion
  bool accumulate_allreduce_grads_in_fp32 = true;              // --accumulate-allreduce-grads-in-fp32
  bool overlap_grad_reduce = true;                             // --overlap-grad-reduce
  bool overlap_param_gather = false;                           // --overlap-param-gather
  bool tp_comm_overlap = false;                                // --tp-comm-overlap
  bool scatter_gather_tensors_in_pipeline = false;             // --no-scatter-gather-tensors-in-pipeline
  DdpImpl ddp_impl = DdpImpl::kLocal;                          // --DDP-impl (megatron-local only)
  bool operator==(const ImplementationOptions&) const = default;
};

ImplementationOptions default_implementation_options(Implementation implementation);
// The defaults for `model`: as above, except that Megatron-LM's implementations train the Llama
// family (RMSNorm models: Llama, Mistral, Qwen2) without dropout, as Megatron's recipes for them
// do; its argparse default of 0.1 is GPT's.
ImplementationOptions default_implementation_options(Implementation implementation, const ModelSpec& model);

// What the options mean for a plan, with Megatron's own conditions applied.
// Attention runs as one fused (flash) kernel: Transformer Engine's, or the local impl's flash.
bool fused_attention(const ImplementationOptions& options);
// Bytes of a main gradient: fp32 unless fp16 training accumulates in fp16 (bf16 forces fp32).
int64_t main_gradient_bytes(const ImplementationOptions& options);
// Gradient reduction overlaps the backward: --overlap-grad-reduce, or PyTorch's DDP (which always
// does), wherever there is a data-parallel reduction.
bool overlaps_gradient_reduction(const ParallelPlan& plan);
// Parameters per gradient bucket: Megatron's max(40M, 1M x dp x cp), or PyTorch DDP's 25 MB of gradients.
int64_t gradient_bucket_parameters(const ParallelPlan& plan);
// --tp-comm-overlap takes effect in Transformer Engine's layers with sequence parallelism and tp > 1
// (Megatron requires all three).
bool overlaps_tensor_parallel_communication(const ParallelPlan& plan);
// --overlap-param-gather takes effect with the distributed optimizer over more than one replica.
bool overlaps_parameter_gather(const ParallelPlan& plan);
// Scatter-gather pipeline transfers: each tp rank sends 1/tp of the activation and the receiving
// tp group all-gathers it; without sequence parallelism (which already splits it) and tp > 1.
bool scatters_pipeline_transfers(const ParallelPlan& plan);

// One line for reports: the implementation and what of its options takes effect in `plan`
// ("megatron-local: fp16, fp16 main gradients; local layers, unfused attention; ...").
std::string describe_implementation(const ParallelPlan& plan);

// Throws SpecError naming the flag and the rule: a dropout outside [0, 1), or (for megaplan) an
// option megaplan's executor does not run.
void validate_implementation_options(const ParallelPlan& plan);

// Whether `implementation` has `schedule`: megaplan's executor runs every kind, Megatron-LM's code
// only its own (schedule_traits' megatron_native: 1f1b and interleaved).
bool runs_schedule(Implementation implementation, ScheduleKind schedule);
// Throws SpecError("--schedule", ...) unless runs_schedule.
void check_schedule_runs(Implementation implementation, ScheduleKind schedule);

// Every option under its Megatron flag's name without dashes ("attention_dropout", ...). Absent
// keys keep the implementation's defaults.
nlohmann::json implementation_options_to_json(const ImplementationOptions& options);
ImplementationOptions implementation_options_from_json(const nlohmann::json& json, const std::string& source,
                                                       Implementation implementation);

}  // namespace megaplan
