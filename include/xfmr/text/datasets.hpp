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

struct NamesCorpus {
  std::string train, val;  // names joined by the separator, which also starts each split
};
NamesCorpus names_corpus(const std::vector<std::string>& lines, double train_fraction, std::uint64_t seed,
                         char separator = '\n');

struct LabeledText {
  int label = 0;
  std::string text;
};
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
