// json_grammar.cpp: json_grammar.hpp's schema compiler and matcher.
#include "xfmr/infer/json_grammar.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "xfmr/core/error.hpp"

namespace xfmr {

namespace {

using json = nlohmann::json;

enum FrameType : std::uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral };
constexpr int kMaxProperties = 32, kMaxNesting = 8, kAnyDepth = 3, kAnyKeyLength = 16, kAnyProperties = 4,
              kAnyItems = 4, kMaxNumber = 16;

bool printable(char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; }
bool digit(char c) { return c >= '0' && c <= '9'; }

int integer_of(const json& s, const char* key, int fallback, int hi, const std::string& at) {
  if (!s.contains(key)) return fallback;
  const json& v = s[key];
  require(v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() <= hi, at, ".", key, " ",
          v.dump(), " is not an integer in [0, ", hi, "]");
  return int(v.get<std::int64_t>());
}

}  // namespace

// --- JsonSchema --------------------------------------------------------------

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema) {
  auto s = std::make_shared<JsonSchema>();
  s->nodes_.reserve(64);
  s->add(schema, 0, "schema");
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  auto s = std::make_shared<JsonSchema>();
  s->nodes_.push_back({});  // the root: an object of any keys
  const int value = s->add_any(kAnyDepth - 1);
  Node& root = s->nodes_[0];
  root.kind = Node::Kind::object;
  root.depth = kAnyDepth;
  root.children = {value};
  root.min_chars = 2;
  root.free_keys = true;
  return s;
}

int JsonSchema::add_any(int depth) {
  const int i = int(nodes_.size());
  nodes_.push_back({});
  Node n;
  n.kind = Node::Kind::any;
  n.depth = depth;
  n.literals = {"true", "false", "null"};
  n.min_chars = 1;  // a digit
  if (depth > 0) n.children = {add_any(depth - 1)};
  nodes_[std::size_t(i)] = std::move(n);
  return i;
}

