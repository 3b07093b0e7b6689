// Per-rank checkpoints in Megatron's layout, resharded on load:
//
//   DIR/latest_checkpointed_iteration.txt            the newest complete save; replaced last
//   DIR/iter_0000040/state.json                      iteration, consumed samples, seed, the model, the
//                                                    saving plan (tp, pp, vpp, dp, schedule, distributed optimizer...),
//                                                    the format and the list of rank directories
//   DIR/iter_0000040/mp_rank_TT[_PPP]/model.bin      per tensor: fp32 value, first moment, second moment
//   DIR/iter_0000040/mp_rank_TT[_PPP]/manifest.json  per tensor: name, dtype, shard shape, global shape,
//                                                    shard (dim, index, count), byte offset, checksum;
//                                                    the checksum's algorithm and block size
//
// TT is the tensor-parallel rank (2 digits) and PPP the pipeline rank (3 digits, only when pp > 1),
// as Megatron names them; under expert parallelism _EEE, the expert-parallel rank, follows. The
// ranks of data-parallel rank 0 write their directory: every stage chunk they hold, each tensor
// their whole tensor-parallel shard, with the Adam moments the distributed optimizer spread over
// the data-parallel group gathered first. Under expert parallelism a routed expert's tensors are
// written by replica 0 of its expert data-parallel group, into the directory of its ep rank
// (parallel_groups.h's writes_parameter), named by the expert's index in the layer.
//
// The checksum (formats megaplan-checkpoint/3 and /4) is XXH3-64 over the list of the XXH3-64s of the
// tensor's bytes (value, then the moments) in blocks of checksum_block_bytes (4 MiB), as the
// manifest's tensor_checksum names it: blocks, so that several threads checksum one large tensor;
// XXH3, because FNV-1a's byte-at-a-time loop (about 1 GB/s on one core) held saves and loads below
// the disk's speed. 64 bits make an accidental match of damaged bytes negligible. Checkpoints of
// format 2, whose manifests carry an FNV-1a 64 of each whole tensor, are still read. Format 4 binds
// each manifest to its checkpoint (the iteration, the directory's name, the saving plan:
// RankBinding), so that a rank directory copied from another checkpoint is refused though its
// checksums pass; format 3, without it, is still read. A load checks model.bin's size against its
// manifest and checksums every replica of a tensor it reads (checkpoint_shard_reader.h).
//
// A save is atomic across ranks: everything goes into iter_XXXXXXX.tmp, every writer syncs its
// files, all ranks meet at a barrier, then global rank 0 renames the directory into place and
// writes latest_checkpointed_iteration.txt. A failure on any rank stops the others at the barrier
// (the communicators abort), so no iter_ directory that a load would pick is left half-written; a
// leftover .tmp directory is never read and the next save of that iteration replaces it.
//
// Speed: a writing rank streams its tensors from the device through a page-locked window of a few
// 4 MiB blocks per thread: once the window is full, threads checksum each block and write it at
// its offset, and the window fills again, so host memory stays small whatever the model. With --async-save the rank
// copies its tensors into a whole host image laid out as model.bin (12 bytes per parameter,
// page-locked once and kept from save to save; the run refuses to start when it cannot fit in the
// host's available memory), and that copy is all the training waits for: a thread writes and
// syncs the .tmp directory's files from it, and the barrier, rename and
// latest_checkpointed_iteration.txt follow on the training thread at the next save or the run's
// end (CheckpointSaver), the previous checkpoint the newest until then. A load reads blocks on
// threads as well: a tensor saved under the loading rank's own cut streams through a window from
// the file to the device (checksummed by the reading thread, no copy on the host); only the others
// are read whole and resharded.
//
// A load finds every tensor a rank needs by name in the manifests, whatever layout saved them: the
// saved shards are concatenated along their split dimension and the rank's part is cut out (tensor
// parallelism), stages are found wherever they were saved (pipeline and virtual pipeline sizes),
// and the distributed optimizer takes its shard of the whole moments (data parallelism). A last
// stage's tied copy of the word embedding is read from the embedding when the saving layout had no
// copy. Under an unchanged layout the resumed run repeats the uninterrupted one bit for bit.
//
// The vocabulary: the word embedding and the output layer hold Megatron's padded vocabulary, rows
// up to a multiple of make_vocab_size_divisible_by x tp, so their rows change with tp. state.json's
// model_spec records the true vocabulary (vocab_size); the rows past it are the saving layout's
// padding. They are saved as trained, not dropped: the padded logits take part in the softmax (as
// in Megatron), so the padding rows are random at initialisation and trained, and a resume under a
// layout of the same padding must find them to repeat the run bit for bit. A load under a layout
// of another padding keeps every real row (with its moments), keeps the padding rows both layouts
// have, drops the rest or adds zero rows (zero moments), as Megatron's checkpoint converter does;
// the loss then changes by what the dropped or added padding logits contributed. A checkpoint of
// another vocabulary (model_spec's vocab_size) is refused. read_checkpoint_weights gives the true
// vocabulary's rows only.
//
// state.json records the tokenizer the run was trained with (train's tokenizer flags, its files as
// absolute paths), when the run named one, for `megaplan convert --to hf`; a resumed run that names
// none carries the loaded one on. Checkpoints saved before this field hold no "tokenizer" and are
// read as they are: their tokenizer is unknown (the format string is unchanged, since every
// reader of it ignores the field or finds it optional).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "executor/data/tokenizer.h"
#include "executor/io/folder_lock.h"
#include "executor/io/parallel_tasks.h"
#include "executor/io/safetensors.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/backend.h"
#include "executor/train/expert_bias_state.h"
#include "executor/train/loss_scaler.h"
#include "executor/train/optimizer.h"
#include "executor/train/parallel_groups.h"

