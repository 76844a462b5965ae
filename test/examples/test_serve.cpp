// xfmr-serve as its clients see it, over loopback: a Llama-shaped model of
// the family fixtures, decoded speculatively with its int8 copy as the
// draft (plain decoding's answers). Greedy completions equal `xfmr-lm sample
// --temperature 0`, alone and eight at once; streams carry the same text
// and end with [DONE]; every bad request is a 4xx naming the field (and
// every field the server does not implement); the HTTP layer over raw
// sockets (pipelining, half-closes, chunked bodies and their bound,
// 100-continue, malformed heads); a client that has gone is noticed;
// slow and idle clients hold no worker; a load of 64 clients (streams,
// dropped streams, answers not waited for, malformed bodies) loses no
// request, leaks no slot and leaves the memory flat; a request cut by the
// drain is reported cut; SIGTERM exits 0.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http.hpp"
#include "xfmr/text/text.hpp"

extern char** environ;

namespace {

using json = nlohmann::json;
const std::string kFixtures = XFMR_FIXTURE_DIR;
const std::string kModel = kFixtures + "/families/smollm2", kTokenizer = kFixtures + "/lm/tokenizer.json";
const std::string kAdapter = kFixtures + "/lora/smollm2";  // a peft LoRA adapter of kModel
const std::string kKey = "test-key";
const httplib::Headers kAuth = {{"Authorization", "Bearer " + kKey}};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One xfmr-serve process on a free port, stopped by SIGTERM.
class Server {
 public:
  explicit Server(std::vector<std::string> extra = {}, const std::string& model = kModel) {
    log_ = "serve_" + std::to_string(::getpid()) + "_" + std::to_string(count_++) + ".log";
    std::vector<std::string> args = {XFMR_SERVE, "--model", model, "--tokenizer", kTokenizer, "--port", "0",
                                     "--api-key", kKey};
    if (std::find(extra.begin(), extra.end(), "--context") == extra.end()) args.insert(args.end(), {"--context", "64"});
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    BOOST_REQUIRE(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    const std::regex listening("listening on http://127.0.0.1:([0-9]+)/");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::smatch m;
      const std::string log = read_file(log_);
      if (std::regex_search(log, m, listening)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    BOOST_REQUIRE_MESSAGE(port_ > 0, "xfmr-serve did not start: " << read_file(log_));
    for (int i = 0; i < 600; ++i) {
      if (auto r = client().Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    BOOST_FAIL("xfmr-serve did not load its model: " << read_file(log_));
  }
  ~Server() {
    if (pid_ > 0) stop();
  }
  // SIGTERM; the exit status.
  int stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60);
    return c;
  }
  std::unique_ptr<httplib::Client> connect() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60);
    return c;
  }
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }
  std::string log() const { return read_file(log_); }
  int port() const { return port_; }

 private:
  static inline int count_ = 0;
  pid_t pid_ = 0;
  int port_ = 0;
  std::string log_;
};

// The server most cases share decodes speculatively with a draft model
// (the fixture's weights in int8), whose answers are plain decoding's:
// every case below checks them, the load test included. It holds two
// LoRA adapters beside the model, which requests naming no adapter do
// not take.
Server& server() {
  static Server s({"--draft", kModel, "--draft-precision", "int8", "--draft-tokens", "3", "--lora", "one=" + kAdapter,
                   "--lora", "three=" + kAdapter + ":3"});
  return s;
}