int JsonSchema::add(const json& s, int depth, const std::string& at) {
  require(depth <= kMaxNesting, at, ": nests deeper than ", kMaxNesting, " levels");
  const int i = int(nodes_.size());
  nodes_.push_back({});
  if (s.is_boolean() && s.get<bool>()) {  // true: any value
    nodes_.pop_back();
    return add_any(kAnyDepth);
  }
  require(s.is_object(), at, " is not a schema (a JSON object)");
  for (const char* refused : {"$ref", "anyOf", "oneOf", "allOf", "not", "if", "pattern", "format", "minimum",
                              "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "patternProperties",
                              "prefixItems", "uniqueItems", "contains", "dependentRequired", "minProperties"})
    require(!s.contains(refused), at, ": '", refused, "' is not supported in a response schema");
  Node n;
  if (s.contains("enum") || s.contains("const")) {
    n.kind = Node::Kind::literal;
    const json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    require(values.is_array() && !values.empty() && values.size() <= 32, at, ".enum must be a list of 1 to 32 values");
    for (const json& v : values) {
      std::string text = v.dump(-1, ' ', true);  // ASCII: non-ASCII characters escaped
      require(text.size() <= 256, at, ".enum holds a value of over 256 characters");
      n.literals.push_back(std::move(text));
    }
    n.min_chars = int(std::min_element(n.literals.begin(), n.literals.end(), [](auto& a, auto& b) {
                        return a.size() < b.size();
                      })->size());
    nodes_[std::size_t(i)] = std::move(n);
    return i;
  }
  require(s.contains("type"), at, " has no 'type' (nor enum or const)");
  require(s["type"].is_string(), at, ".type ", s["type"].dump(), " is not supported (one type, a string)");
  const std::string type = s["type"];
  if (type == "object" && !s.contains("properties")) {  // any object
    require(!s.contains("required"), at, ": 'required' without 'properties'");
    n.kind = Node::Kind::object;
    n.free_keys = true;
    n.children = {add_any(std::min(kAnyDepth, kMaxNesting - depth) - 1)};
    n.min_chars = 2;
  } else if (type == "object") {
    n.kind = Node::Kind::object;
    if (s.contains("additionalProperties"))
      require(s["additionalProperties"] == false, at, ".additionalProperties must be false (only the properties named)");
    const json props = s.value("properties", json::object());
    require(props.is_object() && int(props.size()) <= kMaxProperties, at, ".properties must name at most ",
            kMaxProperties, " properties");
    for (const auto& [key, sub] : props.items()) {
      require(!key.empty() && std::all_of(key.begin(), key.end(), printable), at, ": the property name '", key,
              "' must be printable ASCII without quotes or backslashes");
      n.keys.push_back(key);
      n.children.push_back(add(sub, depth + 1, at + ".properties." + key));
    }
    if (s.contains("required")) {
      require(s["required"].is_array(), at, ".required must be a list of property names");
      for (const json& r : s["required"]) {
        const auto k = r.is_string() ? std::find(n.keys.begin(), n.keys.end(), r.get<std::string>()) : n.keys.end();
        require(k != n.keys.end(), at, ".required names ", r.dump(), ", not one of its properties");
        n.required |= std::uint64_t(1) << (k - n.keys.begin());
      }
    }
    int chars = 1;  // '{', each required entry with its separator (the last '}')
    for (std::size_t k = 0; k < n.keys.size(); ++k)
      if (n.required >> k & 1) chars += int(n.keys[k].size()) + 4 + nodes_[std::size_t(n.children[k])].min_chars;
    n.min_chars = n.required == 0 ? 2 : chars;
  } else if (type == "array") {
    n.kind = Node::Kind::array;
    n.children = {s.contains("items") ? add(s["items"], depth + 1, at + ".items") : add_any(kAnyDepth - 1)};
    n.min_items = integer_of(s, "minItems", 0, 64, at);
    n.max_items = integer_of(s, "maxItems", std::max(n.min_items, 8), 64, at);
    require(n.min_items <= n.max_items, at, ": minItems ", n.min_items, " > maxItems ", n.max_items);
    const int item = nodes_[std::size_t(n.children[0])].min_chars;
    n.min_chars = n.min_items == 0 ? 2 : 1 + n.min_items * (item + 1);
  } else if (type == "string") {
    n.kind = Node::Kind::string;
    n.min_length = integer_of(s, "minLength", 0, 256, at);
    n.max_length = integer_of(s, "maxLength", std::max(n.min_length, 32), 256, at);
    require(n.min_length <= n.max_length, at, ": minLength ", n.min_length, " > maxLength ", n.max_length);
    n.min_chars = 2 + n.min_length;
  } else if (type == "number" || type == "integer") {
    n.kind = type == "number" ? Node::Kind::number : Node::Kind::integer;
    n.min_chars = 1;
  } else if (type == "boolean" || type == "null") {
    n.kind = Node::Kind::literal;
    n.literals = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"true", "false"};
    n.min_chars = 4;
  } else {
    fail(at, ".type \"", type, "\" is not a JSON schema type");
  }
  nodes_[std::size_t(i)] = std::move(n);
  return i;
}

bool JsonSchema::matches(int i, const json& v) const {
  const Node& n = node(i);
  switch (n.kind) {
    case Node::Kind::any:
      return true;
    case Node::Kind::literal:
      return std::any_of(n.literals.begin(), n.literals.end(), [&](const std::string& l) { return json::parse(l) == v; });
    case Node::Kind::string:
      return v.is_string() && int(v.get<std::string>().size()) >= n.min_length &&
             int(v.get<std::string>().size()) <= n.max_length;
    case Node::Kind::number:
      return v.is_number();
    case Node::Kind::integer:
      return v.is_number_integer();
    case Node::Kind::array:
      if (!v.is_array() || int(v.size()) < n.min_items || int(v.size()) > n.max_items) return false;
      return std::all_of(v.begin(), v.end(), [&](const json& x) { return matches(n.children[0], x); });
    case Node::Kind::object: {
      if (!v.is_object()) return false;
      if (n.free_keys) return true;
      std::uint64_t seen = 0;
      for (const auto& [key, value] : v.items()) {
        const auto k = std::find(n.keys.begin(), n.keys.end(), key);
        if (k == n.keys.end() || !matches(n.children[std::size_t(k - n.keys.begin())], value)) return false;
        seen |= std::uint64_t(1) << (k - n.keys.begin());
      }
      return (n.required & ~seen) == 0;
    }
  }
  return false;
}

bool JsonSchema::validates(std::string_view text) const {
  const json v = json::parse(text, nullptr, false);
  return !v.is_discarded() && matches(root(), v);
}

// --- JsonConstraint ----------------------------------------------------------

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonSchema> schema, std::shared_ptr<const TokenPieces> pieces,
                               std::vector<std::int32_t> end_ids)
    : schema_(std::move(schema)), pieces_(std::move(pieces)), ends_(std::move(end_ids)) {
  require(!ends_.empty(), "structured output needs an end-of-text token to end the value (ignore_eos?)");
  state_.frames[0] = Frame{.type = kValue, .node = std::int16_t(schema_->root())};
  state_.size = 1;
}

