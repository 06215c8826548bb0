#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

/// The prompt files `computron loadgen` reads (`--dataset-name`, `--dataset-path`), in the
/// two shapes `vllm bench serve` reads them: its custom JSONL (one object a line with a
/// `prompt` string and an optional `output_tokens`) and ShareGPT's JSON (an array of
/// `{conversations: [{from, value}, ...]}`, the first turn the prompt and the second the
/// reply whose length is the output's). Read from local files only; no network.
namespace computron::net {

enum class dataset_kind { random, custom, sharegpt };

/// "random", "custom", "sharegpt".
std::string to_string(dataset_kind k);

/// The kind --dataset-name names; an empty name takes it from the path's extension
/// (.jsonl custom, .json sharegpt). Errors (invalid_request): an unknown name, a file
/// with neither extension and no name, a path with "random" (it reads no file), a file
/// kind without a path.
caf::expected<dataset_kind> dataset_kind_of(const std::string& name, const std::string& path);

struct dataset_prompt {
  std::string text;
  /// Tokens to generate, as the file says (custom's output_tokens); 0: the run's lengths.
  int64_t output_tokens = 0;
  /// ShareGPT's second turn: its token count (the server's /tokenize) is the output length.
  std::optional<std::string> reply;
  /// Where it came from, for errors: "FILE line N" or "FILE entry N".
  std::string source;
};

/// One object a line; blank lines are skipped. Errors (invalid_request) name the source
/// and the line: text that is not JSON or not an object, a missing or non-string `prompt`,
/// an `output_tokens` that is not a whole number of at least 1, no prompts at all.
caf::expected<std::vector<dataset_prompt>> parse_custom_dataset(std::istream& in,
                                                                const std::string& source);

/// A JSON array of conversations. An entry without turns is skipped (ShareGPT's dumps
/// have them); one turn gives a prompt with no reply. Errors (invalid_request) name the
/// source and the entry: not JSON, not an array, an entry that is not an object or whose
/// `conversations` is not a list of objects with a string `value`, no prompts at all.
caf::expected<std::vector<dataset_prompt>> parse_sharegpt_dataset(std::istream& in,
                                                                  const std::string& source);

/// Reads `path` as `kind` (custom or sharegpt). Errors: the file cannot be opened, or the
/// parser's.
caf::expected<std::vector<dataset_prompt>> read_dataset(dataset_kind kind, const std::string& path);

/// The order requests draw prompts in: a shuffle of 0..n-1 seeded by `seed` (as vLLM
/// shuffles its datasets), the same for the same seed.
std::vector<size_t> dataset_order(size_t n, uint64_t seed);

}  // namespace computron::net