// A connection of bytes, for what client libraries do not send.
class Raw {
 public:
  explicit Raw(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(std::uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BOOST_REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const timeval wait{.tv_sec = 20, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  }
  ~Raw() { ::close(fd_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  bool send(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(std::size_t(n));
    }
    return true;
  }
  void half_close() { ::shutdown(fd_, SHUT_WR); }
  // What comes until the server closes (or 20 s pass without a byte), or
  // until `text` has come `times` times.
  std::string read(std::string_view text = {}, int times = 1) {
    char b[65536];
    for (ssize_t n; (text.empty() || count(got_, text) < times) && (n = ::recv(fd_, b, sizeof b, 0)) > 0;)
      got_.append(b, std::size_t(n));
    return got_;
  }
  static int count(std::string_view s, std::string_view what) {
    int n = 0;
    for (std::size_t at = s.find(what); at != std::string_view::npos; at = s.find(what, at + what.size())) ++n;
    return n;
  }

 private:
  int fd_ = -1;
  std::string got_;
};

json post(const std::string& path, const json& body, int expect = 200, const httplib::Headers& headers = kAuth) {
  auto r = server().client().Post(path, headers, body.dump(), "application/json");
  BOOST_REQUIRE(r);
  BOOST_TEST(r->status == expect, path << " " << body.dump() << " -> " << r->status << " " << r->body);
  return json::parse(r->body);
}

// What `xfmr-lm sample --temperature 0` prints after the prompt, as the
// server sends text (ill-formed bytes as U+FFFD).
// lora: --lora's value (none when empty).
std::string sampled(const std::string& prompt, int tokens, const std::string& lora = "") {
  const std::string cmd = std::string(XFMR_LM) + " sample --model " + kModel + " --tokenizer " + kTokenizer +
                          " --temperature 0 --tokens " + std::to_string(tokens) + " --prompt '" + prompt + "'" +
                          (lora.empty() ? "" : " --lora " + lora) + " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p.get())) > 0;) out.append(buf, n);
  BOOST_REQUIRE(out.size() >= prompt.size() + 1);
  BOOST_REQUIRE(out.compare(0, prompt.size(), prompt) == 0);
  return xfmr::utf8_repaired(out.substr(prompt.size(), out.size() - prompt.size() - 1));
}

// A server-sent event stream's data lines.
std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  return out;
}

const std::vector<std::string> kPrompts = {"Once upon", "The cat", "a",           "In the beginning",
                                           "Why",       "42 is",   "hello hello", "We"};

// The server's greedy text is xfmr-lm's, or its start where the server
// stopped at the end-of-text token (xfmr-lm sample does not stop there).
void check_greedy(const json& r, const std::string& expected) {
  const std::string text = r["choices"][0]["text"];
  if (r["choices"][0]["finish_reason"] == "length") BOOST_TEST(text == expected);
  else BOOST_TEST(expected.compare(0, text.size(), text) == 0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_serve)

BOOST_AUTO_TEST_CASE(the_routes_answer) {
  auto c = server().client();
  auto health = c.Get("/health");
  BOOST_REQUIRE(health);
  BOOST_TEST(health->status == 200);
  auto models = c.Get("/v1/models", kAuth);
  BOOST_REQUIRE(models);
  BOOST_TEST(json::parse(models->body)["data"][0]["id"] == "smollm2");
  auto page = c.Get("/");
  BOOST_REQUIRE(page);
  BOOST_TEST(page->body.find("<title>xfmr chat</title>") != std::string::npos);
  const json ids = post("/tokenize", {{"content", "Once upon"}})["tokens"];
  BOOST_TEST(ids.size() > 0u);
  BOOST_TEST(post("/detokenize", {{"tokens", ids}})["content"] == "Once upon");
  auto metrics = c.Get("/metrics");
  BOOST_REQUIRE(metrics);
  BOOST_TEST(metrics->body.find("# TYPE xfmr_tokens_generated_total counter") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(greedy_completions_equal_xfmr_lm_sample_alone_and_eight_at_once) {
  std::vector<std::string> expected;
  for (const auto& p : kPrompts) expected.push_back(sampled(p, 12));
  for (std::size_t i = 0; i < kPrompts.size(); ++i) {
    const json r = post("/v1/completions", {{"prompt", kPrompts[i]}, {"max_tokens", 12}, {"temperature", 0}});
    BOOST_TEST_CONTEXT("alone: '" << kPrompts[i] << "'") check_greedy(r, expected[i]);
    BOOST_TEST(r["usage"]["completion_tokens"].get<int>() <= 12);
    BOOST_TEST(r["object"] == "text_completion");
  }
  std::vector<json> got(kPrompts.size());
  {
    std::vector<std::jthread> clients;
    for (std::size_t i = 0; i < kPrompts.size(); ++i)
      clients.emplace_back([&, i] {
        auto r = server().client().Post("/v1/completions", kAuth,
                                        json{{"prompt", kPrompts[i]}, {"max_tokens", 12}, {"temperature", 0}}.dump(),
                                        "application/json");
        if (r && r->status == 200) got[i] = json::parse(r->body);
      });
  }
  for (std::size_t i = 0; i < kPrompts.size(); ++i) BOOST_TEST_CONTEXT("eight at once: '" << kPrompts[i] << "'") {
      BOOST_REQUIRE(got[i].is_object());
      check_greedy(got[i], expected[i]);
    }
}

// LoRA adapters beside the model (the shared server's --lora one=... and
// three=...:3): /v1/models lists them; a request naming one answers as
// `xfmr-lm sample --lora` does; the model and both adapters, eight
// clients at once, each answer as alone; an unknown name is a 404 naming
// those there are.
BOOST_AUTO_TEST_CASE(lora_adapters_answer_by_model_name_in_one_batch) {
  auto models = server().client().Get("/v1/models", kAuth);
  BOOST_REQUIRE(models);
  const json data = json::parse(models->body)["data"];
  BOOST_REQUIRE(data.size() == 3u);
  BOOST_TEST(data[1]["id"] == "one");
  BOOST_TEST(data[2]["id"] == "three");
  BOOST_TEST(data[2]["parent"] == "smollm2");
  const std::vector<std::string> names = {"smollm2", "one", "three"};
  const std::vector<std::string> expected = {sampled("Once upon", 12), sampled("Once upon", 12, kAdapter),
                                             sampled("Once upon", 12, kAdapter + ":3")};
  BOOST_TEST(expected[0] != expected[1]);  // (else this would prove nothing)
  BOOST_TEST(expected[1] != expected[2]);
  const auto body = [&](std::size_t i) {
    return json{{"model", names[i % 3]}, {"prompt", "Once upon"}, {"max_tokens", 12}, {"temperature", 0}};
  };
  for (std::size_t i = 0; i < 3; ++i) {
    const json r = post("/v1/completions", body(i));
    BOOST_TEST(r["model"] == names[i]);
    BOOST_TEST_CONTEXT("alone: " << names[i]) check_greedy(r, expected[i]);
  }
  std::vector<json> got(8);
  {
    std::vector<std::jthread> clients;
    for (std::size_t i = 0; i < got.size(); ++i)
      clients.emplace_back([&, i] {
        auto r = server().client().Post("/v1/completions", kAuth, body(i).dump(), "application/json");
        if (r && r->status == 200) got[i] = json::parse(r->body);
      });
  }
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST_CONTEXT("eight at once: " << names[i % 3]) {
      BOOST_REQUIRE(got[i].is_object());
      check_greedy(got[i], expected[i % 3]);
    }
  const json e = post("/v1/completions", {{"model", "two"}, {"prompt", "a"}}, 404);
  BOOST_TEST(e["error"]["message"].get<std::string>().find("'smollm2', 'one', 'three'") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(streams_carry_the_same_text_and_end_with_done) {
  const json whole = post("/v1/completions", {{"prompt", "The cat"}, {"max_tokens", 10}, {"temperature", 0}});
  auto r = server().client().Post("/v1/completions", kAuth,
                                  json{{"prompt", "The cat"},
                                       {"max_tokens", 10},
                                       {"temperature", 0},
                                       {"stream", true},
                                       {"stream_options", {{"include_usage", true}}}}
                                      .dump(),
                                  "application/json");
  BOOST_REQUIRE(r);
  BOOST_TEST(r->status == 200);
  BOOST_TEST(r->get_header_value("Content-Type") == "text/event-stream");
  const auto ev = events(r->body);
  BOOST_REQUIRE(ev.size() >= 3u);
  BOOST_TEST(ev.back() == "[DONE]");
  std::string text;
  for (std::size_t i = 0; i + 2 < ev.size(); ++i) text += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
  BOOST_TEST(text == whole["choices"][0]["text"].get<std::string>());
  BOOST_TEST(json::parse(ev[ev.size() - 3])["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]);
  // (The cached tokens differ: the stream's prompt is the whole answer's, cached.)
  for (const char* count : {"prompt_tokens", "completion_tokens", "total_tokens"})
    BOOST_TEST(json::parse(ev[ev.size() - 2])["usage"][count] == whole["usage"][count], count);
  // A chat stream: the role first, then the content, then the reason.
  const json messages =
      json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  const json chat = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 6}, {"temperature", 0}});
  BOOST_TEST(chat["object"] == "chat.completion");
  BOOST_TEST(chat["choices"][0]["message"]["role"] == "assistant");
  auto s = server().client().Post(
      "/v1/chat/completions", kAuth,
      json{{"messages", messages}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}}.dump(), "application/json");
  BOOST_REQUIRE(s);
  const auto cev = events(s->body);
  BOOST_REQUIRE(cev.size() >= 3u);
  BOOST_TEST(json::parse(cev[0])["choices"][0]["delta"]["role"] == "assistant");
  BOOST_TEST(json::parse(cev[0])["object"] == "chat.completion.chunk");
  std::string content;
  for (std::size_t i = 1; i + 1 < cev.size(); ++i)
    content += json::parse(cev[i])["choices"][0]["delta"].value("content", "");
  BOOST_TEST(content == chat["choices"][0]["message"]["content"].get<std::string>());
}

BOOST_AUTO_TEST_CASE(bad_requests_are_4xx_naming_the_field) {
  auto c = server().client();
  auto no_key = c.Post("/v1/completions", json{{"prompt", "a"}}.dump(), "application/json");
  BOOST_REQUIRE(no_key);
  BOOST_TEST(no_key->status == 401);
  auto wrong = c.Post("/v1/completions", kAuth, "{\"prompt\": ", "application/json");
  BOOST_REQUIRE(wrong);
  BOOST_TEST(wrong->status == 400);
  BOOST_TEST(json::parse(wrong->body)["error"]["message"] == "the request body is not valid JSON");
  const std::string long_prompt(200, 'x');
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"prompt", 3.5}}, "prompt"},
      {{{"prompt", "a"}, {"max_tokens", "8"}}, "max_tokens"},
      {{{"prompt", "a"}, {"max_tokens", 1000}}, "max_tokens"},
      {{{"prompt", "a"}, {"max_tokens", 0}}, "max_tokens"},
      {{{"prompt", "a"}, {"temperature", -1}}, "temperature"},
      {{{"prompt", "a"}, {"top_p", 0}}, "top_p"},
      {{{"prompt", "a"}, {"n", 17}}, "n"},
      {{{"prompt", "a"}, {"logprobs", 6}}, "logprobs"},
      {{{"prompt", "a"}, {"logprobs", true}}, "logprobs"},
      {{{"prompt", "a"}, {"stop", json::array({1})}}, "stop"},
      {{{"prompt", "a"}, {"stream", "yes"}}, "stream"},
      {{{"prompt", long_prompt}}, "prompt"},
      {{{"prompt", json::array({1, 99999})}}, "prompt"},
  };
  for (const auto& [body, param] : cases) {
    const json e = post("/v1/completions", body, 400)["error"];
    BOOST_TEST(e["param"] == param, body.dump() << " -> " << e.dump());
    BOOST_TEST(e["type"] == "invalid_request_error");
  }
  BOOST_TEST(post("/v1/chat/completions", {{"messages", json::array()}}, 400)["error"]["param"] == "messages");
  BOOST_TEST(post("/v1/chat/completions", {{"messages", json::array({{{"role", "robot"}, {"content", "x"}}})}},
                  400)["error"]["message"]
                 .get<std::string>()
                 .find("'robot'") != std::string::npos);
  BOOST_TEST(post("/v1/completions", {{"prompt", "a"}, {"model", "gpt-4"}}, 404)["error"]["param"] == "model");
  auto big = c.Post("/v1/completions", kAuth, std::string(2 << 20, ' '), "application/json");
  BOOST_REQUIRE(big);
  BOOST_TEST(big->status == 413);
}

// Stop strings end the text before them; the stop reason says so.
BOOST_AUTO_TEST_CASE(stop_strings_end_the_text) {
  // A stop string of one ASCII character past the first of a greedy answer
  // (the random model's text holds U+FFFD for its ill-formed bytes, which
  // are no stop string's).
  int tried = 0;
  for (const std::string& prompt : kPrompts) {
    const json whole = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
    const std::string text = whole["choices"][0]["text"];
    const auto at = std::find_if(text.begin() + std::min<std::size_t>(1, text.size()), text.end(),
                                 [](char c) { return c > 0 && c < 0x7f; });
    if (at == text.end()) continue;
    const std::string stop(1, *at);
    const json cut = post("/v1/completions",
                          {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stop", {stop, "never"}}});
    BOOST_TEST(cut["choices"][0]["text"] == text.substr(0, text.find(stop)));
    BOOST_TEST(cut["choices"][0]["finish_reason"] == "stop");
    ++tried;
  }
  BOOST_TEST(tried > 0);
}

// logprobs in OpenAI's two shapes, whole and streamed: under greedy
// decoding each token is its step's likeliest; the top lists are sorted.
BOOST_AUTO_TEST_CASE(logprobs_in_openais_shapes) {
  const json r = post("/v1/completions", {{"prompt", "The cat"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}});
  const json& lp = r["choices"][0]["logprobs"];
  const int n = r["usage"]["completion_tokens"];
  BOOST_REQUIRE(lp.is_object());
  BOOST_TEST(lp["tokens"].size() == std::size_t(n));
  BOOST_TEST(lp["token_logprobs"].size() == std::size_t(n));
  BOOST_TEST(lp["text_offset"][0] == 0);
  for (int i = 0; i < n; ++i) {
    double best = -1e9;
    for (const auto& [token, value] : lp["top_logprobs"][i].items()) best = std::max(best, value.get<double>());
    BOOST_TEST(lp["token_logprobs"][i].get<double>() <= 0.0);
    BOOST_TEST(lp["token_logprobs"][i].get<double>() == best, boost::test_tools::tolerance(1e-6));
  }
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json chat = post("/v1/chat/completions", {{"messages", messages},
                                                  {"max_tokens", 5},
                                                  {"temperature", 0},
                                                  {"logprobs", true},
                                                  {"top_logprobs", 3}});
  const json& content = chat["choices"][0]["logprobs"]["content"];
  BOOST_TEST(content.size() == chat["usage"]["completion_tokens"].get<std::size_t>());
  for (const json& t : content) {
    BOOST_REQUIRE(t["top_logprobs"].size() == 3u);
    BOOST_TEST(t["logprob"].get<double>() == t["top_logprobs"][0]["logprob"].get<double>());
    BOOST_TEST(t["top_logprobs"][0]["logprob"].get<double>() >= t["top_logprobs"][2]["logprob"].get<double>());
    BOOST_TEST(t["bytes"].is_array());
  }
  // Streamed: a token's logprobs in its chunk, as many as the whole answer's.
  auto s = server().client().Post("/v1/chat/completions", kAuth,
                                  json{{"messages", messages},
                                       {"max_tokens", 5},
                                       {"temperature", 0},
                                       {"logprobs", true},
                                       {"stream", true}}
                                      .dump(),
                                  "application/json");
  BOOST_REQUIRE(s);
  std::size_t streamed = 0;
  for (const std::string& e : events(s->body))
    if (e != "[DONE]")
      if (const json c = json::parse(e); !c["choices"].empty() && c["choices"][0]["logprobs"].is_object())
        streamed += c["choices"][0]["logprobs"]["content"].size();
  BOOST_TEST(streamed == content.size());
}

// n choices: choice i is what the request gives alone with seed + i, whole
// and streamed; the prompt is read once.
BOOST_AUTO_TEST_CASE(n_choices_are_each_a_lone_request_with_its_seed) {
  const json body = {{"prompt", "Once upon"}, {"max_tokens", 8}, {"temperature", 0.9}, {"seed", 70}};
  json many = body;
  many["n"] = 3;
  const json r = post("/v1/completions", many);
  BOOST_REQUIRE(r["choices"].size() == 3u);
  int tokens = 0;
  for (int i = 0; i < 3; ++i) {
    json one = body;
    one["seed"] = 70 + i;
    const json alone = post("/v1/completions", one);
    BOOST_TEST(r["choices"][i]["index"] == i);
    BOOST_TEST(r["choices"][i]["text"] == alone["choices"][0]["text"], "choice " << i);
    tokens += alone["usage"]["completion_tokens"].get<int>();
  }
  BOOST_TEST(r["usage"]["completion_tokens"] == tokens);
  many["stream"] = true;
  auto s = server().client().Post("/v1/completions", kAuth, many.dump(), "application/json");
  BOOST_REQUIRE(s);
  std::vector<std::string> text(3);
  int finished = 0;
  for (const std::string& e : events(s->body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    text[c["index"].get<std::size_t>()] += c["text"].get<std::string>();
    finished += !c["finish_reason"].is_null();
  }
  BOOST_TEST(finished == 3);
  for (int i = 0; i < 3; ++i) BOOST_TEST(text[std::size_t(i)] == r["choices"][i]["text"].get<std::string>());
}

// /v1/embeddings: a unit vector of the model's width an input, the same
// for the same text, in floats or base64 (OpenAI's clients' default).
BOOST_AUTO_TEST_CASE(embeddings_of_texts_and_ids) {
  const json r = post("/v1/embeddings", {{"input", {"The cat", "a dog", "The cat"}}});
  BOOST_REQUIRE(r["data"].size() == 3u);
  const auto e0 = r["data"][0]["embedding"].get<std::vector<double>>();
  double length = 0;
  for (double x : e0) length += x * x;
  BOOST_TEST(length == 1.0, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(r["data"][2]["embedding"] == r["data"][0]["embedding"]);
  BOOST_TEST(r["data"][1]["embedding"] != r["data"][0]["embedding"]);
  BOOST_TEST(r["usage"]["prompt_tokens"].get<int>() > 0);
  const json ids = post("/tokenize", {{"content", "The cat"}})["tokens"];
  BOOST_TEST(post("/v1/embeddings", {{"input", ids}})["data"][0]["embedding"] == r["data"][0]["embedding"]);
  const json b64 = post("/v1/embeddings", {{"input", "The cat"}, {"encoding_format", "base64"}});
  BOOST_TEST(b64["data"][0]["embedding"].get<std::string>().size() == (e0.size() * 4 + 2) / 3 * 4);
  BOOST_TEST(post("/v1/embeddings", {{"input", 3.5}}, 400)["error"]["param"] == "input");
  BOOST_TEST(post("/v1/embeddings", {{"input", "a"}, {"dimensions", 7}}, 400)["error"]["param"] == "dimensions");
}

// response_format: 20 of 20 random-model answers parse and validate, whole
// and streamed; json_object answers are objects; a schema the server cannot
// guarantee, or too few tokens for it, is a 400 naming the field.
BOOST_AUTO_TEST_CASE(response_format_answers_are_valid_json) {
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"answer", {{"type", "string"}, {"maxLength", 6}}},
                         {"sure", {{"type", "boolean"}}},
                         {"n", {{"type", "integer"}}}}},
                       {"required", {"answer", "sure"}}};
  const json format = {{"type", "json_schema"}, {"json_schema", {{"name", "reply"}, {"schema", schema}}}};
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  for (int i = 0; i < 20; ++i) {
    const bool chat = i % 2 == 0;
    json body = {{"max_tokens", 40}, {"temperature", 1.0}, {"seed", i}, {"response_format", format}};
    if (chat) body["messages"] = messages;
    else body["prompt"] = "Reply:";
    const json r = post(chat ? "/v1/chat/completions" : "/v1/completions", body);
    const std::string text = chat ? r["choices"][0]["message"]["content"] : r["choices"][0]["text"];
    const json v = json::parse(text, nullptr, false);
    BOOST_TEST_CONTEXT("answer " << i << ": " << text) {
      BOOST_REQUIRE(v.is_object());
      BOOST_TEST(v["answer"].is_string());
      BOOST_TEST(v["answer"].get<std::string>().size() <= 6u);
      BOOST_TEST(v["sure"].is_boolean());
      BOOST_TEST((!v.contains("n") || v["n"].is_number_integer()));
      // The end token, or the last of max_tokens with the value whole.
      BOOST_TEST((r["choices"][0]["finish_reason"] == "stop" || r["choices"][0]["finish_reason"] == "length"));
    }
  }
  auto s = server().client().Post("/v1/chat/completions", kAuth,
                                  json{{"messages", messages}, {"max_tokens", 40}, {"seed", 3}, {"stream", true},
                                       {"response_format", {{"type", "json_object"}}}}
                                      .dump(),
                                  "application/json");
  BOOST_REQUIRE(s);
  std::string streamed;
  for (const std::string& e : events(s->body))
    if (e != "[DONE]") streamed += json::parse(e)["choices"][0]["delta"].value("content", "");
  BOOST_TEST(json::parse(streamed, nullptr, false).is_object(), streamed);
  const json pattern = {{"type", "json_schema"},
                        {"json_schema", {{"schema", {{"type", "string"}, {"pattern", "^a"}}}}}};
  BOOST_TEST(post("/v1/completions", {{"prompt", "a"}, {"response_format", pattern}}, 400)["error"]["message"]
                 .get<std::string>()
                 .find("'pattern' is not supported") != std::string::npos);
  BOOST_TEST(post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 5}, {"response_format", format}}, 400)["error"]["param"] ==
             "max_tokens");
  BOOST_TEST(post("/v1/completions", {{"prompt", "a"}, {"response_format", {{"type", "xml"}}}}, 400)["error"]["param"] ==
             "response_format");
}

