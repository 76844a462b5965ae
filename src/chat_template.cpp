// ChatTemplate (text/chat_template.hpp).
#include "xfmr/text/chat_template.hpp"

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

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

namespace {

// The tools as a model reads them: one JSON object a line, OpenAI's shape.
std::string tools_list(std::span<const ChatTool> tools) {
  std::string out;
  for (const ChatTool& t : tools) {
    nlohmann::json f = {{"name", t.name}, {"description", t.description}};
    f["parameters"] = t.parameters.empty() ? nlohmann::json::object() : nlohmann::json::parse(t.parameters);
    out += nlohmann::json{{"type", "function"}, {"function", f}}.dump() + "\n";
  }
  return out;
}

}  // namespace

std::string ChatTemplate::tool_call_json(const ToolCall& call) const {
  const nlohmann::json args = nlohmann::json::parse(call.arguments.empty() ? "{}" : call.arguments, nullptr, false);
  require(args.is_object(), "a tool call's arguments are not a JSON object: ", call.arguments.substr(0, 80));
  return nlohmann::json{{"name", call.name}, {arguments_key(), args}}.dump();
}

std::string ChatTemplate::tool_call_schema(std::span<const ChatTool> tools, std::string_view named) const {
  nlohmann::json names = nlohmann::json::array(), arguments = {{"type", "object"}, {"properties", nlohmann::json::object()}};
  for (const ChatTool& t : tools)
    if (named.empty() || t.name == named) {
      names.push_back(t.name);
      if (!t.parameters.empty()) arguments = nlohmann::json::parse(t.parameters);
    }
  require(!names.empty(), "no tool named '", named, "' among the tools");
  if (names.size() > 1) arguments = {{"type", "object"}};  // any object: the function is only known once named
  return nlohmann::json{{"type", "object"},
                        {"properties", {{"name", {{"enum", names}}}, {arguments_key(), arguments}}},
                        {"required", {"name", arguments_key()}}}
      .dump();
}

std::string ChatTemplate::tool_call_opening() const { return format_ == Format::llama3 ? "" : "<tool_call>\n"; }

std::string ChatTemplate::tool_call_text(const ToolCall& call) const {
  return format_ == Format::llama3 ? tool_call_json(call) : "<tool_call>\n" + tool_call_json(call) + "\n</tool_call>";
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, std::span<const ChatTool> tools) const {
  require(!messages.empty(), "messages: the conversation is empty");
  std::string out = format_ == Format::llama3 ? "<|begin_of_text|>" : "";
  // The tools go into the system message (one made when there is none).
  std::string offer;
  if (!tools.empty()) {
    offer = format_ == Format::llama3
                ? "Environment: ipython\n\nYou have access to the following functions. To call one, answer with "
                  "JSON in the form {\"name\": function name, \"parameters\": dictionary of argument name and its "
                  "value}, and nothing else.\n\n" + tools_list(tools)
                : "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                  "with function signatures within <tools></tools> XML tags:\n<tools>\n" + tools_list(tools) +
                      "</tools>\n\nFor each function call, return a json object with function name and arguments "
                      "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                      "\"arguments\": <args-json-object>}\n</tool_call>";
  }
  const bool system_first = messages.front().role == "system";
  auto turn = [&](const std::string& role, const std::string& content) {
    switch (format_) {
      case Format::chatml: out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n"; break;
      case Format::llama3: out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>"; break;
      case Format::plain: {
        std::string name = role;
        name[0] = char(name[0] - 'a' + 'A');
        out += name + ": " + content + "\n";
        break;
      }
    }
  };
  if (!offer.empty() && !system_first) turn("system", offer);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    require(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool", "messages[", i,
            "].role '", m.role, "' is not one of system, user, assistant, tool");
    require(m.role != "system" || i == 0, "messages[", i, "]: a system message must come first");
    require(m.tool_calls.empty() || m.role == "assistant", "messages[", i, "]: only an assistant's message has tool calls");
    if (m.role == "system") {
      turn("system", offer.empty() ? m.content : m.content + "\n\n" + offer);
    } else if (m.role == "tool") {
      if (format_ == Format::llama3) turn("ipython", m.content);
      else turn("user", "<tool_response>\n" + m.content + "\n</tool_response>");
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      std::string text = m.content;
      for (const ToolCall& c : m.tool_calls) text += (text.empty() ? "" : "\n") + tool_call_text(c);
      turn("assistant", text);
    } else {
      turn(m.role, m.content);
    }
  }
  switch (format_) {
    case Format::chatml: return out + "<|im_start|>assistant\n";
    case Format::llama3: return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case Format::plain: return out + "Assistant:";
  }
  return out;
}

ChatTemplate::Answer ChatTemplate::parse_tool_calls(std::string_view answer) const {
  Answer a;
  auto call_of = [&](std::string_view text) -> std::optional<ToolCall> {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
    const auto args = j.find(arguments_key());
    if (args != j.end() && !args->is_object()) return std::nullopt;
    return ToolCall{j["name"].get<std::string>(), args == j.end() ? "{}" : args->dump()};
  };
  if (format_ == Format::llama3) {
    std::string_view t = answer;
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
    if (const auto c = t.starts_with("{") ? call_of(t) : std::nullopt) a.calls.push_back(*c);
    else a.content = answer;
    return a;
  }
  std::string_view rest = answer;
  for (;;) {
    const std::size_t open = rest.find("<tool_call>");
    const std::size_t close = open == std::string_view::npos ? open : rest.find("</tool_call>", open);
    if (close == std::string_view::npos) break;
    const auto c = call_of(rest.substr(open + 11, close - open - 11));
    if (!c) break;
    a.content += rest.substr(0, open);
    a.calls.push_back(*c);
    rest.remove_prefix(close + 12);
  }
  a.content += rest;
  // The text around calls: the model's spacing between them, dropped.
  while (!a.calls.empty() && !a.content.empty() && std::isspace(static_cast<unsigned char>(a.content.back())))
    a.content.pop_back();
  return a;
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
