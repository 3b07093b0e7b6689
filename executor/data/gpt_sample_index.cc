#include "executor/data/gpt_sample_index.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"
#include "executor/data/index_file.h"
#include "executor/data/seeded_shuffle.h"

namespace megaplan::exec {

namespace {

// A thread's share of the document index: chunks of whole epochs of about this many entries, so
// that the generator's noted states stay few (2.5 KiB each) and the threads' shares even.
constexpr int64_t kChunkEntries = int64_t{1} << 20;
// Entries a thread gathers before writing them: few writes however short the epochs.
constexpr std::size_t kEntriesPerWrite = std::size_t{1} << 20;

enum Section : std::size_t { kDocuments, kStarts, kShuffle };

// Builds epochs of the document and sample index, a chunk at a time, into buffers it keeps from
// one chunk to the next (one builder per thread).
class EpochBuilder {
 public:
  EpochBuilder(const EpochLayout& layout, const std::vector<int32_t>& lengths, IndexFileWriter& writer)
      : layout_(layout), lengths_(lengths), writer_(writer), order_(static_cast<std::size_t>(layout.sequences)) {
    documents_.reserve(kEntriesPerWrite + order_.size());
    starts_.reserve(kEntriesPerWrite + 2);
  }

  // Epochs [first, last): each one's order of the split's sequences, shuffled by `generator`
  // (which this advances past them), and the starts of the samples that begin in it.
  void build(int64_t first, int64_t last, std::mt19937_64& generator) {
    const uint64_t sequences = order_.size();
    first_document_ = static_cast<uint64_t>(first) * sequences;
    first_start_ = layout_.first_sample(first);
    for (int64_t epoch = first; epoch < last; ++epoch) {
      std::iota(order_.begin(), order_.end(), uint32_t{0});
      shuffle(order_.data(), sequences, generator);
      if (sequences >= kEntriesPerWrite) {  // an epoch long enough to be one write: no copy of it
        writer_.write(kDocuments, first_document_, order_.data(), sequences);
        first_document_ += sequences;
      } else {
        documents_.insert(documents_.end(), order_.begin(), order_.end());
        if (documents_.size() >= kEntriesPerWrite) write_documents();
      }
      add_starts(epoch);
    }
    write_documents();
    write_starts();
  }

 private:
  // Walks epoch `epoch`'s order: slot q holds the token before sample k's first, `before` tokens of
  // the epoch lie ahead of it; a sample whose first token begins a sequence starts at the next slot.
  void add_starts(int64_t epoch) {
    std::size_t q = 0;
    int64_t before = 0;
    const int64_t end = layout_.first_sample(epoch + 1);
    for (int64_t k = layout_.first_sample(epoch); k < end; ++k) {
      if (k == 0) {
        starts_.push_back(0);
        starts_.push_back(0);
        continue;
      }
      const int64_t token = k * layout_.seq_length - epoch * layout_.tokens_per_epoch;  // in (0, T]
      while (before + lengths_[order_[q]] <= token - 1) before += lengths_[order_[q++]];
      const bool inside = token < before + lengths_[order_[q]];
      starts_.push_back(static_cast<uint32_t>(inside ? q : q + 1));
      starts_.push_back(static_cast<uint32_t>(inside ? token - before : 0));
      if (starts_.size() >= kEntriesPerWrite) write_starts();
    }
  }
  void write_documents() {
    writer_.write(kDocuments, first_document_, documents_.data(), documents_.size());
    first_document_ += documents_.size();
    documents_.clear();
  }
  void write_starts() {
    writer_.write(kStarts, 2 * static_cast<uint64_t>(first_start_), starts_.data(), starts_.size());
    first_start_ += static_cast<int64_t>(starts_.size() / 2);
    starts_.clear();
  }

