"""Host-run tests of the R, Java and TypeScript contexts and of contexts'
users (the server started as root with --user, as in the image).

Run from this directory:  python3 -m unittest test_languages

Needs what test_server.py needs, plus Debian's r-cran-irkernel, a JDK
(jshell) and node-typescript; without them the tests of that language are
skipped, or fail when CODEINTERP_REQUIRE=1 is set.  The user tests need
root (they run the server as root with --user nobody).  Uses test_server's
client helpers against a server of its own.
"""

import base64
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import unittest

import test_server as base
from test_server import Background, create_context, execute, request, request_json

_server = None
_tmp = None
_log = None
_saved = None
_env_file = None
AS_ROOT = os.getuid() == 0
REQUIRE = os.environ.get("CODEINTERP_REQUIRE") == "1"


def _have(what, ok):
    if ok:
        return lambda x: x
    if REQUIRE:
        raise RuntimeError(f"CODEINTERP_REQUIRE=1 but {what} is missing")
    return unittest.skip(f"{what} not available")


def _irkernel():
    r = shutil.which("R")
    return bool(r) and subprocess.run([r, "--no-echo", "-e", "library(IRkernel)"],
                                      capture_output=True).returncode == 0


needs_r = _have("R with IRkernel (r-cran-irkernel)", _irkernel())
needs_java = _have("a JDK with jshell", bool(shutil.which("jshell")))
needs_ts = _have("node with the typescript package (node-typescript)",
                 bool(shutil.which("node")) and (os.path.isdir("/usr/share/nodejs/typescript")))
needs_root = unittest.skipUnless(AS_ROOT, "needs root (the server switches users)")


def setUpModule():
    global _server, _tmp, _log, _saved, _env_file
    python = base._python_with_jupyter()
    if python is None:
        if REQUIRE:
            raise RuntimeError("CODEINTERP_REQUIRE=1 but no Python with jupyter_client and ipykernel")
        raise unittest.SkipTest("no Python with jupyter_client and ipykernel found")
    _tmp = tempfile.mkdtemp(prefix="codeinterp-lang-")
    os.chmod(_tmp, 0o711)  # the default user enters its own runtime directory below
    work = os.path.join(_tmp, "work")
    os.makedirs(work)
    os.chmod(work, 0o777)
    _env_file = os.path.join(_tmp, "sandbox-env.json")
    port = base._free_port()
    cmd = [python, base.SERVER, "--host", "127.0.0.1", "--port", str(port), "--cwd", work,
           "--preload", "", "--no-default-js", "--keepalive-seconds", "0.5",
           "--interrupt-grace-seconds", str(base.GRACE), "--runtime-dir", _tmp,
           "--env-file", _env_file, "--machine-id-file", os.path.join(_tmp, "machine-id")]
    if AS_ROOT:
        cmd += ["--user", "nobody"]
    if _irkernel():
        cmd += ["--warm", "r"]
    node = os.environ.get("CODEINTERP_TEST_NODE") or shutil.which("node")
    if node:
        cmd += ["--node", node]
    _saved = base._port
    base._port = port
    _server, _log = base.launch(cmd, None, os.path.join(_tmp, "server.log"))


def tearDownModule():
    base._port = _saved
    base.stop(_server, _log, _tmp)


def set_sandbox_env(env):
    with open(_env_file + ".tmp", "w") as f:
        json.dump(env, f)
    os.replace(_env_file + ".tmp", _env_file)


def results_text(ex):
    return [r.get("text") for r in ex.results]