namespace megaplan::exec {

struct TrainingState {
  int64_t iteration = 0;         // updates done
  int64_t consumed_samples = 0;  // training samples drawn; the data position
  uint64_t seed = 0;             // the data order and the initialisation (no dropout: no other randomness)
  // The tokenizer the data was prepared with, when the run named one (nullopt: unknown).
  std::optional<TokenizerOptions> tokenizer;
  // Iterations skipped for overflowing gradients under loss scaling, and their samples: Adam's
  // step counts only the updates done, and the learning rate's schedule only their samples.
  int64_t skipped_iterations = 0;
  int64_t skipped_samples = 0;
  std::optional<LossScalerState> loss_scaler;  // the scaler's, when the run scales its loss
  // --moe-router-enable-expert-bias: every MoE layer's expert bias (expert_bias_state.h). A save
  // gathers them from the ranks; a load sets them.
  ExpertBiasState expert_biases;
};

// One rank as checkpoints see it: the plan it runs, its place in the world, its stage chunks (in
// increasing stage order, as the optimizer holds them) and their optimizer.
struct CheckpointRank {
  const ModelSpec& model;
  const ParallelPlan& plan;
  const ParallelGroups& groups;
  std::vector<StageChunk*> chunks;
  Optimizer& optimizer;
  Backend& backend;
  int64_t threads = default_checkpoint_threads();  // the threads writing, reading and checksumming
};

// Every rank of the world calls it at the same iteration (it meets the others at barriers on
// groups.world, and gathers the distributed optimizer's moments over the data-parallel group).
// Throws SpecError("--save", ...) when something cannot be written; the other ranks then throw
// CommAborted, and DIR's latest_checkpointed_iteration.txt and earlier iterations are unchanged.
void save_checkpoint(const std::string& directory, const TrainingState& state, const CheckpointRank& rank);

// Saves a rank's checkpoints one after the other, keeping its page-locked host memory (a window, or
// the image of its directory) from one save to the next. Synchronous, save() is save_checkpoint. With
// --async-save (`async`), save() copies the rank's state into the image and returns while a thread
// writes and syncs the rank's files into iter_XXXXXXX.tmp; finish() later waits for that thread,
// meets the other ranks at the barrier and publishes the save (rank 0 renames it and writes
// latest_checkpointed_iteration.txt), on the training thread, the only one using the
// communicators. Until then the previous checkpoint stays the newest: a kill at any moment leaves
// it loadable.
class CheckpointSaver {
 public:
  CheckpointSaver(bool async, Backend& backend);
  ~CheckpointSaver();  // waits for a save being written, and leaves it unpublished
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // As save_checkpoint (every rank at the same iteration), a save being written finished first.
  void save(const std::string& directory, const TrainingState& state, const CheckpointRank& rank);
  // Publishes the save being written, once written, and returns its iteration (nothing when none
  // is). Every rank calls it at the same point. Throws as save_checkpoint does.
  std::optional<int64_t> finish(const CheckpointRank& rank);

  // The last published save of this rank: its model.bin's bytes (0 on a rank that writes none),
  // the seconds spent copying them into the host image (training's pause under --async-save) and
  // writing them (checksums, writes, syncs).
  struct Times {
    uint64_t bytes = 0;
    double snapshot_seconds = 0, write_seconds = 0;
  };
  const Times& last_save() const { return last_save_; }
  // The snapshot of the save started last (published or not).
  double last_snapshot_seconds() const { return last_snapshot_seconds_; }
  // The page-locked host memory the saver holds (0 before its first save on a writing rank): the
  // whole image under --async-save, a window of a few blocks per thread otherwise.
  std::size_t host_bytes() const;