namespace {
// A schema object whose keys are free (any_object's root, or an any node).
bool free_keys(const JsonSchema::Node& n) { return n.kind == JsonSchema::Node::Kind::any || n.free_keys; }
}  // namespace

bool JsonConstraint::start_value(State& s, int node, char c) const {
  using Node = JsonSchema::Node;
  const Node& n = schema_->node(node);
  if (s.size >= kMaxDepth) return false;
  Frame f{.node = std::int16_t(node)};
  const bool any = n.kind == Node::Kind::any;
  if ((n.kind == Node::Kind::object || (any && n.depth > 0)) && c == '{') {
    f.type = kObject;
    f.state = 0;
  } else if ((n.kind == Node::Kind::array || (any && n.depth > 0)) && c == '[') {
    f.type = kArray;
  } else if ((n.kind == Node::Kind::string || any) && c == '"') {
    f.type = kString;
  } else if ((n.kind == Node::Kind::number || n.kind == Node::Kind::integer || any) && (c == '-' || digit(c))) {
    f.type = kNumber;
    f.state = c == '-' ? 0 : c == '0' ? 1 : 2;
    f.pos = 1;
  } else if (n.kind == Node::Kind::literal || any) {
    f.type = kLiteral;
    for (std::size_t a = 0; a < n.literals.size(); ++a)
      if (n.literals[a][0] == c) f.alive |= 1u << a;
    if (f.alive == 0) return false;
    f.pos = 1;
  } else {
    return false;
  }
  s.frames[s.size++] = f;
  return true;
}

bool JsonConstraint::feed(State& s, char c) const {
  for (;;) {
    if (s.size == 0) return false;  // the value is whole: nothing more
    Frame& f = s.frames[s.size - 1];
    if (f.type == kValue) {
      --s.size;
      return start_value(s, f.node, c);
    }
    // A frame that ends without consuming c (a number, a literal) gives c
    // to its parent; the others consume it or refuse it.
    const int before = s.size;
    if (feed_frame(s, c)) return true;
    if (s.size == before) return false;
  }
}

