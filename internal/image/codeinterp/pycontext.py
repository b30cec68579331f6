"""Python contexts: one ipykernel each (see jupyter.py).

Each kernel also runs kernel_module.py (as the private module
_agentvm_codeinterp): env var handling, reseeding, charts and data for
results."""

import logging
import os
import time

import common
from jupyter import JupyterContext

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


class PythonContext(JupyterContext):
    language = "python"
    kernel_name = "python3"

    def __init__(self, server, ctx_id, cwd, preload=()):
        super().__init__(server, ctx_id, cwd)
        self.preload = list(preload)

    def _kernel_command(self, conn_file):
        return [self.server.python, "-m", "ipykernel_launcher", "-f", conn_file,
                f"--IPKernelApp.parent_handle={os.getpid()}",
                "--InteractiveShell.colors=NoColor",
                "--PlainTextFormatter.max_seq_length=0",
                "--HistoryManager.hist_file=:memory:"]

    def _kernel_env(self, env):
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env.setdefault("PYTHONIOENCODING", "utf-8")

    def _after_start(self):
        reply = self._silent(kernel_bootstrap(), common.START_TIMEOUT)
        if reply is None or reply.get("status") != "ok":
            log.warning("python context %s: setup code failed: %s", self.id,
                        (reply or {}).get("evalue", "no reply"))
        if self.preload:
            t0 = time.monotonic()
            self._silent("__import__('_agentvm_codeinterp').preload(%r)" % (self.preload,), common.START_TIMEOUT)
            log.info("python context %s: preloaded %s in %.2fs", self.id, ",".join(self.preload),
                     time.monotonic() - t0)

    def _enter_code(self, cwd):
        return "__import__('_agentvm_codeinterp').enter(%r)" % (cwd,)

    def _reseed(self, first):
        self._silent("__import__('_agentvm_codeinterp').reseed()", 30)

    def _set_env_code(self, env):
        return "__import__('_agentvm_codeinterp').set_env(%r)" % (env,)

    def _restore_env_code(self):
        return "__import__('_agentvm_codeinterp').restore_env()"

    def _global_env_code(self, env, unset):
        return "__import__('_agentvm_codeinterp').set_global_env(%r, %r)" % (env, unset)
