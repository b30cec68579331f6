#!/usr/bin/env python3
"""agentvm code interpreter server (runs inside the guest).

README
======
An HTTP server that executes code in persistent, stateful "contexts" and
streams the output back.  It speaks the wire protocol of E2B's code
interpreter, so the published SDKs (`@e2b/code-interpreter`,
`e2b-code-interpreter`) work against it unchanged.  This is an independent
implementation: only the protocol (paths, JSON field names, status codes) is
shared with E2B.

Run:   python3 server.py --port 49999 --host 127.0.0.1 [--cwd /home/user]
       [--user user] [--env-file FILE] [--preload numpy,pandas,matplotlib.pyplot]
       [--allow-uids 0,1001] [--machine-id-file /etc/machine-id]
Needs: Python 3.11 stdlib, Debian's python3-ipykernel and python3-jupyter-client
       (pyzmq), node, bash; for R r-cran-irkernel, for Java a JDK (jdk.jshell),
       for TypeScript node-typescript where node cannot strip types.  The other
       files of this directory must sit next to this one (embed.go lists them).
Tests: python3 -m unittest test_server test_languages  (in this directory;
       CODEINTERP_REQUIRE=1 turns a missing runtime into a failure)

Who may connect: the server runs any code it is sent, so it listens on
loopback and accepts a connection only when the client's socket belongs to
one of --allow-uids (default: root, i.e. the guest agent, the server's own
uid and --user's), as found in /proc/net/tcp{,6}; other guest users are
refused (see peers.py).

Users: with --user (the image runs the server as root with --user user),
contexts run as that user unless created with "user": "root".  Each user's
kernel sockets and files live in a private 0700 directory of its own.

Languages (a context is one long-lived child process, started in its cwd)
  python (default)  ipykernel, driven over ZeroMQ ipc:// sockets in a private
                    0700 directory (no TCP ports, nothing tied to the VM's IP,
                    so contexts survive pause/snapshot/fork).  matplotlib uses
                    the inline backend; figures carry a structured "chart".
  r                 IRkernel, driven like ipykernel: values as R prints them
                    (plus HTML for data frames), plots as PNG.
  javascript / js   jskernel.js (node): globals persist, top-level await and
                    static `import` work, last expression is the result.
  typescript / ts   jskernel.js with types erased: by node where it can
                    (Node >= 22.13), else by the typescript package.
  java              JShellKernel.java (JShell): the value of the last
                    expression; env vars are system properties, as in E2B.
  bash              one persistent interactive bash: variables, functions and
                    cwd persist; a non-zero status is an "ExitCodeError".

Endpoints (errors are text/plain bodies)
  GET    /health                   200 "OK" once the default Python context
                                   (plus the default JavaScript one, if node
                                   works, those of --warm, and the spares)
                                   are ready; 503 + reason before.
  POST   /execute                  {code, context_id?, language?, env_vars?,
                                   timeout_ms?} -> 200 application/x-ndjson,
                                   chunked, one JSON event per line; 400 bad
                                   body or both context_id and language; 404
                                   "Context <id> not found"; 413 > 10 MiB.
  GET    /contexts                 [{id, language, cwd, user}, ...] in creation order
  POST   /contexts                 {language?, cwd?, user?} -> 200 {id, language, cwd,
                                   user}; 400 bad language/cwd/user; 429 over
                                   --max-contexts
  DELETE /contexts/{id}            200 null | 404
  POST   /contexts/{id}/restart    200 null | 404   (new process, same id)
  POST   /contexts/{id}/interrupt  200 {"interrupted": bool}   (extension)

Events of /execute, in order
  {"type":"number_of_executions","execution_count":N}          first
  {"type":"stdout"|"stderr","text":"...","timestamp":"<ISO 8601 UTC>"}
  {"type":"result","text"?,"html"?,"markdown"?,"svg"?,"png"?,"jpeg"?,"pdf"?,
   "latex"?,"json"?,"javascript"?,"data"?,"chart"?,"extra":{mime: value},
   "is_main_result":bool}       (png/jpeg/pdf base64; text of a str repr
                                 without its quotes, as E2B does)
  {"type":"error","name":"...","value":"...","traceback":"..."}   at most one
  {"type":"keepalive"}          after 5 s without output (SDKs ignore it)
  {"type":"end_of_execution"}   last line, unless the client went away

Cancellation: "timeout_ms" (extension) bounds the whole request.  When it
expires, when the client disconnects (EOF on the socket), or on POST
.../interrupt, the context gets SIGINT and survives with its state; a
timeout ends with one error named "TimeoutError".  A context that ignores
interrupts for 10 s is killed and restarted (state lost, reported).  One
execution at a time per context; different contexts run in parallel.

Random state: contexts started before a VM snapshot (the warm default ones)
are copied into every VM restored or forked from it.  Before each execution
a context compares --machine-id-file (/etc/machine-id, rewritten for each
VM) with what it saw last; when it changed, Python contexts reseed random
and numpy's global generator (os.urandom/secrets need nothing), bash
contexts reseed $RANDOM, and JavaScript contexts that never ran user code
are restarted.  A JavaScript context with state keeps the copied
Math.random and OpenSSL state (V8 and node cannot reseed them; see
jscontext.py).  Python and bash contexts also reseed before their first
execution.

Spares: --spares Python kernels are kept started (in the default cwd, as
the default user, without --preload) for the next Python contexts that are
created, restarted or respawned after a crash as the default user; one
moves into the context's cwd, and a new spare starts behind it (state.py,
take_spare).  A new or restarted Python context then answers about as soon
as a running one instead of after a kernel start, which under emulation
takes seconds.

env_vars apply to one execution and are restored afterwards.  --env-file
names a JSON object of sandbox-wide variables, re-read when it changes and
applied to every context before its next execution (E2B's sandbox envs).
"""


