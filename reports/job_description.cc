#include "reports/job_description.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "core/formulas.h"
#include "core/json_io.h"
#include "core/pipeline_layout.h"
#include "core/text_table.h"
#include "core/units.h"

namespace megaplan {

namespace {

// The MoE layers and how their router chooses and balances, in Megatron's terms (core/moe_spec.h).
std::string router_text(const ModelSpec& model) {
  const MoeSpec& moe = model.moe;
  std::ostringstream out;
  out << "in " << moe.moe_layers(0, model.num_layers) << " of " << model.num_layers << " layers (--moe-layer-freq "
      << moe_layer_freq_text(moe) << "); " << to_string(moe.score_function)
      << (moe.router_pre_softmax ? " before" : " after") << " the top k";
  if (moe.router_topk_scaling_factor) out << ", scaled by " << *moe.router_topk_scaling_factor;
  if (moe.router_enable_expert_bias) out << ", expert bias (rate " << moe.router_bias_update_rate << ")";
  if (moe.shared_expert_gate) out << ", the shared expert gated";
  out << "; " << to_string(moe.load_balancing) << " x " << moe.aux_loss_coeff << ", z loss x " << moe.z_loss_coeff
      << "; ";
  if (moe.expert_capacity_factor) {
    out << "capacity factor " << *moe.expert_capacity_factor << " (" << to_string(moe.token_drop_policy)
        << " drop policy" << (moe.pad_expert_input_to_capacity ? ", padded" : "") << ")";
  } else {
    out << "dropless";
  }
  return out.str();
}

// "4 layers per stage", or for uneven stages each stage's: "layers per stage 7, 8, ..., 8, 7".
std::string layers_per_stage_text(const ModelSpec& model, const ParallelPlan& plan) {
  const std::vector<int64_t> counts = stage_layer_counts(model, plan);
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts.front(); })) {
    return std::to_string(counts.front()) + " layers per stage";
  }
  std::string text = "layers per stage";
  for (std::size_t s = 0; s < counts.size(); ++s) text += (s == 0 ? " " : ", ") + std::to_string(counts[s]);
  return text;
}

struct JobFacts {
  int64_t padded_vocab_size;
  int64_t total_parameters;
  double model_flops_per_iteration;
  double hardware_flops_per_iteration;
  double min_iteration_time_s;  // hardware FLOPs at every GPU's dense bf16 peak
  std::vector<PipelineRankParameters> pipeline_ranks;
};

JobFacts derive_facts(const JobSpec& job) {
  JobFacts facts;
  facts.padded_vocab_size = padded_vocab_size(job.model, job.plan.tensor_parallel_size);
  facts.total_parameters = total_parameters(job.model, job.plan.tensor_parallel_size);
  facts.model_flops_per_iteration = model_flops(job.model, job.plan.global_batch_size, facts.padded_vocab_size);
  facts.hardware_flops_per_iteration =
      hardware_flops(job.model, job.plan.global_batch_size, facts.padded_vocab_size, job.plan.recompute_granularity);
  facts.min_iteration_time_s = facts.hardware_flops_per_iteration /
                               (static_cast<double>(job.cluster.total_gpus()) * job.cluster.gpu.dense_bf16_flops_per_s);
  facts.pipeline_ranks = parameters_per_pipeline_rank(job.model, job.plan);
  return facts;
}

nlohmann::json facts_json(const JobSpec& job, const JobFacts& facts) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const PipelineRankParameters& rank : facts.pipeline_ranks) {
    ranks.push_back({{"pipeline_rank", rank.pipeline_rank},
                     {"num_layers", rank.num_layers},
                     {"virtual_stages", stages_of_pipeline_rank(rank.pipeline_rank, job.plan)},
                     {"has_embedding", rank.has_embedding},
                     {"has_output_layer", rank.has_output_layer},
                     {"parameters", rank.parameters},
                     {"parameters_per_gpu", rank.parameters_per_gpu}});
  }
  nlohmann::json json{{"job", job_spec_to_json(job)},
                      {"padded_vocab_size", facts.padded_vocab_size},
                      {"total_parameters", facts.total_parameters},
                      {"num_microbatches", job.plan.num_microbatches()},
                      {"model_flops_per_iteration", facts.model_flops_per_iteration},
                      {"hardware_flops_per_iteration", facts.hardware_flops_per_iteration},
                      {"min_iteration_time_s", facts.min_iteration_time_s},
                      {"pipeline_ranks", ranks}};
  if (job.model.moe.enabled()) json["active_parameters"] = active_parameters(job.model, job.plan.tensor_parallel_size);
  return json;
}

std::string on_off(bool value) { return value ? "on" : "off"; }

