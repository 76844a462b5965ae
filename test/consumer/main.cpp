// A user's program, through the public API alone: train a character model on
// a text file, save, resume bit for bit, and generate.   consumer CORPUS
#include <fstream>
#include <iostream>
#include <iterator>
#include <xfmr/xfmr.hpp>

using Be = xfmr::CpuBackend<float>;
using Model = xfmr::LanguageModel<Be>;

struct Run {  // a model of the "tiny" preset, its optimizer, and the Trainer that steps both
  Run(int vocab, Be& be)
      : model(xfmr::make_language_model<Be>("tiny", vocab, 1337)), opt(*model),
        trainer(*model, be, opt, {.schedule = xfmr::LrSchedule::parse("cosine", 3e-3, 40), .data_seed = 7}) {}
  std::unique_ptr<Model> model;
  xfmr::AdamW<Be> opt;
  xfmr::Trainer<Model, Be> trainer;
};

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

int main(int argc, char** argv) try {
  const std::string text = xfmr::read_text_file(argc > 1 ? argv[1] : "corpus.txt");
  const auto tok = xfmr::CharTokenizer::from_corpus(text);
  const std::vector<std::int32_t> ids = tok.encode(text);
  const int B = 8, T = xfmr::LanguageModelPresets::info("tiny").max_t;
  const xfmr::LmBatcher batches(ids, B, T);
  std::vector<std::int32_t> x(B * T), y(B * T);
  Be be;
  auto train = [&](Run& r, long until) {  // random windows of the text, next-character targets
    auto next_batch = [&](int) {
      batches.sample(r.trainer.data_rng(), x.data(), y.data());
      return xfmr::BatchTargets{B, y};
    };
    auto forward = [&](const xfmr::Shard& s, Model& m, Be& b) {  // a shard of the batch (one a CPU thread)
      // the trunk alone: the Trainer runs the head and the loss by blocks of rows (head_loss)
      return m.forward_to_head(b, std::span(x).subspan(s.begin * T, s.size() * T), {s.size(), T});
    };
    while (r.trainer.steps() < until) r.trainer.step(next_batch, forward);
  };
  Run straight(tok.size(), be), first(tok.size(), be), second(tok.size(), be);
  train(straight, 40);
  straight.trainer.save("straight", {{"tokenizer", tok.to_json()}});
  train(first, 20);
  first.trainer.save("resumed", {{"tokenizer", tok.to_json()}});
  second.trainer.resume("resumed");  // a fresh process would start here
  train(second, 40);
  second.trainer.save("resumed", {{"tokenizer", tok.to_json()}});
  const bool same = bytes("straight/model.safetensors") == bytes("resumed/model.safetensors");
  std::cout << "40 steps and 20 + 20 resumed: " << (same ? "the same weights, bit for bit" : "DIFFERENT") << "\n";

  const auto loaded = xfmr::CharTokenizer::from_json(xfmr::read_checkpoint_metadata("resumed").at("tokenizer"));
  xfmr::Rng rng(1);
  std::cout << "sample: the";
  const auto out = xfmr::generate(*second.model, be, loaded.encode("the"), {.sampling = {.temperature = 0.8}, .max_tokens = 60},
                                  rng, [&](std::int32_t id) { std::cout << loaded.token(id); });
  std::cout << "\n";
  return same && out.size() == 60 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "consumer: " << e.what() << "\n";
  return 1;
}