import argparse
import json
import logging
import math
import os
import pwd
import re
import shutil
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import common
import peers
from common import ENV_NAME_RE, ApiError, dumps, normalize_language
from contexts import Stream
from state import State

log = logging.getLogger("codeinterp")


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------

CTX_PATH = re.compile(r"^/contexts/([^/]+)(/restart|/interrupt)?/?$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agentvm-codeinterp/1"
    timeout = common.IDLE_CONN_TIMEOUT
    state = None  # set in main()

    def setup(self):
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def log_message(self, fmt, *args):  # noqa: N802 - stdlib name
        log.debug("%s %s", self.address_string(), fmt % args)

    # -- responses -----------------------------------------------------------------
    def _send(self, status, body, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_text(self, status, text):
        self._send(status, text.encode("utf-8"), "text/plain; charset=utf-8")

    def send_json(self, status, obj):
        self._send(status, dumps(obj), "application/json")

    def read_body(self):
        limit = self.state.args.max_body_bytes
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            parts, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";")[0].strip() or b"x", 16)
                except ValueError:
                    self.close_connection = True
                    raise ApiError(400, "Malformed chunked request body")
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > limit:
                    self.close_connection = True
                    raise ApiError(413, f"Request body too large (limit {limit} bytes)")
                parts.append(self.rfile.read(size))
                self.rfile.readline(1024)
            return b"".join(parts)
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            n = int(length)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "Invalid Content-Length")
        if n > limit:
            self.close_connection = True
            raise ApiError(413, f"Request body too large (limit {limit} bytes)")
        return self.rfile.read(n)

    def read_json(self, required=True):
        raw = self.read_body()
        if not raw.strip():
            if required:
                raise ApiError(400, "Request body must be a JSON object")
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"Invalid JSON body: {e}")
        if not isinstance(body, dict):
            raise ApiError(400, "Request body must be a JSON object")
        return body

    # -- dispatch --------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self):  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self):  # noqa: N802
        self._dispatch("PATCH")

    def _dispatch(self, method):
        path = self.path.split("?", 1)[0]
        try:
            if path == "/health":
                self._only(method, "GET")
                return self.health()
            if path == "/execute":
                self._only(method, "POST")
                return self.execute()
            if path in ("/contexts", "/contexts/"):
                if method == "GET":
                    return self.send_json(200, self.state.list())
                self._only(method, "POST")
                return self.create_context()
            m = CTX_PATH.match(path)
            if m:
                return self.context_op(method, m.group(1), m.group(2))
            raise ApiError(404, "Not found")
        except ApiError as e:
            if e.status in (405, 404) and method in ("POST", "PUT", "PATCH"):
                self.close_connection = True  # body not read
            self.send_text(e.status, e.message)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - never crash the server
            log.exception("request failed")
            self.close_connection = True
            try:
                self.send_text(500, f"Internal error: {e.__class__.__name__}: {e}")
            except OSError:
                pass

    @staticmethod
    def _only(method, allowed):
        if method != allowed:
            raise ApiError(405, f"Method {method} not allowed")

    # -- endpoints ---------------------------------------------------------------------
    def health(self):
        st = self.state
        if st.ready.is_set():
            return self.send_json(200, "OK")
        return self.send_text(503, st.startup_error or "starting")

    def create_context(self):
        body = self.read_json(required=False)
        language = normalize_language(body.get("language") or None)
        ctx = self.state.create(language, body.get("cwd") or None, user=body.get("user") or None)
        self.send_json(200, ctx.info())

    def context_op(self, method, ctx_id, action):
        if action is None:
            self._only(method, "DELETE")
            if self.state.remove(ctx_id) is None:
                raise ApiError(404, f"Context {ctx_id} not found")
            log.info("removed context %s", ctx_id)
            return self.send_json(200, None)
        self._only(method, "POST")
        self.read_body()
        ctx = self.state.get(ctx_id)
        if ctx is None:
            raise ApiError(404, f"Context {ctx_id} not found")
        if action == "/restart":
            try:
                ctx.restart()
            except Exception as e:  # noqa: BLE001
                raise ApiError(500, f"Failed to restart context {ctx_id}: {e}")
            log.info("restarted context %s", ctx_id)
            return self.send_json(200, None)
        return self.send_json(200, {"interrupted": ctx.interrupt()})

    def execute(self):
        body = self.read_json()
        code = body.get("code")
        if not isinstance(code, str):
            raise ApiError(400, "'code' must be a string")
        context_id = body.get("context_id") or None
        language = body.get("language") or None
        if context_id is not None and not isinstance(context_id, str):
            raise ApiError(400, "'context_id' must be a string")
        if context_id and language:
            raise ApiError(400, "Only one of context_id or language can be provided")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict):
            raise ApiError(400, "'env_vars' must be an object of strings")
        clean_env = {}
        for k, v in env.items():
            if not ENV_NAME_RE.match(k):
                raise ApiError(400, f"Invalid environment variable name {k!r}")
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, (int, float)):
                v = str(v)
            elif not isinstance(v, str):
                raise ApiError(400, f"Environment variable {k} must be a string")
            if "\0" in v:
                raise ApiError(400, f"Environment variable {k} contains a NUL byte")
            clean_env[k] = v
        timeout_ms = body.get("timeout_ms")
        if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float))
                                       or not math.isfinite(timeout_ms) or timeout_ms < 0):
            raise ApiError(400, "'timeout_ms' must be a non-negative number")
        timeout_s = (timeout_ms / 1000.0) if timeout_ms else None

        if context_id:
            ctx = self.state.get(context_id)
            if ctx is None:
                raise ApiError(404, f"Context {context_id} not found")
        else:
            ctx = self.state.default(normalize_language(language))

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Accel-Buffering", "no")
        if self.request_version == "HTTP/1.0":
            self.close_connection = True
            self.send_header("Connection", "close")
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.connection.settimeout(common.STREAM_WRITE_TIMEOUT)
        except OSError:
            pass
        stream = Stream(self, timeout_s)
        t0 = time.monotonic()
        try:
            ctx.execute(code, clean_env, stream)
        finally:
            if stream.gone:
                self.close_connection = True
            else:
                stream.finish()
                if stream.gone or stream.peer_closed:
                    self.close_connection = True
            try:
                self.connection.settimeout(self.timeout)
            except OSError:
                pass
            log.info("executed in %s context %s: %.3fs%s", ctx.language, ctx.id,
                     time.monotonic() - t0,
                     " (client gone)" if stream.gone or stream.peer_closed
                     else " (timed out)" if stream.timed_out else "")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    # Who may connect (see peers.py): uids owning the client's socket.  None
    # accepts everyone (only for tests that construct a Server directly).
    allow_uids = None
    proc_net_tcp = peers.PROC_NET_TCP

    def verify_request(self, request, client_address):
        if self.allow_uids is None:
            return True
        return peers.peer_allowed(request, client_address, self.allow_uids, self.proc_net_tcp)

    def handle_error(self, request, client_address):
        log.debug("connection error from %s", client_address, exc_info=True)


