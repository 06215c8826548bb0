#include <catch2/catch.hpp>

#include <caf/sec.hpp>

#include "common/error.hpp"
#include "net/http/replies.hpp"

// The one rule from an error to its HTTP status and Retry-After (net/http/replies.cpp):
// every code pinned, so a changed row is a deliberate change. Retry-After only where the
// same request, sent again after a wait, can succeed.

using namespace computron;
namespace replies = computron::net::replies;
namespace http = boost::beast::http;

TEST_CASE("every error code has its HTTP status, and Retry-After only where waiting helps",
          "[net][replies]") {
  struct row {
    ec code;
    http::status status;
    bool retry;
  };
  const row rows[] = {
      {ec::none, http::status::internal_server_error, false},
      {ec::unspecified, http::status::internal_server_error, false},
      {ec::unknown_model, http::status::not_found, false},
      {ec::not_resident, http::status::service_unavailable, true},
      {ec::out_of_device_memory, http::status::service_unavailable, false},
      {ec::out_of_host_memory, http::status::internal_server_error, false},
      {ec::overloaded, http::status::too_many_requests, true},
      {ec::deadline_exceeded, http::status::service_unavailable, true},
      {ec::device_error, http::status::internal_server_error, false},
      {ec::invalid_request, http::status::bad_request, false},
      {ec::invalid_configuration, http::status::bad_request, false},
      {ec::invalid_state, http::status::conflict, false},
      {ec::io_error, http::status::internal_server_error, false},
      {ec::unavailable, http::status::service_unavailable, true},
      {ec::cancelled, http::status::internal_server_error, false},
  };
  // Every code of the enum is in the table (cancelled is the last one).
  CHECK(std::size(rows) == static_cast<size_t>(ec::cancelled) + 1);
  for (auto& r : rows) {
    INFO(to_string(r.code));
    auto a = replies::answer_of(r.code);
    CHECK(a.status == r.status);
    CHECK(a.retry == r.retry);
    if (r.code == ec::none) continue;  // make_error(ec::none) is no error at all
    // Both reply shapes carry the header exactly where the rule says.
    auto e = make_error(r.code, "why");
    auto kserve = replies::error_response(e);
    auto openai = replies::openai_error_response(e);
    CHECK(kserve.result() == r.status);
    CHECK(openai.result() == r.status);
    CHECK((kserve.find(http::field::retry_after) != kserve.end()) == r.retry);
    CHECK((openai.find(http::field::retry_after) != openai.end()) == r.retry);
  }
}

TEST_CASE("CAF's timeouts and lost receivers may be retried, its other errors may not",
          "[net][replies]") {
  for (auto s : {caf::sec::request_timeout, caf::sec::request_receiver_down}) {
    auto a = replies::answer_of(caf::make_error(s));
    CHECK(a.status == http::status::service_unavailable);
    CHECK(a.retry);
  }
  auto other = replies::answer_of(caf::make_error(caf::sec::unexpected_message));
  CHECK(other.status == http::status::internal_server_error);
  CHECK_FALSE(other.retry);
  // A wrapped error keeps its code, and so its answer.
  auto wrapped = with_context(make_error(ec::out_of_device_memory, "needs 12 MiB"), "model m");
  CHECK_FALSE(replies::answer_of(wrapped).retry);
  CHECK(replies::answer_of(wrapped).status == http::status::service_unavailable);
}
