// Hugging Face's safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON naming each tensor's dtype, shape and [begin, end) byte offsets
// into the data that follows (and an optional "__metadata__" object of strings), then the data,
// row-major and little-endian. What megaplan reads and writes of Hugging Face checkpoints.
//
// A file is read only after its header passes every rule: the length within the file and at most
// 100 MB (the format's own limit), the header a JSON object, each tensor's dtype one megaplan
// reads (F32, BF16, F16), its shape non-negative integers, its offsets inside the data and exactly
// its shape's bytes, the tensors covering the data without overlap or gap. A file that breaks one
// gets a SpecError naming the file and the rule, under the caller's field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace megaplan::exec {

enum class SafetensorsDtype { kF32, kBF16, kF16 };
const char* safetensors_dtype_name(SafetensorsDtype dtype);  // "F32", "BF16", "F16"

struct WholeTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major
};

struct SafetensorsEntry {
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes into the data
};

struct SafetensorsHeader {
  std::string path;
  uint64_t data_start = 0;                          // 8 + the header's length
  std::map<std::string, SafetensorsEntry> tensors;  // by name
  std::map<std::string, std::string> metadata;
};

// Throws SpecError(field, "PATH: ...") for a file that cannot be read or breaks a rule above.
SafetensorsHeader read_safetensors_header(const std::string& path, const std::string& field);
// The tensor's values widened to fp32 (exact for all three dtypes).
WholeTensor read_safetensors_tensor(const SafetensorsHeader& header, const std::string& name, const std::string& field);

// Writes `tensors` (in name order) in `dtype` (kF32 or kBF16, rounded to nearest even) with
// `metadata`, atomically (executor/io/staged_file.h). Throws SpecError(field, ...) when the file
// cannot be written.
void write_safetensors(const std::string& path, const std::map<std::string, WholeTensor>& tensors,
                       SafetensorsDtype dtype, const std::map<std::string, std::string>& metadata,
                       const std::string& field);

// The bytes write_safetensors gives a tensor's data in `dtype`.
uint64_t safetensors_bytes(const WholeTensor& tensor, SafetensorsDtype dtype);

}  // namespace megaplan::exec
