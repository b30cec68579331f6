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

Run:  python3 server.py --port 49999 --host 127.0.0.1 [--cwd /home/user]
Deps: Python 3.11 stdlib, Debian's python3-ipykernel / python3-jupyter-client
      (pyzmq), node (for jskernel.js, next to this file), bash.

Languages
  python (default)  a real ipykernel, one process per context, driven over
                    ZeroMQ ipc:// sockets (no TCP ports, nothing tied to the
                    VM's IP address).  matplotlib uses the inline backend.
  javascript / js   jskernel.js: one long-lived node process per context.
  typescript / ts   only when node provides module.stripTypeScriptTypes
                    (Node >= 22.13); otherwise a clear 400 error.
  bash              one persistent interactive bash per context.

Endpoints
  GET    /health                   200 "OK" once the default Python kernel
                                   (and the default JS context attempt) is
                                   ready; 503 with a text reason before.
  POST   /execute                  {code, context_id?, language?, env_vars?,
                                   timeout_ms?} -> 200 application/x-ndjson,
                                   chunked, one JSON event per line.
  GET    /contexts                 [{id, language, cwd}, ...]
  POST   /contexts                 {language?, cwd?} -> {id, language, cwd}
  DELETE /contexts/{id}            200 null | 404 text
  POST   /contexts/{id}/restart    200 null | 404 text   (state is lost)
  POST   /contexts/{id}/interrupt  200 {"interrupted": bool} (extension)

Events streamed by /execute (see also the report in the code review)
  {"type":"number_of_executions","execution_count":N}
  {"type":"stdout","text":"...","timestamp":"<ISO-8601>"}
  {"type":"stderr","text":"...","timestamp":"<ISO-8601>"}
  {"type":"result","text"?,"html"?,"markdown"?,"svg"?,"png"?,"jpeg"?,"pdf"?,
   "latex"?,"json"?,"javascript"?,"data"?,"chart"?,"extra":{...},
   "is_main_result":bool}
  {"type":"error","name":"...","value":"...","traceback":"..."}
  {"type":"keepalive"}               every 5 s of silence (clients ignore it)
  {"type":"end_of_execution"}        last line, unless the client went away

