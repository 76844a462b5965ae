// Structured output (infer/json_grammar.hpp): the matcher takes exactly the
// compact JSON texts a schema accepts, character by character; a random
// walk over a vocabulary's tokens that draws only allowed ones always ends
// with a value that validates, within its budget of tokens; a schema it
// cannot guarantee is an Error naming the keyword.
#include <boost/test/unit_test.hpp>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/infer/json_grammar.hpp"

BOOST_AUTO_TEST_SUITE(test_json_grammar)

using namespace xfmr;
using namespace xfmr::test;
using json = nlohmann::json;

namespace {

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 10]}, "maxItems": 3},
    "ok": {"type": "boolean"},
    "nested": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "null"}}, "required": ["x"]}
  },
  "required": ["name", "age"]
})");

// A vocabulary: every printable ASCII character, some longer pieces, and an end id (the last).
std::shared_ptr<const TokenPieces> vocabulary() {
  auto p = std::make_shared<TokenPieces>();
  for (char c = 0x20; c < 0x7f; ++c) p->push_back(std::string(1, c));
  for (const char* s : {"{\"", "\":", "\":\"", "\",\"", "\"}", "true", "null", "false", "12", "0.5", "name", "age",
                        "[\"a\"", "]}", "},", "\n", "\xc3\xa9"})
    p->push_back(s);
  p->push_back("");  // the end id
  return p;
}

// Whether the matcher takes text whole: every character, and complete after the last.
bool takes(const JsonConstraint& c, const std::string& text) {
  JsonConstraint::State s = c.state();
  for (char ch : text)
    if (!c.feed(s, ch)) return false;
  return c.complete(s);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_matcher_takes_the_schemas_compact_json) {
  const auto schema = JsonSchema::compile(kSchema);
  const auto pieces = vocabulary();
  const JsonConstraint c(schema, pieces, {std::int32_t(pieces->size() - 1)});
  for (const std::string good : {R"({"name":"bob","age":3})", R"({"age":-12,"name":"","tags":["a",10],"ok":true})",
                                 R"({"name":"x","age":0,"nested":{"y":null,"x":1.5}})", R"({"name":"12345678","age":7})"}) {
    BOOST_TEST(takes(c, good), good);
    BOOST_TEST(schema->validates(good), good);
  }
  for (const std::string bad : {R"({"name":"bob"})", R"({"nme")", R"({"name":"b","name")", R"({"name":"b","age":01)",
                                R"({"name":"b","age":1.5)", R"({"tags":["c"])", R"({"name":"123456789")",
                                R"({ "name")", R"({"name":"b","age":1,"nested":{}})", R"({"name":"b","age":1}x)",
                                R"({"name":"\n")", R"({"tags":[10,"a","b","a"])", R"({"ok":tru})", "[]", R"("s")"})
    BOOST_TEST(!takes(c, bad), bad);
  // What finishing costs: the shortest value from the start, nothing once whole.
  BOOST_TEST(c.finish_cost(c.state()) == int(std::string(R"({"name":"","age":0})").size()));
  JsonConstraint::State s = c.state();
  for (char ch : std::string(R"({"name":"bob","age":3})")) BOOST_REQUIRE(c.feed(s, ch));
  BOOST_TEST(c.finish_cost(s) == 0);
}