// One character into the top frame: true when consumed. When the frame is
// a number or a literal that c does not continue but that is whole, it is
// popped (the caller gives c to the parent) and false returned.
bool JsonConstraint::feed_frame(State& s, char c) const {
  using Node = JsonSchema::Node;
  Frame& f = s.frames[s.size - 1];
  const Node& n = schema_->node(f.node);
  // f is whole: pop it, and move its parent past the value.
  auto close = [&] {
    --s.size;
    if (s.size == 0) return;
    Frame& p = s.frames[s.size - 1];
    if (p.type == kObject && p.state == 3) p.state = 4;
    if (p.type == kArray && p.state == 1) p.state = 2, ++p.count;
  };
  auto push_value = [&](int node) {
    if (s.size >= kMaxDepth) return false;
    s.frames[s.size++] = Frame{.type = kValue, .node = std::int16_t(node)};
    return true;
  };
  switch (f.type) {
    case kObject: {
      const bool free = free_keys(n);
      const int most = free ? kAnyProperties : int(n.keys.size());
      const bool required_done = free || (n.required & ~f.seen) == 0;
      auto open_key = [&] {
        f.state = 1, f.pos = 0, f.key = -1;
        if (free) return f.count < most;
        f.alive = 0;
        for (std::size_t k = 0; k < n.keys.size(); ++k)
          if (!(f.seen >> k & 1)) f.alive |= 1u << k;
        return f.alive != 0;
      };
      switch (f.state) {
        case 0:  // after '{'
          if (c == '}' && required_done) return close(), true;
          return c == '"' && open_key();
        case 1:  // in a key
          if (free) {
            if (c == '"') return f.pos > 0 ? (f.state = 2, true) : false;
            if (!printable(c) || f.pos >= kAnyKeyLength) return false;
            ++f.pos;
            return true;
          }
          if (c == '"') {
            for (std::size_t k = 0; k < n.keys.size(); ++k)
              if ((f.alive >> k & 1) && int(n.keys[k].size()) == f.pos) return f.key = std::int16_t(k), f.state = 2, true;
            return false;
          } else {
            std::uint32_t alive = 0;
            for (std::size_t k = 0; k < n.keys.size(); ++k)
              if ((f.alive >> k & 1) && f.pos < int(n.keys[k].size()) && n.keys[k][std::size_t(f.pos)] == c)
                alive |= 1u << k;
            if (alive == 0) return false;
            f.alive = alive, ++f.pos;
            return true;
          }
        case 2:  // after the key's closing quote
          if (c != ':') return false;
          f.state = 3;
          if (free) ++f.count;
          else f.seen |= std::uint64_t(1) << f.key;
          return push_value(n.children[free ? 0 : std::size_t(f.key)]);
        case 4:  // after a value
          if (c == '}' && required_done) return close(), true;
          if (c != ',') return false;
          if (free ? f.count >= most : std::popcount(f.seen) >= most) return false;
          f.state = 5;
          return true;
        case 5:  // after ','
          return c == '"' && open_key();
      }
      return false;
    }
    case kArray: {
      const int item = n.children[0];
      const int min_items = n.kind == Node::Kind::any ? 0 : n.min_items, max_items = n.kind == Node::Kind::any ? kAnyItems : n.max_items;
      switch (f.state) {
        case 0:  // after '['
          if (c == ']') return min_items == 0 ? (close(), true) : false;
          if (max_items == 0) return false;
          f.state = 1;
          return push_value(item) && feed(s, c);
        case 2:  // after a value
          if (c == ']') return f.count >= min_items ? (close(), true) : false;
          if (c != ',' || f.count >= max_items) return false;
          f.state = 3;
          return true;
        case 3:  // after ','
          f.state = 1;
          return push_value(item) && feed(s, c);
      }
      return false;
    }
    case kString: {
      const int min_length = n.kind == Node::Kind::string ? n.min_length : 0;
      const int max_length = n.kind == Node::Kind::string ? n.max_length : 32;
      if (c == '"') return f.pos >= min_length ? (close(), true) : false;
      if (!printable(c) || f.pos >= max_length) return false;
      ++f.pos;
      return true;
    }
    case kNumber: {
      const bool fraction = n.kind != Node::Kind::integer;
      const bool room = f.pos < kMaxNumber;
      switch (f.state) {
        case 0:  // after '-'
          if (c == '0' || (digit(c) && room)) return f.state = c == '0' ? 1 : 2, ++f.pos, true;
          return false;
        case 1:  // after a leading 0
        case 2:  // in the integer's digits
          if (f.state == 2 && digit(c) && room) return ++f.pos, true;
          if (c == '.' && fraction && f.pos + 1 < kMaxNumber) return f.state = 3, ++f.pos, true;
          if (digit(c)) return false;
          close();
          return false;
        case 3:  // after '.'
          if (digit(c)) return f.state = 4, ++f.pos, true;
          return false;
        case 4:  // in the fraction
          if (digit(c) && room) return ++f.pos, true;
          if (digit(c)) return false;
          close();
          return false;
      }
      return false;
    }
    case kLiteral: {
      std::uint32_t alive = 0;
      bool whole = false;
      for (std::size_t a = 0; a < n.literals.size(); ++a) {
        if (!(f.alive >> a & 1)) continue;
        const std::string& l = n.literals[a];
        if (int(l.size()) == f.pos) whole = true;
        else if (l[std::size_t(f.pos)] == c) alive |= 1u << a;
      }
      if (alive != 0) return f.alive = alive, ++f.pos, true;
      if (whole) close();
      return false;
    }
  }
  return false;
}

bool JsonConstraint::complete(const State& s) const {
  if (s.size == 0) return true;
  if (s.size != 1) return false;
  const Frame& f = s.frames[0];
  if (f.type == kNumber) return f.state == 1 || f.state == 2 || f.state == 4;
  if (f.type == kLiteral) {
    const auto& l = schema_->node(f.node).literals;
    for (std::size_t a = 0; a < l.size(); ++a)
      if ((f.alive >> a & 1) && int(l[a].size()) == f.pos) return true;
  }
  return false;
}

// What the required properties not in `seen` (but `except`) cost, each
// with its separator (the last one's the '}').
int JsonConstraint::key_cost(const JsonSchema::Node& n, std::uint64_t seen, int except) const {
  int cost = 0;
  for (std::size_t k = 0; k < n.keys.size(); ++k)
    if ((n.required >> k & 1) && !(seen >> k & 1) && int(k) != except)
      cost += int(n.keys[k].size()) + 4 + schema_->node(n.children[k]).min_chars;
  return cost;
}