  const EpochLayout& layout_;
  const std::vector<int32_t>& lengths_;  // of the split's sequences, by slot
  IndexFileWriter& writer_;
  std::vector<uint32_t> order_;
  std::vector<uint32_t> documents_;  // the orders of epochs from position first_document_ on
  std::vector<uint32_t> starts_;     // (slot, offset) pairs of samples first_start_, ...
  uint64_t first_document_ = 0;
  int64_t first_start_ = 0;
};

// Anonymous memory for the shuffle, asked for in huge pages (fewer page faults and TLB misses over
// an array of hundreds of millions) and given back to the system as soon as it is written.
template <typename T>
class PageBuffer {
 public:
  explicit PageBuffer(uint64_t count) : bytes_(count * sizeof(T)) {
    void* at = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) throw std::bad_alloc();
    (void)::madvise(at, bytes_, MADV_HUGEPAGE);  // advice: without it, ordinary pages
    data_ = static_cast<T*>(at);
  }
  ~PageBuffer() { ::munmap(data_, bytes_); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  T* data() { return data_; }

 private:
  std::size_t bytes_;
  T* data_;
};

template <typename T>
void build_shuffle(uint64_t samples, std::mt19937_64& generator, IndexFileWriter& writer) {
  PageBuffer<T> order(samples);
  std::iota(order.data(), order.data() + samples, T{0});
  shuffle(order.data(), samples, generator);
  writer.write(kShuffle, 0, order.data(), samples);
}

void build_shuffle(int width, uint64_t samples, std::mt19937_64& generator, IndexFileWriter& writer) {
  switch (width) {
    case 2: build_shuffle<uint16_t>(samples, generator, writer); return;
    case 4: build_shuffle<uint32_t>(samples, generator, writer); return;
    default: build_shuffle<uint64_t>(samples, generator, writer); return;
  }
}

// The chunks of epochs, each with the generator's state at its start once the first pass has
// noted it, handed to whichever thread asks next.
class EpochChunks {
 public:
  EpochChunks(int64_t epochs, int64_t chunk_epochs)
      : chunk_epochs_(chunk_epochs), states_(static_cast<std::size_t>((epochs + chunk_epochs - 1) / chunk_epochs)) {}
  int64_t count() const { return static_cast<int64_t>(states_.size()); }
  int64_t first_epoch(int64_t chunk) const { return chunk * chunk_epochs_; }

  void publish(int64_t chunk, const std::mt19937_64& state) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      states_[static_cast<std::size_t>(chunk)] = state;
      published_ = chunk + 1;
    }
    ready_.notify_all();
  }
  // The next chunk no thread has taken and its generator, once noted; nothing when every chunk is
  // taken or the build has failed.
  std::optional<std::pair<int64_t, std::mt19937_64>> take() {
    const int64_t chunk = next_++;
    if (chunk >= count()) return std::nullopt;
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return published_ > chunk || failed_; });
    if (failed_) return std::nullopt;
    std::optional<std::mt19937_64>& state = states_[static_cast<std::size_t>(chunk)];
    std::pair<int64_t, std::mt19937_64> taken{chunk, *state};
    state.reset();
    return taken;
  }
  void fail() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      failed_ = true;
    }
    ready_.notify_all();
  }

 private:
  int64_t chunk_epochs_;
  std::vector<std::optional<std::mt19937_64>> states_;
  std::atomic<int64_t> next_{0};
  std::mutex mutex_;
  std::condition_variable ready_;
  int64_t published_ = 0;
  bool failed_ = false;
};

}  // namespace

int64_t EpochLayout::first_sample(int64_t epoch) const {
  if (epoch == 0) return 0;
  return std::min(samples, epoch * tokens_per_epoch / seq_length + 1);
}

EpochLayout epoch_layout(const IndexedDataset& dataset, DocumentRange documents, int64_t seq_length, int64_t samples) {
  EpochLayout layout;
  layout.first_sequence = dataset.document_start(static_cast<std::size_t>(documents.begin));
  layout.sequences = dataset.document_start(static_cast<std::size_t>(documents.end)) - layout.first_sequence;
  if (layout.sequences > std::numeric_limits<uint32_t>::max()) {
    throw SpecError("--data-path", dataset.prefix() + ": a split of " + std::to_string(layout.sequences) +
                                       " sequences: must be fewer than 2^32 (the document index's entries)");
  }
  for (int64_t s = 0; s < layout.sequences; ++s) {
    const int64_t length = dataset.sequence_length(static_cast<std::size_t>(layout.first_sequence + s));
    layout.tokens_per_epoch += length;
    layout.longest_sequence = std::max(layout.longest_sequence, length);
  }
  if (layout.tokens_per_epoch <= 1) {
    throw SpecError("--split", "the split's documents [" + std::to_string(documents.begin) + ", " +
                                   std::to_string(documents.end) + ") hold " + std::to_string(layout.tokens_per_epoch) +
                                   " tokens, too few for any sample");
  }
  layout.seq_length = seq_length;
  layout.samples = samples;
  // The stream of E epochs holds N samples when its E T tokens reach N seq_length + 1.
  layout.epochs =
      std::max<int64_t>(1, (samples * seq_length + 1 + layout.tokens_per_epoch - 1) / layout.tokens_per_epoch);
  return layout;
}

