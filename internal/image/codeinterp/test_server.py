"""Host-run tests for the code interpreter server (server.py, jskernel.js).

Run from the repository root:

    python3 -m unittest internal/image/codeinterp/test_server.py

Needs Debian's python3-ipykernel, python3-jupyter-client, python3-numpy,
python3-pandas, python3-matplotlib (the server is started with an
interpreter that has them: $CODEINTERP_TEST_PYTHON, this interpreter, or
/usr/bin/python3), plus node ($CODEINTERP_TEST_NODE or node on PATH; the
JavaScript tests are skipped without it) and bash.  Without such a Python
the tests are skipped, or fail when CODEINTERP_REQUIRE=1 is set.  One server
is started for the module on a free port; CODEINTERP_TEST_SHOW_LOG=1 prints
its log.  The warm round-trip latency and the startup time are printed to
stderr (speed targets belong to benchmarks: no test asserts on timing; every
wait is for a condition, with a generous deadline).
"""

import base64
import http.client
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
SERVER = os.path.join(HERE, "server.py")
MAX_CONTEXTS = 12
GRACE = 2.0
DEADLINE = 120.0  # for waits on conditions; never reached when things work

_server = None
_port = None
_tmp = None
_node = None
_startup_seconds = None
_server_log = None
_machine_id_file = None


def _python_with_jupyter():
    candidates = [os.environ.get("CODEINTERP_TEST_PYTHON"), sys.executable, "/usr/bin/python3"]
    for c in candidates:
        if not c or not os.path.exists(c):
            continue
        if c == sys.executable and importlib.util.find_spec("jupyter_client") is not None \
                and importlib.util.find_spec("ipykernel") is not None:
            return c
        r = subprocess.run([c, "-c", "import jupyter_client, ipykernel, zmq"],
                           capture_output=True)
        if r.returncode == 0:
            return c
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setUpModule():
    global _server, _port, _tmp, _node, _startup_seconds, _server_log, _machine_id_file
    python = _python_with_jupyter()
    if python is None:
        if os.environ.get("CODEINTERP_REQUIRE") == "1":
            raise RuntimeError("CODEINTERP_REQUIRE=1 but no Python with jupyter_client, ipykernel "
                               "and zmq was found (set CODEINTERP_TEST_PYTHON)")
        raise unittest.SkipTest("no Python with jupyter_client and ipykernel found")
    _node = os.environ.get("CODEINTERP_TEST_NODE") or shutil.which("node")
    _tmp = tempfile.mkdtemp(prefix="codeinterp-test-")
    home = os.path.join(_tmp, "home")
    os.makedirs(home)
    _port = _free_port()
    _machine_id_file = os.path.join(_tmp, "machine-id")
    set_machine_id()
    env = dict(os.environ)
    env["HOME"] = home
    env["CODEINTERP_PRESET"] = "from-server-env"
    env.pop("MPLBACKEND", None)
    cmd = [python, SERVER, "--host", "127.0.0.1", "--port", str(_port), "--cwd", home,
           "--max-contexts", str(MAX_CONTEXTS), "--keepalive-seconds", "0.5",
           "--interrupt-grace-seconds", str(GRACE), "--runtime-dir", _tmp,
           "--env-file", os.path.join(_tmp, "sandbox-env.json"),
           "--machine-id-file", _machine_id_file, "--spares", "2"]
    if _node:
        cmd += ["--node", _node]
    t0 = time.monotonic()
    _server, _server_log = launch(cmd, env, os.path.join(_tmp, "server.log"))
    _startup_seconds = time.monotonic() - t0
    sys.stderr.write(f"\n[codeinterp] server healthy after {_startup_seconds:.2f}s\n")


def tearDownModule():
    stop(_server, _server_log, _tmp)


