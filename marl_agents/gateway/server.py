"""The gateway's HTTP server: an OpenAI-compatible endpoint for the episodes of this process.

Standard library only (``http.server.ThreadingHTTPServer``, HTTP/1.1 with keep-alive; every
response has a ``Content-Length``, streamed replies too). Routes:

* ``POST /v1/chat/completions`` (``stream`` too), ``POST /v1/completions``,
  ``GET /v1/models`` (the episode's model names);
* the same under ``/e/<key>/v1/...``: the episode's key in the base URL instead of the
  ``Authorization: Bearer <key>`` header (the path's key wins).

**Safe by default.** :func:`gateway` starts one server per process, lazily, on the loopback
address ``127.0.0.1`` and a free port: only processes on this machine can reach it. Each
episode has its own unguessable key, valid while the episode runs; a request without a valid
key is a 401. Request bodies are bounded (``max_body_bytes``, a 413 before the body is read),
so is their JSON nesting (a 400 ``json_too_deep`` before decoding) and so are prompts (the
agent's ``max_prompt_tokens``, a 400 ``context_length_exceeded``; a prompt too long in
characters to fit is refused, or cut, before it is tokenised:
:mod:`marl_agents.gateway.prompt_bound`): no request can make the process allocate more, or
hold the others for long. Each connection is served on its own thread
(``ThreadingHTTPServer``); a served run renders one request at a time, and a request waiting
for its decision holds nobody (:mod:`marl_agents.gateway.standalone`). A request names only
a model, looked up in its episode's agents' names — never a file, a module or a model path.

**Binding elsewhere** is explicit: ``gateway(host="0.0.0.0")`` (or an ``AppScenario`` with
``host=``) listens on every interface. That exposes every running episode's agents to anyone
who can reach the port *and* holds that episode's key; the traffic is plain HTTP (keys and
prompts unencrypted): use it only on a trusted network, e.g. apps in containers on this host.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from marl_agents.gateway.episodes import Registry
from marl_agents.gateway.protocol import (
    GatewayError,
    chat_response,
    models_list,
    parse_chat,
    parse_completion,
    parse_json,
    stream_events,
)

log = logging.getLogger("marl.gateway")

LOOPBACK = "127.0.0.1"
#: the largest request body read (bytes); larger ones are refused with 413
MAX_BODY_BYTES = 4 * 1024 * 1024
#: an oversized body up to this size is read and dropped before the 413 (beyond: closed)
_DRAIN_LIMIT = 64 * 1024 * 1024

_ROUTES = {
    ("POST", "/v1/chat/completions"): "chat",
    ("POST", "/v1/completions"): "completion",
    ("GET", "/v1/models"): "models",
}


class Gateway:
    """An OpenAI-compatible endpoint serving the episodes in :attr:`registry`.

    Args:
        host: the address to listen on (default: loopback only; see the module docstring for
            what another address exposes).
        port: the port (0: a free one).
        max_body_bytes: the largest request body accepted.
        registry: what it serves, by key (default: a new, empty one for episodes).
    """

    def __init__(
        self,
        host: str = LOOPBACK,
        port: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        registry: Registry | None = None,
    ) -> None:
        self.host = host
        self.registry = registry if registry is not None else Registry()
        self.max_body_bytes = int(max_body_bytes)
        self._server = _Server((host, int(port)), _Handler)
        self._server.gateway = self
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="marl-gateway", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The server's root URL as local clients reach it."""
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            host = LOOPBACK
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``…/v1``): give it with an episode's key."""
        return f"{self.url}/v1"

    def stop(self) -> None:
        """Stop serving and close the socket (requests in flight finish on their threads)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # the listen backlog: socketserver's default of 5 resets connections when dozens of
    # requests open at once (apps in flight, a client's pool filling up)
    request_queue_size = 1024
    gateway: Gateway

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        if ":" in address[0]:
            import socket

            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (an app killed when its episode ended: cut off,
        timed out, aborted) is routine: logged at debug level, not a traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("gateway client %s went away: %r", client_address, exc)
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small responses: no 40 ms Nagle / delayed-ACK stalls
    server: _Server
    server_version = "marl-gateway"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        gw = self.server.gateway
        try:
            raw = self._body(gw.max_body_bytes) if method == "POST" else b""
            route, key = self._route(method)
            episode = gw.registry.get(key)
            if route == "models":
                self._send(200, models_list(sorted(episode.models)))
                return
            body = parse_json(raw)
            request = parse_chat(body) if route == "chat" else parse_completion(body)
            reply = episode.ask(request)
            if request.stream:
                self._send_raw(200, stream_events(request, reply), "text/event-stream")
            else:
                self._send(200, chat_response(request, reply))
        except GatewayError as exc:
            self._send(exc.status, exc.body())
        except ConnectionError:  # the client went away: nobody to answer (handle_error)
            raise
        except Exception as exc:  # a bug here: answer 500 rather than drop the connection
            log.exception("gateway request failed")
            self._send(500, GatewayError(f"internal error: {exc}", 500, "server_error").body())

    def _body(self, limit: int) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.close_connection = True
            raise GatewayError("send the request body with a Content-Length", 411)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise GatewayError("Content-Length is not a number", 400) from None
        if length > limit:
            self._discard(length)
            raise GatewayError(
                f"the request body has {length} bytes, over the gateway's limit of {limit}",
                413,
                "invalid_request_error",
                None,
                "request_too_large",
            )
        return self.rfile.read(length) if length > 0 else b""

    def _discard(self, length: int) -> None:
        """Read and drop an oversized body in small pieces (so the client reads the 413), or
        close the connection if it is huge."""
        if length > _DRAIN_LIMIT:
            self.close_connection = True
            return
        while length > 0:
            got = self.rfile.read(min(length, 1 << 16))
            if not got:
                break
            length -= len(got)

    def _route(self, method: str) -> tuple[str, str | None]:
        path = self.path.split("?", 1)[0].rstrip("/")
        key = None
        if path.startswith("/e/"):
            key, _, rest = path[len("/e/") :].partition("/")
            path = "/" + rest
        if key is None:
            auth = self.headers.get("Authorization", "")
            scheme, _, token = auth.partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else None
        route = _ROUTES.get((method, path))
        if route is None:
            raise GatewayError(
                f"no route {method} {path}: the gateway serves POST /v1/chat/completions, "
                "POST /v1/completions and GET /v1/models",
                404,
                "invalid_request_error",
                None,
                "not_found",
            )
        return route, key

    def _send(self, status: int, body: dict[str, Any]) -> None:
        self._send_raw(status, json.dumps(body).encode("utf-8"), "application/json")

    def _send_raw(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


# ----- the process's gateway ------------------------------------------------------------------
_lock = threading.Lock()
_gateway: Gateway | None = None


def gateway(host: str | None = None) -> Gateway:
    """The process's gateway, started on first use (on ``host``; default the loopback address).

    Raises:
        GatewayError: one is running on another address than ``host``.
    """
    global _gateway
    with _lock:
        if _gateway is None:
            _gateway = Gateway(LOOPBACK if host is None else host)
            if not is_loopback(_gateway.host):
                log.warning(
                    "the marl gateway listens on %s:%d, beyond this machine (see "
                    "marl_agents.gateway.server for what that exposes)",
                    _gateway.host,
                    _gateway.port,
                )
        elif host is not None and host != _gateway.host:
            raise GatewayError(
                f"this process's gateway already listens on {_gateway.host}, not {host}: one "
                "gateway per process; stop_gateway() first",
                500,
                "server_error",
            )
        return _gateway


@atexit.register
def stop_gateway() -> None:
    """Stop the process's gateway, if one runs (also at exit)."""
    global _gateway
    with _lock:
        running, _gateway = _gateway, None
    if running is not None:
        running.stop()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["LOOPBACK", "MAX_BODY_BYTES", "Gateway", "gateway", "is_loopback", "stop_gateway"]
