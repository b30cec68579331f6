"""R contexts: one IRkernel each (Debian's r-cran-irkernel; see jupyter.py).

IRkernel answers a value with display_data (text/plain as R prints it,
text/html for data frames, ...) and a plot with image/png, as in E2B's
image, which runs the same kernel."""

from jupyter import JupyterContext


def r_string(s):
    """An R string literal for s (any text without NUL).  Other characters
    go through as they are (R limits literals with \\u escapes to 10,000
    characters); control characters as octal escapes."""
    out = ['"']
    for ch in s:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            out.append("\\%03o" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _setenv_call(env):
    return "Sys.setenv(" + ", ".join(f"{r_string(k)} = {r_string(v)}" for k, v in env.items()) + ")"


class RContext(JupyterContext):
    language = "r"
    kernel_name = "ir"
    reseed_on_first_execution = False

    def _kernel_command(self, conn_file):
        return [self.server.r, "--no-echo", "--no-save", "--no-restore",
                "-e", "IRkernel::main()", "--args", conn_file]

    def _reseed(self, first):
        # A copy of this process in another VM would draw the same numbers.
        self._setup('local({ s <- readBin("/dev/urandom", "integer", 1L); '
                    'set.seed(if (is.na(s)) 1L else s) })', "reseeding")

    def _set_env_code(self, env):
        names = "c(" + ", ".join(r_string(k) for k in env) + ")"
        return (f"options(agentvm.saved_env = Sys.getenv({names}, unset = NA, names = TRUE)); "
                + _setenv_call(env))

    def _restore_env_code(self):
        return ('local({ s <- getOption("agentvm.saved_env"); options(agentvm.saved_env = NULL); '
                'for (n in names(s)) if (is.na(s[[n]])) Sys.unsetenv(n) '
                'else do.call(Sys.setenv, structure(list(s[[n]]), names = n)) })')

    def _global_env_code(self, env, unset):
        code = []
        if env:
            code.append(_setenv_call(env))
        if unset:
            code.append("Sys.unsetenv(c(" + ", ".join(r_string(k) for k in unset) + "))")
        return "; ".join(code) or "NULL"
