// Megatron-LM's rank groups: the masked orthogonal rank grid, RankGenerator, and the decoder and
// expert generators that initialize_model_parallel() combines.
#include "core/rank_groups.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/checked_math.h"
#include "core/error.h"

namespace megaplan {
namespace {

constexpr const char* kOrderField = "--order";

std::string in_quotes(std::string_view text) { return "\"" + std::string(text) + "\""; }

std::string join(const std::vector<std::string>& names, std::string_view separator) {
  std::string joined;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) joined += separator;
    joined += names[i];
  }
  return joined;
}

std::string list_of_dimensions() {
  std::string text;
  for (size_t i = 0; i < kParallelDimensions.size(); ++i) {
    if (i > 0) text += ", ";
    text += kParallelDimensions[i];
  }
  return text;
}

bool is_dimension(std::string_view name) {
  return std::find(kParallelDimensions.begin(), kParallelDimensions.end(), name) != kParallelDimensions.end();
}

std::vector<std::string> split_on_dash(std::string_view text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dash = text.find('-', start);
    parts.emplace_back(text.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start));
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  return parts;
}

// "[0, 1, 2]" for messages.
std::string format_group(const std::vector<int64_t>& group) {
  std::string text = "[";
  for (size_t i = 0; i < group.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(group[i]);
  }
  return text + "]";
}

// The first few groups of a list, for messages about lists that may be long.
std::string format_head(const RankGroupList& groups) {
  constexpr size_t kShown = 3;
  std::string text;
  for (size_t i = 0; i < groups.size() && i < kShown; ++i) {
    if (i > 0) text += " ";
    text += format_group(groups[i]);
  }
  if (groups.size() > kShown) text += " ...";
  return text;
}

}  // namespace

std::vector<std::string> parse_parallel_order(const std::string& order) {
  std::string lowered = order;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::vector<std::string> names = split_on_dash(lowered);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!is_dimension(names[i])) {
      throw SpecError(kOrderField, "unknown name " + in_quotes(names[i]) + " in " + in_quotes(order) +
                                       "; an order joins names from " + list_of_dimensions() + " with '-', e.g. " +
                                       in_quotes(kDefaultParallelOrder));
    }
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw SpecError(kOrderField, in_quotes(names[i]) + " appears more than once in " + in_quotes(order) +
                                       "; each name may appear at most once");
    }
  }
  return names;
}

RankGroupList masked_orthogonal_rank_groups(int64_t world_size, const std::vector<int64_t>& sizes,
                                            const std::vector<bool>& mask) {
  if (sizes.size() != mask.size()) {
    throw std::invalid_argument("masked_orthogonal_rank_groups: sizes and mask differ in length");
  }
  // Stride of dimension i = product of the sizes before it (the first dimension varies fastest).
  std::vector<int64_t> masked_sizes, masked_strides, unmasked_sizes, unmasked_strides;
  int64_t stride = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) {
      throw std::invalid_argument("masked_orthogonal_rank_groups: sizes must be positive");
    }
    (mask[i] ? masked_sizes : unmasked_sizes).push_back(sizes[i]);
    (mask[i] ? masked_strides : unmasked_strides).push_back(stride);
    if (__builtin_mul_overflow(stride, sizes[i], &stride)) {
      throw std::invalid_argument("masked_orthogonal_rank_groups: sizes overflow 64 bits");
    }
  }
  if (stride != world_size) {
    throw std::invalid_argument("masked_orthogonal_rank_groups: the sizes multiply to " + std::to_string(stride) +
                                ", not the world size " + std::to_string(world_size));
  }

  // Mixed-radix decomposition of `index` over `shape`, dotted with `strides`: maps a position
  // among the groups (or within a group) to its rank offset.
  const auto offset_of = [](int64_t index, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
    int64_t offset = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      offset += (index % shape[i]) * strides[i];
      index /= shape[i];
    }
    return offset;
  };

  int64_t group_size = 1;
  for (const int64_t size : masked_sizes) group_size *= size;
  const int64_t num_groups = world_size / group_size;

  std::vector<int64_t> member_offsets(static_cast<size_t>(group_size));
  for (int64_t member = 0; member < group_size; ++member) {
    member_offsets[static_cast<size_t>(member)] = offset_of(member, masked_sizes, masked_strides);
  }

  RankGroupList groups;
  groups.reserve(static_cast<size_t>(num_groups));
  for (int64_t group_index = 0; group_index < num_groups; ++group_index) {
    const int64_t base = offset_of(group_index, unmasked_sizes, unmasked_strides);
    std::vector<int64_t>& group = groups.emplace_back();
    group.reserve(member_offsets.size());
    for (const int64_t offset : member_offsets) group.push_back(base + offset);
  }
  return groups;
}

