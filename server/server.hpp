// server.hpp: xfmr-serve as a component: a language model behind an
// OpenAI-compatible HTTP API, many requests decoded together by the
// library's Engine (infer/engine.hpp), and a chat page.
//
//   xfmr::server::ServerOptions o;
//   o.model = "SmolLM2-135M-Instruct";
//   o.engine.precision = "int8";
//   return xfmr::server::serve(o);  // until SIGINT or SIGTERM
//
// GET  /                      the chat page (server/chat.html, compiled in)
// GET  /health                503 {"status": "loading"} until the model is loaded, then 200
// GET  /v1/models             the model, named `name` (default: the model path's last part), and each
//                             LoRA adapter by its name (a request's "model" chooses), with the
//                             context (max_model_len, as vLLM's)
// POST /v1/completions        OpenAI's shapes, "stream": true as server-sent events ending "data: [DONE]";
//                             logprobs, n choices, response_format (JSON schemas), usage's cached_tokens,
//                             llama-server's timings
// POST /v1/chat/completions   the same for a conversation, rendered by the chat template (text/chat_template.hpp),
//                             with tools and tool_choice
// POST /v1/embeddings         OpenAI's shape: the mean final hidden state of each input, of unit length
// POST /tokenize, /detokenize {"content": text} <-> {"tokens": [ids]}
// GET  /metrics               Prometheus text: requests, tokens, queue, slots
// GET  /slots                 each slot's state: busy, its request, prompt, cached and decoded tokens
//
// Every bad request is a 4xx with {"error": {"message", "type", "param", "code"}}
// naming the field (a field the server does not implement, too); past the
// queue's bound, 503 with Retry-After. The HTTP layer (http.hpp) holds
// connections apart from the workers, with deadlines for a request's head
// (10 s) and body (60 s) and for an idle connection (30 s). SIGINT or
// SIGTERM: no new requests, those running finish (at most `drain` seconds,
// then they are cut: a 503, or an error event in a stream), and serve
// returns 0; a second signal cuts them at once.
//
// The folder is split as llama.cpp's server is: http.cpp (HTTP/1.1:
// connections, parsing, answers), request.cpp (a request's JSON read and
// checked into the engine's CompletionRequest), service.cpp (the model's
// routes), tasks.cpp (a submitted request answered, whole or streamed),
// routes.cpp (the routes, authentication, errors), server.cpp (signals,
// listening, the engine's steps, draining); main.cpp is the program.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "xfmr/infer/engine.hpp"

namespace xfmr::server {

struct ServerOptions {
  std::string model;      // any model Engine::load reads
  EngineOptions engine;   // backend, precision, tokenizer
  std::string host = "127.0.0.1";
  int port = 8080;        // 0: any free one (printed)
  int slots = 8;          // sequences decoded together
  int context = 0;        // tokens a slot holds (0: the model's, at most 2048)
  int queue = 64;         // requests waiting for a slot before 503
  int drain = 10;         // seconds running requests get after SIGTERM
  Speculation speculation;  // drafts a step: by prompt lookup, or by the draft model (both 0: off)
  std::string draft;        // the draft model (Engine::load reads it), for speculation.draft
  EngineOptions draft_engine;  // how to load it: its backend must be the model's (set_draft checks)
  std::size_t max_body = 1 << 20;  // largest request body, however sent (413 past it)
  int max_connections = 1024;      // connections held, idle or not (503 past it; at most half the descriptors)
  std::string api_key;        // required as a Bearer token on /v1 when not empty
  std::string chat_template;  // chatml, llama3 or plain (empty: the model's, else plain)
  std::string name;           // the model's id in the API (empty: the model path's last part)
  // LoRA adapters (peft directories) beside the model, each a model id in
  // the API: a request naming one decodes with it, in the same batch as
  // the others (Engine::add_adapter).
  struct Adapter {
    std::string name;
    std::string dir;
    double scale = 1.0;
  };
  std::vector<Adapter> adapters;
};

// Listens, loads the model (while /health says 503), serves until a signal,
// drains; 0 then. Errors (a port in use, a model that does not load) are
// xfmr::Error.
int serve(const ServerOptions& options);

}  // namespace xfmr::server