// Tools: a forced call (required, or a named function) is a tool call whose
// arguments are its parameters' schema's, whole and streamed; the result
// goes back as a tool message and the conversation goes on.
BOOST_AUTO_TEST_CASE(tool_calls_round_trip) {
  // The tools' offer is some 600 characters: a model of a longer context.
  Server big({"--context", "2048"}, kFixtures + "/families/gpt2-ctx2048");
  auto post = [&](const std::string& path, const json& body, int expect = 200) {
    auto r = big.client().Post(path, kAuth, body.dump(), "application/json");
    BOOST_REQUIRE(r);
    BOOST_TEST(r->status == expect, path << " -> " << r->status << " " << r->body);
    return json::parse(r->body);
  };
  const json tools = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "weather"},
          {"description", "The weather in a city"},
          {"parameters",
           {{"type", "object"},
            {"properties", {{"city", {{"type", "string"}, {"maxLength", 5}}}, {"days", {{"type", "integer"}}}}},
            {"required", {"city"}}}}}}},
       {{"type", "function"}, {"function", {{"name", "time"}, {"parameters", {{"type", "object"}}}}}}});
  const json ask = json::array({{{"role", "user"}, {"content", "Hi"}}});
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "weather"}}}}}) {
    const json r = post("/v1/chat/completions", {{"messages", ask}, {"tools", tools}, {"tool_choice", choice},
                                                 {"max_tokens", 50}, {"seed", 1}});
    const json& c = r["choices"][0];
    BOOST_TEST_CONTEXT(c.dump()) {
      BOOST_TEST(c["finish_reason"] == "tool_calls");
      BOOST_REQUIRE(c["message"]["tool_calls"].size() == 1u);
      const json& call = c["message"]["tool_calls"][0];
      BOOST_TEST(call["type"] == "function");
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      BOOST_TEST(args.is_object());
      if (choice.is_object()) {  // a named function: its parameters' schema (with two, any object)
        BOOST_TEST(call["function"]["name"] == "weather");
        BOOST_TEST(args["city"].is_string());
      }
      BOOST_TEST(c["message"]["content"].is_null());
    }
  }
  // The round trip: the call and its result back in the conversation.
  const json first = post("/v1/chat/completions", {{"messages", ask}, {"tools", tools}, {"max_tokens", 50},
                                                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "weather"}}}}}});
  json conversation = ask;
  conversation.push_back(first["choices"][0]["message"]);
  conversation.push_back({{"role", "tool"}, {"tool_call_id", first["choices"][0]["message"]["tool_calls"][0]["id"]},
                          {"content", "{\"sky\":\"clear\"}"}});
  const json second = post("/v1/chat/completions", {{"messages", conversation}, {"tools", tools}, {"max_tokens", 8}});
  BOOST_TEST(second["usage"]["prompt_tokens"].get<int>() > first["usage"]["prompt_tokens"].get<int>());
  // Streamed: the call comes as a tool_calls delta, then the reason.
  auto s = big.client().Post(
      "/v1/chat/completions", kAuth,
      json{{"messages", ask}, {"tools", tools}, {"tool_choice", "required"}, {"max_tokens", 50}, {"stream", true}}.dump(),
      "application/json");
  BOOST_REQUIRE(s);
  int deltas = 0;
  std::string finish;
  for (const std::string& e : events(s->body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    if (c["delta"].contains("tool_calls")) {
      ++deltas;
      BOOST_TEST(c["delta"]["tool_calls"][0]["index"] == 0);
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  BOOST_TEST(deltas == 1);
  BOOST_TEST(finish == "tool_calls");
  BOOST_TEST(post("/v1/chat/completions", {{"messages", ask}, {"tool_choice", "required"}}, 400)["error"]["param"] ==
             "tool_choice");
  BOOST_TEST(post("/v1/chat/completions", {{"messages", ask}, {"tools", tools},
                                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
                  400)["error"]["param"] == "tool_choice");
}

// --lookup (prompt lookup): the same greedy answers as plain decoding,
// drafts counted in /metrics.
BOOST_AUTO_TEST_CASE(prompt_lookup_changes_no_answer) {
  Server fast({"--lookup", "4"});  // against the shared server: a draft model's answers, plain decoding's
  int drafted = 0;
  for (const std::string& prompt : {std::string("the cat the cat the cat the"), std::string("Once upon"),
                                    std::string("abcabcabcabc")}) {
    const json body = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = fast.client().Post("/v1/completions", kAuth, body.dump(), "application/json");
    BOOST_REQUIRE(r);
    BOOST_TEST(json::parse(r->body)["choices"][0]["text"] == post("/v1/completions", body)["choices"][0]["text"],
               prompt);
  }
  auto m = fast.client().Get("/metrics");
  BOOST_REQUIRE(m);
  std::smatch found;
  const std::regex line("\nxfmr_draft_tokens_total ([0-9]+)\n");
  BOOST_REQUIRE(std::regex_search(m->body, found, line));
  drafted = std::stoi(found[1]);
  BOOST_TEST(drafted > 0);
}

// --draft (the shared server's: a draft model, the fixture's weights in
// int8): the same greedy and seeded sampled answers as a plain server's,
// drafts drawn in /metrics.
BOOST_AUTO_TEST_CASE(a_draft_model_changes_no_answer) {
  Server plain;
  for (const std::string& prompt : {std::string("the cat the cat the cat the"), std::string("Once upon")})
    for (double temperature : {0.0, 0.9}) {
      const json body = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", temperature}, {"seed", 7},
                         {"ignore_eos", true}};
      auto r = plain.client().Post("/v1/completions", kAuth, body.dump(), "application/json");
      BOOST_REQUIRE(r);
      BOOST_TEST(json::parse(r->body)["choices"][0]["text"] == post("/v1/completions", body)["choices"][0]["text"],
                 prompt << " at temperature " << temperature);
    }
  auto m = server().client().Get("/metrics");
  BOOST_REQUIRE(m);
  std::smatch found;
  BOOST_REQUIRE(std::regex_search(m->body, found, std::regex("\nxfmr_draft_accepted_total ([0-9]+)\n")));
  BOOST_TEST(std::stoi(found[1]) > 0);
  BOOST_TEST(server().log().find("draft model") != std::string::npos);
}

// A prompt that begins with what a slot holds reads only the rest, and its
// greedy answer is a fresh server's (no cache), bit for bit.
BOOST_AUTO_TEST_CASE(the_prompt_cache_changes_no_answer) {
  const json first = json::array({5, 9, 14, 22, 31, 40, 52, 60, 71, 80});
  json second = first;
  for (int id : {90, 101, 112, 120}) second.push_back(id);
  const json body = {{"prompt", second}, {"max_tokens", 12}, {"temperature", 0}};
  std::string uncached;
  {
    Server fresh;
    auto r = fresh.client().Post("/v1/completions", kAuth, body.dump(), "application/json");
    BOOST_REQUIRE(r);
    const json j = json::parse(r->body);
    BOOST_TEST(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    uncached = j["choices"][0]["text"];
  }
  post("/v1/completions", {{"prompt", first}, {"max_tokens", 4}, {"temperature", 0}});
  const json cached = post("/v1/completions", body);
  BOOST_TEST(cached["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() >= int(first.size()));
  BOOST_TEST(cached["timings"]["cache_n"] == cached["usage"]["prompt_tokens_details"]["cached_tokens"]);
  BOOST_TEST(cached["choices"][0]["text"] == uncached);
  // GET /slots says what each slot holds.
  auto slots = server().client().Get("/slots");
  BOOST_REQUIRE(slots);
  const json states = json::parse(slots->body);
  BOOST_TEST(states.size() == 8u);
  BOOST_TEST(states[0].contains("n_held"));
}

// Fields of OpenAI's API the server does not implement are refused by
// name (never answered as if not sent); their neutral values pass.
BOOST_AUTO_TEST_CASE(unimplemented_fields_are_refused_by_name) {
  const std::vector<std::pair<std::string, json>> asked = {
      {"top_logprobs", 2},      {"echo", true},        {"best_of", 3},
      {"logit_bias", {{"1", 5}}}, {"suffix", "end"},  {"presence_penalty", 0.5},
      {"frequency_penalty", 1}, {"made_up_field", 1}};
  for (const auto& [key, value] : asked) {
    const json e = post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}, {key, value}}, 400)["error"];
    BOOST_TEST(e["param"] == key, e.dump());
  }
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const std::vector<std::pair<std::string, json>> chat_asked = {
      {"top_logprobs", 2},  // without logprobs: true
      {"logprobs", 3},
      {"tool_choice", "required"}};
  for (const auto& [key, value] : chat_asked) {
    const json e =
        post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 2}, {key, value}}, 400)["error"];
    BOOST_TEST(e["param"] == key, e.dump());
  }
  post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}, {"logprobs", nullptr}, {"echo", false}, {"best_of", 1}});
  BOOST_TEST(post("/v1/chat/completions", {{"messages", messages}, {"logprobs", true}, {"top_logprobs", 21}},
                  400)["error"]["param"] == "top_logprobs");
  post("/v1/chat/completions", {{"messages", messages},
                                {"max_tokens", 2},
                                {"logprobs", false},
                                {"response_format", {{"type", "text"}}},
                                {"user", "me"}});
}

