"""Drives agentvm's code-interpreter image through the unmodified
`e2b-code-interpreter` PyPI package, sync and async (installed by
e2e/e2b_test.go into a throwaway virtualenv next to a copy of this file).
Environment as in sdk.test.mjs."""

import asyncio
import base64
import time
import unittest

from e2b_code_interpreter import AsyncSandbox, Sandbox


class CodeInterpreterSync(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sbx = Sandbox.create(timeout=1800, envs={"SANDBOX_WIDE": "py-create"})

    @classmethod
    def tearDownClass(cls):
        cls.sbx.kill()

    def test_state_and_results(self):
        self.sbx.run_code("y = 20")
        ex = self.sbx.run_code("y * 2 + 2")
        self.assertEqual(ex.text, "42")
        out, err, res = [], [], []
        ex = self.sbx.run_code(
            'import sys\nprint("o")\nprint("e", file=sys.stderr)\n{"k": 1}',
            on_stdout=lambda m: out.append(m.line),
            on_stderr=lambda m: err.append(m.line),
            on_result=lambda r: res.append(r),
        )
        self.assertEqual(out, ["o\n"])
        self.assertEqual(err, ["e\n"])
        self.assertEqual(ex.logs.stdout, ["o\n"])
        self.assertEqual(len(res), 1)
        self.assertEqual(ex.results[0].text, "{'k': 1}")
        self.assertTrue(ex.results[0].is_main_result)

    def test_error(self):
        ex = self.sbx.run_code("undefined_name + 1")
        self.assertEqual(ex.error.name, "NameError")
        self.assertIn("undefined_name", ex.error.value)
        self.assertIn("undefined_name", ex.error.traceback)

    def test_chart_and_dataframe(self):
        ex = self.sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.bar(['a', 'b', 'c'], [3, 1, 2])\nplt.show()"
        )
        pngs = [r.png for r in ex.results if r.png]
        self.assertTrue(pngs, [r.formats() for r in ex.results])
        self.assertEqual(base64.b64decode(pngs[0])[1:4], b"PNG")
        ex = self.sbx.run_code("import pandas as pd\npd.DataFrame({'n': [1, 2, 3]})")
        self.assertIn("<table", ex.results[0].html)

    def test_envs_and_cwd(self):
        self.assertEqual(self.sbx.run_code('import os; os.getenv("SANDBOX_WIDE")').text, "py-create")
        self.assertEqual(self.sbx.run_code('import os; os.getenv("ONE")', envs={"ONE": "1"}).text, "1")
        self.assertEqual(self.sbx.run_code('import os; os.getenv("ONE", "none")').text, "none")
        self.assertEqual(self.sbx.run_code("import os; os.getcwd()").text, "/home/user")
        ex = self.sbx.run_code("echo $HOME; pwd", language="bash")
        self.assertEqual("".join(ex.logs.stdout), "/home/user\n/home/user\n")
        # IPython's shell escape (through a terminal: CRLF): one log entry,
        # not "/home/user" and its line end
        self.assertEqual(self.sbx.run_code("!pwd").logs.stdout, ["/home/user\r\n"])

    def test_r_java_typescript(self):
        ex = self.sbx.run_code('Sys.getenv("SANDBOX_WIDE")', language="r")
        self.assertEqual(ex.results[0].text.strip(), '[1] "py-create"')
        ex = self.sbx.run_code("getwd()", language="r")
        self.assertEqual(ex.results[0].text.strip(), '[1] "/home/user"')
        ex = self.sbx.run_code('System.getProperty("ONE")', language="java", envs={"ONE": "1"})
        self.assertEqual(ex.text, "1")
        self.assertEqual(self.sbx.run_code('System.getProperty("user.dir")', language="java").text, "/home/user")
        # println's text and its line end are two entries, as in E2B's Java kernel
        ex = self.sbx.run_code('System.out.println("Hello, World!")', language="java")
        self.assertEqual(ex.logs.stdout, ["Hello, World!", "\n"])
        ex = self.sbx.run_code("const n: number = 21; n * 2", language="typescript")
        self.assertEqual(ex.text, "42")

    def test_contexts(self):
        ctx = self.sbx.create_code_context(cwd="/tmp", language="python")
        self.assertEqual(self.sbx.run_code("import os; os.getcwd()", context=ctx).text, "/tmp")
        self.assertIn(ctx.id, [c.id for c in self.sbx.list_code_contexts()])
        self.sbx.remove_code_context(ctx)
        self.assertNotIn(ctx.id, [c.id for c in self.sbx.list_code_contexts()])

    def test_timeout_interrupts(self):
        with self.assertRaises(Exception):
            self.sbx.run_code("import time; time.sleep(600)", timeout=5)
        deadline = time.time() + 120
        while True:
            try:
                self.assertEqual(self.sbx.run_code("3 * 3", timeout=20).text, "9")
                break
            except Exception:
                if time.time() > deadline:
                    raise
        self.assertEqual(self.sbx.run_code("y").text, "20")


class CodeInterpreterAsync(unittest.TestCase):
    def test_async(self):
        async def main():
            sbx = await AsyncSandbox.create(timeout=900)
            try:
                await sbx.run_code("z = 'async'")
                ex = await sbx.run_code("z.upper()")
                self.assertEqual(ex.text, "ASYNC")
                ex = await sbx.run_code("[1, 2].map(x => x * 2)", language="javascript")
                self.assertEqual(ex.text, "[ 2, 4 ]")
            finally:
                await sbx.kill()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
