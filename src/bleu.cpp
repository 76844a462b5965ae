// bleu.cpp: 13a tokenization and corpus BLEU (see bleu.hpp).
#include "xfmr/infer/bleu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "xfmr/core/error.hpp"

namespace xfmr {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The symbols the first 13a rule pads with spaces.
bool is_split_symbol(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 0x7b && u <= 0x7e) || (u >= 0x5b && u <= 0x60) || (u >= 0x20 && u <= 0x26) ||
         (u >= 0x28 && u <= 0x2b) || (u >= 0x3a && u <= 0x40) || c == '/';
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// One left-to-right pass of a two-character rule with non-overlapping
// matches, as a regular-expression substitution makes it.
template <class Match, class Emit>
std::string two_char_rule(const std::string& s, Match match, Emit emit) {
  std::string out;
  std::size_t i = 0;
  while (i + 1 < s.size()) {
    if (match(s[i], s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out += s[i++];
    }
  }
  if (i < s.size()) out += s[i];
  return out;
}

using Counts = std::map<std::string, long>;

Counts ngrams(const std::vector<std::string>& words, int n) {
  Counts c;
  for (std::size_t i = 0; i + n <= words.size(); ++i) {
    std::string key;
    for (int k = 0; k < n; ++k) (key += words[i + k]) += '\x1f';
    ++c[key];
  }
  return c;
}

std::vector<std::string> bleu_words(const std::string& s) {
  std::vector<std::string> w;
  std::istringstream in(s);
  for (std::string t; in >> t;) w.push_back(t);
  return w;
}

}  // namespace

std::string tokenize_13a(std::string_view input) {
  std::string line(input);
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  std::replace(line.begin(), line.end(), '\n', ' ');
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  std::string padded = " ";
  for (char c : line) {
    if (is_split_symbol(c)) (padded += ' ') += c, padded += ' ';
    else padded += c;
  }
  padded += ' ';
  // period and comma unless preceded by a digit: ([^0-9])([.,]) -> "\1 \2 "
  padded = two_char_rule(
      padded, [](char a, char b) { return !is_digit(a) && (b == '.' || b == ','); },
      [](std::string& o, char a, char b) { ((o += a) += ' ') += b, o += ' '; });
  // period and comma unless followed by a digit: ([.,])([^0-9]) -> " \1 \2"
  padded = two_char_rule(
      padded, [](char a, char b) { return (a == '.' || a == ',') && !is_digit(b); },
      [](std::string& o, char a, char b) { ((o += ' ') += a) += ' ', o += b; });
  // dash after a digit: ([0-9])(-) -> "\1 \2 "
  padded = two_char_rule(
      padded, [](char a, char b) { return is_digit(a) && b == '-'; },
      [](std::string& o, char a, char b) { ((o += a) += ' ') += b, o += ' '; });
  std::string out;
  for (const auto& w : bleu_words(padded)) (out.empty() ? out : out += ' ') += w;
  return out;
}

BleuScore corpus_bleu(std::span<const std::string> hyps, std::span<const std::vector<std::string>> refs) {
  require(!refs.empty(), "BLEU needs at least one reference set");
  for (std::size_t k = 0; k < refs.size(); ++k)
    require(refs[k].size() == hyps.size(), "reference set ", k + 1, " has ", refs[k].size(), " lines for ",
            hyps.size(), " hypotheses");
  std::array<long, 4> correct{}, total{};
  BleuScore s;
  for (std::size_t i = 0; i < hyps.size(); ++i) {
    const auto h = bleu_words(tokenize_13a(hyps[i]));
    std::vector<std::vector<std::string>> rs;
    for (const auto& set : refs) rs.push_back(bleu_words(tokenize_13a(set[i])));
    // The closest reference length; ties go to the shorter.
    long closest = -1;
    for (const auto& r : rs) {
      const long len = static_cast<long>(r.size()), d = std::labs(len - long(h.size()));
      if (closest < 0 || d < std::labs(closest - long(h.size())) || (d == std::labs(closest - long(h.size())) && len < closest))
        closest = len;
    }
    s.hyp_len += static_cast<long>(h.size());
    s.ref_len += closest;
    for (int n = 1; n <= 4; ++n) {
      const Counts hc = ngrams(h, n);
      Counts max_ref;
      for (const auto& r : rs)
        for (const auto& [g, c] : ngrams(r, n)) max_ref[g] = std::max(max_ref[g], c);
      for (const auto& [g, c] : hc) {
        const auto it = max_ref.find(g);
        correct[n - 1] += std::min(c, it == max_ref.end() ? 0L : it->second);
        total[n - 1] += c;
      }
    }
  }
  if (s.hyp_len == 0) return s;  // empty output scores 0
  double smooth = 1.0, log_sum = 0.0;
  for (int n = 0; n < 4; ++n) {
    if (total[n] == 0) {
      s.precisions[n] = 0;
      log_sum = -INFINITY;
      continue;
    }
    if (correct[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * double(total[n]));
    } else {
      s.precisions[n] = 100.0 * double(correct[n]) / double(total[n]);
    }
    log_sum += std::log(s.precisions[n]);
  }
  s.ratio = double(s.hyp_len) / double(s.ref_len);
  s.brevity_penalty = s.hyp_len < s.ref_len ? std::exp(1.0 - double(s.ref_len) / double(s.hyp_len)) : 1.0;
  s.score = std::isfinite(log_sum) ? s.brevity_penalty * std::exp(log_sum / 4.0) : 0.0;
  return s;
}

std::string BleuScore::to_string() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %ld ref_len = %ld)",
                score, precisions[0], precisions[1], precisions[2], precisions[3], brevity_penalty, ratio, hyp_len,
                ref_len);
  return buf;
}

}  // namespace xfmr
