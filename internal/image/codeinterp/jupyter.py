"""Contexts backed by a Jupyter kernel (Python's ipykernel, R's IRkernel),
driven over ZeroMQ ipc:// sockets in the server's private directory.

A subclass names the kernel's command line and says in the kernel's own
language how to set and restore environment variables and reseed."""

import json
import logging
import os
import secrets
import subprocess
import time

import common
from common import KernelStartError, bundle_to_result, create_private, error_event, now_iso
from contexts import Context

log = logging.getLogger("codeinterp")


SPARE_NICE = 10


def unnice(pid):
    """Gives every thread of process pid the normal priority again (a spare's
    threads start at SPARE_NICE).  Only root may; otherwise it stays."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 0)
        except (OSError, ValueError):
            pass


class JupyterContext(Context):
    kernel_name = "?"

    def __init__(self, server, ctx_id, cwd):
        super().__init__(server, ctx_id, cwd)
        import zmq  # noqa: F401 - fail early with a clear error if missing
        from jupyter_client.session import Session  # noqa: F401
        self.sockets = None
        self.files = []
        self.msg_id = None
        self.partial = None  # a stream's unfinished line, held (_hold_tail)
        self.partial_until = 0.0

    # -- to implement ---------------------------------------------------------
    def _kernel_command(self, conn_file):
        raise NotImplementedError

    def _kernel_env(self, env):
        """Adjusts the kernel's environment (a copy of the server's)."""

    def _after_start(self):
        """Runs once the kernel answers (setup code)."""

    # -- process ----------------------------------------------------------------
    def _start_process(self):
        import zmq
        from jupyter_client.session import Session

        # No message signing: the ipc sockets live in a private 0700
        # directory of the kernel's user, so only that user (and root) can
        # reach them, and an HMAC over every message costs real time under
        # emulation.
        key = ""
        tag = f"{self.kernel_name}-{secrets.token_hex(4)}"
        prefix = os.path.join(self._rundir(), tag)
        ports = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
        conn = dict(ports, ip=prefix, key=key, transport="ipc",
                    signature_scheme="hmac-sha256", kernel_name=self.kernel_name)
        conn_file = prefix + ".json"
        with os.fdopen(create_private(conn_file), "w") as f:
            self._own(f.fileno())
            json.dump(conn, f)
        self.files = [conn_file] + [f"{prefix}-{p}" for p in ports.values()]

        env = dict(os.environ)
        as_user = self._as_user(env)
        self._kernel_env(env)
        # A spare starts at a low priority, so that it does not slow the runs
        # of the contexts it is for (restored by unnice when one takes it).
        nice = ["nice", "-n", str(SPARE_NICE)] if self.is_spare else []
        self.proc = subprocess.Popen(nice + self._kernel_command(conn_file), cwd=self.cwd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.server.child_stderr, start_new_session=True,
                                     **as_user)

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
        self._handshake(time.monotonic() + common.START_TIMEOUT)
        self._after_start()

    def _adopt(self, spare):
        with spare.exec_lock:
            self.proc, self.sockets, self.files = spare.proc, spare.sockets, spare.files
            self.session = spare.session
            spare.proc, spare.sockets, spare.files = None, None, []
        self.seen_machine_id = spare.seen_machine_id
        self.msg_id, self.partial = None, None
        unnice(self.proc.pid)
        if self.cwd != spare.cwd:
            reply = self._silent(self._enter_code(self.cwd), common.START_TIMEOUT)
            if reply is None or reply.get("status") != "ok":
                raise KernelStartError(f"could not enter {self.cwd}: "
                                       + str((reply or {}).get("evalue", "no reply")))
        log.info("context %s: took the spare %s kernel (pid %d)", self.id, self.language,
                 self.proc.pid)

    def _enter_code(self, cwd):
        """Code that moves the kernel into cwd (a subclass with spares)."""
        raise NotImplementedError

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
                raise KernelStartError(f"the {self.language} kernel exited with status "
                                       f"{self.proc.returncode}")
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
        raise KernelStartError(f"timed out waiting for the {self.language} kernel to become ready")

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

    def _setup(self, code, what):
        """Runs setup code silently; a failure is logged and its reason
        returned (None when it worked)."""
        reply = self._silent(code, 30)
        if reply is None or reply.get("status") != "ok":
            why = (reply or {}).get("evalue", "no reply")
            log.warning("%s context %s: %s failed: %s", self.language, self.id, what, why)
            return why
        return None

    # -- execution ----------------------------------------------------------------
    def _begin(self, code, env, stream):
        self.partial = None
        if env:
            why = self._setup(self._set_env_code(env), "setting the run's env")
            if why:
                stream.output("stderr", f"[codeinterp] the run's env vars could not be set: {why}\n")
        shell = self.sockets[0]
        msg = self.session.send(shell, "execute_request", {
            "code": code, "silent": False, "store_history": True,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
        self.msg_id = msg["header"]["msg_id"]
        self.idle_at = None
        self.replied = False

    def _finish(self, env, stream):
        if env and self.alive():
            self._setup(self._restore_env_code(), "restoring the env")

    def _apply_global_env(self, env, unset):
        self._setup(self._global_env_code(env, unset), "setting the sandbox's env")

    def _pump(self, stream, timeout):
        import zmq
        shell, iopub, poller = self.sockets
        events = dict(poller.poll(int(timeout * 1000)))
        if iopub in events:
            # Adjacent stream messages that are already queued are merged
            # (a kernel may split one print() into several messages), and
            # a line's start waits a moment for its end (IPython's `!pwd`
            # sends "/home/user" and its newline apart: two log entries
            # under load).
            held = pending = self.partial
            self.partial = None
            while True:
                _, msg = self.session.recv(iopub, mode=zmq.NOBLOCK)
                if msg is None:
                    break
                if msg["parent_header"].get("msg_id") != self.msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    name = "stderr" if msg["content"].get("name") == "stderr" else "stdout"
                    text = msg["content"].get("text") or ""
                    if pending is not None and pending["type"] == name \
                            and len(pending["text"]) < common.MERGE_TEXT_LIMIT:
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
                self._hold_tail(pending, pending is held, stream)
        if shell in events:
            while True:
                _, msg = self.session.recv(shell, mode=zmq.NOBLOCK)
                if msg is None:
                    break
                if msg["parent_header"].get("msg_id") == self.msg_id:
                    self._flush_partial(stream)
                    self._on_reply(msg["content"], stream)
        done = False
        if self.idle_at is not None:
            # The reply normally precedes idle; don't wait long for it.
            done = self.replied or time.monotonic() - self.idle_at > 1.0
        self._flush_partial(stream, done or not self.alive())
        return done

    def _hold_tail(self, pending, continued, stream):
        """Sends pending up to its last line end and holds the rest, an
        unfinished line, for its end: at most LINE_WAIT from when the line
        was first held (output that never ends a line, progress dots, still
        goes out every LINE_WAIT); continued: pending is the line held
        before, with what came since."""
        text = pending["text"]
        cut = text.rfind("\n") + 1
        if cut == len(text) or len(text) >= common.MERGE_TEXT_LIMIT:
            stream.emit(pending)
            return
        held_since = self.partial_until if continued else None
        if cut > 0:
            stream.emit(dict(pending, text=text[:cut]))
            pending = dict(pending, text=text[cut:])
            held_since = None  # a new line starts here
        self.partial = pending
        self.partial_until = held_since or time.monotonic() + common.LINE_WAIT

    def _flush_partial(self, stream, now=True):
        """Emits a held line start once its wait is over (or now)."""
        if self.partial is not None and (now or time.monotonic() >= self.partial_until):
            stream.emit(self.partial)
            self.partial = None

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
