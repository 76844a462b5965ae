// chat_template.hpp: a conversation as the text a chat model was trained
// on, and the markers that end its turn.
//
//   const auto chat = xfmr::ChatTemplate::for_model("SmolLM2-135M-Instruct");  // its tokenizer_config.json
//   std::string prompt = chat.render({{"system", "Be brief."}, {"user", "Hi!"}});
//   // ... generate until one of chat.stops() ...
//
// Three formats are built in, and a model's own template (the Jinja text of
// tokenizer_config.json's "chat_template") picks one by its markers, as
// llama.cpp picks: "<|im_start|>" is ChatML (SmolLM2, Qwen2.5),
// "<|start_header_id|>" Llama 3; anything else, or no template, the plain
// format ("User: ...\nAssistant:"). The Jinja itself is not run.
//   chatml:  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
//   llama3:  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ...
//            <|start_header_id|>assistant<|end_header_id|>\n\n
//   plain:   System: ...\nUser: ...\nAssistant: ...\n ... Assistant:
// Roles are system, user, assistant and tool (a call's result); an empty
// conversation, another role, or a system message after the first is an
// Error naming it.
//
// Tools (functions the model may call, OpenAI's `tools`) are offered as
// each format's models were trained to see them: chatml as Hermes and
// Qwen2.5 do (the system message lists them in <tools></tools>; a call is
// <tool_call>{"name": ..., "arguments": {...}}</tool_call>; a result is a
// user turn's <tool_response></tool_response>), llama3 as Llama 3.1's JSON
// form (the system message lists them; a call is {"name": ...,
// "parameters": {...}}; a result is an ipython turn), plain as chatml's
// tags in plain text. parse_tool_calls reads an answer's calls back.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xfmr {

// A call of a tool: its name and its arguments (a JSON object's text).
struct ToolCall {
  std::string name, arguments;
};

struct ChatMessage {
  std::string role, content;
  std::vector<ToolCall> tool_calls{};  // an assistant's calls
};

// A function the model may call: its name, what it does, and its
// parameters (a JSON schema's text).
struct ChatTool {
  std::string name, description, parameters;
};

class ChatTemplate {
 public:
  enum class Format { chatml, llama3, plain };

  explicit ChatTemplate(Format f = Format::plain) : format_(f) {}
  // By name: "chatml", "llama3" or "plain" (Error naming the others).
  static ChatTemplate named(std::string_view name);
  // The format a Jinja chat template is written for, by its markers.
  static ChatTemplate detect(std::string_view jinja);
  // A model directory's (or a tokenizer_config.json's) template; plain
  // where it has none (io/pretrained.hpp's model_chat_template reads a
  // GGUF file's too).
  static ChatTemplate for_model(const std::filesystem::path& path);

  Format format() const { return format_; }
  const char* name() const;
  // The prompt: every message, then the opening of the assistant's turn;
  // with tools, offered as the format offers them.
  std::string render(std::span<const ChatMessage> messages, std::span<const ChatTool> tools = {}) const;
  // A call as the model writes it (chatml, plain: within <tool_call> tags;
  // llama3: the JSON object alone), and its JSON (name and arguments, or
  // llama3's parameters) without the tags.
  std::string tool_call_text(const ToolCall& call) const;
  std::string tool_call_json(const ToolCall& call) const;
  // What opens a call the model is made to write (chatml, plain:
  // "<tool_call>\n"; llama3: nothing), and the key of its arguments.
  std::string tool_call_opening() const;
  const char* arguments_key() const { return format_ == Format::llama3 ? "parameters" : "arguments"; }
  // The JSON schema (its text) a call the model is made to write must
  // match: {"name": one of the tools' (or `named`), its arguments: that
  // function's parameters, or any object when several may be called}
  // (infer/json_grammar.hpp compiles it).
  std::string tool_call_schema(std::span<const ChatTool> tools, std::string_view named = {}) const;
  // An answer's calls, and its text outside them; a call that is not
  // valid JSON with a name stays text.
  struct Answer {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Answer parse_tool_calls(std::string_view answer) const;
  // The markers that end the assistant's turn (a tokenizer's single ids
  // where it has them, else text to stop at).
  std::vector<std::string> stops() const;

 private:
  Format format_;
};

}  // namespace xfmr
