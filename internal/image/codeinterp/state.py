"""The server's state: its contexts (by id, and the default one per
language), the users they run as, the sandbox-wide environment and the
machine id (see server.py for the overview)."""

import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import common
from common import ENV_NAME_RE, ApiError, KernelStartError, read_machine_id
from bashcontext import BashContext
from javacontext import JavaContext
from jscontext import JSContext
from pycontext import PythonContext
from rcontext import RContext

log = logging.getLogger("codeinterp")

SPARE_RETRY = 30.0  # seconds without new spares after one failed to start


def _user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _can_enter(path, pw):
    """Whether pw's user (None: this process's) may enter directory path."""
    if pw is None or pw.pw_uid == os.getuid():
        return os.access(path, os.X_OK)
    r = subprocess.run(["test", "-x", path], user=pw.pw_uid, group=pw.pw_gid,
                       extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    return r.returncode == 0


class State:
    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.node = args.node
        self.r = args.r
        self.java = args.java
        self.jskernel = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jskernel.js")
        self.default_cwd = args.cwd
        self.max_contexts = args.max_contexts
        self.child_stderr = None if args.kernel_logs else subprocess.DEVNULL
        self.runtime_dir = tempfile.mkdtemp(prefix="codeinterp-", dir=args.runtime_dir)
        self.own_user = _user_name(os.getuid())
        self.run_as = args.run_as  # pwd entry of the default user; None: the server's
        self.user_dirs = {}
        self.lock = threading.Lock()
        self.contexts = {}            # id -> Context, in creation order
        self.defaults = {}            # language -> id
        self.default_locks = {}
        self.ready = threading.Event()
        self.startup_error = None
        self.genv_lock = threading.Lock()
        self.genv_key = None
        self.genv = (0, {})
        self.spares = []              # Python kernels started ahead (take_spare), oldest first
        self.filling = False          # a thread is starting spares
        self.spares_retry_at = 0.0
        self.closing = False

    def user_runtime_dir(self, pw):
        """A private 0700 directory of the user's (pw None: the server's)
        for kernel sockets and files.  Without --user it is the runtime
        directory itself; with it each user, root too, has its own."""
        if self.run_as is None and (pw is None or pw.pw_uid == os.getuid()):
            return self.runtime_dir
        uid, gid = (os.getuid(), os.getgid()) if pw is None else (pw.pw_uid, pw.pw_gid)
        with self.lock:
            d = self.user_dirs.get(uid)
            if d is None:
                d = os.path.join(self.runtime_dir, str(uid))
                os.chmod(self.runtime_dir, 0o711)  # each user enters only its own
                os.mkdir(d, 0o700)
                os.chown(d, uid, gid)
                self.user_dirs[uid] = d
            return d

    def check_default_user(self):
        """Fails clearly when --user cannot reach its runtime directory."""
        if self.run_as is not None and not _can_enter(self.user_runtime_dir(self.run_as), self.run_as):
            raise SystemExit(f"codeinterp: {self.run_as.pw_name} cannot enter {self.runtime_dir}: "
                             "a directory above it is closed to that user (see --runtime-dir)")

    def resolve_user(self, name):
        """The pwd entry a context of user name runs as (None: the server's
        own user); name None is the default user."""
        if name is None:
            return self.run_as
        if not isinstance(name, str):
            raise ApiError(400, "'user' must be a string")
        default = self.run_as.pw_name if self.run_as else self.own_user
        if name == default:
            return self.run_as
        if name == "root":
            if os.getuid() != 0:
                raise ApiError(400, "contexts as root need the server to run as root")
            return pwd.getpwuid(0)
        raise ApiError(400, f"'user' must be '{default}' (the default) or 'root'")

    def machine_id(self):
        """The current machine id (re-read each time: a few microseconds)."""
        return read_machine_id(self.args.machine_id_file)

    def global_env(self):
        """(version, vars) from --env-file, re-read when the file changes;
        None without --env-file."""
        path = self.args.env_file
        if not path:
            return None
        try:
            st = os.stat(path)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            key = None
        with self.genv_lock:
            if key == self.genv_key:
                return self.genv
            env = {}
            if key is not None:
                try:
                    with open(path, encoding="utf-8") as f:
                        data = json.load(f)
                    if not isinstance(data, dict):
                        raise ValueError("not a JSON object")
                    for k, v in data.items():
                        if ENV_NAME_RE.match(k) and isinstance(v, str) and "\0" not in v:
                            env[k] = v
                        else:
                            log.warning("env file %s: ignoring %r", path, k)
                except (OSError, ValueError) as e:
                    log.warning("env file %s: %s", path, e)
                    return self.genv
            self.genv_key = key
            if env != self.genv[1]:
                self.genv = (self.genv[0] + 1, env)
            return self.genv

    def _new(self, language, cwd, preload=()):
        if language == "python":
            return PythonContext(self, str(uuid.uuid4()), cwd, preload)
        if language in ("javascript", "typescript"):
            return JSContext(self, str(uuid.uuid4()), cwd, language)
        if language == "bash":
            return BashContext(self, str(uuid.uuid4()), cwd)
        if language == "r":
            if not self.r:
                raise ApiError(400, "Language 'r' is not available in this sandbox (no R with IRkernel)")
            return RContext(self, str(uuid.uuid4()), cwd)
        if language == "java":
            if not self.java:
                raise ApiError(400, "Language 'java' is not available in this sandbox (no JDK)")
            return JavaContext(self, str(uuid.uuid4()), cwd)
        raise ApiError(400, f"Unsupported language '{language}'")

    def create(self, language, cwd, preload=(), user=None):
        pw = self.resolve_user(user)
        cwd = cwd or self.default_cwd
        if not isinstance(cwd, str):
            raise ApiError(400, "'cwd' must be a string")
        cwd = os.path.expanduser(cwd)
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.default_cwd, cwd)
        if not os.path.isdir(cwd):
            raise ApiError(400, f"cwd '{cwd}' does not exist or is not a directory")
        if not _can_enter(cwd, pw):
            who = pw.pw_name if pw else self.own_user
            raise ApiError(400, f"cwd '{cwd}' is not accessible to {who}"
                                + ("" if who == "root" else " (a context of user 'root' may enter it)"))
        with self.lock:
            if len(self.contexts) >= self.max_contexts:
                raise ApiError(429, f"Too many contexts (limit {self.max_contexts}); "
                                    "delete unused contexts first")
            ctx = self._new(language, cwd, preload)
            ctx.user = pw
            self.contexts[ctx.id] = ctx
        try:
            ctx.start()
        except KernelStartError as e:
            with self.lock:
                self.contexts.pop(ctx.id, None)
            status = 400 if language == "typescript" and "not supported" in str(e) else 500
            raise ApiError(status, f"Failed to create {language} context: {e}") from e
        log.info("created %s context %s (cwd %s, user %s)", language, ctx.id, cwd, ctx.info()["user"])
        return ctx

    def get(self, ctx_id):
        with self.lock:
            return self.contexts.get(ctx_id)

    def default(self, language, preload=()):
        with self.lock:
            lock = self.default_locks.setdefault(language, threading.Lock())
        with lock:
            with self.lock:
                ctx = self.contexts.get(self.defaults.get(language))
            if ctx is not None:
                return ctx
            ctx = self.create(language, self.default_cwd, preload)
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

    # -- spares: Python kernels started ahead of need ----------------------------
    def take_spare(self, ctx):
        """A started Python kernel for ctx to adopt (Context._spawn), or
        None.  Only a plain Python context of the default user takes one (a
        new one, a restart, a respawn after a crash): a spare is that,
        started in the default cwd without --preload.  A ready spare is
        taken first, else the one furthest along in its start is waited
        for; the pool (--spares) is then filled again, one start at a time.
        A spare started before a change to a site-packages directory (pip
        install, then restart) is not taken: a new start would see the
        change."""
        if (ctx.language != "python" or getattr(ctx, "preload", None) or ctx.closed
                or ctx.is_spare):
            return None
        with self.lock:
            fits = [sp for sp in self.spares if sp.user == ctx.user]
            spare = next((sp for sp in fits if sp.ready.is_set()), fits[0] if fits else None)
            if spare is not None:
                self.spares.remove(spare)
        if spare is None:
            self._refill_spares()
            return None
        spare.ready.wait(common.START_TIMEOUT)
        stale = spare.ready.is_set() and spare.site != self._site_state(spare.user)
        if stale:
            log.info("a site-packages directory changed since the spare started; not using it")
        if stale or ctx.closed or spare.start_error or not spare.ready.is_set() or not spare.alive():
            spare.close()
            spare = None
        self._refill_spares()
        return spare

    def _site_dirs(self, pw):
        """The site-packages directories a Python kernel of user pw looks
        for when it starts (the kernel's interpreter is this server's)."""
        import site
        home = pw.pw_dir if pw is not None else os.path.expanduser("~")
        ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        user_base = os.environ.get("PYTHONUSERBASE") or os.path.join(home, ".local")
        return site.getsitepackages() + [os.path.join(user_base, "lib", ver, "site-packages")]

    def _site_state(self, pw):
        """Each site directory's mtime (None: missing): a package installed
        or removed there, or the directory made, changes it."""
        out = []
        for d in self._site_dirs(pw):
            try:
                out.append(os.stat(d).st_mtime_ns)
            except OSError:
                out.append(None)
        return out

    def _refill_spares(self):
        with self.lock:
            if (self.filling or self.closing or len(self.spares) >= self.args.spares
                    or time.monotonic() < self.spares_retry_at):
                return
            self.filling = True
        threading.Thread(target=self._fill_spares, daemon=True, name="spares").start()

    def _fill_spares(self):
        """Starts spares, one after another, until there are --spares (the
        caller set self.filling).  After a failed start, none is started for
        SPARE_RETRY seconds."""
        while True:
            spare = PythonContext(self, "spare", self.default_cwd)
            spare.user, spare.is_spare = self.run_as, True
            spare.site = self._site_state(spare.user)
            with self.lock:
                if self.closing or len(self.spares) >= self.args.spares:
                    self.filling = False
                    return
                self.spares.append(spare)
            try:
                spare.start()
            except KernelStartError as e:
                log.warning("spare Python kernel not started: %s", e)
                with self.lock:
                    if spare in self.spares:
                        self.spares.remove(spare)
                    self.filling = False
                    self.spares_retry_at = time.monotonic() + SPARE_RETRY
                return
            proc = spare.proc
            if proc is not None:
                log.info("spare python kernel ready (pid %d)", proc.pid)

    def list(self):
        with self.lock:
            return [c.info() for c in self.contexts.values() if not c.start_error]

    def startup(self, languages):
        """Starts the default Python context (retrying until it starts),
        the default contexts of languages and the spare; then /health
        answers 200.  JavaScript starts beside Python, the others after it
        (one vCPU starts them in turn either way)."""
        threads = []

        def start_default(language):
            try:
                self.default(language)
            except Exception as e:  # noqa: BLE001
                log.warning("default %s context not started: %s", language, e)

        def begin(language):
            t = threading.Thread(target=start_default, args=(language,), daemon=True)
            t.start()
            threads.append(t)

        if "javascript" in languages:
            begin("javascript")
        t0 = time.monotonic()
        delay = 1.0
        while True:
            try:
                self.default("python", self.args.preload)
                break
            except Exception as e:  # noqa: BLE001
                self.startup_error = f"default Python context failed to start: {e}"
                log.error("%s; retrying in %.0fs", self.startup_error, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
        self.startup_error = None
        for language in languages:
            if language not in ("python", "javascript"):
                begin(language)
        # Ready only with these and the spares started, so that a template
        # snapshot taken after /health holds them ready too.
        with self.lock:
            fill, self.filling = not self.filling, True
        if fill:
            self._fill_spares()
        for t in threads:
            t.join(common.START_TIMEOUT)
        self.ready.set()
        log.info("ready in %.2fs", time.monotonic() - t0)

    def shutdown(self):
        with self.lock:
            self.closing = True
            ctxs = list(self.contexts.values())
            self.contexts.clear()
            ctxs += self.spares
            self.spares = []
        for c in ctxs:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