void write_facts(const JobSpec& job, const JobFacts& facts, std::ostream& out) {
  const ModelSpec& model = job.model;
  const ParallelPlan& plan = job.plan;
  const ClusterSpec& cluster = job.cluster;
  out << model.name << " on " << cluster.total_gpus() << " x " << cluster.gpu.name << " (" << cluster.name << ": "
      << cluster.num_nodes << " node" << (cluster.num_nodes == 1 ? "" : "s") << " x " << cluster.gpus_per_node
      << ")\n\n";
  out << "model    " << model.num_layers << " layers, hidden " << model.hidden_size << ", ffn "
      << model.effective_ffn_hidden_size() << (model.swiglu ? " (SwiGLU)" : " (GELU)") << ", "
      << model.num_attention_heads << " heads / " << model.effective_num_query_groups() << " query groups x "
      << model.effective_kv_channels() << ", seq " << model.seq_length << "\n";
  out << "         vocab " << model.vocab_size << " padded to " << facts.padded_vocab_size << " for tp "
      << plan.tensor_parallel_size << ", " << to_string(model.normalization) << ", "
      << to_string(model.position_embedding_type) << " positions, "
      << (model.untie_embeddings_and_output_weights ? "untied" : "tied") << " embeddings, "
      << format_count(static_cast<double>(facts.total_parameters)) << " parameters\n";
  if (model.moe.enabled()) {
    out << "experts  " << model.moe.num_experts << " a layer of ffn " << model.effective_moe_ffn_hidden_size()
        << ", each token to its top " << model.moe.effective_router_topk();
    if (model.moe.shared_expert_intermediate_size > 0) {
      out << ", a shared expert of ffn " << model.moe.shared_expert_intermediate_size;
    }
    const int64_t ep = plan.expert_model_parallel_size, etp = plan.expert_tensor_parallel();
    const bool cut_over_tp = etp == plan.tensor_parallel_size;
    const std::string held = ep == 1 ? std::string("every expert")
                                     : std::to_string(model.moe.num_experts / ep) +
                                           (model.moe.num_experts == ep ? " expert" : " experts") + " a layer";
    out << "; " << format_count(static_cast<double>(active_parameters(model, plan.tensor_parallel_size)))
        << " parameters active a token; ep " << ep << (cut_over_tp ? "" : ", etp " + std::to_string(etp))
        << " (each GPU holds "
        << (cut_over_tp ? "its tp shard of " + held
            : etp == 1  ? held + ", whole"
                        : "its etp " + std::to_string(etp) + " shard of " + held)
        << ")\n";
    out << "router   " << router_text(model) << "\n";
  }
  out << "plan     tp " << plan.tensor_parallel_size << " x pp " << plan.pipeline_parallel_size << " x cp "
      << plan.context_parallel_size << " x dp " << plan.data_parallel_size << " = " << plan.world_size()
      << " GPUs; vpp " << plan.virtual_pipeline_parallel_size << " (" << layers_per_stage_text(model, plan)
      << "), schedule " << to_string(plan.schedule) << "\n";
  out << "         mbs " << plan.micro_batch_size << ", gbs " << plan.global_batch_size << ", "
      << plan.num_microbatches() << " microbatches per replica; sequence parallel " << on_off(plan.sequence_parallel)
      << ", distributed optimizer " << on_off(plan.use_distributed_optimizer) << ", recompute "
      << to_string(plan.recompute_granularity) << "\n";
  out << "flops    model " << format_flops(facts.model_flops_per_iteration) << " per iteration, hardware "
      << format_flops(facts.hardware_flops_per_iteration) << "; at the dense bf16 peak ("
      << format_flops(cluster.gpu.dense_bf16_flops_per_s) << "/s per GPU) an iteration takes at least "
      << facts.min_iteration_time_s << " s\n\n";

  TextTable table({"pp rank", "stages", "layers", "embedding", "output", "parameters", "per GPU"});
  for (const PipelineRankParameters& rank : facts.pipeline_ranks) {
    std::string stages;
    for (int64_t stage : stages_of_pipeline_rank(rank.pipeline_rank, plan)) {
      stages += (stages.empty() ? "" : ",") + std::to_string(stage);
    }
    table.add_row({std::to_string(rank.pipeline_rank), stages, std::to_string(rank.num_layers),
                   rank.has_embedding ? "yes" : "", rank.has_output_layer ? "yes" : "",
                   format_count(static_cast<double>(rank.parameters)),
                   format_count(static_cast<double>(rank.parameters_per_gpu))});
  }
  out << table.render();
}

}  // namespace

nlohmann::json job_description_json(const JobSpec& job) { return facts_json(job, derive_facts(job)); }

void write_job_description(const JobSpec& job, std::ostream& out) { write_facts(job, derive_facts(job), out); }

}  // namespace megaplan