@needs_r
class TestR(unittest.TestCase):
    def setUp(self):
        self.ctx = create_context(self, language="r")

    def run_r(self, code, **kw):
        return execute(code, context_id=self.ctx["id"], **kw)

    def test_default_context_started_with_the_server(self):
        # --warm r: the default R context was started before /health said OK.
        status, contexts = request_json("GET", "/contexts")
        self.assertEqual(status, 200)
        self.assertIn("r", [c["language"] for c in contexts if c["id"] != self.ctx["id"]])
        ex = execute("1 + 1", language="r")
        self.assertEqual(results_text(ex), ["[1] 2"])
        # ... and ran it: no new context was made for it.
        self.assertEqual(len(request_json("GET", "/contexts")[1]), len(contexts))

    def test_values_state_and_output(self):
        ex = self.run_r("x <- 41\ncat('hi\\n')\nmessage('to stderr')\nx + 1")
        self.assertIsNone(ex.error)
        self.assertEqual(ex.stdout, "hi\n")
        self.assertIn("to stderr", ex.stderr)
        self.assertEqual(results_text(ex), ["[1] 42"])
        self.assertEqual(self.run_r("x").results[0]["text"], "[1] 41")

    def test_data_frame_as_html_and_plot_as_png(self):
        ex = self.run_r("data.frame(a = 1:2, b = c('x', 'y'))")
        self.assertIn("<table", ex.results[0]["html"])
        ex = self.run_r("plot(1:10)")
        png = base64.b64decode(ex.results[0]["png"])
        self.assertTrue(png.startswith(b"\x89PNG"), png[:8])

    def test_env_per_run_and_sandbox_env(self):
        ex = self.run_r('Sys.getenv("FOO")', env_vars={"FOO": 'b\u00e4r "q" \\ $x'})
        self.assertEqual(ex.results[0]["text"], '[1] "b\u00e4r \\"q\\" \\\\ $x"')
        long = "\u00e9" * 20000 + "\n\t"
        ex = self.run_r('nchar(Sys.getenv("FOO")) == 20002 && Sys.getenv("FOO") == paste0(strrep("\u00e9", 20000), "\\n\\t")',
                        env_vars={"FOO": long})
        self.assertEqual(ex.stderr, "")
        self.assertEqual(ex.results[0]["text"], "[1] TRUE")
        ex = self.run_r('Sys.getenv("FOO", unset = "default")')
        self.assertEqual(ex.results[0]["text"], '[1] "default"')
        set_sandbox_env({"SANDBOX_R": "global"})
        self.addCleanup(set_sandbox_env, {})
        ex = self.run_r('Sys.getenv("SANDBOX_R")', env_vars={"SANDBOX_R": "overwrite"})
        self.assertEqual(ex.results[0]["text"], '[1] "overwrite"')
        self.assertEqual(self.run_r('Sys.getenv("SANDBOX_R")').results[0]["text"], '[1] "global"')

    def test_error_and_interrupt_keep_state(self):
        self.run_r("kept <- 7")
        ex = self.run_r("stop('boom')")
        self.assertIn("boom", ex.error["value"])
        ex = self.run_r("Sys.sleep(600)", timeout_ms=1500)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertTrue(ex.ended)
        self.assertEqual(self.run_r("kept").results[0]["text"], "[1] 7")

    def test_cwd(self):
        self.assertEqual(self.run_r("getwd()").results[0]["text"], f'[1] "{self.ctx["cwd"]}"')


@needs_java
class TestJava(unittest.TestCase):
    def setUp(self):
        self.ctx = create_context(self, language="java")

    def run_java(self, code, **kw):
        return execute(code, context_id=self.ctx["id"], **kw)

    def test_values_state_and_output(self):
        ex = self.run_java('int x = 41;\nSystem.out.println("h\u00e9llo");\nx + 1')
        self.assertIsNone(ex.error, ex.events)
        self.assertEqual(ex.stdout, "h\u00e9llo\n")
        # println's text and line end are two entries, as in E2B's Java kernel
        self.assertEqual([e["text"] for e in ex.events if e["type"] == "stdout"], ["h\u00e9llo", "\n"])
        self.assertEqual(ex.text, "42")
        self.assertEqual(self.run_java('"a\\tb" + x').text, "a\tb41")  # a String, unquoted
        self.assertIsNone(self.run_java('void hi() { System.out.println("hi"); }\nhi()').text)
        self.assertEqual(self.run_java('"a\\u0001b" + "\\u007f"').text, "a\u0001b\u007f")

    def test_env_as_system_properties(self):
        ex = self.run_java('System.getProperty("FOO")', env_vars={"FOO": "bar"})
        self.assertEqual(ex.text, "bar")
        self.assertEqual(self.run_java('System.getProperty("FOO", "default")').text, "default")
        set_sandbox_env({"SANDBOX_J": "global"})
        self.addCleanup(set_sandbox_env, {})
        self.assertEqual(self.run_java('System.getProperty("SANDBOX_J")',
                                       env_vars={"SANDBOX_J": "overwrite"}).text, "overwrite")
        self.assertEqual(self.run_java('System.getProperty("SANDBOX_J")').text, "global")

    def test_errors(self):
        ex = self.run_java("int y = ;")
        self.assertEqual(ex.error["name"], "CompilationException")
        ex = self.run_java('Integer.parseInt("zz")')
        self.assertEqual(ex.error["name"], "java.lang.NumberFormatException")
        self.assertIn('"zz"', ex.error["value"])
        self.assertTrue(ex.error["traceback"].startswith("java.lang.NumberFormatException"))

    def test_interrupt_keeps_state(self):
        self.run_java("int kept = 7;")
        # The snippets after the stopped one do not run.
        ex = self.run_java('while (true) { }\nSystem.out.println("after");\nkept = 8;', timeout_ms=1500)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertTrue(ex.ended)
        self.assertEqual(ex.stdout, "")
        self.assertEqual(self.run_java("kept").text, "7")
        bg = Background(self, 'System.out.println("started");\nwhile (true) { }\nkept = 9;',
                        context_id=self.ctx["id"])
        bg.wait_marker()
        self.assertEqual(request_json("POST", f"/contexts/{self.ctx['id']}/interrupt")[1], {"interrupted": True})
        self.assertEqual(bg.join().error["name"], "KeyboardInterrupt")
        self.assertEqual(self.run_java("kept").text, "7")

    def test_cwd(self):
        self.assertEqual(self.run_java('System.getProperty("user.dir")').text, self.ctx["cwd"])


