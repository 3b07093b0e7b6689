#include "core/gemm.h"

namespace megaplan {

std::string to_string(GemmLayout layout) {
  switch (layout) {
    case GemmLayout::kForward: return "forward";
    case GemmLayout::kInputGradient: return "input_gradient";
    case GemmLayout::kWeightGradient: return "weight_gradient";
  }
  return "?";
}

std::string to_string(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kBiasGelu: return "bias_gelu";
    case GemmEpilogue::kGeluGradient: return "gelu_gradient";
    case GemmEpilogue::kBiasGradient: return "bias_gradient";
  }
  return "?";
}

}  // namespace megaplan
