// xfmr-serve: the server (server.hpp) as a program: its options, and one
// line on stderr and status 1 for an error.
//
//   xfmr-serve --model PATH [--host 127.0.0.1] [--port 8080] [--slots 8] [--context T]
//              [--precision fp32|bf16|int8|q4] [--backend cpu] [--api-key KEY]
//              [--chat-template chatml|llama3|plain]
//              [--lookup K | --draft PATH [--draft-tokens K] [--draft-precision P]]
//              [--lora NAME=DIR[:SCALE] ...]
#include <boost/program_options.hpp>
#include <string>

#include "common.hpp"
#include "server.hpp"

namespace po = boost::program_options;
using namespace xfmr;
using namespace xfmr::examples;

namespace {

int run(int argc, char** argv) {
  server::ServerOptions o;
  std::string tokenizer, backend = "cpu", precision = "fp32", draft_precision;
  std::vector<std::string> adapters;
  int draft_tokens = 4;
  po::options_description opts("xfmr-serve: an OpenAI-compatible server for a language model");
  opts.add_options()("help", "show this help")(
      "model", po::value(&o.model), "a Hugging Face directory, a llama2.c .bin, a GGUF file, or an xfmr-lm checkpoint (required)")(
      "tokenizer", po::value(&tokenizer), "as xfmr-lm sample's (default: the model's)")(
      "host", po::value(&o.host)->default_value(o.host), "address to listen on (0.0.0.0: every interface)")(
      "port", po::value(&o.port)->default_value(o.port), "port to listen on (0: any free one, printed)")(
      "slots", po::value(&o.slots)->default_value(o.slots), "sequences decoded together")(
      "context", po::value(&o.context)->default_value(o.context),
      "tokens a slot holds, prompt and answer (0: the model's context, at most 2048)")(
      "queue", po::value(&o.queue)->default_value(o.queue), "requests waiting for a slot before 503")(
      "precision", po::value(&precision)->default_value(precision), kDecodePrecisionHelp)(
      "backend", po::value(&backend)->default_value(backend), kBackendHelp)(
      "api-key", po::value(&o.api_key), "require 'Authorization: Bearer KEY' on /v1 routes")(
      "chat-template", po::value(&o.chat_template),
      "chatml, llama3 or plain (default: the model's tokenizer_config.json's, else plain)")(
      "name", po::value(&o.name), "the model's id in the API (default: the model path's last part)")(
      "max-body", po::value(&o.max_body)->default_value(o.max_body), "largest request body, bytes (413 past it)")(
      "max-connections", po::value(&o.max_connections)->default_value(o.max_connections),
      "connections held at once, idle or not (503 past it)")(
      "drain", po::value(&o.drain)->default_value(o.drain), "seconds running requests get to finish after SIGTERM")(
      "lookup", po::value(&o.speculation.lookup)->default_value(o.speculation.lookup),
      "speculative decoding by prompt lookup: up to this many drafts a step from the prompt and the answer (0: off)")(
      "draft", po::value(&o.draft),
      "speculative decoding by a draft model: a smaller model of the same tokenizer (any model --model reads; "
      "--tokenizer is both's)")(
      "draft-tokens", po::value(&draft_tokens)->default_value(draft_tokens),
      "with --draft: up to this many of its tokens a step")(
      "draft-precision", po::value(&draft_precision),
      "with --draft: its precision, as --precision's (default: the draft checkpoint's, else fp32)")(
      "lora", po::value(&adapters)->composing(),
      "NAME=DIR[:SCALE], repeatable: a LoRA adapter in peft's format beside the model, at SCALE times its scale; a "
      "request whose \"model\" is NAME decodes with it, in the same batch as the others (CPU backend)");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!o.model.empty(), "--model PATH is required");
  // An unset variable in a script (--api-key "$KEY") must not open the server.
  require(!vm.count("api-key") || o.api_key.find_first_not_of(" \t\r\n") != std::string::npos,
          "--api-key is empty: the server would answer everyone; give a key, or leave the option out");
  o.engine = engine_options(vm, backend, precision, tokenizer);
  require(o.draft.empty() || o.speculation.lookup == 0, "--draft and --lookup: speculative decoding takes its drafts ",
          "from one source");
  require(!o.draft.empty() || (!vm.count("draft-precision") && vm["draft-tokens"].defaulted()),
          "--draft-tokens and --draft-precision are --draft's: name the draft model");
  if (!o.draft.empty()) {
    o.speculation.draft = draft_tokens;
    // Its tokenizer: --tokenizer's (the vocabulary both share), else its own.
    o.draft_engine = {.backend = backend,
                      .precision = draft_precision,
                      .tokenizer = tokenizer,
                      .backend_option = "--backend",
                      .precision_option = "--draft-precision",
                      .tokenizer_option = "--tokenizer"};
  }
  for (const std::string& v : adapters) {
    const std::size_t eq = v.find('=');
    require(eq != std::string::npos && eq > 0 && eq + 1 < v.size(), "--lora ", v, ": give NAME=DIR[:SCALE]");
    const auto [dir, scale] = adapter_location(v.substr(eq + 1), "--lora");
    o.adapters.push_back({v.substr(0, eq), dir, scale});
  }
  return server::serve(o);
}

}  // namespace

int main(int argc, char** argv) {
  return run_command("xfmr-serve", [&] { return run(argc, argv); });
}