Timeouts / cancellation: "timeout_ms" in the request body (extension) bounds
the whole request; when it expires, or when the client disconnects, the
context is interrupted (SIGINT) so it survives with its state.  A timeout is
reported as one error event named "TimeoutError".  If a context ignores
interrupts for GRACE seconds it is killed and restarted (state lost).
"""

import argparse
import codecs
import datetime
import json
import logging
import math
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("codeinterp")

KEEPALIVE_INTERVAL = 5.0     # seconds of silence before a keepalive line
INTERRUPT_GRACE = 10.0       # seconds to wait for an interrupted context
REINTERRUPT_EVERY = 2.0      # re-send SIGINT this often during the grace
STREAM_WRITE_TIMEOUT = 60.0  # a client not reading for this long is gone
IDLE_CONN_TIMEOUT = 600.0    # keep-alive connections idle for this long close
START_TIMEOUT = 60.0         # seconds for a kernel to become ready

LANG_ALIASES = {
    "": "python", "python": "python", "python3": "python", "py": "python",
    "javascript": "javascript", "js": "javascript", "node": "javascript",
    "typescript": "typescript", "ts": "typescript",
    "bash": "bash", "sh": "bash", "shell": "bash",
}
KNOWN_UNAVAILABLE = {"r", "java", "deno"}
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ApiError(Exception):
    """An error that maps to an HTTP status with a text body."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class KernelStartError(Exception):
    pass


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _finite(obj):
    """Replaces NaN/Infinity (not valid JSON) with None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(obj):
    """Compact, ASCII-only JSON (safe for clients that decode chunk by chunk)."""
    try:
        s = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        s = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False, default=str)
    return s.encode("ascii")


def normalize_language(language):
    if language is None:
        return "python"
    if not isinstance(language, str):
        raise ApiError(400, "'language' must be a string")
    lang = language.strip().lower()
    if lang in LANG_ALIASES:
        return LANG_ALIASES[lang]
    if lang in KNOWN_UNAVAILABLE:
        raise ApiError(400, f"Language '{language}' is not available in this sandbox "
                            "(supported: python, javascript, typescript where node supports it, bash)")
    raise ApiError(400, f"Unsupported language '{language}' "
                        "(supported: python, javascript/js, typescript/ts, bash)")


def strip_repr_quotes(text):
    # A str's text/plain repr is quoted ('abc'); like E2B, clients get abc.
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


MIME_FIELDS = (
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
    ("e2b/chart", "chart"),
)


def bundle_to_result(bundle, is_main, strip_quotes=True):
    """Maps a Jupyter MIME bundle to a "result" event."""
    data = dict(bundle or {})
    ev = {"type": "result"}
    for mime, field in MIME_FIELDS:
        if mime in data:
            value = data.pop(mime)
            if value is None:
                continue
            if field == "text" and strip_quotes:
                value = strip_repr_quotes(value)
            ev[field] = value
    ev["extra"] = data
    ev["is_main_result"] = bool(is_main)
    return ev


def error_event(name, value, traceback=""):
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def kill_group(pid, sig):
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False


def descendants(pid):
    """All descendant pids of pid (via /proc), deepest last."""
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


# ---------------------------------------------------------------------------
# Streaming response for one /execute request
# ---------------------------------------------------------------------------

class Stream:
    """Writes events of one execution and watches for timeout/disconnect."""

    def __init__(self, handler, timeout_s):
        self.handler = handler
        self.sock = handler.connection
        self.chunked = handler.request_version != "HTTP/1.0"
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s if timeout_s else None
        self.timeout_s = timeout_s
        self.gone = False
        self.timed_out = False
        self.interrupt_requested = False
        self.can_peek = True
        self.last_write = self.started
        self.error_sent = False
        self.held_error = None
        self.notes = []
        self.lock = threading.Lock()

    # -- low level -------------------------------------------------------
    def _write(self, payload):
        if self.gone:
            return
        with self.lock:
            try:
                if self.chunked:
                    self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                else:
                    self.handler.wfile.write(payload)
                self.last_write = time.monotonic()
            except (OSError, ValueError):
                self.gone = True

    def send(self, ev):
        self._write(dumps(ev) + b"\n")

    def close(self):
        """Ends the response body (terminating chunk)."""
        if self.chunked and not self.gone:
            with self.lock:
                try:
                    self.handler.wfile.write(b"0\r\n\r\n")
                except (OSError, ValueError):
                    self.gone = True

    # -- used by contexts --------------------------------------------------
    def emit(self, ev):
        if ev.get("type") == "error":
            if self.timed_out:
                # The kernel's reaction to our interrupt; reported as TimeoutError.
                self.held_error = ev
                return
            if self.error_sent:
                return
            self.error_sent = True
        self.send(ev)

    def output(self, name, text):
        if text:
            self.emit({"type": name, "text": text, "timestamp": now_iso()})

    def _peer_closed(self):
        if not self.can_peek or self.gone:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return False
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            if data == b"":
                return True
            # The client sent something (pipelining); stop peeking, rely on writes.
            self.can_peek = False
            return False
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    def poll(self):
        """Returns None or why the execution should stop: 'disconnect',
        'timeout' or 'interrupt'.  Also sends keepalives."""
        now = time.monotonic()
        if not self.gone and self._peer_closed():
            self.gone = True
        if not self.gone and now - self.last_write >= KEEPALIVE_INTERVAL:
            self.send({"type": "keepalive"})
        if self.gone:
            return "disconnect"
        if self.deadline is not None and now >= self.deadline:
            self.timed_out = True
            return "timeout"
        if self.interrupt_requested:
            return "interrupt"
        return None

    def finish(self):
        if self.timed_out:
            value = f"Execution timed out after {self.timeout_s * 1000:.0f} ms and was interrupted"
            if self.notes:
                value += "; " + "; ".join(self.notes)
            tb = self.held_error.get("traceback", "") if self.held_error else ""
            self.send(error_event("TimeoutError", value, tb))
        self.send({"type": "end_of_execution"})
        self.close()


# ---------------------------------------------------------------------------
# Contexts
# ---------------------------------------------------------------------------

class Context:
    """A persistent execution environment backed by one child process."""

    language = "?"

    def __init__(self, server, ctx_id, cwd):
        self.server = server
        self.id = ctx_id
        self.cwd = cwd
        self.exec_lock = threading.Lock()
        self.life_lock = threading.Lock()
        self.ready = threading.Event()
        self.start_error = None
        self.closed = False
        self.restarting = False
        self.needs_restart = False
        self.proc = None
        self.active_stream = None
        self.exec_count = 0

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # -- lifecycle ----------------------------------------------------------
    def start(self):
        """Starts the process; blocks until ready.  Raises KernelStartError."""
        try:
            with self.exec_lock:
                self._start_process()
        except Exception as e:  # noqa: BLE001 - reported to the client
            self.start_error = str(e) or e.__class__.__name__
            self._kill_process()
            raise KernelStartError(self.start_error) from e
        finally:
            self.ready.set()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def _signal_kill(self):
        """Kills the process without touching fds/sockets (safe without
        exec_lock); a running execution notices and ends."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            kill_group(proc.pid, signal.SIGKILL)

    def restart(self):
        with self.life_lock:
            self.restarting = True
            try:
                self._signal_kill()
                with self.exec_lock:
                    self._kill_process()
                    self.exec_count = 0
                    self.needs_restart = False
                    self._start_process()
            finally:
                self.restarting = False

    def close(self):
        self.closed = True
        with self.life_lock:
            self._signal_kill()
            if self.exec_lock.acquire(timeout=10):
                try:
                    self._kill_process()
                finally:
                    self.exec_lock.release()
            else:
                log.warning("context %s: execution did not end; leaving cleanup", self.id)

    def interrupt(self):
        stream = self.active_stream
        if stream is not None:
            stream.interrupt_requested = True
            return True
        return False

    # -- execution ------------------------------------------------------------
    def execute(self, code, env, stream):
        while not self.ready.wait(0.2):
            if stream.poll() in ("timeout", "disconnect"):
                return
        if self.start_error:
            stream.emit(error_event("ContextError", f"Context failed to start: {self.start_error}"))
            return
        while not self.exec_lock.acquire(timeout=0.2):
            reason = stream.poll()
            if reason in ("timeout", "disconnect"):
                if reason == "timeout":
                    stream.notes.append("the context was still busy with a previous execution")
                return
        try:
            if self.closed:
                stream.emit(error_event("ContextNotFound", f"Context {self.id} was deleted"))
                return
            self.active_stream = stream
            self._execute_locked(code, env, stream)
        except Exception as e:  # noqa: BLE001 - never let a request kill the server
            log.exception("execution failed in context %s", self.id)
            stream.emit(error_event("InternalError", f"{e.__class__.__name__}: {e}"))
        finally:
            self.active_stream = None
            self.exec_lock.release()

    def _execute_locked(self, code, env, stream):
        if self.needs_restart or not self.alive():
            was_dead = not self.alive()
            self._kill_process()
            self._start_process()
            self.needs_restart = False
            if was_dead:
                stream.output("stderr", f"[codeinterp] the {self.language} context had stopped; "
                                        "it was restarted and its previous state is lost\n")
        self._begin(code, env, stream)
        reason = None
        t_abort = t_intr = 0.0
        while True:
            if self._pump(stream, 0.05 if reason else 0.1):
                break
            if not self.alive():
                self.needs_restart = True
                if self.closed:
                    stream.emit(error_event("ContextDeleted", "The context was deleted during execution"))
                elif self.restarting:
                    stream.emit(error_event("ContextRestarting", "Context was restarted"))
                else:
                    code_ = self.proc.poll() if self.proc else None
                    stream.emit(error_event(
                        "KernelDied",
                        f"The {self.language} process exited unexpectedly (exit status {code_}); "
                        "it will be restarted on the next execution and its state is lost"))
                return
            now = time.monotonic()
            if reason is None:
                reason = stream.poll()
                if reason:
                    log.info("context %s: interrupting (%s)", self.id, reason)
                    self._interrupt(1)
                    t_abort = t_intr = now
            else:
                stream.poll()
                if now - t_abort > INTERRUPT_GRACE:
                    log.warning("context %s ignored interrupts; killing it", self.id)
                    self.needs_restart = True
                    self._kill_process()
                    msg = (f"the {self.language} context did not respond to interrupts within "
                           f"{INTERRUPT_GRACE:.0f} s and was restarted; its state is lost")
                    if stream.timed_out:
                        stream.notes.append(msg)
                    else:
                        stream.emit(error_event("KernelRestarted", msg[0].upper() + msg[1:]))
                    return
                if now - t_intr > REINTERRUPT_EVERY:
                    self._interrupt(2)
                    t_intr = now
        self._finish(env, stream)

    # -- to implement ------------------------------------------------------------
    def _start_process(self):
        raise NotImplementedError

    def _kill_process(self):
        raise NotImplementedError

    def _begin(self, code, env, stream):
        raise NotImplementedError

    def _pump(self, stream, timeout):
        raise NotImplementedError

    def _interrupt(self, attempt):
        if self.proc is not None:
            kill_group(self.proc.pid, signal.SIGINT)

    def _finish(self, env, stream):
        pass

    def _terminate_proc(self, grace=1.0):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            kill_group(proc.pid, signal.SIGKILL if grace <= 0 else signal.SIGTERM)
            try:
                proc.wait(timeout=grace if grace > 0 else 5)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid, signal.SIGKILL)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    log.error("process %s did not die", proc.pid)
        else:
            kill_group(proc.pid, signal.SIGKILL)   # leftovers in its group
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if f:
                    f.close()
            except OSError:
                pass


