"""E2B's Template SDK (the published e2b PyPI package, sync and async)
against agentvm: a build with steps and files, a sandbox of the template
whose start command already serves, a failing step, exists, tags."""

import asyncio
import os
import re
import tempfile
import unittest

from e2b import AsyncSandbox, AsyncTemplate, BuildException, Sandbox, Template, wait_for_port

RUN = re.sub(r"[^a-z0-9-]", "-", os.environ.get("RUN", "run"))[-30:]
CTX = tempfile.mkdtemp(prefix="e2b-template-")
os.makedirs(os.path.join(CTX, "app"))
with open(os.path.join(CTX, "app", "main.py"), "w") as f:
    f.write("print('from the template')\n")


def make(cls):
    return (
        cls(file_context_path=CTX)
        .from_base_image()
        .copy("app", "/app", mode=0o755)
        .set_envs({"WHO": "python sdk"})
        .run_cmd('echo "$WHO" > /app/who.txt && whoami > /app/builder.txt')
        .run_cmd("mkdir -p /opt/root-only && touch /opt/root-only/x", user="root")
        .set_workdir("/app")
        .set_start_cmd("python3 -m http.server 8001", wait_for_port(8001))
    )


class TemplateSync(unittest.TestCase):
    def test_build_and_use(self):
        name = f"tpl-py-{RUN}"
        logs = []
        Template.build(make(Template), name, on_build_logs=lambda e: logs.append(e.message))
        self.assertTrue(any("Template created with ID" in m for m in logs), logs)
        self.assertTrue(Template.exists(name))
        self.assertFalse(Template.exists(f"nope-{RUN}"))
        sbx = Sandbox.create(name)
        try:
            r = sbx.commands.run("curl -sS --max-time 10 http://127.0.0.1:8001/who.txt; cat /app/builder.txt; python3 /app/main.py; ls /opt/root-only")
            self.assertEqual(r.stdout, "python sdk\nuser\nfrom the template\nx\n")
        finally:
            sbx.kill()

    def test_tags(self):
        name = f"tpl-py-tags-{RUN}"
        Template.build(make(Template), f"{name}:v1")
        self.assertTrue(Template.exists(f"{name}:v1"))
        info = Template.assign_tags(f"{name}:v1", ["prod"])
        self.assertEqual(info.tags, ["prod"])
        self.assertEqual(sorted(t.tag for t in Template.get_tags(name)), ["default", "prod", "v1"])
        sbx = Sandbox.create(f"{name}:prod")
        try:
            self.assertEqual(sbx.commands.run("cat /app/who.txt").stdout, "python sdk\n")
        finally:
            sbx.kill()
        Template.remove_tags(name, ["prod"])
        self.assertFalse(Template.exists(f"{name}:prod"))
        self.assertTrue(Template.exists(f"{name}:v1"))

    def test_failing_step(self):
        bad = Template().from_base_image().run_cmd("echo no; exit 5")
        with self.assertRaises(BuildException) as cm:
            Template.build(bad, f"tpl-py-bad-{RUN}")
        self.assertIn("exited with code 5", str(cm.exception))


class TemplateAsync(unittest.IsolatedAsyncioTestCase):
    async def test_build_and_use(self):
        name = f"tpl-pya-{RUN}"
        await AsyncTemplate.build(make(AsyncTemplate), name)
        self.assertTrue(await AsyncTemplate.exists(name))
        sbx = await AsyncSandbox.create(name)
        try:
            r = await sbx.commands.run("curl -sS --max-time 10 http://127.0.0.1:8001/who.txt")
            self.assertEqual(r.stdout, "python sdk\n")
        finally:
            await sbx.kill()


if __name__ == "__main__":
    unittest.main()
