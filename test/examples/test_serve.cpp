// xfmr-serve as its clients see it, over loopback: a Llama-shaped model of
// the family fixtures. Greedy completions equal `xfmr-lm sample
// --temperature 0`, alone and eight at once; streams carry the same text
// and end with [DONE]; every bad request is a 4xx naming the field; a
// client that has gone is noticed; a load of 64 clients (streams, dropped
// streams, answers not waited for, malformed bodies) loses no request,
// leaks no slot and leaves the memory flat; SIGTERM exits 0.
#include <httplib.h>
#include <signal.h>
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

#include "http_connection.hpp"
#include "xfmr/text/text.hpp"

extern char** environ;

namespace {

using json = nlohmann::json;
const std::string kFixtures = XFMR_FIXTURE_DIR;
const std::string kModel = kFixtures + "/families/smollm2", kTokenizer = kFixtures + "/lm/tokenizer.json";
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
  explicit Server(std::vector<std::string> extra = {}) {
    log_ = "serve_" + std::to_string(::getpid()) + "_" + std::to_string(count_++) + ".log";
    std::vector<std::string> args = {XFMR_SERVE, "--model",   kModel, "--tokenizer", kTokenizer, "--port",
                                     "0",        "--api-key", kKey,   "--context",   "64"};
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

 private:
  static inline int count_ = 0;
  pid_t pid_ = 0;
  int port_ = 0;
  std::string log_;
};

Server& server() {
  static Server s;
  return s;
}

json post(const std::string& path, const json& body, int expect = 200, const httplib::Headers& headers = kAuth) {
  auto r = server().client().Post(path, headers, body.dump(), "application/json");
  BOOST_REQUIRE(r);
  BOOST_TEST(r->status == expect, path << " " << body.dump() << " -> " << r->status << " " << r->body);
  return json::parse(r->body);
}

// What `xfmr-lm sample --temperature 0` prints after the prompt, as the
// server sends text (ill-formed bytes as U+FFFD).
std::string sampled(const std::string& prompt, int tokens) {
  const std::string cmd = std::string(XFMR_LM) + " sample --model " + kModel + " --tokenizer " + kTokenizer +
                          " --temperature 0 --tokens " + std::to_string(tokens) + " --prompt '" + prompt +
                          "' 2>/dev/null";
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
  BOOST_TEST(json::parse(ev[ev.size() - 2])["usage"] == whole["usage"]);
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
      {{{"prompt", "a"}, {"n", 2}}, "n"},
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

// 64 clients x 20 requests: whole, streamed, streams dropped after their
// first event, malformed. Each gets one answer; afterwards no slot is
// busy, every accepted request has finished, and the memory is flat.
// The probe that cancels an answer nobody waits for (http_connection.hpp),
// on an httplib server of the test's own: open while its client waits,
// closed once the client has given up.
BOOST_AUTO_TEST_CASE(a_gone_client_is_noticed) {
  httplib::Server http;
  std::atomic<int> open_socket = -2, closed_socket = -2;
  std::atomic<bool> noticed = false;
  http.Get("/open", [&](const httplib::Request& req, httplib::Response& res) {
    const int fd = xfmr::server::connection_socket(req);
    open_socket = fd;
    res.set_content(xfmr::server::connection_closed(fd) ? "closed" : "open", "text/plain");
  });
  http.Get("/wait", [&](const httplib::Request& req, httplib::Response& res) {
    const int fd = xfmr::server::connection_socket(req);
    closed_socket = fd;
    for (int i = 0; i < 600 && !noticed; ++i) {
      noticed = xfmr::server::connection_closed(fd);
      if (!noticed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    res.set_content("late", "text/plain");
  });
  const int port = http.bind_to_any_port("127.0.0.1");
  std::jthread listener([&] { http.listen_after_bind(); });
  {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    auto r = c.Get("/open");
    BOOST_REQUIRE(r);
    BOOST_TEST(r->body == "open");
    BOOST_TEST(open_socket.load() >= 0);
  }
  {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(0, 300 * 1000);  // gives up, and closes its socket, before an answer
    BOOST_TEST(!c.Get("/wait"));
  }
  for (int i = 0; i < 600 && !noticed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(closed_socket.load() >= 0);
  BOOST_TEST(noticed.load());
  http.stop();
}

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
            const std::string path = kind == 4 ? "/v1/chat/completions" : "/v1/completions";
            const std::string text =
                kind == 4
                    ? json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 8}}.dump()
                    : body.dump();
            httplib::Result r = client->Post(path, kAuth, text, "application/json");
            for (int tries = 0; r && r->status == 503 && r->has_header("Retry-After") && tries < 100; ++tries) {
              ++busy;
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
              r = client->Post(path, kAuth, text, "application/json");
            }
            if (r && r->status == 200 && r->body.find("\"finish_reason\"") != std::string::npos) ++ok;
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
