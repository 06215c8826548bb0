#include "net/client/open_loop.hpp"

#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/error.hpp"

namespace computron::net {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;

constexpr size_t max_kept_body = 64 * 1024;

struct connection {
  explicit connection(asio::io_context& ioc) : stream(ioc) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> req;
  std::optional<http::response_parser<http::string_body>> parser;
  /// Served a request before: a failure before any answer may be the server's idle
  /// close, worth one retry on a fresh connection.
  bool reused = false;
};

using conn_ptr = std::shared_ptr<connection>;

/// All state lives on the one I/O thread; handlers never run concurrently.
class runner {
 public:
  runner(const std::vector<timed_request>& reqs, const open_loop_options& o, tcp::endpoint ep)
      : reqs_(reqs), opts_(o), endpoint_(ep), due_timer_(ioc_), progress_timer_(ioc_) {
    results_.resize(reqs.size());
    order_.resize(reqs.size());
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return reqs_[a].at_s < reqs_[b].at_s; });
  }

  std::vector<timed_result> run() {
    t0_ = clock::now();
    if (reqs_.empty()) return {};
    arm_due();
    arm_progress();
    ioc_.run();
    report(true);
    return std::move(results_);
  }

 private:
  double now_s() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }

  void arm_due() {
    if (next_ >= order_.size() || cancelled_) return;
    auto at = t0_ + std::chrono::duration_cast<clock::duration>(
                        std::chrono::duration<double>(reqs_[order_[next_]].at_s));
    due_timer_.expires_at(at);
    due_timer_.async_wait([this](beast::error_code ec) {
      if (ec || cancelled_) return;
      auto now = now_s();
      while (next_ < order_.size() && reqs_[order_[next_]].at_s <= now) dispatch(order_[next_++]);
      arm_due();
    });
  }

  void arm_progress() {
    progress_timer_.expires_after(opts_.progress_interval);
    progress_timer_.async_wait([this](beast::error_code ec) {
      if (ec) return;
      if (opts_.cancel && opts_.cancel->load()) {
        cancel_all();
        return;
      }
      report();
      if (!finished()) arm_progress();
    });
  }

  bool finished() const { return done_ == reqs_.size() || (cancelled_ && in_flight() == 0); }

  size_t in_flight() const { return sent_ - done_; }

  void report(bool final = false) {
    if (!opts_.on_progress) return;
    opts_.on_progress({reqs_.size(), sent_, done_, failed_, live_, now_s(), final});
  }

  /// A request is due: a free connection sends it, else a new one if the cap allows,
  /// else it waits for the first connection to come free.
  void dispatch(size_t i) {
    if (!idle_.empty()) {
      auto c = idle_.back();
      idle_.pop_back();
      send(c, i);
    } else if (live_ < opts_.max_connections) {
      open_and_send(i);
    } else {
      waiting_.push_back(i);
    }
  }

  /// A new connection for request i; `retry` marks the second try after an idle close.
  void open_and_send(size_t i, bool retry = false) {
    ++live_;
    auto c = std::make_shared<connection>(ioc_);
    c->stream.expires_after(opts_.connect_timeout);
    c->stream.async_connect(endpoint_, [this, c, i, retry](beast::error_code ec) {
      if (cancelled_) return;
      if (ec) {
        --live_;
        mark_sent(i);
        fail(i, "connect: " + ec.message());
        next_waiting();
        return;
      }
      send(c, i, retry);
    });
  }

  void mark_sent(size_t i) {
    if (results_[i].sent_s < 0) {
      results_[i].sent_s = now_s();
      ++sent_;
    }
  }

  void send(const conn_ptr& c, size_t i, bool retry = false) {
    mark_sent(i);
    auto& r = reqs_[i];
    c->req = {http::string_to_verb(r.method), r.target, 11};
    c->req.set(http::field::host, opts_.host);
    c->req.keep_alive(true);
    if (!r.body.empty()) c->req.set(http::field::content_type, "application/json");
    c->req.body() = r.body;
    c->req.prepare_payload();
    c->parser.emplace();
    c->parser->body_limit(64ull << 20);
    c->stream.expires_after(opts_.request_timeout);
    in_use_.push_back(c);
    http::async_write(c->stream, c->req, [this, c, i, retry](beast::error_code ec, size_t) {
      if (cancelled_) return;
      if (ec) return broken(c, i, "write: " + ec.message(), retry);
      if (reqs_[i].stream) return read_stream(c, i, retry);
      http::async_read(c->stream, c->buffer, *c->parser,
                       [this, c, i, retry](beast::error_code ec, size_t) {
                         if (cancelled_) return;
                         if (ec) return broken(c, i, read_error(ec), retry);
                         answered(c, i);
                       });
    });
  }

  static std::string read_error(beast::error_code ec) {
    return ec == beast::error::timeout ? std::string{"timeout"} : "read: " + ec.message();
  }

  /// A streamed answer, read piece by piece so that each event is timed when it arrives.
  void read_stream(const conn_ptr& c, size_t i, bool retry) {
    http::async_read_some(c->stream, c->buffer, *c->parser,
                          [this, c, i, retry](beast::error_code ec, size_t) {
                            if (cancelled_) return;
                            if (ec) return broken(c, i, read_error(ec), retry);
                            if (c->parser->is_header_done()) take_events(c, i);
                            if (c->parser->is_done()) return answered(c, i);
                            read_stream(c, i, retry);
                          });
  }

  /// Hands the complete events of a 200 event stream to on_event and drops them from the
  /// body (the parser appends at the body's end, so a consumed prefix may go). Other
  /// answers (an error's JSON) are kept whole.
  void take_events(const conn_ptr& c, size_t i) {
    auto& res = c->parser->get();
    if (res.result_int() != 200) return;
    auto type = res.find(http::field::content_type);
    if (type == res.end() || type->value().find("text/event-stream") == std::string::npos) return;
    auto& body = res.body();
    const double at = now_s();
    size_t begin = 0;
    for (auto end = body.find("\n\n"); end != std::string::npos; end = body.find("\n\n", begin)) {
      std::string_view event{body.data() + begin, end - begin};
      begin = end + 2;
      // An event's lines; only data lines carry anything here (one per event from us).
      while (!event.empty()) {
        auto nl = event.find('\n');
        auto line = event.substr(0, nl);
        event = nl == std::string_view::npos ? std::string_view{} : event.substr(nl + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.substr(0, 5) != "data:") continue;
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (opts_.on_event) opts_.on_event(i, at, line);
      }
    }
    body.erase(0, begin);
  }

  void forget(const conn_ptr& c) {
    in_use_.erase(std::remove(in_use_.begin(), in_use_.end(), c), in_use_.end());
  }

  void answered(const conn_ptr& c, size_t i) {
    forget(c);
    auto& res = c->parser->get();
    auto& out = results_[i];
    out.done_s = now_s();
    out.status = static_cast<int>(res.result_int());
    out.body = res.body().substr(0, max_kept_body);
    ++done_;
    if (out.status != 200) ++failed_;
    c->reused = true;
    if (res.keep_alive()) {
      release(c);
    } else {
      beast::error_code ignored;
      c->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      --live_;
      next_waiting();
    }
    if (finished()) stop();
  }

  /// The connection failed under request i.
  void broken(const conn_ptr& c, size_t i, const std::string& why, bool retried) {
    forget(c);
    const bool idle_close = why.find("end of stream") != std::string::npos ||
                            why.find("reset by peer") != std::string::npos ||
                            why.find("Broken pipe") != std::string::npos;
    beast::error_code ignored;
    c->stream.socket().close(ignored);
    --live_;
    // Never once an answer began: a streamed request may have delivered events already.
    const bool began = c->parser && c->parser->is_header_done();
    if (c->reused && idle_close && !retried && !began) {
      // The server closed a kept-alive connection while it sat idle: once more, fresh.
      open_and_send(i, true);
      return;
    }
    fail(i, why);
    next_waiting();
  }

  void fail(size_t i, const std::string& why) {
    auto& out = results_[i];
    out.done_s = now_s();
    out.status = 0;
    out.error = why;
    out.body = why;
    ++done_;
    ++failed_;
    if (finished()) stop();
  }

  void release(const conn_ptr& c) {
    if (!waiting_.empty()) {
      auto i = waiting_.front();
      waiting_.pop_front();
      send(c, i);
      return;
    }
    idle_.push_back(c);
  }

  /// A connection went away: a waiting request may open its replacement.
  void next_waiting() {
    while (!waiting_.empty() && live_ < opts_.max_connections && !cancelled_) {
      auto i = waiting_.front();
      waiting_.pop_front();
      open_and_send(i);
    }
  }

  void cancel_all() {
    cancelled_ = true;
    for (auto& c : in_use_) {
      beast::error_code ignored;
      c->stream.socket().close(ignored);
    }
    for (size_t i = 0; i < results_.size(); ++i)
      if (results_[i].sent_s >= 0 && results_[i].done_s < 0) fail(i, "cancelled");
    stop();
  }

  void stop() {
    due_timer_.cancel();
    progress_timer_.cancel();
    for (auto& c : idle_) {
      beast::error_code ignored;
      c->stream.socket().close(ignored);
    }
    ioc_.stop();
  }

  const std::vector<timed_request>& reqs_;
  const open_loop_options& opts_;
  tcp::endpoint endpoint_;
  asio::io_context ioc_;
  asio::steady_timer due_timer_;
  asio::steady_timer progress_timer_;
  clock::time_point t0_;
  std::vector<timed_result> results_;
  std::vector<size_t> order_;
  size_t next_ = 0;
  std::vector<conn_ptr> idle_;
  std::vector<conn_ptr> in_use_;
  std::deque<size_t> waiting_;
  size_t live_ = 0;
  size_t sent_ = 0;
  size_t done_ = 0;
  size_t failed_ = 0;
  bool cancelled_ = false;
};

}  // namespace

caf::expected<std::vector<timed_result>> run_open_loop(const std::vector<timed_request>& requests,
                                                       const open_loop_options& opts) {
  if (opts.max_connections == 0)
    return make_error(ec::invalid_request, "max_connections must be at least 1");
  asio::io_context resolver_ctx;
  tcp::resolver resolver{resolver_ctx};
  beast::error_code ec;
  auto found = resolver.resolve(opts.host, std::to_string(opts.port), ec);
  if (ec || found.empty())
    return make_error(ec::invalid_request, "cannot resolve host '" + opts.host + "'" +
                                               (ec ? ": " + ec.message() : std::string{}));
  runner r{requests, opts, found.begin()->endpoint()};
  return r.run();
}

}  // namespace computron::net
