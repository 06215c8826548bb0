#include "net/http/http_transport.hpp"

#include <chrono>
#include <deque>
#include <optional>
#include <vector>

#include <boost/beast/core.hpp>

#include "common/log.hpp"
#include "net/http/llm_api.hpp"
#include "net/http/routes.hpp"

namespace computron::net::transport {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using replies::make_error_response;

namespace {

class session;

/// A request's hold on its connection from outside the I/O threads (its answer paths):
/// the connection is let go first, then the listener's count of held requests drops, so
/// that a server waiting for that count never frees the I/O context under a socket.
struct held_session {
  held_session(std::shared_ptr<session> session, std::atomic<int64_t>& n)
      : s(std::move(session)), n_(n) {
    ++n_;
  }
  ~held_session() {
    s.reset();
    --n_;
  }
  held_session(const held_session&) = delete;
  held_session& operator=(const held_session&) = delete;
  std::shared_ptr<session> s;

 private:
  std::atomic<int64_t>& n_;
};

/// One connection: reads requests, hands each to the listener's handler, writes the
/// answer (whole or as Server-Sent Events), watches the client while it waits.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, listener& srv) : stream_(std::move(socket)), srv_(srv) {}

  void run() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(srv_.opts.max_body_bytes);
    stream_.expires_after(srv_.opts.idle_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted)
      return close();
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      linger_ = true;
      auto message = "the body exceeds " + std::to_string(srv_.opts.max_body_bytes) + " bytes";
      // The header is read by now: a /v1 route answers in OpenAI's shape, as its every
      // other error does.
      auto target = parser_->get().target();
      if (openai_target(std::string_view{target.data(), target.size()}))
        return write(replies::make_json(http::status::payload_too_large,
                                        openai_error(413, message, "payload_too_large")));
      return write(make_error_response(http::status::payload_too_large, message));
    }
    if (ec) {
      keep_alive_ = false;
      linger_ = true;
      return write(make_error_response(http::status::bad_request,
                                       "malformed HTTP request: " + ec.message()));
    }
    auto req = parser_->release();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    answered_ = false;
    // The connection waits for the answer without a read deadline.
    stream_.expires_never();
    auto h = std::make_shared<held_session>(shared_from_this(), srv_.held);
    auto seq = ++requests_;
    srv_.handle(
        req,
        [h](response res) {
          auto self = h->s;
          asio::post(self->stream_.get_executor(),
                     [self, res = std::move(res)]() mutable { self->write(std::move(res)); });
        },
        [h]() -> std::shared_ptr<sse_channel> {
          auto self = h->s;
          asio::post(self->stream_.get_executor(), [self] { self->start_sse(); });
          return std::make_shared<channel>(h);
        },
        [h, seq](std::function<void()> f) {
          auto self = h->s;
          asio::post(self->stream_.get_executor(),
                     [self, seq, f = std::move(f)]() mutable { self->on_gone(seq, std::move(f)); });
        });
  }

  /// Request `seq`'s gone hook. A hook that comes after its answer was written (or for
  /// an earlier request of this connection) has nothing left to stop.
  void on_gone(uint64_t seq, std::function<void()> f) {
    if (seq != requests_ || answered_) return;
    if (gone_) return f();
    on_gone_ = std::move(f);
    watch();
  }

  /// Reads while an answer is being worked on: end of stream or an error is the client
  /// gone (as nginx's 499: a client that half-closes its side counts as gone). Bytes are
  /// the next request (pipelining): they are kept for read(), and the watch ends.
  void watch() {
    if (watching_ || gone_) return;
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (sse_started_) {
      buffer_.consume(buffer_.size());  // bytes after a streamed request: ignored
      if (sse_ended_ || ec == asio::error::operation_aborted) return;
      if (ec) return client_gone();
      return watch();
    }
    if (after_watch_ != after::nothing) {
      // The answer was written meanwhile, and the watch cancelled to go on.
      auto next = std::exchange(after_watch_, after::nothing);
      if (next == after::read && (!ec || ec == asio::error::operation_aborted)) return read();
      return close();
    }
    if (ec && ec != asio::error::operation_aborted) client_gone();
  }

  void client_gone() {
    if (gone_) return;
    gone_ = true;
    if (sse_started_) return sse_lost();
    if (auto f = std::exchange(on_gone_, nullptr)) f();
  }

  /// The session's side of a streamed response; its calls hop onto the session's strand.
  class channel final : public sse_channel {
   public:
    explicit channel(std::shared_ptr<held_session> h) : h_(std::move(h)), s_(h_->s) {}
    ~channel() override { end(); }
    void send(std::string payload) override {
      auto framed = std::make_shared<std::string>("data: " + std::move(payload) + "\n\n");
      asio::post(s_->stream_.get_executor(), [s = s_, framed] {
        s->sse_out_.push_back(framed);
        s->pump_sse();
      });
    }
    void end() override {
      asio::post(s_->stream_.get_executor(), [s = s_] {
        s->sse_ending_ = true;
        s->pump_sse();
      });
    }

   private:
    // Destroyed after s_: the server's count drops once the channel let go of it.
    std::shared_ptr<held_session> h_;
    std::shared_ptr<session> s_;
  };

  /// Writes the stream's head (200, text/event-stream, chunked), then its events in
  /// order. A read waits meanwhile: the client closing its side is how a disconnect shows.
  void start_sse() {
    keep_alive_ = false;
    auto head = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
    head->set(http::field::server, "computron");
    head->set(http::field::content_type, "text/event-stream");
    head->set(http::field::cache_control, "no-cache");
    head->keep_alive(false);
    head->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    sse_writing_ = true;
    sse_started_ = true;
    http::async_write_header(stream_, *sr,
                             [self = shared_from_this(), head, sr](beast::error_code ec, size_t) {
                               self->sse_writing_ = false;
                               if (ec) return self->sse_lost();
                               self->watch();
                               self->pump_sse();
                             });
  }

  void pump_sse() {
    if (sse_writing_ || sse_gone_ || sse_ended_) return;
    if (!sse_out_.empty()) {
      auto data = sse_out_.front();
      sse_out_.pop_front();
      sse_writing_ = true;
      asio::async_write(stream_, http::make_chunk(asio::buffer(*data)),
                        [self = shared_from_this(), data](beast::error_code ec, size_t) {
                          self->sse_writing_ = false;
                          if (ec) return self->sse_lost();
                          self->pump_sse();
                        });
      return;
    }
    if (!sse_ending_) return;
    sse_ended_ = true;
    sse_writing_ = true;
    asio::async_write(stream_, http::make_chunk_last(),
                      [self = shared_from_this()](beast::error_code, size_t) {
                        self->sse_writing_ = false;
                        self->close();
                      });
  }

  void sse_lost() {
    if (sse_gone_ || sse_ended_) return;
    sse_gone_ = true;
    sse_out_.clear();
    if (auto f = std::exchange(on_gone_, nullptr)) f();
    close();
  }

  void write(response res) {
    answered_ = true;
    on_gone_ = nullptr;
    res.version(version_);
    res.keep_alive(keep_alive_);
    res.set(http::field::server, "computron");
    res.prepare_payload();
    auto sp = std::make_shared<response>(std::move(res));
    http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      if (!ec && self->linger_) {
        self->close();
        self->linger_since_ = std::chrono::steady_clock::now();
        return self->drain();
      }
      bool next = !ec && !sp->need_eof();
      if (self->watching_) {
        // The watch's read must end before the next one starts: cancel it and go on from
        // its handler (the only operation left on the socket is that read).
        self->after_watch_ = next ? after::read : after::close;
        beast::error_code ignored;
        self->stream_.socket().cancel(ignored);
        return;
      }
      if (!next) return self->close();
      self->read();
    });
  }

  /// A lingering close, as nginx does after refusing a request early: the client may
  /// still be sending the body we refused, and closing with unread bytes makes the
  /// kernel reset the connection, which can discard our reply before the client reads
  /// it. So the write side is shut and what arrives is read and dropped until the client
  /// closes, for at most 30 s and 1 GiB; then the session ends and the socket closes.
  void drain() {
    constexpr uint64_t max_bytes = 1ull << 30;
    auto elapsed = std::chrono::steady_clock::now() - linger_since_;
    if (drained_ > max_bytes || elapsed > std::chrono::seconds(30)) return;
    if (drain_buf_.empty()) drain_buf_.resize(64 * 1024);
    stream_.expires_after(std::chrono::seconds(5));
    stream_.async_read_some(asio::buffer(drain_buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (!ec) self->drain();
                            });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  listener& srv_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  // A lingering close after an early refusal (413, malformed request).
  bool linger_ = false;
  std::chrono::steady_clock::time_point linger_since_{};
  uint64_t drained_ = 0;
  std::vector<char> drain_buf_;
  // A streamed response (Server-Sent Events), touched only on the strand.
  std::deque<std::shared_ptr<std::string>> sse_out_;
  bool sse_writing_ = false;
  bool sse_ending_ = false;
  bool sse_ended_ = false;
  bool sse_gone_ = false;
  bool sse_started_ = false;
  // The client's side while an answer is worked on (watch()).
  uint64_t requests_ = 0;
  bool answered_ = false;
  bool watching_ = false;
  bool gone_ = false;
  std::function<void()> on_gone_;
  enum class after { nothing, read, close } after_watch_ = after::nothing;
};

}  // namespace