// The HTTP layer over raw sockets: what client libraries never send.
BOOST_AUTO_TEST_CASE(raw_http_clients_get_their_answers) {
  const int port = server().port();
  const std::string auth = "Authorization: Bearer " + kKey + "\r\n";
  const std::string body = json{{"prompt", "The cat"}, {"max_tokens", 4}, {"temperature", 0}}.dump();
  auto status_of = [](const std::string& answer) { return answer.substr(0, std::min<std::size_t>(12, answer.size())); };
  {  // three requests in one write: three answers, in order
    Raw c(port);
    c.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/models HTTP/1.1\r\n"
           "Host: t\r\n" + auth + "Connection: close\r\n\r\n");
    const std::string out = c.read();
    BOOST_TEST(Raw::count(out, "HTTP/1.1 200 OK") == 3, out);
    BOOST_TEST(Raw::count(out, R"({"status":"ok"})") == 2);
    BOOST_TEST(out.find("smollm2") != std::string::npos);
  }
  {  // a client that half-closes after its request is answered
    Raw c(port);
    c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + auth + "Content-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body);
    c.half_close();
    const std::string out = c.read();
    BOOST_TEST(status_of(out) == "HTTP/1.1 200", out);
    BOOST_TEST(out.find("\"finish_reason\"") != std::string::npos);
  }
  {  // a chunked body, in two chunks, with a trailer
    Raw c(port);
    const std::size_t half = body.size() / 2;
    char sizes[64];
    std::snprintf(sizes, sizeof sizes, "%zx", half);
    std::string chunked = "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + auth +
                          "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + sizes + "\r\n" +
                          body.substr(0, half) + "\r\n";
    std::snprintf(sizes, sizeof sizes, "%zx;ext=1", body.size() - half);
    chunked += std::string(sizes) + "\r\n" + body.substr(half) + "\r\n0\r\nX-Trailer: 1\r\n\r\n";
    c.send(chunked);
    const std::string out = c.read();
    BOOST_TEST(status_of(out) == "HTTP/1.1 200", out);
  }
  {  // 100-continue: invited for a body within the bound, refused before it past the bound
    Raw c(port);
    c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + auth + "Expect: 100-continue\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n");
    BOOST_TEST(status_of(c.read("\r\n\r\n")) == "HTTP/1.1 100");
    c.send(body);
    const std::string out = c.read();
    BOOST_TEST(out.find("HTTP/1.1 200 OK") != std::string::npos, out);
    Raw big(port);
    big.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + auth +
             "Expect: 100-continue\r\nContent-Length: 2097152\r\n\r\n");
    const std::string refused = big.read();
    BOOST_TEST(status_of(refused) == "HTTP/1.1 413", refused);
    BOOST_TEST(refused.find("100 Continue") == std::string::npos);
  }
  // Malformed heads: each its status, with OpenAI's error object.
  const std::vector<std::pair<std::string, std::string>> heads = {
      {"GET /health HTTP/1.1\r\nHost t\r\n\r\n", "HTTP/1.1 400"},
      {"GET /health HTTP/2.0\r\n\r\n", "HTTP/1.1 505"},
      {"GET /health HTTP/1.1\r\nExpect: magic\r\n\r\n", "HTTP/1.1 417"},
      {"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 501"},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 400"},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", "HTTP/1.1 400"},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400"},
      {"GET /health HTTP/1.1\r\nX-Big: " + std::string(70000, 'x') + "\r\n\r\n", "HTTP/1.1 431"},
      {"GET health HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
      {"DELETE /health HTTP/1.1\r\n\r\n", "HTTP/1.1 405"},
      {"GET /health HTTP/1.0\r\n\r\n", "HTTP/1.1 200"},  // HTTP/1.0: answered, then closed
  };
  for (const auto& [head, expected] : heads) {
    Raw c(port);
    c.send(head);
    const std::string out = c.read();
    BOOST_TEST(status_of(out) == expected, head.substr(0, 60) << " -> " << out.substr(0, 200));
    if (expected != "HTTP/1.1 200") BOOST_TEST(out.find("\"error\"") != std::string::npos, out);
  }
}

