#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"

BOOST_AUTO_TEST_SUITE(test_blocks)

using namespace xfmr;
using namespace xfmr::test;

namespace {

template <class Block>
void check_self_block(const char* name, Shape bt, const std::vector<std::uint8_t>& pad, float dropout = 0.0f) {
  constexpr int D = Block::D;
  Rng rng(21);
  Be be;
  Block block(rng, dropout);
  GradCase c;
  c.name = name;
  c.input("x", bt.rows() * D, rng);
  c.output(bt.rows() * D, rng);
  c.forward = [&] {
    block.forward(be, crows_of<D>(c.x[0]), rows_of<D>(c.y), bt, pad.empty() ? nullptr : pad.data());
  };
  c.backward = [&] { block.backward(be, crows_of<D>(c.dy), rows_of<D>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { block.visit(f); };
  check_case(c);
}

// With dropout (branches and attention probabilities) the call counters
// restart before every forward: one mask for every evaluation of the loss.
template <class Cfg>
void check_decoder_block(const char* name, Shape tgt, Shape src, const std::vector<std::uint8_t>& tgt_pad,
                         const std::vector<std::uint8_t>& src_pad, float dropout = 0.0f) {
  constexpr int D = Cfg::D_MODEL;
  Rng rng(22);
  Be be;
  DecoderBlock<Cfg, Be> block(rng, dropout, dropout);
  GradCase c;
  c.name = name;
  c.input("x", tgt.rows() * D, rng);
  c.input("memory", src.rows() * D, rng);
  c.output(tgt.rows() * D, rng);
  c.forward = [&] {
    block.for_each_dropout([](auto& d) { d.set_calls(1); });
    block.forward(be, crows_of<D>(c.x[0]), crows_of<D>(c.x[1]), rows_of<D>(c.y), tgt, src,
                  tgt_pad.empty() ? nullptr : tgt_pad.data(), src_pad.empty() ? nullptr : src_pad.data());
  };
  c.backward = [&] {
    block.backward(be, crows_of<D>(c.dy), rows_of<D>(c.dx[0]), rows_of<D>(c.dx[1]));
  };
  c.visit = [&](const ParamFn& f) { block.visit(f); };
  check_case(c);
}

}  // namespace

BOOST_AUTO_TEST_CASE(encoder_block_pre_norm_padded) {
  check_self_block<EncoderBlock<TinyPre, Be>>("EncoderBlock pre-norm, padded", {2, 5}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1});
}
BOOST_AUTO_TEST_CASE(encoder_block_post_norm_padded) {
  check_self_block<EncoderBlock<TinyPost, Be>>("EncoderBlock post-norm, padded", {2, 5}, {0, 0, 0, 0, 1, 0, 0, 1, 1, 1});
}
BOOST_AUTO_TEST_CASE(decoder_only_block_pre_norm) {
  check_self_block<DecoderOnlyBlock<TinyPre, Be>>("DecoderOnlyBlock pre-norm", {2, 6}, {});
}
BOOST_AUTO_TEST_CASE(decoder_only_block_post_norm) {
  check_self_block<DecoderOnlyBlock<TinyPost, Be>>("DecoderOnlyBlock post-norm", {2, 6}, {});
}
BOOST_AUTO_TEST_CASE(blocks_with_rms_norm) {
  check_self_block<DecoderOnlyBlock<TinyRmsPre, Be>>("DecoderOnlyBlock pre-norm, RmsNorm", {2, 6}, {});
  check_self_block<EncoderBlock<TinyRmsPost, Be>>("EncoderBlock post-norm, RmsNorm, padded", {2, 5},
                                                   {0, 0, 0, 0, 1, 0, 0, 1, 1, 1});
  check_decoder_block<TinyRmsPost>("DecoderBlock post-norm, RmsNorm", {2, 4}, {2, 3}, {}, {0, 0, 0, 0, 1, 1});
  check_self_block<DecoderOnlyBlock<TinyLlama, Be>>("DecoderOnlyBlock RmsNorm + SwiGLU", {2, 6}, {});
}
BOOST_AUTO_TEST_CASE(decoder_only_block_wide_heads) {
  check_self_block<DecoderOnlyBlock<TinyWideHeads, Be>>("DecoderOnlyBlock wide heads", {2, 4}, {});
}
BOOST_AUTO_TEST_CASE(decoder_block_pre_norm) {
  check_decoder_block<TinyPre>("DecoderBlock pre-norm", {2, 4}, {2, 5}, {}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1});
}
BOOST_AUTO_TEST_CASE(decoder_block_post_norm_both_padded) {
  check_decoder_block<TinyPost>("DecoderBlock post-norm, both padded", {2, 4}, {2, 3}, {0, 0, 0, 0, 0, 0, 0, 1},
                                {0, 0, 0, 0, 1, 1});
}
BOOST_AUTO_TEST_CASE(decoder_block_split_heads) {
  check_decoder_block<TinySplitHeads>("DecoderBlock QK 3 / V 5", {1, 5}, {1, 4}, {}, {});
}