def launch(cmd, env, log_path):
    """Starts a server and waits until its /health (on _port) answers 200;
    returns the process and its open log."""
    log = open(log_path, "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError("server exited:\n" + log.read())
        try:
            if request("GET", "/health", timeout=2)[0] == 200:
                return proc, log
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("server did not become healthy")


def stop(proc, log, tmp):
    """Ends a server of launch(), shows its log if asked, removes tmp."""
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    if log is not None:
        if os.environ.get("CODEINTERP_TEST_SHOW_LOG"):
            log.seek(0)
            sys.stderr.write(log.read())
        log.close()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------
# Client helpers
# ---------------------------------------------------------------------------

def request(method, path, body=None, timeout=60, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", _port, timeout=timeout)
    try:
        data = None
        hdrs = dict(headers or {})
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def request_json(method, path, body=None):
    status, _, raw = request(method, path, body)
    return status, (json.loads(raw) if raw and status == 200 else raw.decode())


class Execution:
    def __init__(self, status, events, elapsed, arrivals, headers):
        self.status = status
        self.events = events
        self.elapsed = elapsed
        self.arrivals = arrivals
        self.headers = headers

    def of(self, kind):
        return [e for e in self.events if e["type"] == kind]

    @property
    def stdout(self):
        return "".join(e["text"] for e in self.of("stdout"))

    @property
    def stderr(self):
        return "".join(e["text"] for e in self.of("stderr"))

    @property
    def results(self):
        return self.of("result")

    @property
    def error(self):
        errs = self.of("error")
        return errs[-1] if errs else None

    @property
    def text(self):
        for r in self.results:
            if r.get("is_main_result"):
                return r.get("text")
        return None

    @property
    def ended(self):
        return bool(self.events) and self.events[-1]["type"] == "end_of_execution"


def execute(code, timeout=DEADLINE, on_event=None, on_sent=None, **fields):
    """Runs code; on_event(ev) sees every event (keepalives too) as it
    arrives, on_sent() runs once the request is written."""
    body = {"code": code}
    body.update(fields)
    conn = http.client.HTTPConnection("127.0.0.1", _port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", "/execute", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        if on_sent:
            on_sent()
        r = conn.getresponse()
        if r.status != 200:
            return Execution(r.status, r.read().decode(), time.monotonic() - t0, [], dict(r.getheaders()))
        events, arrivals = [], []
        while True:
            line = r.readline()
            if not line:
                break
            ev = json.loads(line)
            if on_event:
                on_event(ev)
            if ev["type"] == "keepalive":
                continue
            events.append(ev)
            arrivals.append(time.monotonic() - t0)
        return Execution(200, events, time.monotonic() - t0, arrivals, dict(r.getheaders()))
    finally:
        conn.close()


class Background:
    """execute() in a thread.  wait_marker() returns once the execution has
    printed the marker (e.g. "started") to stdout; join() returns the result."""

    def __init__(self, testcase, code, marker="started", **fields):
        self.tc = testcase
        self.marker = marker
        self.seen = threading.Event()
        self.sent = threading.Event()
        self.result = None
        self.error = None
        self.out = ""

        def on_event(ev):
            if ev["type"] == "stdout":
                self.out += ev["text"]
                if self.marker in self.out:
                    self.seen.set()

        def run():
            try:
                self.result = execute(code, on_event=on_event, on_sent=self.sent.set, **fields)
            except Exception as e:  # noqa: BLE001 - reported by join()
                self.error = e
            finally:
                self.sent.set()
                self.seen.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait_marker(self):
        self.tc.assertTrue(self.seen.wait(DEADLINE), f"no {self.marker!r} within {DEADLINE}s")
        self.tc.assertIsNone(self.error)
        self.tc.assertIn(self.marker, self.out, self.result and self.result.events)

    def join(self):
        self.thread.join(DEADLINE)
        self.tc.assertFalse(self.thread.is_alive(), "execution did not end")
        self.tc.assertIsNone(self.error)
        return self.result


def py_wait_for(path, deadline=DEADLINE / 2):
    """Python code that waits until path exists (or deadline seconds pass)."""
    return (f"import os as _os, time as _time\n_d = _time.monotonic() + {deadline}\n"
            f"while not _os.path.exists({path!r}) and _time.monotonic() < _d:\n"
            f"    _time.sleep(0.01)\n")


def touch(path):
    with open(path, "w"):
        pass


def set_machine_id(value=None):
    """Writes a (new random) machine id to the server's --machine-id-file."""
    value = value or secrets.token_hex(16)
    tmp = _machine_id_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(value + "\n")
    os.replace(tmp, _machine_id_file)
    return value


def create_context(testcase, **body):
    status, ctx = request_json("POST", "/contexts", body)
    testcase.assertEqual(status, 200, ctx)
    testcase.addCleanup(request, "DELETE", f"/contexts/{ctx['id']}")
    return ctx


def raw_http(data, read_timeout=30):
    s = socket.create_connection(("127.0.0.1", _port))
    s.settimeout(read_timeout)
    try:
        s.sendall(data)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        s.close()


def needs_node(fn):
    return unittest.skipUnless(os.environ.get("CODEINTERP_TEST_NODE") or shutil.which("node"),
                               "node not available")(fn)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

class TestHealthAndProtocol(unittest.TestCase):
    def test_health(self):
        status, headers, body = request("GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), "OK")

    def test_default_contexts_listed(self):
        status, contexts = request_json("GET", "/contexts")
        self.assertEqual(status, 200)
        languages = [c["language"] for c in contexts]
        self.assertIn("python", languages)
        if _node:
            self.assertIn("javascript", languages)
        for c in contexts:
            self.assertEqual(set(c), {"id", "language", "cwd", "user"})

    def test_ndjson_stream_shape(self):
        ex = execute("print('hi')\n1 + 1")
        self.assertEqual(ex.status, 200)
        self.assertEqual(ex.headers.get("Content-Type"), "application/x-ndjson")
        self.assertEqual(ex.headers.get("Transfer-Encoding"), "chunked")
        types = [e["type"] for e in ex.events]
        self.assertEqual(types, ["number_of_executions", "stdout", "result", "end_of_execution"])
        out = ex.of("stdout")[0]
        self.assertEqual(out["text"], "hi\n")
        self.assertRegex(out["timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
        res = ex.results[0]
        self.assertEqual(res, {"type": "result", "text": "2", "extra": {}, "is_main_result": True})

    def test_http10_close_delimited(self):
        body = json.dumps({"code": "print('old client')"}).encode()
        raw = raw_http(b"POST /execute HTTP/1.0\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        head, _, payload = raw.partition(b"\r\n\r\n")
        self.assertIn(b"200", head.split(b"\r\n")[0])
        self.assertNotIn(b"chunked", head.lower())
        events = [json.loads(l) for l in payload.splitlines() if l.strip()]
        self.assertEqual(events[-1]["type"], "end_of_execution")
        self.assertIn({"old client\n"}, [{e.get("text")} for e in events])

    def test_chunked_request_body(self):
        body = json.dumps({"code": "'chunked ok'"}).encode()
        half = len(body) // 2
        data = (b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                + b"%x\r\n%s\r\n" % (half, body[:half])
                + b"%x\r\n%s\r\n" % (len(body) - half, body[half:]) + b"0\r\n\r\n")
        raw = raw_http(data)
        self.assertIn(b'"text":"chunked ok"', raw)

    def test_unicode_is_ascii_escaped(self):
        ex = execute("print('h\u00e9llo \u2713')")
        self.assertEqual(ex.stdout, "h\u00e9llo \u2713\n")


class TestBadRequests(unittest.TestCase):
    def test_invalid_json(self):
        status, _, body = request("POST", "/execute", b"{not json")
        self.assertEqual(status, 400)
        self.assertIn(b"Invalid JSON", body)

    def test_non_object_json(self):
        status, _, _ = request("POST", "/execute", b"[1, 2]")
        self.assertEqual(status, 400)

    def test_missing_code(self):
        status, _, body = request("POST", "/execute", {"language": "python"})
        self.assertEqual(status, 400)
        self.assertIn(b"code", body)

    def test_context_and_language(self):
        status, _, body = request("POST", "/execute", {"code": "1", "context_id": "abc", "language": "python"})
        self.assertEqual(status, 400)
        self.assertIn(b"Only one of context_id or language", body)

    def test_unknown_context(self):
        status, headers, body = request("POST", "/execute", {"code": "1", "context_id": "nope"})
        self.assertEqual(status, 404)
        self.assertTrue(headers["Content-Type"].startswith("text/plain"))
        self.assertEqual(body, b"Context nope not found")

    def test_unsupported_language(self):
        status, _, body = request("POST", "/execute", {"code": "1", "language": "cobol"})
        self.assertEqual(status, 400)
        status, _, body = request("POST", "/execute", {"code": "1", "language": "deno"})
        self.assertEqual(status, 400)
        self.assertIn(b"not available", body)
        status, _, _ = request("POST", "/contexts", {"language": "cobol"})
        self.assertEqual(status, 400)

    def test_bad_fields(self):
        for body in ({"code": "1", "timeout_ms": "soon"}, {"code": "1", "timeout_ms": -5},
                     {"code": "1", "env_vars": {"BAD-NAME": "x"}},
                     {"code": "1", "env_vars": {"A": {"nested": 1}}},
                     {"code": "1", "env_vars": ["A"]}, {"code": 5}):
            status, _, _ = request("POST", "/execute", body)
            self.assertEqual(status, 400, body)

    def test_oversized_body(self):
        raw = raw_http(b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 20000000\r\n\r\n{\"code\": \"")
        self.assertTrue(raw.startswith(b"HTTP/1.1 413"), raw[:100])
        self.assertIn(b"too large", raw)

    def test_not_found_and_method(self):
        self.assertEqual(request("GET", "/nope")[0], 404)
        self.assertEqual(request("GET", "/execute")[0], 405)
        self.assertEqual(request("PUT", "/contexts/x")[0], 405)

    def test_server_survives_garbage(self):
        raw_http(b"\x00\x01garbage\r\n\r\n", read_timeout=5)
        raw_http(b"POST /execute HTTP/1.1\r\nContent-Length: abc\r\n\r\n", read_timeout=5)
        self.assertEqual(request("GET", "/health")[0], 200)


class TestPython(unittest.TestCase):
    def test_state_across_calls(self):
        execute("py_state = 1")
        ex = execute("py_state += 1; py_state")
        self.assertEqual(ex.text, "2")
        self.assertIsNone(ex.error)

    def test_execution_count(self):
        ctx = create_context(self)
        execute("1", context_id=ctx["id"])
        ex = execute("!pwd", context_id=ctx["id"])
        self.assertEqual(ex.of("number_of_executions")[0]["execution_count"], 2)

    def test_stdout_stderr_order(self):
        ex = execute("import sys\nprint('a', flush=True)\nprint('b', file=sys.stderr, flush=True)\n"
                     "print('c', flush=True)")
        got = [(e["type"], e["text"]) for e in ex.events if e["type"] in ("stdout", "stderr")]
        self.assertEqual(got, [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")])

    def test_a_line_is_sent_whole(self):
        # IPython's `!pwd` sends "/home/user" and its newline as two stream
        # messages; a client joining the log entries saw "/home/user,".
        ex = execute("import sys, time\nsys.stdout.write('/home/user'); sys.stdout.flush()\n"
                     "time.sleep(0.02)\nsys.stdout.write('\\n'); sys.stdout.flush()")
        got = [e["text"] for e in ex.events if e["type"] == "stdout"]
        self.assertEqual(got, ["/home/user\n"])

    def test_an_unfinished_line_is_not_held_for_long(self):
        # A line's start is sent on its own when its end does not follow
        # (a prompt, a progress dot): the code goes on only once the test
        # has received it.
        flag = tempfile.mktemp(dir=_tmp)

        def on_event(ev):
            if ev["type"] == "stdout" and ev["text"] == "Continue? ":
                touch(flag)

        code = ("import sys\nsys.stdout.write('Continue? '); sys.stdout.flush()\n" + py_wait_for(flag) +
                f"print('yes' if _os.path.exists({flag!r}) else 'no flag')")
        ex = execute(code, on_event=on_event)
        self.assertEqual([e["text"] for e in ex.events if e["type"] == "stdout"], ["Continue? ", "yes\n"])

    def test_output_without_line_ends_is_not_held_back(self):
        # Progress dots never end a line: they still go out while the code
        # runs (it goes on only once the test has received some).
        flag = tempfile.mktemp(dir=_tmp)

        def on_event(ev):
            if ev["type"] == "stdout" and "." in ev["text"]:
                touch(flag)

        code = ("import os as _os, sys, time\n_d = time.monotonic() + 60\n"
                f"while not _os.path.exists({flag!r}) and time.monotonic() < _d:\n"
                "    sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.05)\n"
                f"print('yes' if _os.path.exists({flag!r}) else 'no flag')")
        ex = execute(code, on_event=on_event)
        self.assertTrue(ex.stdout.endswith(".yes\n"), ex.stdout[-200:])
        # whole lines before an unfinished one are not held with it
        ex = execute("import sys\nsys.stdout.write('a\\nb'); sys.stdout.flush()\n" + py_wait_for(flag + "-2", 1) +
                     "print()")
        self.assertEqual([e["text"] for e in ex.events if e["type"] == "stdout"][0], "a\n")

    def test_output_is_streamed(self):
        # The code goes on only once the test has received "first": without
        # streaming it would wait in vain and print "no flag".
        flag = tempfile.mktemp(dir=_tmp)

        def on_event(ev):
            if ev["type"] == "stdout" and "first" in ev["text"]:
                touch(flag)

        code = ("print('first', flush=True)\n" + py_wait_for(flag) +
                f"print('second' if _os.path.exists({flag!r}) else 'no flag')")
        ex = execute(code, on_event=on_event)
        self.assertEqual(ex.stdout, "first\nsecond\n")

    def test_keepalive_lines(self):
        # The code ends once the test has received a keepalive line.
        flag = tempfile.mktemp(dir=_tmp)
        lines = []

        def on_event(ev):
            lines.append(ev)
            if ev == {"type": "keepalive"}:
                touch(flag)

        ex = execute(py_wait_for(flag) + f"_os.path.exists({flag!r})", on_event=on_event)
        self.assertIn({"type": "keepalive"}, lines)
        self.assertEqual(ex.text, "True")
        self.assertEqual(lines[-1], {"type": "end_of_execution"})

    def test_error_with_traceback(self):
        ex = execute("def f():\n    return 1 / 0\nf()")
        self.assertEqual(ex.error["name"], "ZeroDivisionError")
        self.assertEqual(ex.error["value"], "division by zero")
        self.assertIn("ZeroDivisionError", ex.error["traceback"])
        self.assertIn("1 / 0", ex.error["traceback"])
        self.assertNotIn("\x1b[", ex.error["traceback"])  # no ANSI colours
        self.assertTrue(ex.ended)

    def test_name_error_message(self):
        ctx = create_context(self)
        ex = execute("undefined_name_xyz", context_id=ctx["id"])
        self.assertEqual(ex.error["name"], "NameError")
        self.assertEqual(ex.error["value"], "name 'undefined_name_xyz' is not defined")

    def test_string_result_unquoted(self):
        self.assertEqual(execute("'abc'").text, "abc")

    def test_display_and_main_result(self):
        ex = execute("from IPython.display import display\ndisplay('shown')\n42")
        self.assertEqual([(r["text"], r["is_main_result"]) for r in ex.results],
                         [("shown", False), ("42", True)])

    def test_latex_only_display(self):
        ex = execute("from IPython.display import display\n"
                     "display({'text/latex': r'\\text{X}'}, raw=True)")
        self.assertEqual(ex.results[0]["latex"], r"\text{X}")
        self.assertNotIn("text", ex.results[0])

    def test_indented_code(self):
        ex = execute("\n        a_val = 3\n        a_val * 2\n        ")
        self.assertEqual(ex.text, "6")

    def test_matplotlib_png_and_chart(self):
        ex = execute("import matplotlib.pyplot as plt\nimport numpy as np\n"
                     "x = np.linspace(0, 20, 100)\nplt.plot(x, np.sin(x), label='sin')\n"
                     "plt.title('Sine')\nplt.xlabel('t (s)')\nplt.show()")
        self.assertIsNone(ex.error, ex.error)
        self.assertEqual(len(ex.results), 1)
        r = ex.results[0]
        self.assertFalse(r["is_main_result"])
        self.assertTrue(base64.b64decode(r["png"]).startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertTrue(r["text"].startswith("<Figure"))
        self.assertEqual(r["extra"], {})
        chart = r["chart"]
        self.assertEqual(chart["type"], "line")
        self.assertEqual(chart["title"], "Sine")
        self.assertEqual(chart["x_unit"], "s")
        self.assertEqual(chart["elements"][0]["label"], "sin")
        self.assertEqual(len(chart["elements"][0]["points"]), 100)

    def test_figure_as_last_expression(self):
        ex = execute("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
                     "ax.bar(['a', 'b'], [3, 4], label='g')\nfig")
        mains = [r for r in ex.results if r["is_main_result"]]
        self.assertEqual(len(mains), 1)
        self.assertTrue(base64.b64decode(mains[0]["png"]).startswith(b"\x89PNG"))
        self.assertEqual(mains[0]["chart"]["type"], "bar")
        self.assertEqual([(e["label"], e["value"]) for e in mains[0]["chart"]["elements"]],
                         [("a", 3.0), ("b", 4.0)])

    def test_plot_and_value_give_two_results(self):
        ex = execute("import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()\n7")
        self.assertEqual(len(ex.results), 2)
        self.assertEqual(ex.text, "7")

    def test_pie_chart(self):
        ex = execute("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
                     "ax.pie([90, 10], labels=['No', 'Yes'], startangle=90)\nplt.title('P')\nplt.show()")
        chart = ex.results[0]["chart"]
        self.assertEqual(chart["type"], "pie")
        self.assertEqual([(e["label"], e["angle"]) for e in chart["elements"]], [("No", 324), ("Yes", 36)])

    def test_dataframe_html_and_data(self):
        ex = execute("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', None]})")
        r = ex.results[0]
        self.assertTrue(r["is_main_result"])
        self.assertIn("<table", r["html"])
        self.assertIn("a", r["text"])
        self.assertEqual(r["data"], {"a": [1, 2, 3], "b": ["x", "y", None]})

    def test_dataframe_nan_is_valid_json(self):
        ex = execute("import pandas as pd, numpy as np\npd.DataFrame({'v': [1.5, np.nan]})")
        self.assertEqual(ex.results[0]["data"], {"v": [1.5, None]})

    def test_pil_image(self):
        ex = execute("from PIL import Image\nimg = Image.new('RGB', (8, 8), 'red')\nimg.show()\nprint('shown')")
        self.assertTrue(base64.b64decode(ex.results[0]["png"]).startswith(b"\x89PNG"))
        self.assertEqual(ex.stdout, "shown\n")

    def test_shell_escape_uses_cwd(self):
        ctx = create_context(self)
        ex = execute("!pwd", context_id=ctx["id"])
        self.assertEqual(ex.stdout.strip(), ctx["cwd"])
        ex = execute("from pathlib import Path; print(Path.cwd())", context_id=ctx["id"])
        self.assertEqual(ex.stdout.strip(), ctx["cwd"])

    def test_env_vars_scoped_to_one_execution(self):
        ex = execute("import os; os.getenv('CI_FOO')", env_vars={"CI_FOO": "bar"})
        self.assertEqual(ex.text, "bar")
        ex = execute("import os; os.getenv('CI_FOO', 'default')")
        self.assertEqual(ex.text, "default")
        # an existing variable is restored, not deleted
        ex = execute("import os; os.environ['CODEINTERP_PRESET']", env_vars={"CODEINTERP_PRESET": "tmp"})
        self.assertEqual(ex.text, "tmp")
        ex = execute("import os; os.environ['CODEINTERP_PRESET']")
        self.assertEqual(ex.text, "from-server-env")
        # visible to subprocesses too
        ex = execute("import subprocess; print(subprocess.check_output(['sh', '-c', 'echo $CI_SUB']).decode())",
                     env_vars={"CI_SUB": "sub'val\"ue"})
        self.assertEqual(ex.stdout.strip(), "sub'val\"ue")

    def test_timeout_interrupts_and_keeps_state(self):
        ctx = create_context(self)
        execute("survivor = 41", context_id=ctx["id"])
        ex = execute("import time\nprint('before', flush=True)\ntime.sleep(60)", context_id=ctx["id"],
                     timeout_ms=1000)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertIn("KeyboardInterrupt", ex.error["traceback"])
        self.assertEqual(len(ex.of("error")), 1)
        self.assertEqual(ex.stdout, "before\n")
        self.assertTrue(ex.ended)
        ex = execute("survivor + 1", context_id=ctx["id"])
        self.assertEqual(ex.text, "42")

    def start_sleeper(self, ctx):
        """A raw connection whose run has printed 'go' and sleeps; returns
        the socket and what it read so far."""
        body = json.dumps({"code": "import time\nprint('go', flush=True)\ntime.sleep(120)",
                           "context_id": ctx["id"]}).encode()
        s = socket.create_connection(("127.0.0.1", _port))
        self.addCleanup(s.close)
        s.sendall(b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        s.settimeout(DEADLINE)
        buf = b""
        while b'"go\\n"' not in buf:
            b = s.recv(4096)
            self.assertTrue(b, buf)
            buf += b
        return s, buf

    def test_client_disconnect_interrupts(self):
        ctx = create_context(self)
        execute("kept = 'yes'", context_id=ctx["id"])
        s, _ = self.start_sleeper(ctx)
        s.close()
        # Unless the disconnect interrupted the sleep(120), this times out.
        ex = execute("kept", context_id=ctx["id"], timeout_ms=60000)
        self.assertEqual(ex.text, "yes")

    def test_half_closed_client_gets_the_whole_stream(self):
        # A client (or a relay) that ends its side after the request still
        # reads: the run is interrupted, and its stream ends with an error
        # and end_of_execution, then the terminating chunk, never mid-way.
        s, buf = self.start_sleeper(create_context(self))
        s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(4096)
            if not b:
                break
            buf += b
        self.assertTrue(buf.endswith(b"\r\n0\r\n\r\n"), buf[-200:])
        self.assertIn(b'"name":"KeyboardInterrupt"', buf)
        self.assertIn(b'{"type":"end_of_execution"}', buf)

    def test_interrupt_endpoint(self):
        ctx = create_context(self)
        bg = Background(self, "import time\nval = 9\nprint('started', flush=True)\ntime.sleep(600)",
                        context_id=ctx["id"])
        bg.wait_marker()
        status, body = request_json("POST", f"/contexts/{ctx['id']}/interrupt")
        self.assertEqual(status, 200)
        self.assertEqual(body, {"interrupted": True})
        self.assertEqual(bg.join().error["name"], "KeyboardInterrupt")
        self.assertEqual(execute("val", context_id=ctx["id"]).text, "9")

    def test_unresponsive_kernel_is_restarted(self):
        ctx = create_context(self)
        execute("lost = 1", context_id=ctx["id"])
        code = ("import time\nwhile True:\n    try:\n        time.sleep(10)\n"
                "    except KeyboardInterrupt:\n        pass\n")
        ex = execute(code, context_id=ctx["id"], timeout_ms=500)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertIn("restarted", ex.error["value"])
        ex = execute("lost", context_id=ctx["id"])
        self.assertIn("restarted", ex.stderr)
        self.assertEqual(ex.error["name"], "NameError")
        self.assertEqual(execute("1 + 1", context_id=ctx["id"]).text, "2")

    def test_kernel_death_reported_and_recovered(self):
        ctx = create_context(self)
        ex = execute("import os; os._exit(3)", context_id=ctx["id"])
        self.assertEqual(ex.error["name"], "KernelDied")
        self.assertTrue(ex.ended)
        ex = execute("2 * 21", context_id=ctx["id"])
        self.assertEqual(ex.text, "42")

    def test_contexts_run_concurrently(self):
        # Each execution announces itself, then waits for the other one's
        # announcement: run one after the other, they would give up alone.
        a, b = create_context(self), create_context(self)
        d = tempfile.mkdtemp(dir=_tmp)
        mine = {k: os.path.join(d, k) for k in ("a", "b")}

        def code(me, other):
            return (f"open({mine[me]!r}, 'w').close()\n" + py_wait_for(mine[other]) +
                    f"'together' if _os.path.exists({mine[other]!r}) else 'alone'")

        bgs = [Background(self, code("a", "b"), context_id=a["id"]),
               Background(self, code("b", "a"), context_id=b["id"])]
        self.assertEqual([bg.join().text for bg in bgs], ["together", "together"])

    def test_context_serializes_executions(self):
        # The first execution holds a busy marker until the second request
        # has been sent; the second one must not find it.
        ctx = create_context(self)
        d = tempfile.mkdtemp(dir=_tmp)
        busy, second_sent = os.path.join(d, "busy"), os.path.join(d, "second-sent")
        code = ("import os\n"
                f"try:\n    os.close(os.open({busy!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))\n"
                "    mine = 'serial'\nexcept FileExistsError:\n    mine = 'overlap'\n"
                "print('started', flush=True)\n" + py_wait_for(second_sent) +
                f"if mine == 'serial':\n    os.unlink({busy!r})\nmine")
        first = Background(self, code, context_id=ctx["id"])
        first.wait_marker()
        second = Background(self, code, context_id=ctx["id"])
        self.assertTrue(second.sent.wait(DEADLINE))
        touch(second_sent)
        self.assertEqual([first.join().text, second.join().text], ["serial", "serial"])


class TestGlobalEnvFile(unittest.TestCase):
    """--env-file: sandbox-wide variables applied to every context."""

    def write(self, env):
        path = os.path.join(_tmp, "sandbox-env.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(env, f)
        os.replace(tmp, path)

    def tearDown(self):
        try:
            os.unlink(os.path.join(_tmp, "sandbox-env.json"))
        except FileNotFoundError:
            pass

    def test_env_file(self):
        self.write({"CI_GLOBAL": "g1"})
        self.assertEqual(execute("import os; os.getenv('CI_GLOBAL')").text, "g1")
        # a per-execution value wins once, then the sandbox-wide one is back
        self.assertEqual(execute("import os; os.getenv('CI_GLOBAL')", env_vars={"CI_GLOBAL": "o"}).text, "o")
        self.assertEqual(execute("import os; os.getenv('CI_GLOBAL')").text, "g1")
        self.assertEqual(execute("echo $CI_GLOBAL", language="bash").stdout, "g1\n")
        if _node:
            self.assertEqual(execute("process.env.CI_GLOBAL", language="js").text, "g1")
        self.write({"CI_OTHER": "x"})
        self.assertEqual(execute("import os; (os.getenv('CI_GLOBAL'), os.getenv('CI_OTHER'))").text,
                         "(None, 'x')")
        self.assertEqual(execute("echo ${CI_GLOBAL:-unset} $CI_OTHER", language="bash").stdout, "unset x\n")
        os.unlink(os.path.join(_tmp, "sandbox-env.json"))
        self.assertEqual(execute("import os; os.getenv('CI_OTHER', 'gone')").text, "gone")


class TestContexts(unittest.TestCase):
    def test_crud_and_restart(self):
        sub = tempfile.mkdtemp(dir=_tmp)
        ctx = create_context(self, language="python", cwd=sub)
        self.assertEqual(ctx["language"], "python")
        self.assertEqual(ctx["cwd"], sub)
        status, contexts = request_json("GET", "/contexts")
        self.assertEqual(contexts[-1], ctx)
        # independent from the default context
        execute("shared_name = 1")
        ex = execute("shared_name", context_id=ctx["id"])
        self.assertEqual(ex.error["value"], "name 'shared_name' is not defined")
        # restart loses state, keeps id and cwd
        execute("x = 1", context_id=ctx["id"])
        status, body = request_json("POST", f"/contexts/{ctx['id']}/restart")
        self.assertEqual((status, body), (200, None))
        ex = execute("x", context_id=ctx["id"])
        self.assertEqual(ex.error["name"], "NameError")
        self.assertEqual(ex.error["value"], "name 'x' is not defined")
        ex = execute("import os; os.getcwd()", context_id=ctx["id"])
        self.assertEqual(ex.text, sub)
        # delete
        status, body = request_json("DELETE", f"/contexts/{ctx['id']}")
        self.assertEqual((status, body), (200, None))
        self.assertNotIn(ctx["id"], [c["id"] for c in request_json("GET", "/contexts")[1]])
        self.assertEqual(request("DELETE", f"/contexts/{ctx['id']}")[0], 404)
        self.assertEqual(request("POST", f"/contexts/{ctx['id']}/restart")[0], 404)
        self.assertEqual(request("POST", "/execute", {"code": "1", "context_id": ctx["id"]})[0], 404)

    def test_default_options(self):
        ctx = create_context(self)
        self.assertEqual(ctx["language"], "python")
        self.assertEqual(ctx["cwd"], os.path.join(_tmp, "home"))
        uuid_re = r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
        self.assertRegex(ctx["id"], uuid_re)

    def test_bad_cwd(self):
        status, _, body = request("POST", "/contexts", {"cwd": "/nonexistent/dir"})
        self.assertEqual(status, 400)
        self.assertIn(b"does not exist", body)

    def test_restart_during_execution(self):
        ctx = create_context(self)
        bg = Background(self, "import time\nprint('started', flush=True)\ntime.sleep(600)",
                        context_id=ctx["id"])
        bg.wait_marker()
        self.assertEqual(request("POST", f"/contexts/{ctx['id']}/restart")[0], 200)
        ex = bg.join()
        self.assertEqual(ex.error["name"], "ContextRestarting")
        self.assertTrue(ex.ended)
        self.assertEqual(execute("5", context_id=ctx["id"]).text, "5")

    def test_delete_during_execution(self):
        status, ctx = request_json("POST", "/contexts", {"language": "bash"})
        bg = Background(self, "echo started; sleep 600", context_id=ctx["id"])
        bg.wait_marker()
        self.assertEqual(request("DELETE", f"/contexts/{ctx['id']}")[0], 200)
        self.assertEqual(bg.join().error["name"], "ContextDeleted")

    def test_context_limit(self):
        created = []
        try:
            for _ in range(MAX_CONTEXTS + 1):
                status, _, body = request("POST", "/contexts", {"language": "bash"})
                if status != 200:
                    break
                created.append(json.loads(body)["id"])
            self.assertEqual(status, 429)
            self.assertIn(b"Too many contexts", body)
        finally:
            for cid in created:
                request("DELETE", f"/contexts/{cid}")
        ctx = create_context(self, language="bash")
        self.assertEqual(execute("echo ok", context_id=ctx["id"]).stdout, "ok\n")


def server_log_has(text, deadline=DEADLINE):
    """Whether the server's log shows text within deadline seconds."""
    end = time.monotonic() + deadline
    while True:
        with open(_server_log.name) as f:
            if text in f.read():
                return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


class TestSpare(unittest.TestCase):
    """The spare Python kernel (state.py take_spare): a new or restarted
    Python context takes a kernel started ahead, in its own cwd, with no
    state of anyone's."""

    def pid_and_cwd(self, ctx_id):
        ex = execute("import os, json; print(json.dumps([os.getpid(), os.getcwd()]))",
                     context_id=ctx_id)
        self.assertIsNone(ex.error)
        return json.loads(ex.stdout)

    def test_new_and_restarted_contexts_take_the_spare(self):
        sub = tempfile.mkdtemp(dir=_tmp)
        ctx = create_context(self, language="python", cwd=sub)
        pid, cwd = self.pid_and_cwd(ctx["id"])
        self.assertEqual(cwd, sub)
        self.assertTrue(server_log_has(f"context {ctx['id']}: took the spare python kernel (pid {pid})"))
        execute("x = 1", context_id=ctx["id"])
        self.assertEqual(request("POST", f"/contexts/{ctx['id']}/restart")[0], 200)
        pid2, cwd2 = self.pid_and_cwd(ctx["id"])
        self.assertNotEqual(pid2, pid)
        self.assertEqual(cwd2, sub)
        self.assertTrue(server_log_has(f"context {ctx['id']}: took the spare python kernel (pid {pid2})"))
        self.assertEqual(execute("x", context_id=ctx["id"]).error["name"], "NameError")
        # Two contexts never share a kernel.
        other = create_context(self, language="python")
        pid3, cwd3 = self.pid_and_cwd(other["id"])
        self.assertNotIn(pid3, (pid, pid2))
        self.assertEqual(cwd3, os.path.join(_tmp, "home"))
        execute("y = 2", context_id=other["id"])
        self.assertEqual(execute("y", context_id=ctx["id"]).error["name"], "NameError")

    def test_default_context_restarts_with_its_preload(self):
        # The default context (with --preload) never takes a spare (none has it).
        ids = [c["id"] for c in request_json("GET", "/contexts")[1] if c["language"] == "python"]
        self.assertEqual(request("POST", f"/contexts/{ids[0]}/restart")[0], 200)
        ex = execute("import sys; 'pandas' in sys.modules")
        self.assertEqual(ex.text, "True")

    def test_a_moved_spare_imports_from_its_own_cwd(self):
        home, sub = os.path.join(_tmp, "home"), tempfile.mkdtemp(dir=_tmp)
        for where in (home, sub):
            with open(os.path.join(where, "spare_probe.py"), "w") as f:
                f.write(f"WHERE = {where!r}\n")
        self.addCleanup(os.unlink, os.path.join(home, "spare_probe.py"))
        ctx = create_context(self, language="python", cwd=sub)
        ex = execute("import os, spare_probe; print(os.getpid()); spare_probe.WHERE",
                     context_id=ctx["id"])
        self.assertEqual(ex.text, sub)
        pid = int(ex.stdout)
        self.assertTrue(server_log_has(f"context {ctx['id']}: took the spare python kernel (pid {pid})"))
        self.assertEqual(execute("_dh", context_id=ctx["id"]).text, repr([sub]))

    def test_a_crashed_context_comes_back_on_a_spare(self):
        ctx = create_context(self, language="python")
        ex = execute("import os; os._exit(1)", context_id=ctx["id"])
        self.assertEqual(ex.error["name"], "KernelDied")
        pid, _ = self.pid_and_cwd(ctx["id"])
        self.assertTrue(server_log_has(f"context {ctx['id']}: took the spare python kernel (pid {pid})"))

    def test_no_spare_from_before_a_site_packages_change(self):
        # pip install --user, then a new context (or a restart): a kernel
        # started before the user's site-packages existed would not see it.
        ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site_dir = os.path.join(_tmp, "home", ".local", "lib", ver, "site-packages")
        self.assertTrue(server_log_has("spare python kernel ready"))
        os.makedirs(site_dir)
        self.addCleanup(shutil.rmtree, os.path.join(_tmp, "home", ".local"))
        with open(os.path.join(site_dir, "spare_site_probe.py"), "w") as f:
            f.write("OK = 1\n")
        for _ in range(3):  # more than --spares: each is new or was dropped
            ctx = create_context(self, language="python")
            ex = execute("import spare_site_probe; spare_site_probe.OK", context_id=ctx["id"])
            self.assertIsNone(ex.error, ex.error)
            self.assertEqual(ex.text, "1")


@needs_node
class TestJavaScript(unittest.TestCase):
    def setUp(self):
        self.ctx = create_context(self, language="javascript")

    def run_js(self, code, **kw):
        return execute(code, context_id=self.ctx["id"], **kw)

    def test_language_alias_uses_default_context(self):
        ex = execute("console.log('Hello World!')", language="js")
        self.assertEqual(ex.stdout, "Hello World!\n")

    def test_state_and_result(self):
        self.run_js("let counter = 1")
        self.assertEqual(self.run_js("counter += 1; counter").text, "2")
        self.run_js("const fixed = {a: [1, 2]}")
        self.assertEqual(self.run_js("fixed").text, "{ a: [ 1, 2 ] }")
        self.assertEqual(self.run_js("const fixed = 3; fixed").text, "3")  # re-declaration is fine
        self.assertEqual(self.run_js("function twice(v) { return 2 * v }").text, None)
        self.assertEqual(self.run_js("twice(21)").text, "42")
        self.assertEqual(self.run_js("class P { constructor() { this.q = 1 } }\nnew P()").text, "P { q: 1 }")
        self.assertEqual(self.run_js("'plain string'").text, "plain string")
        self.assertEqual(self.run_js("{ k: 1 }").text, "{ k: 1 }")
        self.assertEqual(self.run_js("undefined").results, [])

    def test_console_and_order(self):
        ex = self.run_js("console.log('a'); console.error('b'); process.stdout.write('c\\n')")
        got = [(e["type"], e["text"]) for e in ex.events if e["type"] in ("stdout", "stderr")]
        self.assertEqual(got, [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")])

    def test_top_level_await_and_esm(self):
        self.assertEqual(self.run_js("await Promise.resolve('Hello World!')").text, "Hello World!")
        ex = self.run_js("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)")
        self.assertEqual(ex.stdout, "function\n")
        self.assertEqual(self.run_js("typeof readFileSync").text, "function")
        ex = self.run_js("const { join } = await import('path'); const joined = join('a', 'b'); joined")
        self.assertEqual(ex.text, "a/b")
        self.assertEqual(self.run_js("joined").text, "a/b")
        ex = self.run_js("async function later() { return 5 }\nawait later()")
        self.assertEqual(ex.text, "5")
        self.assertEqual(self.run_js("await later() + 1").text, "6")
        self.assertEqual(self.run_js("require('os').EOL").text, "\n")

    def test_errors(self):
        ex = self.run_js("throw new TypeError('bad thing')")
        self.assertEqual((ex.error["name"], ex.error["value"]), ("TypeError", "bad thing"))
        self.assertIn("TypeError: bad thing", ex.error["traceback"])
        self.assertNotIn("jskernel.js", ex.error["traceback"])
        ex = self.run_js("await Promise.reject(new RangeError('nope'))")
        self.assertEqual(ex.error["name"], "RangeError")
        ex = self.run_js("this is not javascript")
        self.assertEqual(ex.error["name"], "SyntaxError")
        ex = self.run_js("throw 'a string'")
        self.assertEqual((ex.error["name"], ex.error["value"]), ("Error", "a string"))
        self.assertTrue(ex.ended)

    def test_cwd_and_env(self):
        self.assertEqual(self.run_js("process.cwd()").text, self.ctx["cwd"])
        self.assertEqual(self.run_js("process.env.CI_JS", env_vars={"CI_JS": "bar"}).text, "bar")
        self.assertEqual(self.run_js("process.env.CI_JS || 'default'").text, "default")

    def test_timeout_interrupt_keeps_globals(self):
        self.run_js("var keepMe = 'kept'")
        ex = self.run_js("while (true) {}", timeout_ms=800)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertEqual(self.run_js("keepMe").text, "kept")
        ex = self.run_js("await new Promise(r => setTimeout(r, 60000))", timeout_ms=800)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertEqual(self.run_js("keepMe + '!'").text, "kept!")

    def test_uninterruptible_loop_restarts_runtime(self):
        ex = self.run_js("await null; while (true) {}", timeout_ms=500)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertIn("restarted", ex.error["value"])
        self.assertEqual(self.run_js("1 + 1").text, "2")

    def test_process_exit_is_survivable(self):
        ex = self.run_js("process.exit(0)")
        self.assertEqual(ex.error["name"], "KernelDied")
        self.assertEqual(self.run_js("'back'").text, "back")

    def test_async_callback_output_and_errors(self):
        ex = self.run_js("setTimeout(() => { throw new Error('late') }, 0); await new Promise(r => setTimeout(r, 50)); 1")
        self.assertEqual(ex.text, "1")
        self.assertIn("late", ex.stderr)


class TestBash(unittest.TestCase):
    def setUp(self):
        self.ctx = create_context(self, language="bash")

    def run_sh(self, code, **kw):
        return execute(code, context_id=self.ctx["id"], **kw)

    def test_default_bash_context(self):
        ex = execute("echo $((6 * 7))", language="bash")
        self.assertEqual(ex.stdout, "42\n")

    def test_state_cwd_functions(self):
        self.assertEqual(self.run_sh("pwd").stdout, self.ctx["cwd"] + "\n")
        self.run_sh("MYVAR=hello; greet() { echo \"hi $1\"; }; cd /")
        ex = self.run_sh("echo $MYVAR; pwd; greet there")
        self.assertEqual(ex.stdout, "hello\n/\nhi there\n")
        self.assertIsNone(ex.error)

    def test_stdout_stderr_and_exit_code(self):
        ex = self.run_sh("echo out; echo err >&2; false")
        self.assertEqual(ex.stdout, "out\n")
        self.assertEqual(ex.stderr, "err\n")
        self.assertEqual(ex.error["name"], "ExitCodeError")
        self.assertIn("1", ex.error["value"])
        self.assertIsNone(self.run_sh("true").error)

    def test_stdin_is_not_the_control_channel(self):
        ex = self.run_sh("cat; read -r line; echo after")
        self.assertEqual(ex.stdout, "after\n")

    def test_env_vars(self):
        self.assertEqual(self.run_sh("echo $CI_SH", env_vars={"CI_SH": "a b'c"}).stdout, "a b'c\n")
        self.assertEqual(self.run_sh("echo ${CI_SH:-default}").stdout, "default\n")

    def test_timeout_keeps_shell(self):
        self.run_sh("KEEP=1")
        ex = self.run_sh("sleep 60; echo not-reached", timeout_ms=800)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertNotIn("not-reached", ex.stdout)
        ex = self.run_sh("while true; do :; done", timeout_ms=500)
        self.assertEqual(ex.error["name"], "TimeoutError")
        self.assertEqual(self.run_sh("echo $KEEP").stdout, "1\n")

    def test_user_functions_do_not_break_the_shell(self):
        self.run_sh("printf() { echo hijacked; }; export() { :; }; unset() { :; }; .() { :; }")
        ex = self.run_sh("echo $CI_B", env_vars={"CI_B": "still works"})
        self.assertEqual(ex.stdout, "still works\n")
        self.assertEqual(self.run_sh("echo ${CI_B:-restored}").stdout, "restored\n")

    def test_invalid_utf8_output(self):
        ex = self.run_sh("printf 'a\\377b\\n'")
        self.assertEqual(ex.stdout, "a\ufffdb\n")

    def test_exit_restarts_shell(self):
        ex = self.run_sh("exit 3")
        self.assertEqual(ex.error["name"], "KernelDied")
        ex = self.run_sh("echo back")
        self.assertEqual(ex.stdout, "back\n")


class TestPerformance(unittest.TestCase):
    def test_warm_latency(self):
        conn = http.client.HTTPConnection("127.0.0.1", _port, timeout=30)
        report = []
        langs = ["python", "bash"] + (["javascript"] if _node else [])
        code = {"python": "print(1)", "javascript": "console.log(1)", "bash": "echo 1"}
        try:
            for lang in langs:
                times = []
                for i in range(55):
                    t0 = time.perf_counter()
                    conn.request("POST", "/execute", body=json.dumps({"code": code[lang], "language": lang}))
                    body = conn.getresponse().read()
                    times.append(time.perf_counter() - t0)
                    events = [json.loads(l) for l in body.splitlines()]
                    self.assertEqual("".join(e["text"] for e in events if e["type"] == "stdout"), "1\n")
                times = times[5:]
                p50 = statistics.median(times) * 1000
                report.append(f"{lang} p50 {p50:.1f} ms")  # reported, not asserted (see bench/)
        finally:
            conn.close()
        sys.stderr.write(f"\n[codeinterp] warm round trip (50 runs): {', '.join(report)}; "
                         f"startup to healthy {_startup_seconds:.2f}s\n")


# /proc/net/tcp{,6} samples (little-endian): server 127.0.0.1:49999 (C34F)
# and ::1:49999; clients 40000.. (9C40..).  Line 2 is the server's end of
# the connection from 40000 (owned by the server's uid, here 1002).
PROC_TCP_SAMPLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:C34F 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 101 1 0 100 0 0 10 0
   1: 0100007F:9C40 0100007F:C34F 01 00000000:00000000 00:00000000 00000000  1001        0 102 1 0 20 4 30 10 -1
   2: 0100007F:C34F 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1002        0 103 1 0 20 4 30 10 -1
   3: 0100007F:9C41 0100007F:C34F 01 00000000:00000000 00:00000000 00000000 65534        0 104 1 0 20 4 30 10 -1
   4: 0100007F:9C42 0100007F:C34F 06 00000000:00000000 03:00000F5A 00000000     0        0 0 3 0
   5: 0100007F:9C45 0100007F:C34F 04 00000000:00000000 01:00000014 00000000  1001        0 0 1 0
   6: 0100007F:9C46 0100007F:C34F 05 00000000:00000000 03:00001770 00000000     0        0 0 3 0
"""
PROC_TCP6_SAMPLE = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:9C43 00000000000000000000000001000000:C34F 01 00000000:00000000 00:00000000 00000000     0        0 201 1 0 20 4 30 10 -1
   1: 0000000000000000FFFF00000100007F:9C44 0000000000000000FFFF00000100007F:C34F 01 00000000:00000000 00:00000000 00000000  1001        0 202 1 0 20 4 30 10 -1
"""


class FakeSocket:
    def __init__(self, name):
        self.name = name

    def getsockname(self):
        return self.name


@unittest.skipUnless(sys.byteorder == "little", "samples are little-endian")
class TestPeerUidLookup(unittest.TestCase):
    """peers.py against crafted /proc/net/tcp{,6} samples."""

    def setUp(self):
        import peers
        self.peers = peers
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        self.paths = (os.path.join(d, "tcp"), os.path.join(d, "tcp6"))
        for path, text in zip(self.paths, (PROC_TCP_SAMPLE, PROC_TCP6_SAMPLE)):
            with open(path, "w") as f:
                f.write(text)

    def owners(self, client, server):
        return self.peers.socket_owners(client, server, self.paths)

    def test_socket_owners(self):
        v4 = ("127.0.0.1", 49999)
        # line 1 (the client's socket), not line 2 (the server's end, uid 1002)
        self.assertEqual(self.owners(("127.0.0.1", 40000), v4), {1001})
        self.assertEqual(self.owners(("127.0.0.1", 40001), v4), {65534})
        # timewait lines say uid 0 whoever owned the socket: ignored, also
        # as the FIN_WAIT2 left by a client that closed after its request
        self.assertEqual(self.owners(("127.0.0.1", 40002), v4), set())
        self.assertEqual(self.owners(("127.0.0.1", 40006), v4), set())
        # and so are sockets no process holds any more (inode 0)
        self.assertEqual(self.owners(("127.0.0.1", 40005), v4), set())
        self.assertEqual(self.owners(("127.0.0.1", 40009), v4), set())
        self.assertEqual(self.owners(("::1", 40003, 0, 0), ("::1", 49999, 0, 0)), {0})
        # an IPv4 client of a dual-stack server: in tcp, or in tcp6 (mapped)
        mapped = ("::ffff:127.0.0.1", 49999, 0, 0)
        self.assertEqual(self.owners(("::ffff:127.0.0.1", 40000, 0, 0), mapped), {1001})
        self.assertEqual(self.owners(("::ffff:127.0.0.1", 40004, 0, 0), mapped), {1001})
        self.assertEqual(self.owners(("127.0.0.1", 40004), v4), {1001})
        self.assertEqual(self.peers.socket_owners(("127.0.0.1", 40000), v4, ("/nonexistent",) * 2), set())

    def test_peer_allowed(self):
        request = FakeSocket(("127.0.0.1", 49999))
        allowed = {0, 1001}
        self.assertTrue(self.peers.peer_allowed(request, ("127.0.0.1", 40000), allowed, self.paths))
        with self.assertLogs("codeinterp", "WARNING") as logs:
            self.assertFalse(self.peers.peer_allowed(request, ("127.0.0.1", 40001), allowed, self.paths))
            self.assertFalse(self.peers.peer_allowed(request, ("127.0.0.1", 40002), allowed, self.paths))
            self.assertFalse(self.peers.peer_allowed(request, ("10.0.0.7", 40000), allowed, self.paths))
        self.assertIn("uid 65534", logs.output[0])
        self.assertTrue(self.peers.peer_allowed(request, ("127.0.0.1", 40001), {65534}, self.paths))

    def test_parse_uids(self):
        self.assertEqual(self.peers.parse_uids("", 1001), {0, 1001})
        self.assertEqual(self.peers.parse_uids("0, 5", 1001), {0, 5})
        self.assertEqual(self.peers.parse_uids("root", 1001), {0})
        with self.assertRaises(ValueError):
            self.peers.parse_uids("no-such-user-xyz", 1001)

    def test_server_verify_request(self):
        import server
        srv = server.Server.__new__(server.Server)
        srv.allow_uids = frozenset({0})
        srv.proc_net_tcp = self.paths
        with self.assertLogs("codeinterp", "WARNING"):
            self.assertFalse(srv.verify_request(FakeSocket(("127.0.0.1", 49999)), ("127.0.0.1", 40000)))
        srv.allow_uids = frozenset({1001})
        self.assertTrue(srv.verify_request(FakeSocket(("127.0.0.1", 49999)), ("127.0.0.1", 40000)))


class TestPeerUidLive(unittest.TestCase):
    """The running server (default --allow-uids: 0 and its own uid)."""

    CLIENT = ("exec 3<>/dev/tcp/127.0.0.1/{port} || exit 9\n"
              "printf 'GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' >&3\n"
              "cat <&3\n")

    def bash_client(self, preexec_fn=None):
        return subprocess.run(["bash", "-c", self.CLIENT.format(port=_port)], cwd="/",
                              capture_output=True, timeout=DEADLINE, preexec_fn=preexec_fn)

    def test_same_uid_allowed(self):
        raw = raw_http(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertTrue(raw.startswith(b"HTTP/1.1 200"), raw[:100])
        r = self.bash_client()
        self.assertTrue(r.stdout.startswith(b"HTTP/1.1 200"), (r.stdout, r.stderr))

    def test_other_uid_refused(self):
        if os.getuid() != 0:
            self.skipTest("needs root to connect as another user")
        nobody = pwd.getpwnam("nobody")

        def become_nobody():
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)

        r = self.bash_client(become_nobody)
        self.assertNotIn(b"HTTP/1.1", r.stdout, r.stderr)
        self.assertNotEqual(r.returncode, 9, r.stderr)  # it did connect
        self.assertTrue(server_log_has(f"owned by uid {nobody.pw_uid}"))
        self.assertEqual(request("GET", "/health")[0], 200)


def js_kernel_pids():
    """Pids of the server's node children (JavaScript contexts)."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == _server.pid and b"jskernel.js" in cmdline:
            out.add(int(name))
    return out


class TestReseedOnNewMachine(unittest.TestCase):
    """--machine-id-file changes (a VM restored or forked): fresh random state."""

    def test_python_reseeds_on_each_change(self):
        ctx = create_context(self)
        seed = "random.seed(7); np.random.seed(7)"
        execute(f"import random, numpy as np\n{seed}\nfirst = (random.random(), float(np.random.random()))\n"
                f"{seed}", context_id=ctx["id"])
        draw = (f"now = (random.random(), float(np.random.random()))\n{seed}\n"
                "[a == b for a, b in zip(now, first)]")
        self.assertEqual(execute(draw, context_id=ctx["id"]).text, "[True, True]")
        for _ in range(2):  # not only on the first change
            set_machine_id()
            self.assertEqual(execute(draw, context_id=ctx["id"]).text, "[False, False]")
            self.assertEqual(execute(draw, context_id=ctx["id"]).text, "[True, True]")

    def test_bash_reseeds_random(self):
        ctx = create_context(self, language="bash")
        execute("RANDOM=7; first=\"$RANDOM $RANDOM $RANDOM\"; RANDOM=7", context_id=ctx["id"])
        draw = ("now=\"$RANDOM $RANDOM $RANDOM\"; RANDOM=7; "
                "if [ \"$now\" = \"$first\" ]; then echo same; else echo differs; fi")
        self.assertEqual(execute(draw, context_id=ctx["id"]).stdout, "same\n")
        set_machine_id()
        self.assertEqual(execute(draw, context_id=ctx["id"]).stdout, "differs\n")
        self.assertEqual(execute(draw, context_id=ctx["id"]).stdout, "same\n")

    @needs_node
    def test_unused_js_context_restarts(self):
        ctx = create_context(self, language="javascript")
        before = js_kernel_pids()
        self.assertTrue(before)
        set_machine_id()
        ex = execute("process.pid", context_id=ctx["id"])
        self.assertIsNone(ex.error)
        self.assertNotIn(int(ex.text), before)
        self.assertEqual(ex.stderr, "")

    @needs_node
    def test_used_js_context_keeps_state(self):
        ctx = create_context(self, language="javascript")
        pid = execute("var keptJs = 5; process.pid", context_id=ctx["id"]).text
        set_machine_id()
        self.assertEqual(execute("[keptJs, process.pid].join(' ')", context_id=ctx["id"]).text,
                         f"5 {pid}")


if __name__ == "__main__":
    unittest.main()
