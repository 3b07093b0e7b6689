#include "executor/data/indexed_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "executor/io/mapped_file.h"
#include "executor/io/staged_file.h"

namespace megaplan::exec {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
const std::string kDataPathFlag = "--data-path";

template <typename T>
T load(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof value);  // the arrays need not be aligned for T
  return value;
}

[[noreturn]] void refuse(const std::string& path, const std::string& rule) {
  throw SpecError(kDataPathFlag, path + ": " + rule);
}

bool known(uint8_t code) { return code >= 1 && code <= 8; }

// A stored value as a token id. A float dataset's NaN, infinity or value outside int64 becomes
// INT64_MIN, which no vocabulary holds, so the run refuses the file by name (never undefined).
template <typename T>
int64_t token_of(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    constexpr double kLimit = 9223372036854775808.0;  // 2^63
    const auto wide = static_cast<double>(value);
    if (!(wide >= -kLimit && wide < kLimit)) return std::numeric_limits<int64_t>::min();
  }
  return static_cast<int64_t>(value);
}

// Folds `count` tokens of type T at `at` into [smallest, largest].
template <typename T>
void widen(const unsigned char* at, std::size_t count, int64_t& smallest, int64_t& largest) {
  for (std::size_t i = 0; i < count; ++i) {
    const int64_t token = token_of(load<T>(at + i * sizeof(T)));
    smallest = std::min(smallest, token);
    largest = std::max(largest, token);
  }
}

}  // namespace

std::size_t token_bytes(TokenType type) {
  switch (type) {
    case TokenType::kUint8:
    case TokenType::kInt8: return 1;
    case TokenType::kInt16:
    case TokenType::kUint16: return 2;
    case TokenType::kInt32:
    case TokenType::kFloat32: return 4;
    case TokenType::kInt64:
    case TokenType::kFloat64: return 8;
  }
  return 0;
}

