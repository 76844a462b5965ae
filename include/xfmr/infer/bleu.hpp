// bleu.hpp: corpus BLEU as sacreBLEU computes it by default.
//
// tokenize_13a(): the mteval-v13a tokenization (sacreBLEU's default "13a"):
//   unescape &quot; &amp; &lt; &gt;, split off the symbols
//   { | } ~ [ \ ] ^ _ ` space ! " # $ % & ( ) * + : ; < = > ? @ /,
//   split '.' and ',' unless next to a digit, split '-' after a digit, and
//   collapse whitespace.
// corpus_bleu(): n-grams 1..4 clipped by the largest count in any reference,
//   brevity penalty against the closest reference length, geometric mean of
//   the precisions with sacreBLEU's default "exp" smoothing for orders with no
//   match. Scores are on 0..100; identical output scores 100, empty output 0.
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xfmr {

std::string tokenize_13a(std::string_view line);

struct BleuScore {
  double score = 0;                    // 0..100
  std::array<double, 4> precisions{};  // 0..100
  double brevity_penalty = 0, ratio = 0;
  long hyp_len = 0, ref_len = 0;
  std::string to_string() const;  // "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 ...)"
};

// hypotheses[i] is scored against references[k][i] for every reference set k.
BleuScore corpus_bleu(std::span<const std::string> hypotheses, std::span<const std::vector<std::string>> references);

}  // namespace xfmr
