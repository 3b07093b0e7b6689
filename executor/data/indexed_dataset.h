// Megatron-LM's indexed dataset: PREFIX.bin holds every sequence's tokens back to back, PREFIX.idx
// says where each starts ("MMIDIDX" version 1). Read by mmap, so a corpus larger than memory costs
// nothing to open; written through temporary files renamed into place, so a failed or interrupted
// write leaves nothing behind.
//
// .idx layout (little-endian): the 9-byte magic "MMIDIDX\0\0", version (uint64 = 1), dtype code
// (uint8), sequence count n (uint64), document count d (uint64), then n int32 sequence lengths (in
// tokens), n int64 sequence pointers (byte offsets into .bin), and d int64 document indices: the
// sequence index where each document starts, the last one equal to n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor/io/mapped_file.h"

namespace megaplan::exec {

// Megatron's dtype codes.
enum class TokenType : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};
std::size_t token_bytes(TokenType type);
// Megatron's choice for a vocabulary: uint16 below 65500 tokens, else int32.
TokenType token_type_for_vocabulary(int64_t vocab_size);

// A read-only view of PREFIX.bin and PREFIX.idx, both memory-mapped.
class IndexedDataset {
 public:
  // Throws SpecError("--data-path", ...) naming the file and the rule for a missing or truncated
  // file, a wrong magic or version, an unknown dtype code, or a sequence reaching past .bin's end.
  explicit IndexedDataset(const std::string& prefix);
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  TokenType token_type() const { return token_type_; }
  std::size_t num_sequences() const { return num_sequences_; }
  std::size_t num_documents() const { return num_document_indices_ - 1; }
  int32_t sequence_length(std::size_t sequence) const;
  // The sequence index where document `document` starts; document_start(num_documents()) is n.
  int64_t document_start(std::size_t document) const;
  // Tokens [offset, offset + count) of a sequence, converted to int64 (float dtypes truncate).
  // REQUIRES: offset + count <= sequence_length(sequence).
  void read(std::size_t sequence, std::size_t offset, std::size_t count, int64_t* out) const;
  std::vector<int64_t> sequence(std::size_t sequence) const;
  const std::string& prefix() const { return prefix_; }
  // The smallest and largest token of every sequence (float dtypes truncated); {0, -1} when the
  // dataset holds no tokens. One pass over .bin.
  std::pair<int64_t, int64_t> token_range() const;

 private:
  std::string prefix_;
  MappedFile index_;
  MappedFile data_;
  TokenType token_type_ = TokenType::kUint16;
  std::size_t num_sequences_ = 0;
  std::size_t num_document_indices_ = 0;
  const unsigned char* lengths_ = nullptr;    // int32 x n, unaligned-safe reads
  const unsigned char* pointers_ = nullptr;   // int64 x n
  const unsigned char* documents_ = nullptr;  // int64 x d
};

class StagedFile;

// Writes documents (one sequence each, as Megatron's preprocess_data writes them) to PREFIX.bin as
// they come, under a temporary name beside it (executor/io/staged_file.h), and PREFIX.idx at the
// end; both appear under their names only once complete. Tokens must fit the token type (checked).
class IndexedDatasetWriter {
 public:
  // Throws StagedFile's SpecError when PREFIX.bin or PREFIX.idx exists and is no regular file, or
  // is an input of this command.
  IndexedDatasetWriter(std::string prefix, TokenType type);
  ~IndexedDatasetWriter();  // what was not committed is removed
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_document(const std::vector<int64_t>& tokens);
  // seal() then commit(): both files in place.
  void finish();
  // Writes PREFIX.idx and syncs both files, still under their temporary names; no document may
  // follow. For writers that commit together (data prepare's keys): seal all, then commit each.
  void seal();
  // Renames PREFIX.bin, then PREFIX.idx, into place; when the second fails the first is removed.
  // Throws SpecError(path, ...) when a file cannot be written. REQUIRES: sealed.
  void commit();

 private:
  void flush();

  std::string prefix_;
  TokenType type_;
  std::unique_ptr<StagedFile> data_;
  std::unique_ptr<StagedFile> index_;
  std::vector<unsigned char> pending_;  // encoded tokens not yet written to .bin
  int64_t data_bytes_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
};

}  // namespace megaplan::exec
