// xfmr-serve-bench: a running xfmr-serve's throughput and latency under N
// concurrent streaming clients (benchmark/serve_bench.sh starts the server).
//
//   xfmr-serve-bench --url http://127.0.0.1:8080 [--clients 1,4,8,16] [--requests 4] [--rounds 3]
//                    [--prompt TEXT] [--max-tokens 64] [--api-key KEY]
//
// Each client sends its requests one after another, streaming, greedy, with
// ignore_eos (every answer max_tokens long). The numbers of clients take
// turns, --rounds times. Per number of clients: the decoded tokens a second
// over all of them (the median round, and against one client's median),
// the time to the first token and the time between tokens over every
// round, p50 and p99.
#include <httplib.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace po = boost::program_options;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(p / 100 * double(v.size())))];
}

struct Round {
  int clients = 0, requests = 0, failed = 0;
  long tokens = 0;
  double seconds = 0;
  std::vector<double> ttft_ms, itl_ms;
};

Round run_round(const std::string& host, int port, const std::string& key, int clients, int requests,
                const std::string& prompt, int max_tokens) {
  Round r;
  r.clients = clients;
  std::mutex m;
  const std::string body = json{{"prompt", prompt},
                                {"max_tokens", max_tokens},
                                {"temperature", 0},
                                {"stream", true},
                                {"ignore_eos", true},
                                {"stream_options", {{"include_usage", true}}}}
                               .dump();
  const auto t0 = Clock::now();
  {
    std::vector<std::jthread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&] {
        httplib::Client client(host, port);
        client.set_read_timeout(600);
        httplib::Headers headers;
        if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
        for (int i = 0; i < requests; ++i) {
          std::vector<double> itl;
          double ttft = -1;
          long tokens = 0;
          std::string buffered;
          const auto sent = Clock::now();
          auto last = sent;
          httplib::Request req;
          req.method = "POST", req.path = "/v1/completions", req.headers = headers, req.body = body;
          req.set_header("Content-Type", "application/json");
          req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
            buffered.append(data, n);
            for (std::size_t end; (end = buffered.find("\n\n")) != std::string::npos;) {
              const std::string event = buffered.substr(0, end);
              buffered.erase(0, end + 2);
              if (event.rfind("data: {", 0) != 0) continue;
              const json j = json::parse(event.substr(6));
              if (j.contains("usage") && j["usage"].is_object()) tokens = j["usage"]["completion_tokens"];
              if (!j["choices"].empty() && j["choices"][0]["finish_reason"].is_null()) {
                const auto now = Clock::now();
                if (ttft < 0) ttft = ms_between(sent, now);
                else itl.push_back(ms_between(last, now));
                last = now;
              }
            }
            return true;
          };
          const auto res = client.send(req);
          std::lock_guard lock(m);
          if (!res || res->status != 200 || tokens == 0) {
            ++r.failed;
            continue;
          }
          ++r.requests;
          r.tokens += tokens;
          r.ttft_ms.push_back(ttft);
          r.itl_ms.insert(r.itl_ms.end(), itl.begin(), itl.end());
        }
      });
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string url = "http://127.0.0.1:8080", clients_list = "1,4,8,16", prompt = "Once upon a time", key, json_out;
  int requests = 4, max_tokens = 64, rounds_wanted = 3;
  po::options_description opts("xfmr-serve-bench: throughput and latency of a running xfmr-serve");
  opts.add_options()("help", "show this help")("url", po::value(&url)->default_value(url), "the server")
      ("clients", po::value(&clients_list)->default_value(clients_list), "concurrent clients, a round each")
      ("requests", po::value(&requests)->default_value(requests), "requests each client sends, one after another")
      ("prompt", po::value(&prompt)->default_value(prompt), "the prompt of every request")
      ("max-tokens", po::value(&max_tokens)->default_value(max_tokens), "tokens each answer decodes")
      ("rounds", po::value(&rounds_wanted)->default_value(rounds_wanted), "times each number of clients runs, in turn")
      ("api-key", po::value(&key), "the server's --api-key")
      ("json", po::value(&json_out), "also write the rounds to this JSON file");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  const auto colon = url.rfind(':');
  if (url.rfind("http://", 0) != 0 || colon < 7) throw std::runtime_error("--url must be http://HOST:PORT");
  const std::string host = url.substr(7, colon - 7);
  const int port = std::stoi(url.substr(colon + 1));
  std::vector<int> counts;
  std::stringstream list(clients_list);
  for (std::string n; std::getline(list, n, ',');) counts.push_back(std::stoi(n));
  run_round(host, port, key, 1, 1, prompt, 8);  // warm-up: the weights read once, the buffers sized
  std::printf("%7s %8s %7s %9s %7s %10s %10s %9s %9s\n", "clients", "requests", "tokens", "tokens/s", "x one",
              "TTFT p50", "TTFT p99", "ITL p50", "ITL p99");
  // Each number of clients once a round, in turn; then the median round's
  // tokens/s, and the latencies of all the rounds pooled.
  std::vector<std::vector<Round>> runs(counts.size());
  for (int round = 0; round < rounds_wanted; ++round)
    for (std::size_t i = 0; i < counts.size(); ++i)
      runs[i].push_back(run_round(host, port, key, counts[i], requests, prompt, max_tokens));
  json rounds = json::array();
  double one = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    Round all;
    std::vector<double> rates;
    for (const Round& r : runs[i]) {
      rates.push_back(double(r.tokens) / r.seconds);
      all.requests += r.requests, all.failed += r.failed, all.tokens += r.tokens;
      all.ttft_ms.insert(all.ttft_ms.end(), r.ttft_ms.begin(), r.ttft_ms.end());
      all.itl_ms.insert(all.itl_ms.end(), r.itl_ms.begin(), r.itl_ms.end());
    }
    const double rate = percentile(rates, 50);
    const int c = counts[i];
    if (c == 1) one = rate;
    std::printf("%7d %8d %7ld %9.1f %7.2f %8.1fms %8.1fms %7.1fms %7.1fms  (rounds:", c, all.requests, all.tokens, rate,
                one > 0 ? rate / one : 0.0, percentile(all.ttft_ms, 50), percentile(all.ttft_ms, 99),
                percentile(all.itl_ms, 50), percentile(all.itl_ms, 99));
    for (double r : rates) std::printf(" %.1f", r);
    std::printf(")%s\n", all.failed ? (" " + std::to_string(all.failed) + " failed").c_str() : "");
    rounds.push_back({{"clients", c},
                      {"requests", all.requests},
                      {"failed", all.failed},
                      {"tokens", all.tokens},
                      {"tokens_per_second", rate},
                      {"tokens_per_second_rounds", rates},
                      {"ttft_ms_p50", percentile(all.ttft_ms, 50)},
                      {"ttft_ms_p99", percentile(all.ttft_ms, 99)},
                      {"itl_ms_p50", percentile(all.itl_ms, 50)},
                      {"itl_ms_p99", percentile(all.itl_ms, 99)}});
  }
  if (!json_out.empty()) {
    std::FILE* f = std::fopen(json_out.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + json_out);
    std::fputs((rounds.dump(1) + "\n").c_str(), f);
    std::fclose(f);
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "xfmr-serve-bench: error: " << e.what() << "\n";
  return 1;
}
