"""Python contexts: one ipykernel each, driven over ZeroMQ ipc:// sockets.

Each kernel also runs kernel_module.py (as the private module
_agentvm_codeinterp): env var handling, reseeding, charts and data for
results."""

import json
import logging
import os
import secrets
import subprocess
import time

import common
from common import KernelStartError, bundle_to_result, error_event, now_iso
from contexts import Context

log = logging.getLogger("codeinterp")

KERNEL_MODULE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_module.py")

_BOOTSTRAP = '''\
def __codeinterp_bootstrap(src, filename):
    import sys, types
    m = types.ModuleType("_agentvm_codeinterp")
    m.__file__ = filename
    exec(compile(src, filename, "exec"), m.__dict__)
    sys.modules[m.__name__] = m
    m.install(get_ipython())
try:
    __codeinterp_bootstrap(%r, %r)
finally:
    del __codeinterp_bootstrap
'''
_bootstrap_code = None


def kernel_bootstrap():
    """Code that installs kernel_module.py's source in a kernel (read once)."""
    global _bootstrap_code
    if _bootstrap_code is None:
        with open(KERNEL_MODULE_PATH, encoding="utf-8") as f:
            _bootstrap_code = _BOOTSTRAP % (f.read(), KERNEL_MODULE_PATH)
    return _bootstrap_code


class PythonContext(Context):
    language = "python"

    def __init__(self, server, ctx_id, cwd, preload=()):
        super().__init__(server, ctx_id, cwd)
        import zmq  # noqa: F401 - fail early with a clear error if missing
        from jupyter_client.session import Session  # noqa: F401
        self.preload = list(preload)
        self.sockets = None
        self.files = []
        self.msg_id = None

    # -- process ----------------------------------------------------------------
    def _start_process(self):
        import zmq
        from jupyter_client.session import Session

        # No message signing: the ipc sockets live in the server's private
        # 0700 directory, so only this user (and root) can reach them, and an
        # HMAC over every message costs real time under emulation.
        key = ""
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
        self._handshake(time.monotonic() + common.START_TIMEOUT)
        reply = self._silent(kernel_bootstrap(), common.START_TIMEOUT)
        if reply is None or reply.get("status") != "ok":
            log.warning("python context %s: setup code failed: %s", self.id,
                        (reply or {}).get("evalue", "no reply"))
        if self.preload:
            t0 = time.monotonic()
            self._silent("__import__('_agentvm_codeinterp').preload(%r)" % (self.preload,), common.START_TIMEOUT)
            log.info("python context %s: preloaded %s in %.2fs", self.id, ",".join(self.preload),
                     time.monotonic() - t0)

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
    def _reseed(self, first):
        self._silent("__import__('_agentvm_codeinterp').reseed()", 30)

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

    def _apply_global_env(self, env, unset):
        self._silent("__import__('_agentvm_codeinterp').set_global_env(%r, %r)" % (env, unset), 30)
