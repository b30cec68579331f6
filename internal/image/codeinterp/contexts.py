"""Execution plumbing: the streamed response of one /execute request
(Stream) and the life cycle shared by all contexts (Context).  The
contexts of each language are in pycontext.py, rcontext.py, jscontext.py,
javacontext.py and bashcontext.py."""

import logging
import os
import signal
import socket
import subprocess
import threading
import time

import common
from common import KernelStartError, dumps, error_event, kill_group, now_iso, wait_fds

log = logging.getLogger("codeinterp")


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
        self.gone = False         # writes fail: nothing more reaches the client
        self.peer_closed = False  # the client ended its side (it may still read)
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
        if ev.get("type") in ("stdout", "stderr") and len(ev.get("text", "")) > common.MAX_TEXT_EVENT:
            text = ev["text"]
            for i in range(0, len(text), common.MAX_TEXT_EVENT):
                self.send(dict(ev, text=text[i:i + common.MAX_TEXT_EVENT]))
            return
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
        if not self.can_peek or self.gone or self.peer_closed:
            return False
        try:
            if not wait_fds([self.sock.fileno()], 0):
                return False
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            if data == b"":
                # The client closed its side: it is gone, or it half-closed
                # and still reads.  (Writes cannot tell: the guest agent's
                # relay keeps reading after the host closes its stream.)
                # The run is interrupted and its stream still ends properly.
                log.info("client closed the connection during the execution")
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
        if self._peer_closed():
            self.peer_closed = True
        if not self.gone and now - self.last_write >= common.KEEPALIVE_INTERVAL:
            self.send({"type": "keepalive"})
        if self.gone or self.peer_closed:
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
    """A persistent execution environment backed by one child process.

    Random state: a context may be started before a VM snapshot is taken,
    and every VM restored or forked from it then holds a copy of the same
    process.  Before each execution the context compares /etc/machine-id
    (which the guest agent rewrites for each VM) with the value it saw last;
    on a change it restarts itself if it never ran user code
    (restart_if_unused_on_new_machine) or else calls _reseed().  Subclasses
    with reseed_on_first_execution also reseed before their first execution.
    """

    language = "?"
    reseed_on_first_execution = True
    restart_if_unused_on_new_machine = False

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
        self.genv_version, self.genv = None, {}
        self.seen_machine_id = None  # None: reseed before the next execution
        self.ran_user_code = False
        self.user = None  # pwd entry of the user the process runs as; None: the server's
        self.is_spare = False  # a kernel started ahead (State.take_spare), not a context

    def info(self):
        out = {"id": self.id, "language": self.language, "cwd": self.cwd}
        out["user"] = self.user.pw_name if self.user else self.server.own_user
        return out

    # -- the process's user ------------------------------------------------------
    def _as_user(self, env):
        """Popen arguments that run the process as the context's user (and
        that user's HOME, USER and LOGNAME in env)."""
        pw = self.user
        if pw is None:
            return {}
        env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
        if pw.pw_uid == os.getuid():
            return {}
        return {"user": pw.pw_uid, "group": pw.pw_gid,
                "extra_groups": os.getgrouplist(pw.pw_name, pw.pw_gid)}

    def _own(self, fd):
        """Gives an open file the server made to the context's user."""
        if self.user is not None and self.user.pw_uid != os.getuid():
            os.fchown(fd, self.user.pw_uid, self.user.pw_gid)

    def _rundir(self):
        """The private directory for this user's sockets and files."""
        return self.server.user_runtime_dir(self.user)

    # -- lifecycle ----------------------------------------------------------
    def start(self):
        """Starts the process; blocks until ready.  Raises KernelStartError."""
        try:
            with self.exec_lock:
                self._spawn()
                if self.closed:  # deleted while it started: close() may have given up
                    self._kill_process()
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
                    self._spawn()
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
        def gave_up(reason, what):
            if reason == "timeout":
                stream.notes.append(f"the context was still {what}")
            else:
                stream.emit(error_event("ClientDisconnected", "The client closed the connection "
                                        f"while the context was {what}; the code did not run"))

        while not self.ready.wait(0.2):
            reason = stream.poll()
            if reason in ("timeout", "disconnect"):
                gave_up(reason, "starting")
                return
        if self.start_error:
            stream.emit(error_event("ContextError", f"Context failed to start: {self.start_error}"))
            return
        while not self.exec_lock.acquire(timeout=0.2):
            reason = stream.poll()
            if reason in ("timeout", "disconnect"):
                gave_up(reason, "busy with a previous execution")
                return
        try:
            if self.closed:
                stream.emit(error_event("ContextNotFound", f"Context {self.id} was deleted"))
                return
            self.active_stream = stream
            self._execute_locked(code, env, stream)
        except Exception as e:  # noqa: BLE001 - never let a request kill the server
            log.exception("execution failed in context %s", self.id)
            self._flush_partial(stream)
            stream.emit(error_event("InternalError", f"{e.__class__.__name__}: {e}"))
        finally:
            self.active_stream = None
            self.exec_lock.release()

    def _execute_locked(self, code, env, stream):
        machine_id = self.server.machine_id()
        if machine_id != self.seen_machine_id and self.restart_if_unused_on_new_machine \
                and self.seen_machine_id is not None and not self.ran_user_code and self.alive():
            # Started before a snapshot this VM was restored or forked from:
            # a new process gets fresh random state, and nothing is lost.
            log.info("context %s: new machine id; restarting the unused %s context",
                     self.id, self.language)
            self.needs_restart = True
        if self.needs_restart or not self.alive():
            was_dead = not self.alive()
            self._kill_process()
            self._spawn()
            self.needs_restart = False
            if was_dead:
                stream.output("stderr", f"[codeinterp] the {self.language} context had stopped; "
                                        "it was restarted and its previous state is lost\n")
        try:
            genv = self.server.global_env()
            if genv is not None and genv[0] != self.genv_version:
                unset = sorted(k for k in self.genv if k not in genv[1])
                if genv[1] or unset:
                    self._apply_global_env(genv[1], unset)
                self.genv_version, self.genv = genv
            machine_id = self.server.machine_id()
            if machine_id != self.seen_machine_id:
                self._reseed(self.seen_machine_id is None)
                self.seen_machine_id = machine_id
            self.ran_user_code = True
            self._begin(code, env, stream)
        except OSError:
            if self.alive():
                raise
            # died while receiving the code: reported by the loop below
        reason = None
        t_abort = t_intr = 0.0
        while True:
            if self._pump(stream, 0.05 if reason else 0.1):
                break
            if not self.alive():
                self.needs_restart = True
                self._flush_partial(stream)
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
                if now - t_abort > common.INTERRUPT_GRACE:
                    log.warning("context %s ignored interrupts; killing it", self.id)
                    self.needs_restart = True
                    self._flush_partial(stream)
                    self._kill_process()
                    msg = (f"the {self.language} context did not respond to interrupts within "
                           f"{common.INTERRUPT_GRACE:.0f} s and was restarted; its state is lost")
                    if stream.timed_out:
                        stream.notes.append(msg)
                    else:
                        stream.emit(error_event("KernelRestarted", msg[0].upper() + msg[1:]))
                    return
                if now - t_intr > common.REINTERRUPT_EVERY:
                    self._interrupt(2)
                    t_intr = now
        self._finish(env, stream)

    def _spawn(self):
        self.genv_version, self.genv = None, {}
        self.ran_user_code = False
        # A new process has fresh random state: it needs no reseeding unless
        # the machine changes (read before starting, so that a snapshot taken
        # while it starts counts as a change).
        self.seen_machine_id = None if self.reseed_on_first_execution else self.server.machine_id()
        spare = self.server.take_spare(self)
        if spare is not None:
            try:
                self._adopt(spare)
                return
            except Exception as e:  # noqa: BLE001 - a new process instead
                log.warning("context %s: the spare kernel could not be used (%s); starting one",
                            self.id, e)
                self._kill_process()
        self._start_process()

    # -- to implement ------------------------------------------------------------
    def _start_process(self):
        raise NotImplementedError

    def _adopt(self, spare):
        """Takes over the started process of spare (State.take_spare), in
        this context's cwd."""
        raise NotImplementedError

    def _apply_global_env(self, env, unset):
        """Sets sandbox-wide variables (--env-file) persistently."""
        raise NotImplementedError

    def _reseed(self, first):
        """Gives the process fresh pseudo-random state (see the class doc);
        first: before the first execution rather than on a new machine."""

    def _kill_process(self):
        raise NotImplementedError

    def _begin(self, code, env, stream):
        raise NotImplementedError

    def _pump(self, stream, timeout):
        raise NotImplementedError

    def _flush_partial(self, stream, now=True):
        """Emits output a context holds back (jupyter.py: a line's start)."""

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
        # (An already reaped process's group is not signalled: its pid may
        # have been reused.)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if f:
                    f.close()
            except OSError:
                pass
