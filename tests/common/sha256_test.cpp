#include <catch2/catch.hpp>

#include <string>

#include "common/sha256.hpp"

using computron::sha256;

namespace {

std::string hex_of(std::string_view text) {
  sha256 h;
  h.update(text);
  return h.finish_hex();
}

}  // namespace

TEST_CASE("sha256 gives the FIPS 180-4 digests", "[common][sha256]") {
  CHECK(hex_of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Two blocks: the padding spills into a second one.
  CHECK(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  CHECK(hex_of(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 is the same however the message is cut", "[common][sha256]") {
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>('a' + i % 26);
  auto whole = hex_of(text);
  for (size_t cut : {0u, 1u, 55u, 56u, 63u, 64u, 65u, 128u, 299u}) {
    sha256 h;
    h.update(std::string_view(text).substr(0, cut));
    h.update(std::string_view(text).substr(cut));
    CHECK(h.finish_hex() == whole);
  }
}