 private:
  struct Writing;
  struct Held;
  bool async_;
  std::unique_ptr<Held> held_;
  std::unique_ptr<Writing> writing_;
  Times last_save_;
  double last_snapshot_seconds_ = 0;
};

// The host memory --async-save keeps for a rank of `plan`: an image of its directory's model.bin,
// 12 bytes per parameter of its stages at its tensor-parallel rank (0 on a rank that writes none).
uint64_t async_save_image_bytes(const ModelSpec& model, const ParallelPlan& plan, const ParallelGroups& groups);
// Before training starts: throws SpecError("--async-save", ...) when the images of the ranks a
// process holds, `image_bytes`, take more than 3/4 of `available_bytes` (the host's available
// memory, host_available_bytes(); ranks of one host in several processes each count it alone).
void check_async_save_memory(uint64_t image_bytes, int64_t available_bytes);

// Before training starts: `load` (--load) must be a directory, or not exist when it is also
// `save` (Megatron's resume-or-start idiom: the first run starts from scratch, later ones resume);
// `save` (--save) must be a directory, or creatable, that this process can write, on a filesystem
// with `checkpoint_bytes` free. Throws SpecError naming the flag and the rule.
void check_checkpoint_directories(const std::optional<std::string>& load, const std::optional<std::string>& save,
                                  int64_t checkpoint_bytes);

// The --save folder held by one run for its life: created when missing (and removed again, when
// still empty, once let go), and locked (io/folder_lock.h), so that a second run saving into it is
// refused before it trains rather than racing this one's saves. The process of global rank 0 takes
// it. Throws SpecError("--save", ...) when another run holds it; holds nothing without --save.
class SaveFolderLock {
 public:
  explicit SaveFolderLock(const std::optional<std::string>& save);
  ~SaveFolderLock();
  SaveFolderLock(const SaveFolderLock&) = delete;
  SaveFolderLock& operator=(const SaveFolderLock&) = delete;

 private:
  std::string created_;  // the folder, when this lock created it
  std::unique_ptr<FolderLock> lock_;
};

// Whether two paths name the same directory (spelled differently, or through a link).
bool same_directory(const std::string& a, const std::string& b);

// The newest checkpoint under `directory` loaded into the rank's chunks and optimizer (compute
// weights refreshed), or nothing when the directory holds none (no iter_ directory, no
// latest_checkpointed_iteration.txt). Throws SpecError("--load", ...)
// naming the file and the rule for an unreadable checkpoint, one of another model (a tensor
// missing, extra, or of another global shape: both shapes named; another vocabulary) or a
// corrupted tensor (its checksum); nothing has been trained or written then. The vocabulary's
// tensors load under any padding (the header above says how). The state's tokenizer is the
// checkpoint's (nullopt when it records none).
// `counts`, when given, says what the load read.
struct CheckpointLoadCounts {
  uint64_t bytes = 0;             // of the checkpoint's files
  int64_t tensors_as_saved = 0;   // a saved shard exactly the rank's part: streamed to the device
  int64_t tensors_resharded = 0;  // joined from saved parts and cut (another layout)
  // Newer iteration directories passed over, incomplete, where no latest_checkpointed_iteration.txt
  // named one: each with what it lacks.
  std::vector<std::string> incomplete;
};
std::optional<TrainingState> load_checkpoint(const std::string& directory, const CheckpointRank& rank,
                                             CheckpointLoadCounts* counts = nullptr);

// The newest checkpoint's weights as whole tensors (each joined from its shards; a tied output
// layer's copy left out; the vocabulary's tensors cut to the model's vocab_size rows, without the
// saving layout's padding), the model and the tokenizer state.json records: what `megaplan
// convert` reads. Throws SpecError("--load", ...) as load_checkpoint does.
struct CheckpointWeights {
  ModelSpec model;
  std::map<std::string, WholeTensor> tensors;  // by Megatron's name, global shapes (unpadded)
  std::optional<TokenizerOptions> tokenizer;   // nullopt: the checkpoint does not say
};
CheckpointWeights read_checkpoint_weights(const std::string& directory);

// `tensors` (whole, by Megatron's name; the vocabulary's rows, when fewer than `plan` pads the
// vocabulary to, padded with zero rows) saved as a checkpoint of `model` laid out for `plan`, at
// iteration 0 with zero Adam moments: training from it (--load) starts a fresh optimizer at
// iteration 1 (Megatron's --finetune), drawing data with `seed`. Atomic as save_checkpoint; throws
// SpecError("--save", ...) when it cannot be written.
void write_checkpoint_weights(const std::string& directory, const ModelSpec& model, const ParallelPlan& plan,
                              const std::map<std::string, WholeTensor>& tensors, uint64_t seed);

}  // namespace megaplan::exec
