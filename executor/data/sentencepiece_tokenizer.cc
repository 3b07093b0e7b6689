#include "executor/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "core/text_file.h"

namespace megaplan::exec {

namespace {
const char* const kModelFlag = "--tokenizer-model";
}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : model_path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  // Read here rather than by Load(path), so a missing file gets megaplan's one line and not the
  // library's message.
  std::string serialized;
  try {
    serialized = read_text_file(model_path);
  } catch (const SpecError& error) {
    throw SpecError(kModelFlag, error.what());
  }
  if (serialized.empty() || !processor_->LoadFromSerializedProto(serialized).ok() || processor_->GetPieceSize() <= 0) {
    throw SpecError(kModelFlag,
                    model_path + ": not a SentencePiece model (a tokenizer.model protobuf, as spm_train writes)");
  }
  vocab_size_ = processor_->GetPieceSize();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok())
    throw SpecError(kModelFlag, model_path_ + ": libsentencepiece cannot encode a document: " + status.ToString());
  return std::vector<int64_t>(ids.begin(), ids.end());
}

int64_t SentencePieceTokenizer::end_of_document() const {
  const int eos = processor_->eos_id();
  if (eos < 0)
    throw SpecError("--append-eod", model_path_ + ": the SentencePiece model has no end-of-sentence piece (eos_id -1)");
  return eos;
}

}  // namespace megaplan::exec
