#include "executor/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "executor/io/staged_file.h"

namespace megaplan::exec {

namespace {

// The format's bound on the header (safetensors refuses larger ones too).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

uint64_t dtype_bytes(SafetensorsDtype dtype) { return dtype == SafetensorsDtype::kF32 ? 4 : 2; }

// A JSON value as text for an error message, short.
std::string quoted(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32: return "F32";
    case SafetensorsDtype::kBF16: return "BF16";
    case SafetensorsDtype::kF16: return "F16";
  }
  return "?";
}

SafetensorsHeader read_safetensors_header(const std::string& path, const std::string& field) {
  const auto fail = [&](const std::string& rule) -> void { throw SpecError(field, path + ": " + rule); };
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  if (error) fail("cannot read (" + error.message() + ")");
  if (size < 8) fail("is " + std::to_string(size) + " bytes, shorter than a safetensors header's length");
  std::ifstream file(path, std::ios::binary);
  unsigned char length_bytes[8];
  if (!file.read(reinterpret_cast<char*>(length_bytes), 8)) fail("cannot read");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  if (length > kMaxHeaderBytes || length > size - 8) {
    fail("its header length, " + std::to_string(length) + " bytes, runs past the file's " + std::to_string(size) +
         " bytes" + (length > kMaxHeaderBytes ? " (the format allows 100 MB)" : ""));
  }
  std::string text(length, '\0');
  if (!file.read(text.data(), static_cast<std::streamsize>(length))) fail("cannot read its header");
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) fail("its header is not a JSON object");

  SafetensorsHeader header;
  header.path = path;
  header.data_start = 8 + length;
  const uint64_t data_bytes = size - header.data_start;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("\"__metadata__\" is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail("\"__metadata__\"." + key + " is not a string");
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\"";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      fail(where + " lacks dtype, shape or data_offsets");
    }
    SafetensorsEntry tensor{};
    const nlohmann::json& dtype = entry["dtype"];
    if (dtype == "F32") {
      tensor.dtype = SafetensorsDtype::kF32;
    } else if (dtype == "BF16") {
      tensor.dtype = SafetensorsDtype::kBF16;
    } else if (dtype == "F16") {
      tensor.dtype = SafetensorsDtype::kF16;
    } else {
      fail(where + " has dtype " + quoted(dtype) + ", which megaplan does not read (F32, BF16, F16)");
    }
    uint64_t count = 1;
    const nlohmann::json& shape = entry["shape"];
    if (!shape.is_array()) fail(where + " has shape " + quoted(shape) + ", not a list of sizes");
    for (const nlohmann::json& extent : shape) {
      if (!extent.is_number_unsigned() ||
          extent.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(where + " has shape " + quoted(shape) + ", not a list of sizes");
      }
      const uint64_t value = extent.get<uint64_t>();
      if (value != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / value)
        fail(where + "'s shape overflows 64 bits");
      count *= value;
      tensor.shape.push_back(static_cast<int64_t>(value));
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(where + " has data_offsets " + quoted(offsets) + ", not [begin, end]");
    }
    tensor.begin = offsets[0].get<uint64_t>();
    tensor.end = offsets[1].get<uint64_t>();
    if (tensor.begin > tensor.end || tensor.end > data_bytes) {
      fail(where + " has data_offsets [" + std::to_string(tensor.begin) + ", " + std::to_string(tensor.end) +
           "], past the " + std::to_string(data_bytes) + " bytes of data");
    }
    if (tensor.end - tensor.begin != count * dtype_bytes(tensor.dtype)) {
      fail(where + " holds " + std::to_string(tensor.end - tensor.begin) + " bytes, but its shape of " +
           safetensors_dtype_name(tensor.dtype) + " needs " + std::to_string(count * dtype_bytes(tensor.dtype)));
    }
    ranges.emplace_back(tensor.begin, tensor.end);
    header.tensors.emplace(name, std::move(tensor));
  }
  // The data is exactly the tensors, one after another in some order.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != covered)
      fail("its tensors " + std::string(begin < covered ? "overlap" : "leave a gap") + " at byte " +
           std::to_string(std::min(begin, covered)) + " of the data");
    covered = end;
  }
  if (covered != data_bytes) {
    fail("its tensors cover " + std::to_string(covered) + " of its " + std::to_string(data_bytes) + " bytes of data");
  }
  return header;
}

WholeTensor read_safetensors_tensor(const SafetensorsHeader& header, const std::string& name,
                                    const std::string& field) {
  const auto found = header.tensors.find(name);
  if (found == header.tensors.end()) throw SpecError(field, header.path + ": holds no tensor \"" + name + "\"");
  const SafetensorsEntry& entry = found->second;
  std::vector<unsigned char> bytes(entry.end - entry.begin);
  std::ifstream file(header.path, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(header.data_start + entry.begin));
  if (!file.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()))) {
    throw SpecError(field, header.path + ": cannot read tensor \"" + name + "\"");
  }
  WholeTensor tensor{entry.shape, std::vector<float>(bytes.size() / dtype_bytes(entry.dtype))};
  for (std::size_t i = 0; i < tensor.values.size(); ++i) {
    if (entry.dtype == SafetensorsDtype::kF32) {
      uint32_t bits = 0;
      for (int b = 3; b >= 0; --b) bits = (bits << 8) | bytes[4 * i + static_cast<std::size_t>(b)];
      tensor.values[i] = std::bit_cast<float>(bits);
    } else {
      const auto bits = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
      tensor.values[i] = entry.dtype == SafetensorsDtype::kBF16 ? bf16_to_float(bits) : fp16_to_float(bits);
    }
  }
  return tensor;
}

uint64_t safetensors_bytes(const WholeTensor& tensor, SafetensorsDtype dtype) {
  return tensor.values.size() * dtype_bytes(dtype);
}

void write_safetensors(const std::string& path, const std::map<std::string, WholeTensor>& tensors,
                       SafetensorsDtype dtype, const std::map<std::string, std::string>& metadata,
                       const std::string& field) {
  if (dtype == SafetensorsDtype::kF16) throw std::logic_error("write_safetensors: F32 or BF16 only");
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t bytes = safetensors_bytes(tensor, dtype);
    header[name] = {
        {"dtype", safetensors_dtype_name(dtype)}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the format advises
  try {
    StagedFile file(path);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
    file.write(length, 8);
    file.write(text.data(), text.size());
    std::vector<unsigned char> bytes;
    for (const auto& [name, tensor] : tensors) {
      bytes.resize(safetensors_bytes(tensor, dtype));
      for (std::size_t i = 0; i < tensor.values.size(); ++i) {
        if (dtype == SafetensorsDtype::kF32) {
          const auto bits = std::bit_cast<uint32_t>(tensor.values[i]);
          for (int b = 0; b < 4; ++b)
            bytes[4 * i + static_cast<std::size_t>(b)] = static_cast<unsigned char>(bits >> (8 * b));
        } else {
          const uint16_t bits = float_to_bf16(tensor.values[i]);
          bytes[2 * i] = static_cast<unsigned char>(bits);
          bytes[2 * i + 1] = static_cast<unsigned char>(bits >> 8);
        }
      }
      file.write(bytes.data(), bytes.size());
    }
    file.commit();
  } catch (const SpecError& error) {
    throw SpecError(field, error.what());
  }
}

}  // namespace megaplan::exec