RankGenerator::RankGenerator(std::string name, int64_t tp, int64_t ep, int64_t dp, int64_t pp, int64_t cp,
                             const std::string& order)
    : name_(std::move(name)) {
  const std::array<std::pair<std::string_view, int64_t>, 5> sizes = {
      {{"tp", tp}, {"cp", cp}, {"ep", ep}, {"dp", dp}, {"pp", pp}}};
  for (const auto& [dimension, size] : sizes) {
    if (size <= 0) {
      throw std::invalid_argument("RankGenerator: " + std::string(dimension) + " must be positive, got " +
                                  std::to_string(size));
    }
    if (__builtin_mul_overflow(world_size_, size, &world_size_)) {
      throw std::invalid_argument("RankGenerator: the sizes overflow 64 bits");
    }
  }
  // Megatron keeps cp in the dense layers' generator and ep in the experts' one.
  if (ep != 1 && cp != 1) {
    throw std::invalid_argument("RankGenerator: ep and cp cannot both exceed 1 in one generator");
  }

  order_ = parse_parallel_order(order);
  // Names left out are appended in Megatron's order (its name_to_size dict: tp, pp, dp, ep, cp).
  for (const size_t index : {0, 4, 3, 2, 1}) {
    const auto& [dimension, size] = sizes[index];
    if (std::find(order_.begin(), order_.end(), dimension) != order_.end()) continue;
    if (size != 1) {
      throw SpecError(kOrderField, in_quotes(order) + " leaves out " + std::string(dimension) + ", whose size in the " +
                                       name_ + " rank generator is " + std::to_string(size) +
                                       "; a name left out of the order must have size 1");
    }
    order_.emplace_back(dimension);
  }
  for (const std::string& dimension : order_) {
    for (const auto& [known, size] : sizes) {
      if (known == dimension) ordered_sizes_.push_back(size);
    }
  }
}

int64_t RankGenerator::size_of(std::string_view dimension) const {
  const auto position = std::find(order_.begin(), order_.end(), dimension);
  if (position == order_.end()) {
    throw std::invalid_argument("RankGenerator: unknown dimension " + in_quotes(dimension));
  }
  return ordered_sizes_[static_cast<size_t>(position - order_.begin())];
}

RankGroupList RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> mask(order_.size(), false);
  for (const std::string& dimension : split_on_dash(token)) {
    const auto position = std::find(order_.begin(), order_.end(), dimension);
    if (position == order_.end()) {
      throw std::invalid_argument("RankGenerator::get_ranks: " + in_quotes(dimension) + " is not in the order " +
                                  in_quotes(join(order_, "-")));
    }
    mask[static_cast<size_t>(position - order_.begin())] = true;
  }
  return masked_orthogonal_rank_groups(world_size_, ordered_sizes_, mask);
}

bool RankGroups::contains(std::string_view kind) const {
  return std::any_of(kinds.begin(), kinds.end(), [&](const auto& entry) { return entry.first == kind; });
}

const RankGroupList& RankGroups::at(std::string_view kind) const {
  for (const auto& [name, groups] : kinds) {
    if (name == kind) return groups;
  }
  throw std::out_of_range("RankGroups: no group kind " + in_quotes(kind));
}

