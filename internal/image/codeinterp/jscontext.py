"""JavaScript / TypeScript contexts: a node process running jskernel.js,
driven over two pipes (commands in, JSON events out)."""

import json
import logging
import os
import subprocess
import time

import common
from common import KernelStartError, PipeReader, bundle_to_result, error_event, read_pipes, write_all
from contexts import Context

log = logging.getLogger("codeinterp")


class JSContext(Context):
    """A node process running jskernel.js (JavaScript, or TypeScript where
    node can strip types).

    Random state after a snapshot: a context that has not run user code yet
    (such as the default one, warmed before a template is saved) is
    restarted when the machine id changes.  One that has run code keeps its
    state, and with it the random state of the VM it was copied from:
    V8's Math.random cannot be reseeded, and node exposes no way to reseed
    OpenSSL's DRBG (no RAND_add/RAND_poll binding; checked on node 20 /
    OpenSSL 3.0).  OpenSSL reseeds its DRBGs on a pid change, after a number
    of requests, or when the last reseed is older than its time interval
    (minutes to an hour), not when a VM is cloned, so crypto.randomBytes,
    crypto.randomUUID (which also caches bytes for 128 UUIDs) and
    crypto.randomInt can repeat across copies for a while.  Code that needs
    unique values in forked VMs should restart its context first.
    """

    language = "javascript"
    reseed_on_first_execution = False
    restart_if_unused_on_new_machine = True

    def __init__(self, server, ctx_id, cwd, language="javascript"):
        super().__init__(server, ctx_id, cwd)
        self.language = language
        self.cmd_fd = None
        self.readers = None
        self.ev_buf = ""
        self.kernel_info = {}
        self.cur = None
        self.done = False

    # node's --expose-internals gives jskernel.js node's own acorn parser.
    node_flags = ["--expose-internals"]

    def _start_process(self):
        try:
            self._start_node(JSContext.node_flags)
        except KernelStartError as e:
            if not JSContext.node_flags or "bad option" not in str(e):
                raise
            log.warning("node does not accept %s; starting without", " ".join(JSContext.node_flags))
            JSContext.node_flags = []
            self._kill_process()
            self._start_node([])

    def _start_node(self, flags):
        self._start_pipes([self.server.node, *flags, self.server.jskernel],
                          {"CODEINTERP_LANG": self.language}, "node")

    def _on_ready(self, msg):
        log.info("javascript runtime: node %s, acorn %s, typescript %s", msg.get("node"),
                 "yes" if msg.get("acorn") else "NO (top-level await/import degraded)",
                 ("tsc " + msg["tsc"]) if msg.get("tsc") else
                 "yes" if msg.get("typescript") else "no")
        if self.language == "typescript" and not msg.get("typescript"):
            raise KernelStartError(
                "TypeScript is not supported by this sandbox's Node.js "
                f"{msg.get('node', '')} (needs module.stripTypeScriptTypes, Node >= 22.13, "
                "or the typescript package, Debian's node-typescript)")

    def _start_pipes(self, argv, extra_env, what):
        """Starts a runtime that speaks jskernel.js's protocol on two pipes
        (their fds in $CODEINTERP_FDS) and waits for its ready event."""
        cmd_r, cmd_w = os.pipe()
        ev_r, ev_w = os.pipe()
        for fd in (cmd_r, ev_w):
            # The runtime may reopen them (/proc/self/fd/N): a pipe answers
            # only its owner.
            self._own(fd)
        env = dict(os.environ)
        env.update(extra_env)
        env["CODEINTERP_FDS"] = f"{cmd_r},{ev_w}"
        try:
            self.proc = subprocess.Popen(
                argv, cwd=self.cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(cmd_r, ev_w), start_new_session=True, **self._as_user(env))
        except OSError as e:
            for fd in (cmd_r, cmd_w, ev_r, ev_w):
                os.close(fd)
            raise KernelStartError(f"cannot run {what} ({argv[0]}): {e}") from e
        os.close(cmd_r)
        os.close(ev_w)
        os.set_blocking(cmd_w, False)
        self.cmd_fd = cmd_w
        self.readers = {"ev": PipeReader(ev_r),
                        "stdout": PipeReader(self.proc.stdout.fileno()),
                        "stderr": PipeReader(self.proc.stderr.fileno())}
        self.ev_buf = ""
        deadline = time.monotonic() + common.START_TIMEOUT
        startup_err = []
        while time.monotonic() < deadline:
            for msg in self._read_events(0.1, startup_err):
                if msg.get("ev") == "ready":
                    self.kernel_info = msg
                    self._on_ready(msg)
                    return
            if self.proc.poll() is not None:
                startup_err.append(self.readers["stderr"].read())
                raise KernelStartError(f"{what} exited with status {self.proc.returncode}: "
                                       + "".join(startup_err)[-2000:].strip())
        raise KernelStartError(f"timed out waiting for the {self.language} runtime")

    def _read_events(self, timeout, sink_stderr=None, stream=None):
        """Reads what is available; returns parsed control messages.
        Raw stdout/stderr go to stream (or to sink_stderr during startup)."""
        lines, self.ev_buf, raw = read_pipes(self.readers, "ev", self.ev_buf, timeout)
        for name, text in raw:
            if stream is not None:
                stream.output(name, text)
            elif sink_stderr is not None and name == "stderr":
                sink_stderr.append(text)
        msgs = []
        for line in lines:
            if line.strip():
                try:
                    msgs.append(json.loads(line))
                except ValueError:
                    log.warning("jskernel: bad control line %r", line[:200])
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

    def _reseed(self, first):
        log.warning("context %s: the machine id changed but the JavaScript context has state; "
                    "Math.random and crypto continue the copied random state", self.id)

    def _apply_global_env(self, env, unset):
        line = json.dumps({"op": "setenv", "env": env, "unset": unset}) + "\n"
        write_all(self.cmd_fd, line.encode("utf-8"), time.monotonic() + 30, self.proc)

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
