#pragma once

// The HTTP server's replies (internal to net/): errors as KServe and OpenAI bodies with
// their status codes, model metadata and Triton's states, the merged status. Pure
// functions of what the actors answered; the server's routes (net/http/http_server.cpp,
// inference_routes.cpp), its transport's own refusals (http_transport.cpp), the text
// routes' tokenizer replies (text_models.cpp) and the generation actor (generation.cpp)
// use them.
#include <functional>
#include <string>
#include <utility>

#include <boost/beast/http.hpp>
#include <caf/error.hpp>
#include <caf/sec.hpp>
#include <caf/settings.hpp>
#include <nlohmann/json.hpp>

#include "actors/messages.hpp"
#include "common/error_code.hpp"
#include "net/http/llm_api.hpp"

namespace computron::net::replies {

using json = nlohmann::json;
using response = boost::beast::http::response<boost::beast::http::string_body>;
/// Hands a response back to the connection (from any thread).
using responder = std::function<void(response)>;

response make_json(boost::beast::http::status status, const json& body);
response make_error_response(boost::beast::http::status status, const std::string& message);
/// How an error is answered over HTTP.
struct error_answer {
  boost::beast::http::status status;
  /// Whether Retry-After is sent: only where the same request, sent again after a
  /// wait, can succeed without anyone acting on the server.
  bool retry;
};
/// The one rule (a table in replies.cpp, a row per code, each saying why) that every
/// error reply of the server follows: its status, and Retry-After or not.
error_answer answer_of(ec code);
/// answer_of for our errors; CAF's request timeouts and lost receivers are a 503 with
/// Retry-After, its other errors a 500 without.
error_answer answer_of(const caf::error& e);
response error_response(const caf::error& e);
/// The error's name as OpenAI's `code` ("model_not_found" as OpenAI calls it).
std::string code_of(const caf::error& e);
/// An error in OpenAI's shape, with the same HTTP status as the KServe routes.
response openai_error_response(const caf::error& e, const std::string& param = {});
response openai_bad_request(const request_error& e);
json info_json(const actors::model_info& i);
/// Triton's model state (READY, LOADING, UNLOADING, UNAVAILABLE) and its reason, from
/// ours. A registered model is READY whether or not it is resident: it is swapped in on
/// demand.
std::pair<std::string, std::string> triton_state(const actors::model_info& i);
/// Why a model the index lists cannot serve, as the error its requests get (none when
/// it is READY).
caf::error serving_error(const actors::model_info& i);
/// The merged status (every actor's report) plus a per-node summary an operator reads
/// first: which nodes answer, their devices' memory and link, what is resident.
json status_json(const caf::settings& s);

}  // namespace computron::net::replies
