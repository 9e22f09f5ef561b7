# One endpoint in front of several replicas of a model: HAProxy (Debian's `haproxy` package, with
# `socat` for its admin socket) in a container on one node, and a `router` resource that an apply
# drives through that socket: a change that replaces a replica takes it out first (drain: no new
# requests, those in flight finish within `drain_timeout`), and puts it back once its own probes
# and HAProxy's health check pass, one replica after another. Why HAProxy and not vLLM's or
# SGLang's router: docs/replicas.md.

variable "node" {
  type        = any
  description = "The node the router runs on (node.x); the endpoint is its `listen` address and `port` there."
}

variable "image" {
  type        = string
  description = "An image with HAProxy 2.4 or later and socat (Debian's `haproxy` and `socat` packages)."
}

variable "name" {
  type        = string
  default     = "sparkform-router"
  description = "The router container's Docker name."
}

variable "listen" {
  type        = string
  default     = "0.0.0.0"
  description = "The address the endpoint listens on, on the router's node."
}

variable "address" {
  type        = string
  default     = null
  description = "How clients (and the probes, from the router's node) reach the endpoint's host: the node's address by default."
}

variable "port" {
  type    = number
  default = 8000
  validation {
    condition     = var.port >= 1 && var.port <= 65535 && floor(var.port) == var.port
    error_message = "port must be a whole number from 1 to 65535"
  }
}

variable "replicas" {
  type        = any
  description = "Each replica by its key (HAProxy's server name: letters, digits, `_`, `-`): `{ a = { address = \"HOST:PORT\", members = [container.engine[\"a\"], probe.direct[\"a\"]] } }`, where `address` is the engine as the router's node reaches it and `members` the resources a change replaces (their probes included: a replica is put back only once they pass)."
}

variable "api_key" {
  type        = string
  default     = null
  sensitive   = true
  description = "The key a client sends as `Authorization: Bearer KEY` on /v1, as the engines ask for it: the router refuses a request without it (401) before it reaches a replica. It reaches HAProxy through its environment, never a command line."
}

variable "drain_timeout" {
  type        = string
  default     = "60s"
  description = "How long taking a replica out waits for the requests it is answering."
}

variable "request_timeout" {
  type        = string
  default     = "10m"
  description = "The longest a request may take (a long generation), client and server side."
}

variable "health_path" {
  type        = string
  default     = "/health"
  description = "What HAProxy asks each replica, every second: a replica that fails it twice gets no new requests until it passes again."
}

variable "server_options" {
  type        = string
  default     = "check inter 1s fall 2 rise 1"
  description = "What each replica's HAProxy `server` line says after its address: by default a health check (the backend's `health_path`) each second, out after 2 failures, in after 1 success."
}