// The body's bound holds for chunked bodies: a 3 MiB JSON body sent
// chunked is refused, and a 200 MiB one is not read into memory.
BOOST_AUTO_TEST_CASE(the_body_bound_holds_for_chunked_bodies) {
  const long before = server().rss_kib();
  for (const std::size_t total : {std::size_t(3) << 20, std::size_t(200) << 20}) {
    Raw c(server().port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + kKey +
           "\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string piece = "{\"prompt\": \"" + std::string(65536 - 14, 'a');
    std::string chunk(65536, ' ');
    std::size_t sent = 0;
    for (bool first = true; sent < total; first = false) {
      const std::string& data = first ? piece : chunk;
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      if (!c.send(std::string(size) + data + "\r\n")) break;  // the server has refused and closed
      sent += data.size();
    }
    const std::string out = c.read();
    BOOST_TEST(out.substr(0, 12) == "HTTP/1.1 413", total << " bytes: " << out.substr(0, 200));
  }
  const long after = server().rss_kib();
  BOOST_TEST(after <= before + 32 * 1024, "RSS " << before << " KiB before, " << after << " after");
}

// 200 connections that never finish their heads and 200 idle ones hold no
// worker: /health and a completion are answered at once meanwhile, and the
// server's memory stays flat.
BOOST_AUTO_TEST_CASE(slow_and_idle_clients_hold_no_worker) {
  const long before = server().rss_kib();
  std::vector<std::unique_ptr<Raw>> slow, idle;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<Raw>(server().port()));
    slow.back()->send("POST /v1/completions HTTP/1.1\r\nHost: t\r\n");
    idle.push_back(std::make_unique<Raw>(server().port()));
  }
  for (auto& c : slow) c->send("X-Slowly: 1\r\n");  // a line now and then, never the end
  // The best of three tries (a shared machine may stall one), each within a second.
  double health_s = 1e9, completion_s = 1e9;
  for (int round = 0; round < 3; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    auto h = server().client().Get("/health");
    BOOST_REQUIRE(h);
    BOOST_TEST(h->status == 200);
    auto t1 = std::chrono::steady_clock::now();
    post("/v1/completions", {{"prompt", "The cat"}, {"max_tokens", 4}, {"temperature", 0}});
    auto t2 = std::chrono::steady_clock::now();
    health_s = std::min(health_s, std::chrono::duration<double>(t1 - t0).count());
    completion_s = std::min(completion_s, std::chrono::duration<double>(t2 - t1).count());
  }
  BOOST_TEST_MESSAGE("with 200 slow and 200 idle connections: /health " << health_s << " s, a completion "
                                                                       << completion_s << " s");
  BOOST_TEST(health_s < 1.0);
  BOOST_TEST(completion_s < 1.0);
  const long after = server().rss_kib();
  BOOST_TEST(after <= before + 16 * 1024, "RSS " << before << " KiB before, " << after << " after");
}