RankGroups megatron_rank_groups(int64_t world_size, int64_t tensor_parallel_size, int64_t pipeline_parallel_size,
                                int64_t context_parallel_size, int64_t expert_parallel_size, const std::string& order,
                                int64_t expert_tensor_parallel_size) {
  require_positive(world_size, "--world-size");
  require_positive(tensor_parallel_size, "--tp");
  require_positive(pipeline_parallel_size, "--pp");
  require_positive(context_parallel_size, "--cp");
  require_positive(expert_parallel_size, "--ep");
  if (expert_tensor_parallel_size == 0) expert_tensor_parallel_size = tensor_parallel_size;
  require_positive(expert_tensor_parallel_size, "--etp");
  if (world_size > kMaxRankGroupWorldSize) {
    throw SpecError("--world-size", "must be at most " + std::to_string(kMaxRankGroupWorldSize) +
                                        " to list every rank group, got " + std::to_string(world_size));
  }

  const int64_t tp_pp = checked_multiply(tensor_parallel_size, pipeline_parallel_size, "--pp");
  const int64_t model_size = checked_multiply(tp_pp, context_parallel_size, "--cp");
  if (world_size % model_size != 0) {
    throw SpecError("--world-size", "must be divisible by tp*pp*cp = " + std::to_string(model_size) + ", got " +
                                        std::to_string(world_size));
  }
  const int64_t expert_model_size = checked_multiply(
      checked_multiply(expert_tensor_parallel_size, pipeline_parallel_size, "--etp"), expert_parallel_size, "--ep");
  if (world_size % expert_model_size != 0) {
    throw SpecError("--ep", "the world size " + std::to_string(world_size) +
                                " must be divisible by etp*ep*pp = " + std::to_string(expert_model_size) +
                                " for the expert layers, got ep = " + std::to_string(expert_parallel_size) +
                                " and etp = " + std::to_string(expert_tensor_parallel_size));
  }

  RankGroups result;
  result.world_size = world_size;
  result.tensor_parallel_size = tensor_parallel_size;
  result.pipeline_parallel_size = pipeline_parallel_size;
  result.context_parallel_size = context_parallel_size;
  result.expert_parallel_size = expert_parallel_size;
  result.expert_tensor_parallel_size = expert_tensor_parallel_size;
  result.data_parallel_size = world_size / model_size;
  result.expert_data_parallel_size = world_size / expert_model_size;

  const std::vector<std::string> given_order = parse_parallel_order(order);
  const RankGenerator decoder("decoder", tensor_parallel_size, 1, result.data_parallel_size, pipeline_parallel_size,
                              context_parallel_size, order);
  const RankGenerator expert("expert", expert_tensor_parallel_size, expert_parallel_size,
                             result.expert_data_parallel_size, pipeline_parallel_size, 1, order);
  result.order = decoder.order();

  // Megatron's checks that dense and expert layers agree on the pipeline: with pp not last, the
  // pipeline stride depends on dp, so both data-parallel sizes must match...
  if (given_order.back() != "pp" && pipeline_parallel_size > 1 &&
      result.expert_data_parallel_size != result.data_parallel_size) {
    throw SpecError(kOrderField, in_quotes(order) +
                                     " does not end in pp and pp = " + std::to_string(pipeline_parallel_size) +
                                     " > 1, so the expert data-parallel size world/(etp*ep*pp) = " +
                                     std::to_string(result.expert_data_parallel_size) +
                                     " must equal the data-parallel size world/(tp*pp*cp) = " +
                                     std::to_string(result.data_parallel_size) + "; put pp last or make ep equal cp");
  }
  // ...and, whatever the order, the pipeline groups themselves must be the same.
  const RankGroupList pipeline_groups = decoder.get_ranks("pp");
  const RankGroupList expert_pipeline_groups = expert.get_ranks("pp");
  if (pipeline_groups != expert_pipeline_groups) {
    throw SpecError(kOrderField, in_quotes(order) + " gives the dense layers pipeline groups " +
                                     format_head(pipeline_groups) + " but the expert layers " +
                                     format_head(expert_pipeline_groups) + "; both must have the same pipeline groups");
  }

  RankGroupList embedding, position_embedding;
  for (const std::vector<int64_t>& stages : pipeline_groups) {
    // Word embeddings live on the first and last stage (tied input/output), position embeddings on
    // the first: Megatron's default_embedding_ranks and default_position_embedding_ranks.
    if (stages.size() == 1) {
      embedding.push_back({stages.front()});
    } else {
      embedding.push_back({stages.front(), stages.back()});
    }
    position_embedding.push_back({stages.front()});
  }

  for (const std::string_view kind : kRankGroupKinds) {
    RankGroupList groups;
    if (kind == "embedding") {
      groups = embedding;
    } else if (kind == "position-embedding") {
      groups = position_embedding;
    } else if (kind == "pp") {
      groups = pipeline_groups;
    } else if (kind == "ep" || kind == "tp-ep") {
      groups = expert.get_ranks(kind);
    } else if (kind == "expert-dp") {  // Megatron's expert data-parallel group
      groups = expert.get_ranks("dp");
    } else if (kind == "expert-tp") {  // Megatron's expert tensor-parallel group
      groups = expert.get_ranks("tp");
    } else {
      groups = decoder.get_ranks(kind);
    }
    result.kinds.emplace_back(std::string(kind), std::move(groups));
  }
  return result;
}

nlohmann::ordered_json rank_groups_to_json(const RankGroups& groups) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const auto& [kind, list] : groups.kinds) json[kind] = list;
  return json;
}

}  // namespace megaplan