int JsonConstraint::frame_cost(const Frame& f) const {
  using Node = JsonSchema::Node;
  const Node& n = schema_->node(f.node);
  switch (f.type) {
    case kValue:
      return n.min_chars;
    case kObject: {
      const bool free = free_keys(n);
      const int child = free ? schema_->node(n.children[0]).min_chars : 0;
      const int rest = free ? 0 : key_cost(n, f.seen, -1);
      switch (f.state) {
        case 0:
        case 4:
          return rest == 0 ? 1 : rest + (f.state == 4 ? 1 : 0);
        case 1: {
          if (free) return (f.pos == 0 ? 1 : 0) + 3 + child;
          int best = std::numeric_limits<int>::max();
          for (std::size_t k = 0; k < n.keys.size(); ++k)
            if (f.alive >> k & 1)
              best = std::min(best, int(n.keys[k].size()) - f.pos + 3 + schema_->node(n.children[k]).min_chars +
                                        key_cost(n, f.seen, int(k)));
          return best;
        }
        case 2:
          return free ? 2 + child : 2 + schema_->node(n.children[std::size_t(f.key)]).min_chars + key_cost(n, f.seen, f.key);
        case 3:
          return 1 + rest;
        case 5: {
          if (free) return 5 + child;
          if (rest > 0) return rest;
          int best = std::numeric_limits<int>::max();
          for (std::size_t k = 0; k < n.keys.size(); ++k)
            if (!(f.seen >> k & 1)) best = std::min(best, int(n.keys[k].size()) + 4 + schema_->node(n.children[k]).min_chars);
          return best;
        }
      }
      return 0;
    }
    case kArray: {
      const int min_items = n.kind == Node::Kind::any ? 0 : n.min_items;
      const int item = schema_->node(n.children[0]).min_chars + 1;
      switch (f.state) {
        case 0:
          return min_items == 0 ? 1 : min_items * item;
        case 1:
          return std::max(0, min_items - (f.count + 1)) * item + 1;
        case 2:
          return std::max(0, min_items - f.count) * item + 1;
        case 3:
          return std::max(1, min_items - f.count) * item;
      }
      return 0;
    }
    case kString:
      return std::max(0, (n.kind == Node::Kind::string ? n.min_length : 0) - f.pos) + 1;
    case kNumber:
      return f.state == 0 || f.state == 3 ? 1 : 0;
    case kLiteral: {
      int best = std::numeric_limits<int>::max();
      for (std::size_t a = 0; a < n.literals.size(); ++a)
        if (f.alive >> a & 1) best = std::min(best, int(n.literals[a].size()) - f.pos);
      return best;
    }
  }
  return 0;
}

int JsonConstraint::finish_cost(const State& s) const {
  int cost = 0;
  for (int i = 0; i < s.size; ++i) cost += frame_cost(s.frames[i]);
  return cost;
}

bool JsonConstraint::done() const { return complete(state_); }

bool JsonConstraint::allowed(std::vector<std::uint8_t>& mask, int left) const {
  const TokenPieces& pieces = *pieces_;
  mask.assign(pieces.size(), 0);
  bool any = false;
  if (complete(state_))
    for (std::int32_t id : ends_)
      if (id >= 0 && std::size_t(id) < mask.size()) mask[std::size_t(id)] = 1, any = true;
  // The first characters the state takes: most tokens fail at their first.
  bool first[256];
  for (int b = 0; b < 256; ++b) {
    State t = state_;
    first[b] = feed(t, char(b));
  }
  for (std::size_t id = 0; id < pieces.size(); ++id) {
    const std::string& p = pieces[id];
    if (p.empty() || !first[static_cast<unsigned char>(p[0])]) continue;
    if (std::find(ends_.begin(), ends_.end(), std::int32_t(id)) != ends_.end()) continue;
    State t = state_;
    bool ok = true;
    for (char c : p)
      if (!(ok = feed(t, c))) break;
    if (ok && finish_cost(t) <= left) mask[id] = 1, any = true;
  }
  return any;
}

void JsonConstraint::accept(std::int32_t id) {
  if (std::find(ends_.begin(), ends_.end(), id) != ends_.end()) return;
  require(id >= 0 && std::size_t(id) < pieces_->size(), "structured output: id ", id, " has no text");
  for (char c : (*pieces_)[std::size_t(id)])
    require(feed(state_, c), "structured output: id ", id, " leaves the schema's grammar");
}

}  // namespace xfmr