def main(argv=None):
    p = argparse.ArgumentParser(description="agentvm code interpreter server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=49999)
    p.add_argument("--cwd", default=None, help="default working directory (default: $HOME)")
    p.add_argument("--python", default=sys.executable, help="interpreter for Python kernels")
    p.add_argument("--node", default=os.environ.get("CODEINTERP_NODE", "node"))
    p.add_argument("--r", default=os.environ.get("CODEINTERP_R", "R"),
                   help="R, with IRkernel installed, for R contexts ('' for none)")
    p.add_argument("--java", default=os.environ.get("CODEINTERP_JAVA", "java"),
                   help="java of a JDK (with jdk.jshell) for Java contexts ('' for none)")
    p.add_argument("--user", dest="run_as", default=None,
                   help="user that contexts run as unless one asks for root (the server must "
                        "then run as root; default: the server's own user)")
    p.add_argument("--max-contexts", type=int, default=64)
    p.add_argument("--max-body-bytes", type=int, default=10 * 1024 * 1024)
    p.add_argument("--runtime-dir", default=os.environ.get("XDG_RUNTIME_DIR") or None,
                   help="parent of the private directory for kernel sockets")
    p.add_argument("--preload", default="numpy,pandas,matplotlib.pyplot",
                   help="modules imported into the default Python context at startup, so that "
                        "a snapshot taken after /health is warm (comma-separated; '' for none)")
    p.add_argument("--env-file", default=os.environ.get("CODEINTERP_ENV_FILE") or None,
                   help="JSON object of sandbox-wide environment variables, re-read before each "
                        "execution when it changes and applied to every context")
    p.add_argument("--allow-uids", default="",
                   help="comma-separated uids (or user names) whose local processes may connect "
                        "(default: 0 and the server's own uid); other connections are refused")
    p.add_argument("--machine-id-file", default="/etc/machine-id",
                   help="file whose change means this VM was restored or forked: contexts then "
                        "reseed their pseudo-random state")
    p.add_argument("--spares", type=int, default=1,
                   help="Python kernels kept started ahead for the next new (or restarted) "
                        "Python contexts (0: none)")
    p.add_argument("--no-default-js", action="store_true",
                   help="do not start the default JavaScript context at startup")
    p.add_argument("--warm", default="",
                   help="more languages whose default contexts start at startup, before "
                        "/health answers 200 (comma-separated: typescript, r, java, bash)")
    p.add_argument("--kernel-logs", action="store_true", help="pass kernels' stderr through")
    p.add_argument("--log-level", default=os.environ.get("CODEINTERP_LOG_LEVEL", "INFO"))
    p.add_argument("--keepalive-seconds", type=float, default=common.KEEPALIVE_INTERVAL,
                   help=argparse.SUPPRESS)
    p.add_argument("--interrupt-grace-seconds", type=float, default=common.INTERRUPT_GRACE,
                   help=argparse.SUPPRESS)
    p.add_argument("--start-timeout-seconds", type=float, default=common.START_TIMEOUT,
                   help="how long a kernel may take to start")
    args = p.parse_args(argv)
    if not 0 <= args.spares <= 8:
        p.error("--spares must be between 0 and 8")
    if args.spares and os.path.realpath(args.python) != os.path.realpath(sys.executable):
        # A spare is not taken after its site-packages changed, which this
        # server knows for its own interpreter only (state.py, _site_dirs).
        p.error("--spares needs --python to be the server's own interpreter (or --spares 0)")

    common.KEEPALIVE_INTERVAL = max(0.05, args.keepalive_seconds)
    common.INTERRUPT_GRACE = max(0.5, args.interrupt_grace_seconds)
    common.START_TIMEOUT = max(5.0, args.start_timeout_seconds)
    try:
        allow_uids = peers.parse_uids(args.allow_uids, os.getuid())
    except ValueError as e:
        p.error(str(e))
    if args.run_as:
        try:
            args.run_as = pwd.getpwnam(args.run_as)
        except KeyError:
            p.error(f"--user: no user {args.run_as!r}")
        if args.run_as.pw_uid == os.getuid():
            args.run_as = None
        elif os.getuid() != 0:
            p.error("--user needs the server to run as root")
        if args.run_as and not args.allow_uids:
            allow_uids = set(allow_uids) | {args.run_as.pw_uid}

    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cwd is None:
        home = args.run_as.pw_dir if args.run_as else os.path.expanduser("~")
        args.cwd = home if os.path.isdir(home) else os.getcwd()
    args.cwd = os.path.abspath(args.cwd)
    args.preload = [m.strip() for m in args.preload.split(",") if m.strip()]
    warm = [w.strip() for w in args.warm.split(",") if w.strip()]
    bad = [w for w in warm if w not in ("typescript", "r", "java", "bash")]
    if bad:
        p.error(f"--warm: unknown language {bad[0]!r} (typescript, r, java or bash)")
    args.warm = ([] if args.no_default_js else ["javascript"]) + warm
    if args.node and os.sep not in args.node:
        args.node = shutil.which(args.node) or args.node
    if args.r and os.sep not in args.r:
        args.r = shutil.which(args.r) or ""
    if args.java and os.sep not in args.java:
        args.java = shutil.which(args.java) or ""

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    Server.address_family = family
    Server.allow_uids = frozenset(allow_uids)
    httpd = Server((args.host, args.port), Handler)
    state = State(args)
    state.check_default_user()
    Handler.state = state
    log.info("listening on %s:%d (cwd %s; clients of uid %s)", args.host, httpd.server_address[1],
             args.cwd, ",".join(map(str, sorted(allow_uids))))

    def on_term(signum, frame):
        raise SystemExit(0)

    # Children must be interruptible even if we were started with SIGINT
    # ignored (e.g. as a background job of a non-interactive shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    threading.Thread(target=state.startup, args=(args.warm,), daemon=True).start()
    try:
        httpd.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        log.info("shutting down")
        state.shutdown()
        httpd.server_close()


if __name__ == "__main__":
    main()
