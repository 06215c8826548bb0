#include "net/http/http_server_impl.hpp"

// The inference routes (KServe infer, OpenAI completions and chat, Triton generate) and
// the tokenizer routes: each reads its body strictly, then asks the frontend.
namespace computron::net {

void http_server::impl::infer(const std::string& model, const std::string& body, responder reply,
                              gone_hook on_gone) {
  auto body_json = parse_json_body(body);
  if (auto e = std::get_if<request_error>(&body_json))
    return reply(make_error_response(http::status::bad_request, "invalid_request: " + e->message));
  auto& j = std::get<json>(body_json);
  auto p = parse_infer_body(j, opts.max_batch_rows, max_tokens_cap());
  if (auto e = std::get_if<request_error>(&p))
    return reply(make_error_response(http::status::bad_request, "invalid_request: " + e->message));
  auto fe = frontend;
  auto timeout = caf::timespan{opts.request_timeout};
  auto parsed = std::make_shared<infer_body>(std::move(std::get<infer_body>(p)));
  auto asker = sys.spawn([=](caf::event_based_actor* self) {
    auto rows = parsed->rows.size();
    auto j = actors::make_join<actors::infer_reply>(
        rows,
        [=](std::vector<actors::infer_reply> rs) {
          json data = json::array();
          double queue_ms = 0, load_ms = 0, compute_ms = 0, total_ms = 0;
          bool swapped = false;
          uint32_t batch = 0;
          for (auto& r : rs) {
            for (auto t : r.tokens) data.push_back(t);
            queue_ms = std::max(queue_ms, r.queue_ms);
            load_ms = std::max(load_ms, r.load_ms);
            compute_ms = std::max(compute_ms, r.compute_ms);
            total_ms = std::max(total_ms, r.total_ms);
            swapped = swapped || r.swapped;
            batch = std::max(batch, r.batch_size);
          }
          json out{{"model_name", model},
                   {"outputs", json::array({json{{"name", "output_ids"},
                                                 {"datatype", "INT64"},
                                                 {"shape", {rows, parsed->max_tokens}},
                                                 {"data", data}}})},
                   {"parameters",
                    {{"queue_ms", queue_ms},
                     {"load_ms", load_ms},
                     {"compute_ms", compute_ms},
                     {"total_ms", total_ms},
                     {"batch_size", batch},
                     {"swapped", swapped}}}};
          if (!parsed->request_id.empty()) out["id"] = parsed->request_id;
          reply(make_json(http::status::ok, out));
          self->quit();
        },
        [=](caf::error e, size_t) {
          explain(model, std::move(e), [reply](caf::error x) { reply(error_response(x)); });
          self->quit();
        });
    for (size_t r = 0; r < rows; ++r) {
      actors::infer_request req;
      req.model = model;
      req.tokens = parsed->rows[r];
      req.max_tokens = parsed->max_tokens;
      req.sampling = parsed->sampling;
      req.sampling.seed = parsed->sampling.seed + r;
      req.deadline_ms = parsed->deadline_ms;
      req.drop_late = parsed->drop_late;
      self->request(fe, timeout, actors::infer_atom_v, std::move(req))
          .then([=](actors::infer_reply& rep) { j->ok(r, std::move(rep)); },
                [=](caf::error& e) { j->failed(std::move(e), r); });
    }
  });
  on_gone(exit_on_gone(asker));
}

void http_server::impl::text_request(text_api api, const std::string& model,
                                     const std::string& body, bool stream, responder reply,
                                     sse_opener open_sse, gone_hook on_gone) {
  auto bad = [&](const request_error& e) {
    reply(api != text_api::triton
              ? openai_bad_request(e)
              : make_error_response(http::status::bad_request, "invalid_request: " + e.message));
  };
  auto body_json = parse_json_body(body);
  if (auto e = std::get_if<request_error>(&body_json)) return bad(*e);
  auto& j = std::get<json>(body_json);
  auto parsed = api == text_api::openai ? parse_completion(j, opts.max_batch_rows, max_tokens_cap())
                : api == text_api::chat ? parse_chat(j, opts.max_batch_rows, max_tokens_cap())
                                        : parse_generate(j, model, stream, max_tokens_cap());
  if (auto e = std::get_if<request_error>(&parsed)) return bad(*e);
  auto g = std::make_shared<generation_request>(std::move(std::get<generation_request>(parsed)));
  auto fe = frontend;
  auto timeout = caf::timespan{opts.request_timeout};
  auto limit = max_tokens_cap();
  auto fail = [api, reply](const caf::error& e) {
    reply(api == text_api::triton ? error_response(e) : openai_error_response(e));
  };
  // The model as registered (the swap scheduler is not asked): one that failed or is
  // registering answers with the reason before its tokenizer is looked at; one the
  // scheduler cannot serve now is refused by the generation request, with its reason.
  info_of(
      g->model,
      [=](actors::model_info& info) {
        if (auto why = serving_error(info)) return fail(why);
        auto text = texts.for_request(info, api, *g);
        if (!text) return fail(text.error());
        auto st = std::make_shared<gen_state>();
        st->g = std::move(*g);
        st->api = api;
        st->tok = (*text)->tok;
        st->vocab = info.vocab;
        st->reply = reply;
        st->open_sse = open_sse;
        st->created = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
        st->completion_id =
            !st->g.request_id.empty()
                ? st->g.request_id
                : fresh_completion_id(api == text_api::chat ? "chatcmpl-" : "cmpl-");
        if (!st->g.ignored.empty())
          log::debug("{} request for {}: ignored {}", api == text_api::chat ? "chat" : "completion",
                     st->g.model, fmt::join(st->g.ignored, ", "));
        if (auto err = prepare_rows(*st, **text, info, limit)) return fail(err);
        on_gone(exit_on_gone(sys.spawn(generation, st, fe, timeout)));
      },
      [=](const caf::error& e) { fail(e); }, lookup::as_registered);
}

template <class OnOk, class OnErr>
void http_server::impl::with_text(const std::string& model, OnOk ok, OnErr fail) {
  info_of(
      model,
      [=](actors::model_info& info) {
        if (auto why = serving_error(info)) return fail(why);
        auto text = texts.of(info);
        if (!text) return fail(text.error());
        ok(info, **text);
      },
      [=](const caf::error& e) { fail(e); }, lookup::as_registered);
}

void http_server::impl::tokenize(const std::string& body, bool forward, responder reply) {
  auto fail = [reply](const caf::error& e) { reply(openai_error_response(e)); };
  auto body_json = parse_json_body(body);
  if (auto e = std::get_if<request_error>(&body_json)) return reply(openai_bad_request(*e));
  auto& j = std::get<json>(body_json);
  if (!forward) {
    auto d = parse_detokenize(j);
    if (auto e = std::get_if<request_error>(&d)) return reply(openai_bad_request(*e));
    auto req = std::get<detokenize_body>(d);
    return with_text(
        req.model,
        [=](const actors::model_info& info, const model_text& text) {
          reply(detokenize_reply(req, info, text));
        },
        fail);
  }
  auto t = parse_tokenize(j);
  if (auto e = std::get_if<request_error>(&t)) return reply(openai_bad_request(*e));
  auto req = std::get<tokenize_body>(t);
  with_text(
      req.g.model,
      [=](const actors::model_info& info, const model_text& text) {
        reply(tokenize_reply(req, info, text));
      },
      fail);
}

}  // namespace computron::net
