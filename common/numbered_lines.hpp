#pragma once

#include <cstddef>
#include <istream>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <caf/error.hpp>

#include "common/error.hpp"

namespace computron {

/// A text file's lines, read one at a time with their numbers, so that every line-based
/// reader (traces, length CSVs, JSONL datasets) names a bad line the same way:
/// "SOURCE line N: why".
class numbered_lines {
 public:
  numbered_lines(std::istream& in, std::string source) : in_(in), source_(std::move(source)) {}

  /// Reads the next line into line(); false at the end of the text.
  bool next() {
    if (!std::getline(in_, line_)) return false;
    ++number_;
    return true;
  }

  const std::string& line() const { return line_; }
  size_t number() const { return number_; }

  /// "SOURCE line N" for the current line.
  std::string where() const { return fmt::format("{} line {}", source_, number_); }

  /// invalid_request: "SOURCE line N: why".
  caf::error fail(const std::string& why) const {
    return make_error(ec::invalid_request, where() + ": " + why);
  }

  /// io_error when reading stopped on an error rather than at the end, else none.
  caf::error read_error() const {
    if (in_.bad()) return make_error(ec::io_error, "cannot read " + source_);
    return {};
  }

 private:
  std::istream& in_;
  std::string source_;
  std::string line_;
  size_t number_ = 0;
};

}  // namespace computron