void accept(listener& srv) {
  srv.acceptor.async_accept(asio::make_strand(srv.ioc),
                            [&srv](beast::error_code ec, tcp::socket socket) {
                              if (ec) {
                                if (srv.stopped) return;
                                log::warn("http: accept failed: {}", ec.message());
                              } else {
                                std::make_shared<session>(std::move(socket), srv)->run();
                              }
                              accept(srv);
                            });
}

guarded_answer guard_answer(const request& req, responder reply, sse_opener open_sse,
                            std::function<void(int status)> answered) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto log_it = [t0 = std::chrono::steady_clock::now(), method = std::string{req.method_string()},
                 target = std::string{req.target()},
                 answered = std::move(answered)](int status, bool stream) {
    auto ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log::info("http {} {} {}{} {:.1f} ms", method, target, status, stream ? " stream" : "", ms);
    if (answered) answered(status);
  };
  guarded_answer g;
  g.done = done;
  g.reply = [reply = std::move(reply), done, log_it](response r) {
    if (done->exchange(true)) return;
    log_it(static_cast<int>(r.result_int()), false);
    reply(std::move(r));
  };
  g.open_sse = [open_sse = std::move(open_sse), done, log_it] {
    if (!done->exchange(true)) log_it(200, true);
    return open_sse();
  };
  return g;
}

}  // namespace computron::net::transport
