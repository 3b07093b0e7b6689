// `megaplan presets`' outputs.
#include "reports/presets_report.h"

#include "core/cluster_spec.h"
#include "core/formulas.h"
#include "core/model_presets.h"
#include "core/text_table.h"
#include "core/units.h"

namespace megaplan {

nlohmann::json presets_json() {
  nlohmann::json models = nlohmann::json::array();
  for (const ModelPreset& preset : model_presets()) {
    nlohmann::json entry = model_spec_to_json(preset.spec);
    entry["total_parameters"] = total_parameters(preset.spec);
    entry["published_parameters"] = preset.published_parameters;
    entry["citation"] = preset.citation;
    models.push_back(entry);
  }
  nlohmann::json clusters = nlohmann::json::array();
  for (const ClusterSpec& cluster : cluster_presets()) clusters.push_back(cluster_spec_to_json(cluster));
  return {{"models", models}, {"clusters", clusters}};
}

void write_presets_text(std::ostream& out) {
  TextTable models(
      {"model", "layers", "hidden", "ffn", "heads", "groups", "seq", "vocab", "experts", "parameters", "published"});
  for (const ModelPreset& preset : model_presets()) {
    const ModelSpec& spec = preset.spec;
    models.add_row(
        {spec.name, std::to_string(spec.num_layers), std::to_string(spec.hidden_size),
         std::to_string(spec.effective_ffn_hidden_size()), std::to_string(spec.num_attention_heads),
         std::to_string(spec.effective_num_query_groups()), std::to_string(spec.seq_length),
         std::to_string(spec.vocab_size),
         spec.moe.enabled()
             ? std::to_string(spec.moe.num_experts) + ", top " + std::to_string(spec.moe.effective_router_topk())
             : "-",
         format_count(static_cast<double>(total_parameters(spec))), format_count(preset.published_parameters)});
  }
  TextTable clusters({"cluster", "nodes", "GPUs/node", "GPU", "bf16 TFLOP/s", "HBM GiB", "HBM TB/s", "NVLink GB/s/dir",
                      "NICs", "NIC GB/s"});
  for (const ClusterSpec& cluster : cluster_presets()) {
    clusters.add_row({cluster.name, std::to_string(cluster.num_nodes), std::to_string(cluster.gpus_per_node),
                      cluster.gpu.name, format_fixed(cluster.gpu.dense_bf16_flops_per_s / 1e12, 1),
                      gib_number(static_cast<double>(cluster.gpu.hbm_capacity_bytes)),
                      format_fixed(cluster.gpu.hbm_bandwidth_bytes_per_s / 1e12, 2),
                      format_fixed(cluster.intra_node.bandwidth_per_gpu_bytes_per_s / 1e9, 0),
                      std::to_string(cluster.inter_node.nics_per_node),
                      format_fixed(cluster.inter_node.bandwidth_per_nic_bytes_per_s / 1e9, 0)});
  }
  out << models.render() << "\n" << clusters.render() << "\nSources:\n";
  for (const ModelPreset& preset : model_presets()) out << "  " << preset.spec.name << ": " << preset.citation << "\n";
  for (const ClusterSpec& cluster : cluster_presets()) out << "  " << cluster.name << ": " << cluster.source << "\n";
}

}  // namespace megaplan
