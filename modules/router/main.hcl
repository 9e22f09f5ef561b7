locals {
  keys = keys(var.replicas)
  # `$${…}` is HAProxy's own environment expansion, read when it starts (the key is never in
  # the file). A request that fails to connect, or whose replica died before answering, is
  # sent again to another replica (`retry-on`, `redispatch`): HAProxy keeps a request's body
  # for that (`http-buffer-request`). A streamed answer already under way cannot be retried.
  auth = var.api_key == null ? "" : "  http-request return status 401 content-type application/json string '{\"error\":\"Unauthorized\"}' if { path_beg /v1 } !{ req.hdr(authorization) -m str \"Bearer $${SPARKFORM_API_KEY}\" }\n"
  config = join("", [
    "global\n",
    "  stats socket /run/haproxy/admin.sock mode 600 level admin\n",
    "  log stdout format raw local0 info\n",
    "defaults\n",
    "  mode http\n",
    "  log global\n",
    "  option httplog\n",
    "  option http-buffer-request\n",
    "  timeout connect 2s\n",
    "  timeout client ${var.request_timeout}\n",
    "  timeout server ${var.request_timeout}\n",
    "  retries 3\n",
    "  option redispatch 1\n",
    "  retry-on conn-failure empty-response\n",
    "frontend api\n",
    "  bind ${var.listen}:${var.port}\n",
    local.auth,
    "  default_backend engines\n",
    "backend engines\n",
    "  balance leastconn\n",
    "  option httpchk GET ${var.health_path}\n",
    "  http-check expect status 200\n",
    # No server here: the router resource puts each replica in through the admin socket
    # (and writes them to servers.cfg, appended below when HAProxy starts again in this
    # container), so that a replica added or removed restarts nothing.
  ])
}

check "replicas_present" {
  condition     = length(local.keys) > 0
  error_message = "a router needs at least one replica in `replicas`"
}

container "haproxy" {
  node         = var.node
  name         = var.name
  image        = var.image
  network_mode = "host"
  env = merge(
    { HAPROXY_CONFIG = local.config },
    var.api_key == null ? {} : { SPARKFORM_API_KEY = var.api_key },
  )
  # The configuration arrives in the environment and is written where the admin socket lives,
  # the servers the router resource last put in after it (the backend is its last section);
  # HAProxy runs in the foreground as the container's process.
  entrypoint = ["/bin/sh", "-c"]
  command    = ["mkdir -p /run/haproxy && cd /run/haproxy && printf '%s' \"$HAPROXY_CONFIG\" > haproxy.cfg && { [ ! -f servers.cfg ] || cat servers.cfg >> haproxy.cfg; } && exec haproxy -db -f haproxy.cfg"]
  restart    = "no"
  ready {
    tcp      = "${var.listen == "0.0.0.0" ? "127.0.0.1" : var.listen}:${var.port}"
    timeout  = "30s"
    interval = "1s"
    fail_on_log = {
      "Starting frontend .*: cannot bind socket" = "the router's port is taken on its node: choose another `port`, or stop what holds it"
      "\\[ALERT\\]"                              = "HAProxy refused its configuration: the line above says which"
    }
  }
}

router "endpoint" {
  container      = container.haproxy
  drain_timeout  = var.drain_timeout
  server_options = var.server_options
  port           = var.port
  replicas       = { for k in local.keys : k => { address = var.replicas[k].address, members = var.replicas[k].members } }
}