// Random walks over the vocabulary, drawing only allowed tokens, with
// budgets from the shortest value up: each ends whole within its budget
// and validates; also for OpenAI's json_object (any object).
BOOST_AUTO_TEST_CASE(any_walk_of_allowed_tokens_ends_in_a_valid_value) {
  const auto pieces = vocabulary();
  const std::int32_t end = std::int32_t(pieces->size() - 1);
  std::mt19937 rng(7);
  for (const auto& schema : {JsonSchema::compile(kSchema), JsonSchema::any_object(),
                             JsonSchema::compile(json::parse(R"({"type": "array", "items": {"type": "number"}, "minItems": 2})"))}) {
    const int shortest = JsonConstraint(schema, pieces, {end}).finish_cost(JsonConstraint(schema, pieces, {end}).state());
    for (int walk = 0; walk < 300; ++walk) {
      JsonConstraint c(schema, pieces, {end});
      const int budget = shortest + walk % 60;
      std::string text;
      bool ended = false;
      for (int drawn = 0; drawn < budget && !ended; ++drawn) {
        std::vector<std::uint8_t> mask;
        BOOST_REQUIRE(c.allowed(mask, budget - drawn - 1));
        std::vector<std::int32_t> ids;
        for (std::size_t i = 0; i < mask.size(); ++i)
          if (mask[i]) ids.push_back(std::int32_t(i));
        const std::int32_t id = ids[std::uniform_int_distribution<std::size_t>(0, ids.size() - 1)(rng)];
        c.accept(id);
        if (id == end) ended = true;
        else text += (*pieces)[std::size_t(id)];
      }
      BOOST_TEST_CONTEXT("walk " << walk << " (budget " << budget << "): " << text) {
        BOOST_TEST(c.done());
        BOOST_TEST(schema->validates(text));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(schemas_it_cannot_guarantee_are_refused_by_keyword) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "string", "pattern": "^a"})", "'pattern' is not supported"},
           {R"({"anyOf": [{"type": "string"}]})", "'anyOf' is not supported"},
           {R"({"type": ["string", "null"]})", "one type"},
           {R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}})", "properties.a: 'minimum'"},
           {R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]})", "required names \"b\""},
           {R"({"type": "thing"})", "\"thing\" is not a JSON schema type"},
           {R"({"type": "string", "maxLength": 1000})", "maxLength 1000"}}) {
    const json schema = json::parse(text);  // (clang 14 captures no structured binding)
    const std::string error = error_of([&] { (void)JsonSchema::compile(schema); });
    BOOST_TEST(error.find(expected) != std::string::npos, text << " -> " << error);
  }
  BOOST_TEST(error_of([] { JsonConstraint(JsonSchema::any_object(), vocabulary(), {}); }).find("end-of-text") !=
             std::string::npos);
}

// A random-weight model through the engine's batcher: 100 of 100 answers
// parse and validate, sampled at temperature 1 with 100 seeds; and 20
// json_object answers are objects.
BOOST_AUTO_TEST_CASE(a_random_model_writes_valid_json_100_times_of_100) {
  const std::string fixtures = XFMR_FIXTURE_DIR;
  Engine e = Engine::load(fixtures + "/families/gpt2-ctx2048", {.tokenizer = fixtures + "/lm/tokenizer.json"});
  e.start_batching({.slots = 8, .context = 512, .queue = 128});
  const auto schema = JsonSchema::compile(kSchema);
  const std::vector<std::int32_t> prompt = e.prompt("Write the record as JSON:");
  std::vector<Completion> done(120);
  for (std::size_t i = 0; i < done.size(); ++i)
    e.submit({.prompt = prompt,
              .sampling = {.temperature = 1.0},
              .max_tokens = 400,
              .seed = i,
              .json_schema = i < 100 ? schema : JsonSchema::any_object()},
             OnText{}, [&done, i](const Completion& c) { done[i] = c; });
  while (e.step()) {
  }
  int valid = 0, objects = 0;
  for (std::size_t i = 0; i < done.size(); ++i) BOOST_TEST_CONTEXT("request " << i << ": " << done[i].text) {
      BOOST_TEST((done[i].reason == FinishReason::stop));  // the end token, once the value was whole
      if (i < 100) valid += schema->validates(done[i].text);
      else objects += json::parse(done[i].text, nullptr, false).is_object();
    }
  BOOST_TEST(valid == 100);
  BOOST_TEST(objects == 20);
  BOOST_TEST_MESSAGE("e.g. " << done[0].text << " and " << done[100].text);
}

BOOST_AUTO_TEST_SUITE_END()
