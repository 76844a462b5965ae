// json_grammar.hpp: structured output. A JSON schema (a subset: objects
// with properties and required ones, or any keys without properties;
// arrays, strings, numbers, integers, booleans, null, enum and const,
// nesting; or any JSON object, OpenAI's "json_object") compiled into a
// grammar, and JsonConstraint, which tells a decoder at each step which
// tokens keep the text a prefix of a value the schema accepts and still
// finishable within the tokens left.
//
//   auto schema = xfmr::JsonSchema::compile(nlohmann::json::parse(text));  // Error naming what is not supported
//   xfmr::JsonConstraint c(schema, pieces, end_ids);   // pieces: each id's text (TokenPieces)
//   c.allowed(mask, tokens_left);  ... draw an id where mask[id] ... c.accept(id);
//
// The text it lets through is compact JSON (no white space outside
// strings), strings of printable ASCII without escapes, numbers without
// exponents, every object's keys among the schema's (no others), so that
// any model, even one of random weights, writes a value that parses and
// validates: strings, arrays and numbers are bounded (maxLength, maxItems,
// else 32 characters, 8 items, 16 characters; an object of any keys, 4
// keys of up to 16 characters, its arrays 4 items), and a token is allowed only
// if the value can still be finished in the tokens left, one character a
// token (a byte-level vocabulary has a token for each). Once the value is
// whole, only the end ids are allowed.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/infer/token_constraint.hpp"

namespace xfmr {

class JsonSchema {
 public:
  struct Node {
    enum class Kind : std::uint8_t { object, array, string, number, integer, literal, any } kind = Kind::any;
    std::vector<std::string> keys{};  // object: its properties' names (quotes not included)
    std::vector<int> children{};      // object: each property's node; array: the items' node
    std::uint64_t required = 0;       // object: a bit a required property
    bool free_keys = false;           // object: any keys (OpenAI's json_object), not `keys`
    int min_items = 0, max_items = 8;   // array
    int min_length = 0, max_length = 32;  // string
    std::vector<std::string> literals{};  // literal (enum, const, boolean, null): each as JSON text
    int depth = 0;                        // any: how deep it may still nest
    int min_chars = 0;                    // the shortest text of a value
  };

  // A schema, or OpenAI's {"type": "json_object"} as any_object().
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);
  static std::shared_ptr<const JsonSchema> any_object();
  const Node& node(int i) const { return nodes_[std::size_t(i)]; }
  int root() const { return 0; }
  // Whether `text` is a value of the schema (the test's check, and the
  // fuzz target's): parses, and matches every constraint.
  bool validates(std::string_view text) const;

 private:
  int add(const nlohmann::json& s, int depth, const std::string& at);
  int add_any(int depth);
  bool matches(int node, const nlohmann::json& v) const;
  std::vector<Node> nodes_;
};

// Each token's text as it adds it to a completion (ModelTokenizer::piece
// after an ordinary token), once per tokenizer.
using TokenPieces = std::vector<std::string>;

class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const JsonSchema> schema, std::shared_ptr<const TokenPieces> pieces,
                 std::vector<std::int32_t> end_ids);

  // mask[id] = 1 for each id allowed now (mask sized to the vocabulary),
  // `left` tokens left after this one; false when none is (never, for a
  // byte-level vocabulary and enough tokens).
  bool allowed(std::vector<std::uint8_t>& mask, int left) const override;
  // The id drawn.
  void accept(std::int32_t id) override;
  bool done() const;

  // The matcher: where the text is in the grammar, a fixed-size stack of
  // frames (copied for each candidate token, without allocation).
  struct Frame {
    std::uint8_t type = 0, state = 0;
    std::int16_t node = 0;
    std::int16_t pos = 0, count = 0;  // chars or items so far
    std::uint32_t alive = 0;          // literal: alternatives still matching; object: candidate keys
    std::uint64_t seen = 0;           // object: properties written
    std::int16_t key = -1;            // object: the property whose value is being written
  };
  static constexpr int kMaxDepth = 24;
  struct State {
    Frame frames[kMaxDepth];
    int size = 0;
    bool started = false;  // the root value has begun
  };
  // Feeds one character; false if the text would leave the grammar.
  bool feed(State& s, char c) const;
  // Characters that finish the value from s, one a token, at most.
  int finish_cost(const State& s) const;
  bool complete(const State& s) const;
  const State& state() const { return state_; }

 private:
  bool feed_frame(State& s, char c) const;
  bool start_value(State& s, int node, char c) const;
  int frame_cost(const Frame& f) const;
  int key_cost(const JsonSchema::Node& n, std::uint64_t seen, int except) const;

  std::shared_ptr<const JsonSchema> schema_;
  std::shared_ptr<const TokenPieces> pieces_;
  std::vector<std::int32_t> ends_;
  State state_;
};

}  // namespace xfmr