void build_gpt_sample_index(const IndexedDataset& dataset, const EpochLayout& layout, uint64_t seed, int64_t threads,
                            const std::string& path, nlohmann::json header) {
  const auto sequences = static_cast<uint64_t>(layout.sequences);
  const auto samples = static_cast<uint64_t>(layout.samples);
  header["facts"] = {{"epochs", layout.epochs},
                     {"tokens_per_epoch", layout.tokens_per_epoch},
                     {"first_sequence", layout.first_sequence},
                     {"sequences", layout.sequences}};
  const int shuffle_width = index_width(samples - 1);
  IndexFileWriter writer(
      path, std::move(header),
      {{kDocumentIndex, index_width(sequences - 1), static_cast<uint64_t>(layout.epochs) * sequences},
       {kSampleIndex, index_width(std::max<uint64_t>(sequences, static_cast<uint64_t>(layout.longest_sequence))),
        2 * samples},
       {kShuffleIndex, shuffle_width, samples}});
  std::vector<int32_t> lengths(sequences);
  for (uint64_t s = 0; s < sequences; ++s) {
    lengths[s] = dataset.sequence_length(static_cast<std::size_t>(layout.first_sequence) + s);
  }
  const int64_t chunk_epochs = std::max<int64_t>(1, kChunkEntries / layout.sequences);
  EpochChunks chunks(layout.epochs, chunk_epochs);
  const auto build_chunk = [&](EpochBuilder& builder, int64_t chunk, std::mt19937_64& generator) {
    const int64_t first = chunks.first_epoch(chunk);
    builder.build(first, std::min(layout.epochs, first + chunk_epochs), generator);
  };
  std::mt19937_64 generator(seed);
  if (threads <= 1) {
    EpochBuilder builder(layout, lengths, writer);
    for (int64_t chunk = 0; chunk < chunks.count(); ++chunk) build_chunk(builder, chunk, generator);
    build_shuffle(shuffle_width, samples, generator, writer);
    writer.commit();
    return;
  }

  std::mutex error_mutex;
  std::exception_ptr error;  // the first failure, rethrown once every thread has ended
  const auto guarded = [&](const auto& work) {
    try {
      work();
    } catch (...) {
      {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      chunks.fail();
    }
  };
  const auto take_chunks = [&] {
    std::optional<EpochBuilder> builder;
    while (std::optional<std::pair<int64_t, std::mt19937_64>> taken = chunks.take()) {
      if (!builder) builder.emplace(layout, lengths, writer);
      build_chunk(*builder, taken->first, taken->second);
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (int64_t t = 1; t < threads; ++t) helpers.emplace_back([&] { guarded(take_chunks); });
  } catch (const std::system_error&) {
    // No more threads to be had: those started, and this one, share the chunks.
  }
  guarded([&] {
    // The first pass notes each chunk's state, then shuffles the samples from where it ends.
    for (int64_t chunk = 0; chunk < chunks.count(); ++chunk) {
      chunks.publish(chunk, generator);
      const int64_t last = std::min(layout.epochs, chunks.first_epoch(chunk) + chunk_epochs);
      for (int64_t epoch = chunks.first_epoch(chunk); epoch < last; ++epoch) skip_shuffle(sequences, generator);
    }
    build_shuffle(shuffle_width, samples, generator, writer);
    take_chunks();
  });
  for (std::thread& helper : helpers) helper.join();
  if (error) std::rethrow_exception(error);
  writer.commit();
}

}  // namespace megaplan::exec