@needs_ts
class TestTypeScript(unittest.TestCase):
    def test_types_are_erased(self):
        ctx = create_context(self, language="ts")
        cid = ctx["id"]
        ex = execute('const message: string = "Hello World!"; console.log(message)', context_id=cid)
        self.assertEqual(ex.stdout, "Hello World!\n")
        ex = execute("import os from 'os'\ninterface P { x: number }\nconst p: P = { x: 2 }; p.x * 21",
                     context_id=cid)
        self.assertEqual(ex.text, "42")
        # The import of the cell before is kept; top-level await works.
        ex = execute("typeof os.platform(); await new Promise<number>((r) => setTimeout(() => r(5), 10))",
                     context_id=cid)
        self.assertEqual(ex.text, "5")
        ex = execute("import type { Stats } from 'fs'\nexport type N = number\nconst s: N = 3; s", context_id=cid)
        self.assertIsNone(ex.error, ex.events)
        self.assertEqual(ex.text, "3")
        ex = execute("const y: = 3", context_id=cid)
        self.assertEqual(ex.error["name"], "SyntaxError")
        self.assertIn("(1:10)", ex.error["value"])
        self.assertEqual(execute("process.cwd()", language="typescript").text, ctx["cwd"])


@needs_root
class TestUsers(unittest.TestCase):
    """The server runs as root with --user nobody."""

    def test_default_user_everywhere(self):
        nobody = pwd.getpwnam("nobody")
        ex = execute("import os; os.getuid(), os.environ['HOME']")
        self.assertEqual(ex.text, f"({nobody.pw_uid}, '{nobody.pw_dir}')")
        self.assertEqual(execute("id -un", language="bash").stdout, "nobody\n")
        ctx = create_context(self)
        self.assertEqual(ctx["user"], "nobody")
        statuses = {c["id"]: c["user"] for c in request_json("GET", "/contexts")[1]}
        self.assertEqual(statuses[ctx["id"]], "nobody")

    @needs_java
    def test_java_as_default_user(self):
        ctx = create_context(self, language="java")
        self.assertEqual(execute('System.getProperty("user.name")', context_id=ctx["id"]).text, "nobody")

    @needs_r
    def test_r_as_default_user(self):
        ctx = create_context(self, language="r")
        ex = execute('Sys.info()[["effective_user"]]', context_id=ctx["id"])
        self.assertEqual(ex.results[0]["text"], '[1] "nobody"')

    def test_root_context(self):
        status, _, body = request("POST", "/contexts", {"cwd": "/root"})
        self.assertEqual(status, 400)
        self.assertIn(b"not accessible to nobody", body)
        ctx = create_context(self, cwd="/root", user="root")
        self.assertEqual((ctx["cwd"], ctx["user"]), ("/root", "root"))
        ex = execute("import os; os.getuid(), os.getcwd(), os.environ['HOME']", context_id=ctx["id"])
        self.assertEqual(ex.text, "(0, '/root', '/root')")
        # Restarted, it is root still.
        self.assertEqual(request("POST", f"/contexts/{ctx['id']}/restart")[0], 200)
        self.assertEqual(execute("import os; os.getuid()", context_id=ctx["id"]).text, "0")
        private = os.path.join(_tmp, "private")
        os.makedirs(private, mode=0o700, exist_ok=True)
        with open(os.path.join(private, "secret"), "w") as f:
            f.write("s3cret")
        bash = create_context(self, language="bash", user="root")
        self.assertEqual(execute(f"id -u; cat {private}/secret", context_id=bash["id"]).stdout, "0\ns3cret")
        ex = execute(f"cat {private}/secret", language="bash")  # the default user's
        self.assertIn("Permission denied", ex.stderr)

    def test_planted_symlinks_are_not_followed(self):
        # The root server writes a bash context's cell file in the user's
        # own directory: a symlink planted there must not reach the target.
        victim = os.path.join(_tmp, "victim")
        with open(victim, "w") as f:
            f.write("untouched")
        os.chmod(victim, 0o600)
        ctx = create_context(self, language="bash")
        ex = execute(f'ln -sf {victim} "$BASH_SOURCE" && echo planted', context_id=ctx["id"])
        self.assertEqual(ex.stdout, "planted\n", ex.events)
        self.assertEqual(execute("echo next", context_id=ctx["id"]).stdout, "next\n")
        with open(victim) as f:
            self.assertEqual(f.read(), "untouched")
        self.assertEqual(os.stat(victim).st_uid, 0)

    def test_bad_user(self):
        for user, want in (("bob", b"'user' must be 'nobody' (the default) or 'root'"),
                           (5, b"'user' must be a string")):
            status, _, body = request("POST", "/contexts", {"user": user})
            self.assertEqual((status, body), (400, want))

    def test_interrupt_of_a_root_context(self):
        ctx = create_context(self, user="root")
        bg = Background(self, "import time\nprint('started', flush=True)\ntime.sleep(600)",
                        context_id=ctx["id"], timeout_ms=60000)
        bg.wait_marker()
        self.assertEqual(request_json("POST", f"/contexts/{ctx['id']}/interrupt")[1], {"interrupted": True})
        self.assertEqual(bg.join().error["name"], "KeyboardInterrupt")


if __name__ == "__main__":
    unittest.main()
