"""Bash contexts: one persistent interactive bash each, driven over its
stdin with a control pipe for the end of each cell."""

import logging
import os
import secrets
import signal
import subprocess
import time

import common
from common import (KernelStartError, PipeReader, create_private, descendants, error_event, kill_group,
                    read_pipes, write_all)
from contexts import Context

log = logging.getLogger("codeinterp")


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
                pass_fds=(ctl_w,), start_new_session=True, **self._as_user(env))
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
        self.cell_file = os.path.join(self._rundir(), f"bash-{self.id}.sh")
        token = secrets.token_hex(8)
        self._send(f"set +o history +m; unset HISTFILE MAILCHECK PROMPT_COMMAND; "
                   f"builtin printf 'READY {token} %s\\n' \"$$\" >&{self.ctl_w}\n")
        deadline = time.monotonic() + common.START_TIMEOUT
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
        lines, self.ctl_buf, raw = read_pipes(self.readers, "ctl", self.ctl_buf, timeout)
        for name, text in raw:
            if stream is None:
                continue
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

    def _reseed(self, first):
        # Assigning RANDOM seeds bash's generator ($SRANDOM, bash >= 5.1,
        # reads getrandom() and needs nothing).
        self._send(f"RANDOM={secrets.randbelow(1 << 31)}\n")

    def _apply_global_env(self, env, unset):
        parts = [f"builtin unset {k}; " for k in unset]
        parts += [f"builtin export {k}={self._quote(v)}; " for k, v in sorted(env.items())]
        if parts:
            self._send("".join(parts) + "\n")

    def _begin(self, code, env, stream):
        self.exec_count += 1
        stream.emit({"type": "number_of_executions", "execution_count": self.exec_count})
        with os.fdopen(create_private(self.cell_file), "w", encoding="utf-8") as f:
            self._own(f.fileno())
            f.write(code)
            if not code.endswith("\n"):
                f.write("\n")
        self.token = secrets.token_hex(8)
        self.result = None
        self.interrupted = False
        set_env, restore_env = [], []
        for i, (k, v) in enumerate(sorted((env or {}).items())):
            set_env.append(f"__ci_s{i}=${{{k}+x}}; __ci_v{i}=${{{k}-}}; builtin export {k}={self._quote(v)}; ")
            restore_env.append(f"if [ -n \"$__ci_s{i}\" ]; then builtin export {k}=\"$__ci_v{i}\"; "
                               f"else builtin unset {k}; fi; builtin unset __ci_s{i} __ci_v{i}; ")
        # Line 1 runs the cell (SIGINT aborts this whole line in an interactive
        # shell); line 2 always runs and reports the status.
        self._send(f"__ci_rc=130; {''.join(set_env)}{{ builtin . {self._quote(self.cell_file)}; }} </dev/null; "
                   f"__ci_rc=$?\n"
                   f"{''.join(restore_env)}builtin printf '%s %s\\n' {self.token} \"$__ci_rc\" >&{self.ctl_w}\n")

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
