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
// Roles are system, user and assistant; an empty conversation, another role,
// or a system message after the first is an Error naming it.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xfmr {

struct ChatMessage {
  std::string role, content;
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
  // The prompt: every message, then the opening of the assistant's turn.
  std::string render(std::span<const ChatMessage> messages) const;
  // The markers that end the assistant's turn (a tokenizer's single ids
  // where it has them, else text to stop at).
  std::vector<std::string> stops() const;

 private:
  Format format_;
};

}  // namespace xfmr
