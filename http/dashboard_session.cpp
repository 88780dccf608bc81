#include "http/dashboard_session.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/websocket.hpp>

#include "http/dashboard.h"

namespace paged::server {
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

template <class Stream>
DashboardSession<Stream>::DashboardSession(Stream&& stream, ServerContext& ctx)
    : ws_(std::move(stream)), timer_(ws_.get_executor()), ctx_(ctx) {}

template <class Stream>
void DashboardSession<Stream>::run(http::request<http::string_body> upgrade) {
  beast::get_lowest_layer(ws_).expires_never();
  ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws_.set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(http::field::server, "paged"); }));
  ws_.read_message_max(4096);
  auto req = std::make_shared<http::request<http::string_body>>(std::move(upgrade));
  net::dispatch(ws_.get_executor(), [self = this->shared_from_this(), req] {
    self->ws_.async_accept(*req, [self, req](beast::error_code ec) { self->on_accept(ec); });
  });
}

template <class Stream>
void DashboardSession<Stream>::on_accept(beast::error_code ec) {
  if (ec) return;
  do_read();
  on_tick();
}

template <class Stream>
void DashboardSession<Stream>::do_read() {
  ws_.async_read(buffer_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
    if (ec) {
      self->close();
      return;
    }
    self->buffer_.consume(self->buffer_.size());
    self->do_read();
  });
}

template <class Stream>
void DashboardSession<Stream>::close() {
  closed_ = true;
  timer_.cancel();
}

template <class Stream>
void DashboardSession<Stream>::on_tick() {
  if (closed_) return;
  if (!asking_ && !writing_) {
    asking_ = true;
    std::weak_ptr<DashboardSession> weak = this->weak_from_this();
    auto executor = ws_.get_executor();
    ctx_.engine.kv_snapshot(ctx_.gate->guard<std::vector<ReplicaKv>>([weak, executor](std::vector<ReplicaKv> replicas) {
      net::post(executor, [weak, replicas = std::move(replicas)]() mutable {
        if (auto self = weak.lock()) self->on_snapshot(std::move(replicas));
      });
    }));
  }
  timer_.expires_after(kPushInterval);
  timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
    if (!ec) self->on_tick();
  });
}

template <class Stream>
void DashboardSession<Stream>::on_snapshot(std::vector<ReplicaKv> replicas) {
  asking_ = false;
  if (closed_) return;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  frame_ = dashboard_frame(replicas, dashboard_figures(ctx_.engine.metrics()), now_ms, ++seq_);
  writing_ = true;
  ws_.text(true);
  ws_.async_write(net::buffer(frame_), [self = this->shared_from_this()](beast::error_code ec, size_t) {
    self->writing_ = false;
    if (ec) self->close();
  });
}

template class DashboardSession<PlainStream>;
template class DashboardSession<TlsStream>;

}  // namespace paged::server