class PipeReader:
    """Non-blocking reader with incremental UTF-8 decoding."""

    def __init__(self, fd):
        self.fd = fd
        os.set_blocking(fd, False)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.eof = False

    def read(self):
        chunks = []
        while not self.eof:
            try:
                b = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self.eof = True
                break
            if not b:
                self.eof = True
                break
            chunks.append(b)
            if len(b) < 65536:
                break
        if not chunks:
            return ""
        return self.decoder.decode(b"".join(chunks))

    def close(self):
        try:
            os.close(self.fd)
        except OSError:
            pass


def write_all(fd, data, deadline, proc):
    """Writes data to a non-blocking fd, giving up at deadline or if proc dies."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
            view = view[n:]
            continue
        except BlockingIOError:
            pass
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            raise OSError("child process is not reading its input")
        select.select([], [fd], [], 0.1)


# ---------------------------------------------------------------------------
# Python: ipykernel over ZeroMQ ipc
# ---------------------------------------------------------------------------

# Runs inside each Python kernel, in a private module (_agentvm_codeinterp).
KERNEL_MODULE_SRC = r'''
import datetime as _dt
import math
import os
import re
import sys

_saved_env = None


def set_env(env):
    global _saved_env
    _saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)


def restore_env():
    global _saved_env
    saved, _saved_env = _saved_env, None
    for k, v in (saved or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def jsonable(v, depth=0):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if depth > 32:
        return str(v)
    pd = sys.modules.get("pandas")
    if pd is not None and v is pd.NaT:
        return None
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, dict):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x, depth + 1) for x in v]
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(v, np.datetime64):
            return None if np.isnat(v) else str(v)
        if isinstance(v, np.generic):
            return jsonable(v.item(), depth + 1)
        if isinstance(v, np.ndarray):
            return jsonable(v.tolist(), depth + 1)
    if pd is not None:
        if isinstance(v, pd.Timedelta):
            return str(v)
        try:
            if pd.isna(v) is True:
                return None
        except (TypeError, ValueError):
            pass
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, complex):
        return str(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def dataframe_data(df):
    try:
        return {str(k): [jsonable(x) for x in col]
                for k, col in df.to_dict(orient="list").items()}
    except Exception:
        return None


# -- chart extraction from matplotlib figures --------------------------------

def _unit(label):
    if not label:
        return None
    m = re.search(r"[(\[]([^()\[\]]+)[)\]]\s*$", label)
    return m.group(1).strip() if m else None


def _axis_kind(axis):
    import matplotlib.category as mcat
    import matplotlib.dates as mdates
    conv = getattr(axis, "converter", None)
    if conv is None and hasattr(axis, "get_converter"):
        conv = axis.get_converter()
    fmt = axis.get_major_formatter()
    date_convs = tuple(c for c in (getattr(mdates, "DateConverter", None),
                                   getattr(mdates, "ConciseDateConverter", None),
                                   getattr(mdates, "_SwitchableDateConverter", None)) if c)
    date_fmts = tuple(c for c in (getattr(mdates, "DateFormatter", None),
                                  getattr(mdates, "AutoDateFormatter", None),
                                  getattr(mdates, "ConciseDateFormatter", None)) if c)
    if (date_convs and isinstance(conv, date_convs)) or (date_fmts and isinstance(fmt, date_fmts)):
        return "datetime"
    if isinstance(conv, mcat.StrCategoryConverter) or isinstance(fmt, mcat.StrCategoryFormatter):
        return "categorical"
    return None


def _value(v, kind, axis):
    if kind == "datetime":
        import matplotlib.dates as mdates
        try:
            if not isinstance(v, (int, float)) and type(v).__module__ == "numpy" and hasattr(v, "item"):
                v = v.item() if not hasattr(v, "dtype") or v.dtype.kind in "iuf" else v
            if isinstance(v, (int, float)):
                return mdates.num2date(v).isoformat()
            return mdates.num2date(mdates.date2num(v)).isoformat()
        except Exception:
            return str(v)
    if kind == "categorical":
        if isinstance(v, str):
            return v
        try:
            return str(axis.get_major_formatter()(v))
        except Exception:
            return str(v)
    try:
        f = float(v)
        return f if math.isfinite(f) else None
    except (TypeError, ValueError):
        return str(v)


def _ticks(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    locs = [float(x) for x in axis.get_ticklocs()]
    try:
        labels = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
    except Exception:
        labels = [str(x) for x in locs]
    kind = _axis_kind(axis)
    eps = abs(hi - lo) * 1e-9
    ticks, tick_labels = [], []
    for loc, lab in zip(locs, labels):
        if lo - eps <= loc <= hi + eps:
            ticks.append(_value(loc, kind, axis) if kind != "categorical" else loc)
            tick_labels.append(lab)
    scale = kind or ax.get_xscale() if which == "x" else kind or ax.get_yscale()
    return ticks, tick_labels, scale, kind


def _label(artist):
    lab = artist.get_label()
    if lab is None or str(lab).startswith("_"):
        return ""
    return str(lab)


def _base2d(ax, type_):
    xl, yl = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {"type": type_, "title": ax.get_title() or None,
            "x_label": xl, "y_label": yl, "x_unit": _unit(xl), "y_unit": _unit(yl)}


def _tick_label_at(ax, which, pos):
    axis = ax.xaxis if which == "x" else ax.yaxis
    if _axis_kind(axis) == "categorical":
        return _value(pos, "categorical", axis)
    ticks, labels, _, _ = _ticks(ax, which)
    best = None
    for t, lab in zip(ticks, labels):
        if isinstance(t, float) and (best is None or abs(t - pos) < abs(best[0] - pos)):
            best = (t, lab)
    if best is not None and abs(best[0] - pos) < 0.5:
        return best[1]
    return str(round(pos, 6))


def _is_rect_line(line):
    xs, ys = line.get_xdata(), line.get_ydata()
    return (len(xs) == 5 and len(ys) == 5 and xs[0] == xs[-1] and ys[0] == ys[-1]
            and len(set(map(float, xs))) == 2 and len(set(map(float, ys))) == 2)


def _box_chart(ax):
    from matplotlib.patches import PathPatch
    rects = []
    for line in ax.get_lines():
        if _is_rect_line(line):
            rects.append((line, [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]))
    for p in ax.patches:
        if isinstance(p, PathPatch):
            v = p.get_path().vertices
            xs, ys = sorted(set(map(float, v[:, 0]))), sorted(set(map(float, v[:, 1])))
            if len(xs) == 2 and len(ys) == 2:
                rects.append((p, xs, ys))
    if not rects:
        return None
    lines = [l for l in ax.get_lines() if not any(l is r[0] for r in rects)]
    elements = []
    for _, xs, ys in sorted(rects, key=lambda r: min(r[1])):
        x0, x1, q1, q3 = min(xs), max(xs), min(ys), max(ys)
        cx, w = (x0 + x1) / 2, (x1 - x0)
        lo, hi, med, outliers = q1, q3, None, []
        for l in lines:
            lx, ly = [float(x) for x in l.get_xdata()], [float(y) for y in l.get_ydata()]
            if not lx:
                continue
            if l.get_linestyle() in ("None", "", " ") and all(abs(x - cx) <= w for x in lx):
                outliers.extend(ly)
            elif len(lx) == 2 and lx[0] == lx[1] and abs(lx[0] - cx) <= w / 2:
                if max(ly) <= q1 + 1e-12:
                    lo = min(lo, min(ly))
                elif min(ly) >= q3 - 1e-12:
                    hi = max(hi, max(ly))
            elif len(lx) == 2 and ly[0] == ly[1] and x0 - 1e-9 <= min(lx) and max(lx) <= x1 + 1e-9 \
                    and q1 <= ly[0] <= q3:
                med = ly[0]
        if med is None:
            return None
        elements.append({"label": _tick_label_at(ax, "x", cx), "min": lo, "first_quartile": q1,
                         "median": med, "third_quartile": q3, "max": hi, "outliers": outliers})
    chart = _base2d(ax, "box_and_whisker")
    chart["elements"] = elements
    return chart


def axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge
    title = ax.get_title() or None
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return {"type": "pie", "title": title, "elements": [
            {"label": _label(w), "angle": round(abs(w.theta2 - w.theta1), 4), "radius": float(w.r)}
            for w in wedges]}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        chart = _base2d(ax, "bar")
        elements = []
        for c in bars:
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            group = _label(c)
            for r in c.patches:
                if horizontal:
                    pos, value = r.get_y() + r.get_height() / 2, r.get_width()
                    label = _tick_label_at(ax, "y", pos)
                else:
                    pos, value = r.get_x() + r.get_width() / 2, r.get_height()
                    label = _tick_label_at(ax, "x", pos)
                elements.append({"label": label, "value": float(value), "group": group})
        chart["elements"] = elements
        return chart
    box = _box_chart(ax)
    if box:
        return box
    lines = [l for l in ax.get_lines() if len(l.get_xdata()) > 0]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    if not lines and not scatters:
        return {"type": "unknown", "title": title, "elements": []}
    chart = _base2d(ax, "line" if lines else "scatter")
    xt, xtl, xs, xkind = _ticks(ax, "x")
    yt, ytl, ys, ykind = _ticks(ax, "y")
    chart.update({"x_ticks": xt, "x_tick_labels": xtl, "x_scale": xs,
                  "y_ticks": yt, "y_tick_labels": ytl, "y_scale": ys})
    elements = []
    if lines:
        for l in lines:
            xd, yd = l.get_xdata(orig=True), l.get_ydata(orig=True)
            pts = [[_value(x, xkind, ax.xaxis), _value(y, ykind, ax.yaxis)] for x, y in zip(xd, yd)]
            elements.append({"label": _label(l), "points": pts})
    else:
        for c in scatters:
            pts = [[_value(x, xkind, ax.xaxis), _value(y, ykind, ax.yaxis)] for x, y in c.get_offsets()]
            elements.append({"label": _label(c), "points": pts})
    chart["elements"] = elements
    return chart


def figure_chart(fig):
    try:
        axes = [ax for ax in fig.get_axes() if ax.get_visible()]
        charts = [axes_chart(ax) for ax in axes]
        sup = getattr(fig, "_suptitle", None)
        sup = sup.get_text() if sup is not None else None
        if len(charts) == 1:
            return jsonable(charts[0])
        return jsonable({"type": "superchart" if charts else "unknown",
                         "title": sup or None, "elements": charts})
    except Exception:
        return None


def _install_pil(display):
    try:
        from PIL import Image, ImageShow
    except Exception:
        return

    class _NotebookViewer(ImageShow.Viewer):
        def show(self, image, **options):
            display(image)
            return 1

    ImageShow.register(_NotebookViewer(), order=-1)
    original_save = Image.Image.save
    if getattr(original_save, "_codeinterp", False):
        return

    def save(self, fp, format=None, **params):
        result = original_save(self, fp, format, **params)
        if isinstance(fp, (str, os.PathLike)):
            try:
                display(self)
            except Exception:
                pass
        return result

    save._codeinterp = True
    save.__wrapped__ = original_save
    save.__doc__ = original_save.__doc__
    Image.Image.save = save


def install(ip):
    from IPython.core.formatters import BaseFormatter
    from IPython.display import display
    from traitlets import ObjectName, Unicode

    # Formatters for extra MIME types.  Types are matched lazily through
    # sys.modules (no import cost) and in __call__, because the inline
    # matplotlib backend drops all registered Figure printers when it starts.
    def register(mime, module, name, func):
        formatters = ip.display_formatter.formatters
        fmt = formatters.get(mime)
        if fmt is None:
            def __call__(self, obj):
                for mod_name, type_name, fn in self.lazy_types:
                    mod = sys.modules.get(mod_name)
                    typ = getattr(mod, type_name, None) if mod is not None else None
                    if typ is not None and isinstance(obj, typ):
                        value = fn(obj)
                        return value if isinstance(value, dict) else None
                return None

            cls = type("CodeinterpFormatter", (BaseFormatter,), {
                "format_type": Unicode(mime),
                "print_method": ObjectName("_repr_codeinterp_none_"),
                "_return_type": (dict,),
                "__call__": __call__,
            })
            fmt = cls(parent=ip.display_formatter)
            fmt.lazy_types = []
            formatters[mime] = fmt
        fmt.lazy_types.append((module, name, func))

    register("e2b/data", "pandas", "DataFrame", dataframe_data)
    register("e2b/chart", "matplotlib.figure", "Figure", figure_chart)
    _install_pil(display)
'''

KERNEL_BOOTSTRAP = '''\
def __codeinterp_bootstrap(src):
    import sys, types
    m = types.ModuleType("_agentvm_codeinterp")
    exec(compile(src, "<agentvm-codeinterp>", "exec"), m.__dict__)
    sys.modules[m.__name__] = m
    m.install(get_ipython())
try:
    __codeinterp_bootstrap(%r)
finally:
    del __codeinterp_bootstrap
''' % KERNEL_MODULE_SRC


class PythonContext(Context):
    language = "python"

    def __init__(self, server, ctx_id, cwd):
        super().__init__(server, ctx_id, cwd)
        import zmq  # noqa: F401 - fail early with a clear error if missing
        from jupyter_client.session import Session  # noqa: F401
        self.sockets = None
        self.files = []
        self.msg_id = None

    # -- process ----------------------------------------------------------------
    def _start_process(self):
        import zmq
        from jupyter_client.session import Session

        key = secrets.token_hex(16)
        tag = f"py-{secrets.token_hex(4)}"
        prefix = os.path.join(self.server.runtime_dir, tag)
        ports = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
        conn = dict(ports, ip=prefix, key=key, transport="ipc",
                    signature_scheme="hmac-sha256", kernel_name="python3")
        conn_file = prefix + ".json"
        fd = os.open(conn_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(conn, f)
        self.files = [conn_file] + [f"{prefix}-{p}" for p in ports.values()]

        env = dict(os.environ)
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env.setdefault("PYTHONIOENCODING", "utf-8")
        cmd = [self.server.python, "-m", "ipykernel_launcher", "-f", conn_file,
               f"--IPKernelApp.parent_handle={os.getpid()}",
               "--InteractiveShell.colors=NoColor",
               "--PlainTextFormatter.max_seq_length=0",
               "--HistoryManager.hist_file=:memory:"]
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.server.child_stderr,
                                     start_new_session=True)

        self.session = Session(key=key.encode(), signature_scheme="hmac-sha256",
                               username="codeinterp")
        zctx = zmq.Context.instance()
        shell = zctx.socket(zmq.DEALER)
        shell.linger = 0
        shell.connect(f"ipc://{prefix}-1")
        iopub = zctx.socket(zmq.SUB)
        iopub.linger = 0
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        iopub.connect(f"ipc://{prefix}-2")
        poller = zmq.Poller()
        poller.register(shell, zmq.POLLIN)
        poller.register(iopub, zmq.POLLIN)
        self.sockets = (shell, iopub, poller)
        self._handshake(time.monotonic() + START_TIMEOUT)
        reply = self._silent(KERNEL_BOOTSTRAP, START_TIMEOUT)
        if reply is None or reply.get("status") != "ok":
            log.warning("python context %s: setup code failed: %s", self.id,
                        (reply or {}).get("evalue", "no reply"))

    def _kill_process(self):
        self._terminate_proc(grace=0)
        if self.sockets:
            for s in self.sockets[:2]:
                try:
                    s.close(linger=0)
                except Exception:  # noqa: BLE001
                    pass
            self.sockets = None
        for f in self.files:
            try:
                os.unlink(f)
            except OSError:
                pass
        self.files = []

    def _handshake(self, deadline):
        import zmq
        shell, iopub, poller = self.sockets
        got_reply = got_iopub = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise KernelStartError(f"ipykernel exited with status {self.proc.returncode}")
            self.session.send(shell, "kernel_info_request", {})
            round_end = time.monotonic() + (0.25 if got_reply else 1.0)
            while time.monotonic() < round_end:
                events = dict(poller.poll(50))
                if shell in events:
                    while True:
                        _, msg = self.session.recv(shell, mode=zmq.NOBLOCK)
                        if msg is None:
                            break
                        if msg["msg_type"] == "kernel_info_reply":
                            got_reply = True
                if iopub in events:
                    while self.session.recv(iopub, mode=zmq.NOBLOCK)[1] is not None:
                        got_iopub = True
                if got_reply and got_iopub:
                    return
        raise KernelStartError("timed out waiting for ipykernel to become ready")

    def _silent(self, code, timeout):
        """Runs code without output or history; returns the reply content."""
        import zmq
        shell, iopub, poller = self.sockets
        msg = self.session.send(shell, "execute_request", {
            "code": code, "silent": True, "store_history": False,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
        msg_id = msg["header"]["msg_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = dict(poller.poll(100))
            if iopub in events:  # not needed; keep the queue short
                while self.session.recv(iopub, mode=zmq.NOBLOCK)[1] is not None:
                    pass
            if shell in events:
                while True:
                    _, reply = self.session.recv(shell, mode=zmq.NOBLOCK)
                    if reply is None:
                        break
                    if reply["parent_header"].get("msg_id") == msg_id:
                        return reply["content"]
            if self.proc.poll() is not None:
                return None
        return None

    # -- execution ----------------------------------------------------------------
    def _begin(self, code, env, stream):
        if env:
            self._silent("__import__('_agentvm_codeinterp').set_env(%r)" % (env,), 30)
        shell = self.sockets[0]
        msg = self.session.send(shell, "execute_request", {
            "code": code, "silent": False, "store_history": True,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
        self.msg_id = msg["header"]["msg_id"]
        self.idle_at = None
        self.replied = False

    def _pump(self, stream, timeout):
        import zmq
        shell, iopub, poller = self.sockets
        events = dict(poller.poll(int(timeout * 1000)))
        if iopub in events:
            # Adjacent stream messages that are already queued are merged
            # (ipykernel may split one print() into several messages).
            pending = None
            while True:
                _, msg = self.session.recv(iopub, mode=zmq.NOBLOCK)
                if msg is None:
                    break
                if msg["parent_header"].get("msg_id") != self.msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    name = "stderr" if msg["content"].get("name") == "stderr" else "stdout"
                    text = msg["content"].get("text") or ""
                    if pending is not None and pending["type"] == name:
                        pending["text"] += text
                        continue
                    if pending is not None:
                        stream.emit(pending)
                    date = msg["header"].get("date")
                    ts = date.isoformat() if hasattr(date, "isoformat") else (date or now_iso())
                    pending = {"type": name, "text": text, "timestamp": ts}
                    continue
                if pending is not None:
                    stream.emit(pending)
                    pending = None
                self._on_iopub(msg, stream)
            if pending is not None and pending["text"]:
                stream.emit(pending)
        if shell in events:
            while True:
                _, msg = self.session.recv(shell, mode=zmq.NOBLOCK)
                if msg is None:
                    break
                if msg["parent_header"].get("msg_id") == self.msg_id:
                    self._on_reply(msg["content"], stream)
        if self.idle_at is not None:
            # The reply normally precedes idle; don't wait long for it.
            return self.replied or time.monotonic() - self.idle_at > 1.0
        return False

    def _on_iopub(self, msg, stream):
        t = msg["msg_type"]
        c = msg["content"]
        if t == "execute_result":
            stream.emit(bundle_to_result(c.get("data"), True))
        elif t == "display_data":
            stream.emit(bundle_to_result(c.get("data"), False))
        elif t == "error":
            stream.emit(error_event(c.get("ename", ""), c.get("evalue", ""),
                                    "\n".join(c.get("traceback") or [])))
        elif t == "execute_input":
            self.exec_count = c.get("execution_count", self.exec_count)
            stream.emit({"type": "number_of_executions", "execution_count": c.get("execution_count")})
        elif t == "status":
            if c.get("execution_state") == "idle":
                self.idle_at = time.monotonic()

    def _on_reply(self, c, stream):
        self.replied = True
        status = c.get("status")
        if status == "error":
            stream.emit(error_event(c.get("ename", ""), c.get("evalue", ""),
                                    "\n".join(c.get("traceback") or [])))
        elif status in ("abort", "aborted"):
            stream.emit(error_event("ExecutionAborted", "Execution was aborted"))

    def _finish(self, env, stream):
        if env and self.alive():
            self._silent("__import__('_agentvm_codeinterp').restore_env()", 30)


# ---------------------------------------------------------------------------
# JavaScript / TypeScript: jskernel.js
# ---------------------------------------------------------------------------

class JSContext(Context):
    language = "javascript"

    def __init__(self, server, ctx_id, cwd, language="javascript"):
        super().__init__(server, ctx_id, cwd)
        self.language = language
        self.cmd_fd = None
        self.readers = None
        self.ev_buf = ""
        self.kernel_info = {}
        self.cur = None
        self.done = False

    def _start_process(self):
        cmd_r, cmd_w = os.pipe()
        ev_r, ev_w = os.pipe()
        env = dict(os.environ)
        env["CODEINTERP_FDS"] = f"{cmd_r},{ev_w}"
        env["CODEINTERP_LANG"] = self.language
        try:
            self.proc = subprocess.Popen(
                [self.server.node, self.server.jskernel], cwd=self.cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(cmd_r, ev_w), start_new_session=True)
        except OSError as e:
            for fd in (cmd_r, cmd_w, ev_r, ev_w):
                os.close(fd)
            raise KernelStartError(f"cannot run node ({self.server.node}): {e}") from e
        os.close(cmd_r)
        os.close(ev_w)
        os.set_blocking(cmd_w, False)
        self.cmd_fd = cmd_w
        self.readers = {"ev": PipeReader(ev_r),
                        "stdout": PipeReader(self.proc.stdout.fileno()),
                        "stderr": PipeReader(self.proc.stderr.fileno())}
        self.ev_buf = ""
        deadline = time.monotonic() + START_TIMEOUT
        startup_err = []
        while time.monotonic() < deadline:
            for msg in self._read_events(0.1, startup_err):
                if msg.get("ev") == "ready":
                    self.kernel_info = msg
                    log.info("javascript runtime: node %s, acorn %s, typescript %s", msg.get("node"),
                             "yes" if msg.get("acorn") else "NO (top-level await/import degraded)",
                             "yes" if msg.get("typescript") else "no")
                    if self.language == "typescript" and not msg.get("typescript"):
                        raise KernelStartError(
                            "TypeScript is not supported by this sandbox's Node.js "
                            f"{msg.get('node', '')} (needs module.stripTypeScriptTypes, Node >= 22.13)")
                    return
            if self.proc.poll() is not None:
                raise KernelStartError(f"node exited with status {self.proc.returncode}: "
                                       + "".join(startup_err)[-2000:])
        raise KernelStartError("timed out waiting for the JavaScript runtime")

    def _read_events(self, timeout, sink_stderr=None, stream=None):
        """Reads what is available; returns parsed control messages.
        Raw stdout/stderr go to stream (or to sink_stderr during startup)."""
        fds = [r.fd for r in self.readers.values() if not r.eof]
        if not fds:
            time.sleep(timeout)
            return []
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):
            return []
        msgs = []
        for name, r in self.readers.items():
            if r.fd not in ready:
                continue
            text = r.read()
            if not text:
                continue
            if name == "ev":
                self.ev_buf += text
                *lines, self.ev_buf = self.ev_buf.split("\n")
                for line in lines:
                    if line.strip():
                        try:
                            msgs.append(json.loads(line))
                        except ValueError:
                            log.warning("jskernel: bad control line %r", line[:200])
            elif stream is not None:
                stream.output(name, text)
            elif sink_stderr is not None and name == "stderr":
                sink_stderr.append(text)
        return msgs

    def _kill_process(self):
        if self.cmd_fd is not None:
            try:
                os.close(self.cmd_fd)
            except OSError:
                pass
            self.cmd_fd = None
        self._terminate_proc(grace=0)
        if self.readers:
            self.readers["ev"].close()
            self.readers = None

    def _begin(self, code, env, stream):
        self.exec_count += 1
        self.cur = self.exec_count
        self.done = False
        stream.emit({"type": "number_of_executions", "execution_count": self.exec_count})
        line = json.dumps({"op": "execute", "id": self.cur, "code": code, "env": env or {}}) + "\n"
        write_all(self.cmd_fd, line.encode("utf-8"), time.monotonic() + 30, self.proc)

    def _pump(self, stream, timeout):
        for msg in self._read_events(timeout, stream=stream):
            self._on_msg(msg, stream)
        if self.done:
            # Raw output written before "done" is already in the pipes.
            for name in ("stdout", "stderr"):
                stream.output(name, self.readers[name].read())
        return self.done

    def _on_msg(self, msg, stream):
        ev = msg.get("ev")
        if ev in ("stdout", "stderr"):
            stream.output(ev, msg.get("text", ""))
            return
        if msg.get("id") != self.cur:
            return
        if ev == "result":
            bundle = msg.get("data") or {}
            stream.emit(bundle_to_result(bundle, msg.get("main", True), strip_quotes=False))
        elif ev == "error":
            stream.emit(error_event(msg.get("name", "Error"), msg.get("value", ""),
                                    msg.get("traceback", "")))
        elif ev == "done":
            self.done = True


# ---------------------------------------------------------------------------
# Bash
# ---------------------------------------------------------------------------

class BashContext(Context):
    language = "bash"

    def __init__(self, server, ctx_id, cwd):
        super().__init__(server, ctx_id, cwd)
        self.readers = None
        self.ctl_buf = ""
        self.ctl_w = None
        self.token = None
        self.result = None
        self.interrupted = False
        self.cell_file = None

    def _send(self, text, deadline=None):
        write_all(self.proc.stdin.fileno(), text.encode("utf-8"),
                  deadline or time.monotonic() + 30, self.proc)

    def _start_process(self):
        ctl_r, ctl_w = os.pipe()
        env = dict(os.environ)
        for k in ("PROMPT_COMMAND", "MAILCHECK", "MAIL", "BASH_ENV", "ENV", "HISTFILE"):
            env.pop(k, None)
        env.update({"PS1": "", "PS2": "", "PS0": "", "PS4": "+ ", "TERM": env.get("TERM", "dumb")})
        try:
            self.proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "--noediting", "-i"], cwd=self.cwd, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(ctl_w,), start_new_session=True)
        except OSError as e:
            os.close(ctl_r)
            os.close(ctl_w)
            raise KernelStartError(f"cannot run bash: {e}") from e
        os.close(ctl_w)
        self.ctl_w = ctl_w  # the number as seen by bash
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.readers = {"ctl": PipeReader(ctl_r),
                        "stdout": PipeReader(self.proc.stdout.fileno()),
                        "stderr": PipeReader(self.proc.stderr.fileno())}
        self.ctl_buf = ""
        self.cell_file = os.path.join(self.server.runtime_dir, f"bash-{self.id}.sh")
        token = secrets.token_hex(8)
        self._send(f"set +o history +m; unset HISTFILE; printf 'READY {token} %s\\n' \"$$\" >&{self.ctl_w}\n")
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for line in self._read(0.1, None):
                if line.startswith(f"READY {token}"):
                    # Discard startup noise ("no job control", prompts).
                    self.readers["stdout"].read()
                    self.readers["stderr"].read()
                    return
            if self.proc.poll() is not None:
                raise KernelStartError(f"bash exited with status {self.proc.returncode}")
        raise KernelStartError("timed out waiting for bash")

    def _read(self, timeout, stream):
        fds = [r.fd for r in self.readers.values() if not r.eof]
        if not fds:
            time.sleep(timeout)
            return []
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):
            return []
        lines = []
        for name in ("stdout", "stderr", "ctl"):
            r = self.readers[name]
            if r.fd not in ready:
                continue
            text = r.read()
            if not text:
                continue
            if name == "ctl":
                self.ctl_buf += text
                *done, self.ctl_buf = self.ctl_buf.split("\n")
                lines.extend(done)
            elif stream is not None:
                if name == "stderr" and self.interrupted and text.strip() == "":
                    continue  # interactive bash echoes a newline on SIGINT
                stream.output(name, text)
        return lines

    def _kill_process(self):
        self._terminate_proc(grace=0)
        if self.readers:
            self.readers["ctl"].close()
            self.readers = None
        if self.cell_file:
            try:
                os.unlink(self.cell_file)
            except OSError:
                pass

    @staticmethod
    def _quote(s):
        return "'" + s.replace("'", "'\\''") + "'"

    def _begin(self, code, env, stream):
        self.exec_count += 1
        stream.emit({"type": "number_of_executions", "execution_count": self.exec_count})
        fd = os.open(self.cell_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(code)
            if not code.endswith("\n"):
                f.write("\n")
        self.token = secrets.token_hex(8)
        self.result = None
        self.interrupted = False
        set_env, restore_env = [], []
        for i, (k, v) in enumerate(sorted((env or {}).items())):
            set_env.append(f"__ci_s{i}=${{{k}+x}}; __ci_v{i}=${{{k}-}}; export {k}={self._quote(v)}; ")
            restore_env.append(f"if [ -n \"$__ci_s{i}\" ]; then export {k}=\"$__ci_v{i}\"; "
                               f"else unset {k}; fi; unset __ci_s{i} __ci_v{i}; ")
        # Line 1 runs the cell (SIGINT aborts this whole line in an interactive
        # shell); line 2 always runs and reports the status.
        self._send(f"__ci_rc=130; {''.join(set_env)}{{ . {self._quote(self.cell_file)}; }} </dev/null; __ci_rc=$?\n"
                   f"{''.join(restore_env)}printf '%s %s\\n' {self.token} \"$__ci_rc\" >&{self.ctl_w}\n")

    def _interrupt(self, attempt):
        self.interrupted = True
        if self.proc is None:
            return
        if attempt == 1:
            kill_group(self.proc.pid, signal.SIGINT)
        else:
            # Something ignores SIGINT: kill the shell's children, keep the shell.
            for pid in descendants(self.proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def _pump(self, stream, timeout):
        for line in self._read(timeout, stream):
            parts = line.split()
            if len(parts) == 2 and parts[0] == self.token:
                try:
                    self.result = int(parts[1])
                except ValueError:
                    self.result = 1
        if self.result is None:
            return False
        for name in ("stdout", "stderr"):
            text = self.readers[name].read()
            if text and not (name == "stderr" and self.interrupted and not text.strip()):
                stream.output(name, text)
        rc = self.result
        if self.interrupted and rc in (130, 137, 143):
            stream.emit(error_event("KeyboardInterrupt", "Execution interrupted"))
        elif rc != 0:
            stream.emit(error_event("ExitCodeError", f"Command exited with code {rc}"))
        return True


# ---------------------------------------------------------------------------
# Registry / server state
# ---------------------------------------------------------------------------

class State:
    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.node = args.node
        self.jskernel = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jskernel.js")
        self.default_cwd = args.cwd
        self.max_contexts = args.max_contexts
        self.child_stderr = None if args.kernel_logs else subprocess.DEVNULL
        self.runtime_dir = tempfile.mkdtemp(prefix="codeinterp-", dir=args.runtime_dir)
        self.lock = threading.Lock()
        self.contexts = {}            # id -> Context, in creation order
        self.defaults = {}            # language -> id
        self.default_locks = {}
        self.ready = threading.Event()
        self.startup_error = None

    def _new(self, language, cwd):
        if language == "python":
            return PythonContext(self, str(uuid.uuid4()), cwd)
        if language in ("javascript", "typescript"):
            return JSContext(self, str(uuid.uuid4()), cwd, language)
        if language == "bash":
            return BashContext(self, str(uuid.uuid4()), cwd)
        raise ApiError(400, f"Unsupported language '{language}'")

    def create(self, language, cwd):
        cwd = cwd or self.default_cwd
        if not isinstance(cwd, str):
            raise ApiError(400, "'cwd' must be a string")
        cwd = os.path.expanduser(cwd)
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.default_cwd, cwd)
        if not os.path.isdir(cwd):
            raise ApiError(400, f"cwd '{cwd}' does not exist or is not a directory")
        if not os.access(cwd, os.X_OK):
            raise ApiError(400, f"cwd '{cwd}' is not accessible to uid {os.getuid()}")
        with self.lock:
            if len(self.contexts) >= self.max_contexts:
                raise ApiError(429, f"Too many contexts (limit {self.max_contexts}); "
                                    "delete unused contexts first")
            ctx = self._new(language, cwd)
            self.contexts[ctx.id] = ctx
        try:
            ctx.start()
        except KernelStartError as e:
            with self.lock:
                self.contexts.pop(ctx.id, None)
            status = 400 if language == "typescript" and "not supported" in str(e) else 500
            raise ApiError(status, f"Failed to create {language} context: {e}") from e
        log.info("created %s context %s (cwd %s)", language, ctx.id, cwd)
        return ctx

    def get(self, ctx_id):
        with self.lock:
            return self.contexts.get(ctx_id)

    def default(self, language):
        with self.lock:
            lock = self.default_locks.setdefault(language, threading.Lock())
        with lock:
            with self.lock:
                ctx = self.contexts.get(self.defaults.get(language))
            if ctx is not None:
                return ctx
            ctx = self.create(language, self.default_cwd)
            with self.lock:
                self.defaults[language] = ctx.id
            return ctx

    def remove(self, ctx_id):
        with self.lock:
            ctx = self.contexts.pop(ctx_id, None)
            for lang, did in list(self.defaults.items()):
                if did == ctx_id:
                    del self.defaults[lang]
        if ctx is not None:
            ctx.close()
        return ctx

    def list(self):
        with self.lock:
            return [c.info() for c in self.contexts.values() if not c.start_error]

    def startup(self, with_js):
        def start_js():
            try:
                self.default("javascript")
            except Exception as e:  # noqa: BLE001
                log.warning("default JavaScript context not started: %s", e)

        js = threading.Thread(target=start_js, daemon=True) if with_js else None
        if js:
            js.start()
        t0 = time.monotonic()
        delay = 1.0
        while True:
            try:
                self.default("python")
                break
            except Exception as e:  # noqa: BLE001
                self.startup_error = f"default Python context failed to start: {e}"
                log.error("%s; retrying in %.0fs", self.startup_error, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
        self.startup_error = None
        if js:
            js.join(START_TIMEOUT)
        self.ready.set()
        log.info("ready in %.2fs", time.monotonic() - t0)

    def shutdown(self):
        with self.lock:
            ctxs = list(self.contexts.values())
            self.contexts.clear()
        for c in ctxs:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------

CTX_PATH = re.compile(r"^/contexts/([^/]+)(/restart|/interrupt)?/?$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agentvm-codeinterp/1"
    timeout = IDLE_CONN_TIMEOUT
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
        ctx = self.state.create(language, body.get("cwd") or None)
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
            self.connection.settimeout(STREAM_WRITE_TIMEOUT)
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
                if stream.gone:
                    self.close_connection = True
            try:
                self.connection.settimeout(self.timeout)
            except OSError:
                pass
            log.info("executed in %s context %s: %.3fs%s", ctx.language, ctx.id,
                     time.monotonic() - t0,
                     " (client gone)" if stream.gone else " (timed out)" if stream.timed_out else "")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        log.debug("connection error from %s", client_address, exc_info=True)


def main(argv=None):
    global KEEPALIVE_INTERVAL, INTERRUPT_GRACE
    p = argparse.ArgumentParser(description="agentvm code interpreter server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=49999)
    p.add_argument("--cwd", default=None, help="default working directory (default: $HOME)")
    p.add_argument("--python", default=sys.executable, help="interpreter for Python kernels")
    p.add_argument("--node", default=os.environ.get("CODEINTERP_NODE", "node"))
    p.add_argument("--max-contexts", type=int, default=64)
    p.add_argument("--max-body-bytes", type=int, default=10 * 1024 * 1024)
    p.add_argument("--runtime-dir", default=os.environ.get("XDG_RUNTIME_DIR") or None,
                   help="parent of the private directory for kernel sockets")
    p.add_argument("--no-default-js", action="store_true",
                   help="do not start the default JavaScript context at startup")
    p.add_argument("--kernel-logs", action="store_true", help="pass kernels' stderr through")
    p.add_argument("--log-level", default=os.environ.get("CODEINTERP_LOG_LEVEL", "INFO"))
    p.add_argument("--keepalive-seconds", type=float, default=KEEPALIVE_INTERVAL,
                   help=argparse.SUPPRESS)
    p.add_argument("--interrupt-grace-seconds", type=float, default=INTERRUPT_GRACE,
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    KEEPALIVE_INTERVAL = max(0.05, args.keepalive_seconds)
    INTERRUPT_GRACE = max(0.5, args.interrupt_grace_seconds)

    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cwd is None:
        home = os.path.expanduser("~")
        args.cwd = home if os.path.isdir(home) else os.getcwd()
    args.cwd = os.path.abspath(args.cwd)
    if args.node and os.sep not in args.node:
        args.node = shutil.which(args.node) or args.node

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    Server.address_family = family
    httpd = Server((args.host, args.port), Handler)
    state = State(args)
    Handler.state = state
    log.info("listening on %s:%d (cwd %s)", args.host, httpd.server_address[1], args.cwd)

    def on_term(signum, frame):
        raise SystemExit(0)

    # Children must be interruptible even if we were started with SIGINT
    # ignored (e.g. as a background job of a non-interactive shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    threading.Thread(target=state.startup, args=(not args.no_default_js,), daemon=True).start()
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
