// datasets.hpp: batches for language modelling and classification.
//
// LmBatcher: random-offset (B, T) windows of a token stream with targets
//   shifted by one (the seeds' get_batch); fixed evaluation batches from
//   their own seed, so every evaluation sees the same windows.
// names_corpus: the names mode: lines shuffled with a seed, split by name,
//   each split joined with a separator so one stream holds every name.
// LabeledText / read_labeled_tsv: "label<TAB>text" with a header line; a line
//   without a tab or with a non-integer label is an error naming the line.
// make_class_batch: encoded sequences padded to the batch's longest (capped
//   at max_t by truncation), with the key-padding mask and labels.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "xfmr/core/rng.hpp"

namespace xfmr {

class LmBatcher {
 public:
  LmBatcher(std::span<const std::int32_t> tokens, int batch, int length);
  // ids, targets: batch * length each.
  void sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const;
  // The i-th of the fixed evaluation batches drawn from `seed`.
  void fixed(std::uint64_t seed, int i, std::int32_t* ids, std::int32_t* targets) const;
  int batch() const { return batch_; }
  int length() const { return length_; }

 private:
  void window(std::size_t offset, std::int32_t* ids, std::int32_t* targets) const;
  std::span<const std::int32_t> tokens_;
  int batch_, length_;
};

// Names mode (seed 000): non-empty lines shuffled with a seed and split by name.
struct NamesSplit {
  std::vector<std::string> train, val;
};
NamesSplit split_names(const std::vector<std::string>& lines, double train_fraction, std::uint64_t seed);

// One whole sequence per row, as makemore trains on names: ids are
// [sep, s1 .. sn] and targets [s1 .. sn, sep], the rest of the row padded
// (ids pad_id, targets ignore_index). Sequences longer than length - 1 are an
// error naming the sequence.
class SequenceBatcher {
 public:
  SequenceBatcher(std::vector<std::vector<std::int32_t>> sequences, int batch, int length, std::int32_t sep,
                  std::int32_t pad_id, std::int32_t ignore_index);
  // A batch of sequences drawn at random (with replacement).
  void sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const;
  // The i-th batch of the sequences in order (the last may be partly padding
  // rows whose targets are all ignored); batches() covers them all once.
  void in_order(int i, std::int32_t* ids, std::int32_t* targets) const;
  int batches() const { return static_cast<int>((seqs_.size() + batch_ - 1) / batch_); }
  std::size_t size() const { return seqs_.size(); }

 private:
  void row(const std::vector<std::int32_t>* seq, std::int32_t* ids, std::int32_t* targets) const;
  std::vector<std::vector<std::int32_t>> seqs_;
  int batch_, length_;
  std::int32_t sep_, pad_, ignore_;
};

struct LabeledText {
  int label = 0;
  std::string text;
};
// Labels lie in 0..kMaxClasses-1: a classifier has one output row a class,
// so a stray huge label would otherwise size the model (and exhaust memory).
inline constexpr int kMaxClasses = 1 << 16;
std::vector<LabeledText> read_labeled_tsv(const std::filesystem::path& path);

struct ClassBatch {
  int B = 0, T = 0;
  std::vector<std::int32_t> ids;         // (B, T), pad_id where padded
  std::vector<std::uint8_t> padding;     // (B, T), 1 = pad
  std::vector<std::int32_t> labels;      // (B)
};
// sequences[i] are encoded token ids; cls_id >= 0 prepends it to each.
ClassBatch make_class_batch(std::span<const std::vector<std::int32_t>> sequences, std::span<const int> labels,
                            int max_t, std::int32_t pad_id, std::int32_t cls_id = -1);

}  // namespace xfmr
