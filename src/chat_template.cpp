// ChatTemplate (text/chat_template.hpp).
#include "xfmr/text/chat_template.hpp"

#include <nlohmann/json.hpp>

#include "xfmr/core/error.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

ChatTemplate ChatTemplate::named(std::string_view name) {
  if (name == "chatml") return ChatTemplate(Format::chatml);
  if (name == "llama3") return ChatTemplate(Format::llama3);
  if (name == "plain") return ChatTemplate(Format::plain);
  fail("chat template '", name, "' is not one of chatml, llama3, plain");
}

ChatTemplate ChatTemplate::detect(std::string_view jinja) {
  if (jinja.find("<|im_start|>") != std::string_view::npos) return ChatTemplate(Format::chatml);
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate(Format::llama3);
  return ChatTemplate(Format::plain);
}

ChatTemplate ChatTemplate::for_model(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(path) ? path / "tokenizer_config.json" : path;
  if (!fs::is_regular_file(file)) return ChatTemplate(Format::plain);
  const auto j = nlohmann::json::parse(read_text_file(file.string()), nullptr, false);
  require(!j.is_discarded() && j.is_object(), file.string(), ": not a JSON object");
  const auto t = j.find("chat_template");
  if (t == j.end() || t->is_null()) return ChatTemplate(Format::plain);
  // A string, or a list of named templates ({"name": "default", "template": ...}).
  if (t->is_string()) return detect(t->get<std::string>());
  require(t->is_array(), file.string(), ": chat_template is neither text nor a list of templates");
  for (const auto& e : *t)
    if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
      return detect(e["template"].get<std::string>());
  return ChatTemplate(Format::plain);
}

const char* ChatTemplate::name() const {
  switch (format_) {
    case Format::chatml: return "chatml";
    case Format::llama3: return "llama3";
    case Format::plain: return "plain";
  }
  return "?";
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages) const {
  require(!messages.empty(), "messages: the conversation is empty");
  std::string out = format_ == Format::llama3 ? "<|begin_of_text|>" : "";
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    require(m.role == "system" || m.role == "user" || m.role == "assistant", "messages[", i, "].role '", m.role,
            "' is not one of system, user, assistant");
    require(m.role != "system" || i == 0, "messages[", i, "]: a system message must come first");
    switch (format_) {
      case Format::chatml: out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n"; break;
      case Format::llama3:
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
        break;
      case Format::plain: {
        std::string role = m.role;
        role[0] = char(role[0] - 'a' + 'A');
        out += role + ": " + m.content + "\n";
        break;
      }
    }
  }
  switch (format_) {
    case Format::chatml: return out + "<|im_start|>assistant\n";
    case Format::llama3: return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case Format::plain: return out + "Assistant:";
  }
  return out;
}

std::vector<std::string> ChatTemplate::stops() const {
  switch (format_) {
    case Format::chatml: return {"<|im_end|>", "<|endoftext|>"};
    case Format::llama3: return {"<|eot_id|>", "<|end_of_text|>"};
    case Format::plain: return {"\nUser:", "\nSystem:"};
  }
  return {};
}

}  // namespace xfmr
