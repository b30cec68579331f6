"""Shared pieces of the code interpreter: constants, errors, event helpers
and process/pipe utilities (see server.py for the overview)."""

import codecs
import datetime
import json
import logging
import math
import os
import re
import select
import time

log = logging.getLogger("codeinterp")

# Tunables: main() may override them, so other modules read them as
# common.NAME at the time of use (not with "from common import NAME").
KEEPALIVE_INTERVAL = 5.0     # seconds of silence before a keepalive line
INTERRUPT_GRACE = 10.0       # seconds to wait for an interrupted context
REINTERRUPT_EVERY = 2.0      # re-send SIGINT this often during the grace
STREAM_WRITE_TIMEOUT = 60.0  # a client not reading for this long is gone
IDLE_CONN_TIMEOUT = 600.0    # keep-alive connections idle for this long close
START_TIMEOUT = 180.0        # seconds for a kernel to become ready (slow under emulation)
MAX_TEXT_EVENT = 1 << 20     # longer stdout/stderr texts are split into several events
MERGE_TEXT_LIMIT = 256 << 10  # adjacent Python stream messages are merged up to this
LINE_WAIT = 0.5  # s a stream's unfinished line waits (from its first byte) for its end

LANG_ALIASES = {
    "": "python", "python": "python", "python3": "python", "py": "python",
    "javascript": "javascript", "js": "javascript", "node": "javascript",
    "typescript": "typescript", "ts": "typescript",
    "bash": "bash", "sh": "bash", "shell": "bash",
    "r": "r",
    "java": "java",
}
KNOWN_UNAVAILABLE = {"deno"}
SUPPORTED = "python, javascript/js, typescript/ts, r, java, bash"
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
                            f"(supported: {SUPPORTED})")
    raise ApiError(400, f"Unsupported language '{language}' (supported: {SUPPORTED})")


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


def wait_fds(fds, timeout, events=select.POLLIN):
    """The subset of fds that are ready (or hung up/errored) within timeout
    seconds.  poll(), not select(): fds may be above FD_SETSIZE."""
    p = select.poll()
    for fd in fds:
        p.register(fd, events)
    try:
        return {fd for fd, _ in p.poll(max(0, int(timeout * 1000)))}
    except InterruptedError:
        return set()


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



class PipeReader:
    """Non-blocking reader with incremental UTF-8 decoding."""

    def __init__(self, fd):
        self.fd = fd
        os.set_blocking(fd, False)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.eof = False

    def read(self, limit=1 << 20):
        chunks = []
        total = 0
        while not self.eof and total < limit:
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
            total += len(b)
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


def read_pipes(readers, control, buf, timeout):
    """Waits up to timeout for a runtime's pipes (readers: name ->
    PipeReader) and reads what came.  Returns the complete lines of the
    control pipe, the rest of its last line (buf is the rest from the call
    before), and (name, text) of the other pipes, in readers' order."""
    fds = [r.fd for r in readers.values() if not r.eof]
    if not fds:
        time.sleep(timeout)
        return [], buf, []
    ready = wait_fds(fds, timeout)
    lines, raw = [], []
    for name, r in readers.items():
        if r.fd not in ready:
            continue
        text = r.read()
        if not text:
            continue
        if name == control:
            buf += text
            *done, buf = buf.split("\n")
            lines.extend(done)
        else:
            raw.append((name, text))
    return lines, buf, raw


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
        wait_fds([fd], 0.1, select.POLLOUT)


def create_private(path, mode=0o600):
    """Opens a new regular file at path for writing, replacing what was
    there without following a symlink: path may lie in a directory of
    another user's, who could plant one (the server runs as root)."""
    for _ in range(10):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue  # something was created in between: again
    raise OSError(f"cannot create {path}: it keeps being recreated")


def read_machine_id(path):
    """The content of /etc/machine-id (path), or "" when unreadable.  It
    changes when a VM is restored from a template or forked, which is how
    contexts notice that their pseudo-random state is shared."""
    try:
        with open(path, "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""
