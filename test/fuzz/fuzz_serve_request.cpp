// Fuzz target: a /v1/completions or /v1/chat/completions body as xfmr-serve
// reads it (server/request.hpp's read_completion: every field's type and
// range, the prompt and messages, the fields refused by name), against the
// fixtures' tokenizer and the chatml template. The input's first byte picks
// the route. An answer other than a request within the context, or an
// HttpError (a 4xx naming what is wrong), is a bug, as is a crash or a
// sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "request.hpp"

using namespace xfmr;
using namespace xfmr::server;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const ModelTokenizer tokenizer = ModelTokenizer::load(XFMR_FUZZ_TOKENIZER);
  static const ChatTemplate chat = ChatTemplate::named("chatml");
  static const std::vector<std::int32_t> stop_ids = {};
  static const std::vector<std::string> stop_strings = {"<|im_end|>"};
  static const std::string name = "m";
  if (size == 0) return 0;
  const bool is_chat = data[0] & 1;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const ModelFacts model{tokenizer, chat, stop_ids, stop_strings, name, 64};
  try {
    http::Request req;
    req.body = text;
    const CompletionParams p = read_completion(parse_body(req), is_chat, model);
    const CompletionRequest& r = p.request;
    if (r.prompt.empty() || int(r.prompt.size()) + r.max_tokens > 64 || r.max_tokens < 1) std::abort();
    for (std::int32_t id : r.prompt)
      if (id < 0 || id >= tokenizer.size()) std::abort();
    r.sampling.validate();
  } catch (const HttpError& e) {
    if (e.status < 400 || e.status >= 500 || e.message.empty()) std::abort();
  }
  return 0;
}