TokenType token_type_for_vocabulary(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenType::kUint16 : TokenType::kInt32;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string index_path = prefix + ".idx";
  const std::string data_path = prefix + ".bin";
  index_ = MappedFile(index_path, kDataPathFlag);
  data_ = MappedFile(data_path, kDataPathFlag);
  if (index_.size() < kHeaderBytes) {
    refuse(index_path, "truncated: " + std::to_string(index_.size()) + " bytes, shorter than the " +
                           std::to_string(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(index_.data(), kMagic, sizeof kMagic) != 0)
    refuse(index_path, "not a Megatron index (no MMIDIDX magic)");
  const auto version = load<uint64_t>(index_.data() + 9);
  if (version != 1) refuse(index_path, "index version " + std::to_string(version) + " (only version 1 is known)");
  const uint8_t code = index_.data()[17];
  if (!known(code)) refuse(index_path, "unknown dtype code " + std::to_string(code) + " (Megatron's are 1-8)");
  token_type_ = static_cast<TokenType>(code);
  const auto sequences = load<uint64_t>(index_.data() + 18);
  const auto documents = load<uint64_t>(index_.data() + 26);
  // Sizes from the header, checked before they are trusted as offsets.
  constexpr uint64_t kLimit = std::numeric_limits<uint64_t>::max() / 32;
  if (sequences > kLimit || documents > kLimit) refuse(index_path, "implausible counts in the header");
  const uint64_t expected = kHeaderBytes + sequences * (4 + 8) + documents * 8;
  if (index_.size() != expected) {
    refuse(index_path, std::string(index_.size() < expected ? "truncated" : "too long") + ": " +
                           std::to_string(index_.size()) + " bytes, but its header promises " +
                           std::to_string(sequences) + " sequences and " + std::to_string(documents) +
                           " document indices, " + std::to_string(expected) + " bytes");
  }
  num_sequences_ = static_cast<std::size_t>(sequences);
  num_document_indices_ = static_cast<std::size_t>(documents);
  lengths_ = index_.data() + kHeaderBytes;
  pointers_ = lengths_ + 4 * num_sequences_;
  documents_ = pointers_ + 8 * num_sequences_;
  if (num_document_indices_ == 0 || load<int64_t>(documents_) != 0 ||
      load<int64_t>(documents_ + 8 * (num_document_indices_ - 1)) != static_cast<int64_t>(num_sequences_)) {
    refuse(index_path, "document indices must run from 0 to the sequence count " + std::to_string(num_sequences_));
  }
  for (std::size_t d = 1; d < num_document_indices_; ++d) {
    if (load<int64_t>(documents_ + 8 * d) < load<int64_t>(documents_ + 8 * (d - 1))) {
      refuse(index_path, "document indices decrease at document " + std::to_string(d));
    }
  }
  const std::size_t width = token_bytes(token_type_);
  for (std::size_t s = 0; s < num_sequences_; ++s) {
    const int32_t length = sequence_length(s);
    const auto pointer = load<int64_t>(pointers_ + 8 * s);
    if (length < 0 || pointer < 0 ||
        static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * width > data_.size()) {
      refuse(data_path, "truncated: sequence " + std::to_string(s) + " (" + std::to_string(length) +
                            " tokens at byte " + std::to_string(pointer) + ") reaches past its " +
                            std::to_string(data_.size()) + " bytes");
    }
  }
}

int32_t IndexedDataset::sequence_length(std::size_t sequence) const { return load<int32_t>(lengths_ + 4 * sequence); }

int64_t IndexedDataset::document_start(std::size_t document) const { return load<int64_t>(documents_ + 8 * document); }

std::pair<int64_t, int64_t> IndexedDataset::token_range() const {
  int64_t smallest = std::numeric_limits<int64_t>::max();
  int64_t largest = std::numeric_limits<int64_t>::min();
  for (std::size_t s = 0; s < num_sequences_; ++s) {
    const unsigned char* at = data_.data() + static_cast<std::size_t>(load<int64_t>(pointers_ + 8 * s));
    const auto count = static_cast<std::size_t>(sequence_length(s));
    switch (token_type_) {
      case TokenType::kUint8: widen<uint8_t>(at, count, smallest, largest); break;
      case TokenType::kInt8: widen<int8_t>(at, count, smallest, largest); break;
      case TokenType::kInt16: widen<int16_t>(at, count, smallest, largest); break;
      case TokenType::kUint16: widen<uint16_t>(at, count, smallest, largest); break;
      case TokenType::kInt32: widen<int32_t>(at, count, smallest, largest); break;
      case TokenType::kInt64: widen<int64_t>(at, count, smallest, largest); break;
      case TokenType::kFloat32: widen<float>(at, count, smallest, largest); break;
      case TokenType::kFloat64: widen<double>(at, count, smallest, largest); break;
    }
  }
  if (smallest > largest) return {0, -1};
  return {smallest, largest};
}

void IndexedDataset::read(std::size_t sequence, std::size_t offset, std::size_t count, int64_t* out) const {
  const std::size_t width = token_bytes(token_type_);
  const unsigned char* at =
      data_.data() + static_cast<std::size_t>(load<int64_t>(pointers_ + 8 * sequence)) + offset * width;
  for (std::size_t i = 0; i < count; ++i, at += width) {
    switch (token_type_) {
      case TokenType::kUint8: out[i] = load<uint8_t>(at); break;
      case TokenType::kInt8: out[i] = load<int8_t>(at); break;
      case TokenType::kInt16: out[i] = load<int16_t>(at); break;
      case TokenType::kUint16: out[i] = load<uint16_t>(at); break;
      case TokenType::kInt32: out[i] = load<int32_t>(at); break;
      case TokenType::kInt64: out[i] = load<int64_t>(at); break;
      case TokenType::kFloat32: out[i] = token_of(load<float>(at)); break;
      case TokenType::kFloat64: out[i] = token_of(load<double>(at)); break;
    }
  }
}

std::vector<int64_t> IndexedDataset::sequence(std::size_t sequence) const {
  std::vector<int64_t> tokens(static_cast<std::size_t>(sequence_length(sequence)));
  read(sequence, 0, tokens.size(), tokens.data());
  return tokens;
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenType type)
    : prefix_(std::move(prefix)),
      type_(type),
      data_(std::make_unique<StagedFile>(prefix_ + ".bin")),
      index_(std::make_unique<StagedFile>(prefix_ + ".idx")) {}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;

void IndexedDatasetWriter::add_document(const std::vector<int64_t>& tokens) {
  const std::size_t width = token_bytes(type_);
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<int32_t>::max())) {
    throw SpecError("--input", "a document of " + std::to_string(tokens.size()) + " tokens exceeds int32 lengths");
  }
  pointers_.push_back(data_bytes_);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  for (int64_t token : tokens) {
    unsigned char bytes[8];
    bool fits = true;
    switch (type_) {
      case TokenType::kUint8: {
        const auto v = static_cast<uint8_t>(token);
        fits = v == token;
        std::memcpy(bytes, &v, 1);
        break;
      }
      case TokenType::kInt8: {
        const auto v = static_cast<int8_t>(token);
        fits = v == token;
        std::memcpy(bytes, &v, 1);
        break;
      }
      case TokenType::kInt16: {
        const auto v = static_cast<int16_t>(token);
        fits = v == token;
        std::memcpy(bytes, &v, 2);
        break;
      }
      case TokenType::kUint16: {
        const auto v = static_cast<uint16_t>(token);
        fits = v == token;
        std::memcpy(bytes, &v, 2);
        break;
      }
      case TokenType::kInt32: {
        const auto v = static_cast<int32_t>(token);
        fits = v == token;
        std::memcpy(bytes, &v, 4);
        break;
      }
      case TokenType::kInt64: std::memcpy(bytes, &token, 8); break;
      case TokenType::kFloat32: {
        const auto v = static_cast<float>(token);
        fits = static_cast<int64_t>(v) == token;
        std::memcpy(bytes, &v, 4);
        break;
      }
      case TokenType::kFloat64: {
        const auto v = static_cast<double>(token);
        fits = static_cast<int64_t>(v) == token;
        std::memcpy(bytes, &v, 8);
        break;
      }
    }
    if (!fits) {
      throw SpecError("--input", "token " + std::to_string(token) + " does not fit dtype code " +
                                     std::to_string(static_cast<int>(type_)));
    }
    pending_.insert(pending_.end(), bytes, bytes + width);
  }
  data_bytes_ += static_cast<int64_t>(tokens.size() * width);
  constexpr std::size_t kFlushBytes = std::size_t{1} << 20;  // a write per MiB, not per document
  if (pending_.size() >= kFlushBytes) flush();
}

void IndexedDatasetWriter::flush() {
  data_->write(pending_.data(), pending_.size());
  pending_.clear();
}

void IndexedDatasetWriter::seal() {
  flush();
  index_->write(kMagic, sizeof kMagic);
  const uint64_t version = 1;
  const auto code = static_cast<uint8_t>(type_);
  const uint64_t sequences = lengths_.size();
  const uint64_t document_indices = lengths_.size() + 1;
  index_->write(&version, 8);
  index_->write(&code, 1);
  index_->write(&sequences, 8);
  index_->write(&document_indices, 8);
  index_->write(lengths_.data(), 4 * lengths_.size());
  index_->write(pointers_.data(), 8 * pointers_.size());
  std::vector<int64_t> starts(document_indices);
  for (uint64_t d = 0; d < document_indices; ++d) starts[d] = static_cast<int64_t>(d);
  index_->write(starts.data(), 8 * starts.size());
}

void IndexedDatasetWriter::commit() {
  data_->commit();
  try {
    index_->commit();
  } catch (...) {
    ::unlink((prefix_ + ".bin").c_str());
    throw;
  }
}

void IndexedDatasetWriter::finish() {
  seal();
  commit();
}

}  // namespace megaplan::exec