// The probe that cancels an answer nobody waits for (http::client_gone), on
// an http::Server of the test's own: a client that closed is gone; one
// that half-closed after its request (at once, or later) is answered.
BOOST_AUTO_TEST_CASE(a_gone_client_is_noticed_and_a_half_closed_one_answered) {
  namespace http = xfmr::server::http;
  std::atomic<bool> noticed = false;
  http::Server s(
      {},
      [&](const http::Request& q, http::Response& r) {
        if (q.path == "/wait") {
          for (int i = 0; i < 600 && !noticed; ++i) {
            noticed = http::client_gone(q);
            if (!noticed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          r.set_content("late", "text/plain");
        } else {  // an answer that takes a second, probing as the server's do
          bool gone = false;
          for (int i = 0; i < 20; ++i) {
            gone = gone || http::client_gone(q);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          r.set_content(gone ? "gone" : "here", "text/plain");
        }
      },
      [](int, const std::string& message, http::Response& r) { r.set_content(message, "text/plain"); });
  const int port = s.listen("127.0.0.1", 0);
  s.start();
  {
    Raw c(port);
    c.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }  // closed, before an answer
  for (int i = 0; i < 600 && !noticed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(noticed.load());
  for (int delay_ms : {0, 300}) {
    Raw c(port);
    c.send("GET /half HTTP/1.1\r\nHost: t\r\n\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    c.half_close();
    const std::string out = c.read();
    BOOST_TEST(out.find("HTTP/1.1 200 OK") != std::string::npos, out);
    BOOST_TEST(out.ends_with("\r\n\r\nhere"), delay_ms << " ms: " << out);
  }
  s.stop();
}

// The request parser alone: what it takes whole, and the status of what it refuses.
BOOST_AUTO_TEST_CASE(the_request_parser) {
  namespace http = xfmr::server::http;
  http::Limits limits;
  limits.max_body = 100;
  {  // fed a byte at a time, two pipelined requests
    http::RequestParser p(limits);
    const std::string two = "POST /a?x=1 HTTP/1.1\r\nContent-Length: 5\r\nX-A:  b \r\n\r\nhelloGET /b HTTP/1.0\r\n\r\n";
    for (char c : two.substr(0, two.size() - 1)) p.feed(std::string_view(&c, 1));
    BOOST_REQUIRE(p.status() == http::RequestParser::Status::complete);
    const http::Request a = p.take();
    BOOST_TEST(a.method == "POST");
    BOOST_TEST(a.path == "/a");
    BOOST_TEST(a.body == "hello");
    BOOST_TEST(a.header("x-a") == "b");
    BOOST_TEST((p.feed({}) == http::RequestParser::Status::more));
    BOOST_TEST((p.feed("\n") == http::RequestParser::Status::complete));
    const http::Request b = p.take();
    BOOST_TEST(b.path == "/b");
    BOOST_TEST(!b.keep_alive);
  }
  auto refused = [&](const std::string& bytes) {
    http::RequestParser p(limits);
    return p.feed(bytes) == http::RequestParser::Status::failed ? p.error_status() : 0;
  };
  BOOST_TEST(refused("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n") == 413);
  BOOST_TEST(refused("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" + std::string(64, 'a') +
                     "\r\n40\r\n") == 413);
  BOOST_TEST(refused("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n") == 400);
  BOOST_TEST(refused("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX") == 400);
  BOOST_TEST(refused("GET / HTTP/1.1\r\n folded\r\n\r\n") == 400);
  BOOST_TEST(refused("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n") == 400);
  BOOST_TEST(refused("GET / HTTP/1.1\r\nX: a\x01" "b\r\n\r\n") == 400);
  BOOST_TEST(refused("GET / HTTP/3.0\r\n\r\n") == 505);
  BOOST_TEST(refused("GET / HTTPS/1.1\r\n\r\n") == 400);
  BOOST_TEST(refused(std::string(70000, 'A')) == 431);
}

// 64 clients x 20 requests to the drafting server: whole (with logprobs,
// two choices, a JSON object), streamed, streams dropped after their
// first event, malformed, chats and embeddings. Each gets one answer; afterwards no slot is
// busy, every accepted request has finished, and the memory is flat.
BOOST_AUTO_TEST_CASE(a_load_of_64_clients_loses_nothing) {
  auto metric = [](const std::string& name) {
    auto r = server().client().Get("/metrics");
    BOOST_REQUIRE(r);
    const std::regex line("\nxfmr_" + name + " ([0-9.e+]+)\n");
    std::smatch m;
    BOOST_REQUIRE(std::regex_search(r->body, m, line));
    return std::stod(m[1]);
  };
  std::atomic<int> ok = 0, rejected = 0, dropped = 0, failed = 0, busy = 0;
  std::mutex m;
  std::vector<std::string> failures;
  auto note = [&](const httplib::Result& r, int kind, int i) {
    std::lock_guard lock(m);
    failures.push_back("kind " + std::to_string(kind) + " request " + std::to_string(i) + ": " +
                       (r ? std::to_string(r->status) + " " + r->body : "no answer: " + httplib::to_string(r.error())));
  };
  auto round = [&](int clients, int requests) {
    std::vector<std::jthread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        auto client = server().connect();
        for (int i = 0; i < requests; ++i) {
          const int kind = (c + i) % 5;
          const json body = {{"prompt", kPrompts[(c + i) % kPrompts.size()]},
                             {"max_tokens", 8},
                             {"seed", c * 100 + i},
                             {"stream", kind == 1 || kind == 2}};
          if (kind == 3) {  // malformed
            auto r = client->Post("/v1/completions", kAuth, "{\"prompt\": [", "application/json");
            if (r && r->status == 400) ++rejected;
            else ++failed, note(r, kind, i);
          } else if (kind == 2 && i % 2 == 1) {  // a whole answer the client does not wait for
            client->set_read_timeout(0, 1000);
            json whole = body;
            whole["max_tokens"] = 40;
            (void)client->Post("/v1/completions", kAuth, whole.dump(), "application/json");
            ++dropped;
            client = server().connect();
          } else if (kind == 2) {  // a stream the client drops after its first event
            bool first = true;
            httplib::Request req;
            req.method = "POST", req.path = "/v1/completions", req.headers = kAuth, req.body = body.dump();
            req.set_header("Content-Type", "application/json");
            req.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) {
              const bool go_on = !first;
              first = false;
              return go_on;
            };
            (void)client->send(req);
            ++dropped;
            client = server().connect();  // the dropped connection is gone
          } else {
            // 503 (every slot busy, the queue full: dropped streams hold
            // theirs until the server notices) says when to come back.
            // The features in the mix: logprobs, two choices, structured
            // output (plain completions), embeddings (every other chat).
            const bool embed = kind == 4 && i % 2 == 1;
            json plain = body;
            if (kind == 0 && i % 3 == 0) plain["logprobs"] = 2;
            if (kind == 0 && i % 3 == 1) plain["n"] = 2;
            if (kind == 0 && i % 3 == 2) plain["response_format"] = {{"type", "json_object"}};
            const std::string path = embed ? "/v1/embeddings" : kind == 4 ? "/v1/chat/completions" : "/v1/completions";
            const std::string text =
                embed ? json{{"input", kPrompts[(c + i) % kPrompts.size()]}}.dump()
                : kind == 4
                    ? json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 8}}.dump()
                    : plain.dump();
            httplib::Result r = client->Post(path, kAuth, text, "application/json");
            for (int tries = 0; r && r->status == 503 && r->has_header("Retry-After") && tries < 100; ++tries) {
              ++busy;
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
              r = client->Post(path, kAuth, text, "application/json");
            }
            if (r && r->status == 200 && r->body.find(embed ? "\"embedding\"" : "\"finish_reason\"") != std::string::npos)
              ++ok;
            else ++failed, note(r, kind, i);
          }
        }
      });
  };
  round(16, 5);  // warm-up: every slot, the thread pool, the buffers
  const long warm = server().rss_kib();
  ok = rejected = dropped = failed = 0;
  round(64, 20);
  BOOST_TEST(failed.load() == 0);
  BOOST_TEST_MESSAGE(ok.load() << " answered, " << rejected.load() << " malformed refused, " << dropped.load()
                               << " dropped by their clients, " << busy.load() << " answers of 503");
  for (const auto& f : failures) BOOST_TEST_MESSAGE("failed: " << f);
  BOOST_TEST(ok.load() + rejected.load() + dropped.load() == 64 * 20);
  BOOST_TEST(rejected.load() == 64 * 20 / 5);
  // Dropped requests are cancelled at the next step: let the engine take them in.
  for (int i = 0; i < 200 && metric("slots_busy") + metric("queue_length") > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(metric("slots_busy") == 0);
  BOOST_TEST(metric("queue_length") == 0);
  BOOST_TEST(metric("requests_total") == metric("requests_finished_total"));
  const long after = server().rss_kib();
  BOOST_TEST(after <= warm + warm / 4 + 16 * 1024, "RSS " << warm << " KiB after warm-up, " << after << " after");
}

BOOST_AUTO_TEST_CASE(sigterm_stops_the_server_with_status_0) {
  const std::string log = server().log();
  BOOST_TEST(server().stop() == 0, log);
}

BOOST_AUTO_TEST_SUITE_END()