BOOST_AUTO_TEST_CASE(block_with_dropout_has_exact_gradients_for_its_mask) {
  // Dropout masks depend only on (seed, call number): restarting the call
  // counters before every forward fixes the masks, and the block's gradient
  // is then exact, dropout included (branches 0.2, attention probabilities
  // 0.3; three counters).
  constexpr int D = TinyPre::D_MODEL;
  Rng rng(23);
  Be be;
  DecoderOnlyBlock<TinyPre, Be> block(rng, 0.2f, 0.3f);
  int counters = 0;
  block.for_each_dropout([&](auto&) { ++counters; });
  BOOST_TEST(counters == 3);
  // Without attention dropout a block has its two branch counters only, as
  // before attention dropout existed (checkpoints of then still resume).
  Rng other(24);
  DecoderOnlyBlock<TinyPre, Be> branches_only(other, 0.2f);
  counters = 0;
  branches_only.for_each_dropout([&](auto&) { ++counters; });
  BOOST_TEST(counters == 2);
  const Shape bt{2, 5};
  GradCase c;
  c.name = "DecoderOnlyBlock pre-norm, dropout 0.2, attention dropout 0.3";
  c.input("x", bt.rows() * D, rng);
  c.output(bt.rows() * D, rng);
  c.forward = [&] {
    block.for_each_dropout([](auto& d) { d.set_calls(3); });
    block.forward(be, crows_of<D>(c.x[0]), rows_of<D>(c.y), bt);
  };
  c.backward = [&] { block.backward(be, crows_of<D>(c.dy), rows_of<D>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { block.visit(f); };
  check_case(c);

  // The masks are live: evaluation mode gives a different output.
  c.forward();
  const Vec train_y = c.y;
  block.set_training(false);
  block.forward(be, crows_of<D>(c.x[0]), rows_of<D>(c.y), bt);
  BOOST_TEST((train_y != c.y));
}

BOOST_AUTO_TEST_CASE(decoder_block_with_dropout_has_exact_gradients_for_its_mask) {
  check_decoder_block<TinyPost>("DecoderBlock post-norm, dropout 0.25 (branches, self and cross attention)", {2, 4},
                                {2, 5}, {0, 0, 0, 1, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, 0.25f);
}

BOOST_AUTO_TEST_CASE(block_parameter_names) {
  Rng rng(1);
  DecoderBlock<TinyPre, Be> dec(rng);
  std::vector<std::string> names;
  dec.visit([&](std::string_view n, auto&, auto&) { names.emplace_back(n); });
  const std::vector<std::string> want = {
      "ln1.weight", "ln1.bias", "self_attn.qkv.weight", "self_attn.qkv.bias", "self_attn.proj.weight",
      "self_attn.proj.bias", "ln2.weight", "ln2.bias", "cross_attn.q.weight", "cross_attn.q.bias",
      "cross_attn.kv.weight", "cross_attn.kv.bias", "cross_attn.proj.weight", "cross_attn.proj.bias", "ln3.weight",
      "ln3.bias", "ff.fc1.weight", "ff.fc1.bias", "ff.fc2.weight", "ff.fc2.bias"};
  BOOST_TEST(names == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
