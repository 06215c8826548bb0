// The serve config's server sections: `http` (the HTTP server), the controller's peers
// (`nodes`, the console port, `tls`) and the process itself (`trace_file`,
// `compute_threads`, `chunk_mb`).
#include <chrono>
#include <cstdint>

#include "common/error.hpp"
#include "serve/json_fields.hpp"
#include "serve/sections.hpp"

namespace computron::serve {

namespace fs = std::filesystem;

caf::error read_http(const nlohmann::json& file, const std::string& where, serve_config& c) {
  auto h = file.find("http");
  if (h == file.end()) return {};
  auto hw = where + " http";
  caf::error e;
  if ((e = check_keys(*h, hw,
                      {"host", "port", "threads", "max_body_bytes", "max_batch_rows",
                       "allow_runtime_lora_updating"})))
    return e;
  if ((e = read(*h, "host", hw, c.http.host)) || (e = read(*h, "port", hw, c.http.port)) ||
      (e = read(*h, "threads", hw, c.http.threads)) ||
      (e = read(*h, "max_body_bytes", hw, c.http.max_body_bytes)) ||
      (e = read(*h, "max_batch_rows", hw, c.http.max_batch_rows)) ||
      (e = read(*h, "allow_runtime_lora_updating", hw, c.http.runtime_lora_updates)))
    return e;
  if (c.http.threads < 1 || c.http.threads > 256) return bad(hw, "threads must be from 1 to 256");
  return {};
}

caf::error read_controller(const nlohmann::json& file, const std::string& where,
                           const fs::path& base, serve_config& c) {
  caf::error e;
  if (file.contains("nodes")) {
    std::vector<std::string> list;
    if ((e = read(file, "nodes", where, list))) return e;
    std::string joined;
    for (auto& a : list) joined += (joined.empty() ? "" : ",") + a;
    auto nodes = net::parse_node_list(joined);
    if (!nodes) return bad(where, render(nodes.error()));
    c.cluster.nodes = std::move(*nodes);
  }
  if ((e = read(file, "console_host", where, c.console_host)) ||
      (e = read(file, "console_port", where, c.console_port)))
    return e;
  if (c.console_port > 65535) return bad(where, "console_port must be at most 65535");
  double node_wait_s = 20;
  if ((e = read(file, "node_wait_s", where, node_wait_s))) return e;
  if (!(node_wait_s >= 0 && node_wait_s <= 1e6))
    return bad(where, "node_wait_s must be from 0 to 1000000");
  c.cluster.connect_wait = std::chrono::milliseconds(static_cast<int64_t>(node_wait_s * 1000));
  if (auto t = file.find("tls"); t != file.end()) {
    auto tw = where + " tls";
    if ((e = check_keys(*t, tw, {"certificate", "key", "cafile"}))) return e;
    auto rel = [&](std::string& f) {
      if (!f.empty() && fs::path{f}.is_relative()) f = (base / f).string();
    };
    if ((e = read(*t, "certificate", tw, c.tls.certificate)) ||
        (e = read(*t, "key", tw, c.tls.key)) || (e = read(*t, "cafile", tw, c.tls.cafile)))
      return e;
    rel(c.tls.certificate);
    rel(c.tls.key);
    rel(c.tls.cafile);
  }
  return {};
}

caf::error read_process(const nlohmann::json& file, const std::string& where, serve_config& c) {
  caf::error e;
  double chunk_mb = static_cast<double>(c.runtime.worker.chunk_bytes) / mib;
  if ((e = read(file, "trace_file", where, c.trace_file)) ||
      (e = read(file, "compute_threads", where, c.compute_threads)) ||
      (e = read(file, "chunk_mb", where, chunk_mb)))
    return e;
  if (c.compute_threads < 0 || c.compute_threads > 1024)
    return bad(where, "compute_threads must be from 0 (the default) to 1024");
  if (!(chunk_mb > 0)) return bad(where, "chunk_mb must be positive");
  return mib_to_bytes(chunk_mb, where, "chunk_mb", c.runtime.worker.chunk_bytes);
}

}  // namespace computron::serve
