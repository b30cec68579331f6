"""Drives agentvm through the unmodified `e2b` PyPI package, sync and async
clients (installed by e2e/e2b_test.go into a throwaway virtualenv next to a
copy of this file). Environment as in sdk.test.mjs."""

import asyncio
import http.client
import json
import os
import time
import unittest
import urllib.parse

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    Template,
    TimeoutException,
)

RUN = os.environ["RUN"] + "-py"
PROXY = os.environ["AGENTVM_PROXY"]
DOMAIN = os.environ["E2B_DOMAIN"]


def wait_for(what, cond, seconds=180):
    end = time.time() + seconds
    while True:
        try:
            if cond():
                return
        except Exception:
            if time.time() > end:
                raise
        if time.time() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.25)


def get(host, path, headers=None):
    h, p = PROXY.split(":")
    c = http.client.HTTPConnection(h, int(p), timeout=60)
    try:
        c.request("GET", path, headers={"Host": host, **(headers or {})})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


class SyncSDK(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sbx = Sandbox.create(timeout=900, metadata={"suite": "py", "run": RUN})

    @classmethod
    def tearDownClass(cls):
        Sandbox.kill(cls.sbx.sandbox_id)

    def test_01_commands(self):
        s = self.sbx
        r = s.commands.run("echo hello; echo oops >&2")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, "hello\n", "oops\n"))
        self.assertEqual(s.commands.run("whoami").stdout.strip(), "user")
        self.assertEqual(s.commands.run("whoami", user="root").stdout.strip(), "root")
        self.assertEqual(s.commands.run("echo $FOO", envs={"FOO": "bar"}).stdout, "bar\n")
        self.assertEqual(s.commands.run("pwd", cwd="/tmp").stdout, "/tmp\n")
        with self.assertRaises(CommandExitException) as cm:
            s.commands.run("exit 4")
        self.assertEqual(cm.exception.exit_code, 4)
        with self.assertRaises(TimeoutException):
            s.commands.run("sleep 60", timeout=1.5)

    def test_02_background_and_stdin(self):
        s = self.sbx
        h = s.commands.run("until [ -e /tmp/go-bg ]; do sleep 0.1; done; echo bg", background=True)
        self.assertIn(h.pid, [p.pid for p in s.commands.list()])
        again = s.commands.connect(h.pid)
        s.files.write("/tmp/go-bg", "")
        self.assertEqual(again.wait().stdout, "bg\n")
        cat = s.commands.run("cat", background=True, stdin=True)
        s.commands.send_stdin(cat.pid, "abc\n")
        s.commands.close_stdin(cat.pid)
        self.assertEqual(cat.wait().stdout, "abc\n")
        sleeper = s.commands.run("sleep 300", background=True)
        self.assertTrue(s.commands.kill(sleeper.pid))
        with self.assertRaises(CommandExitException):
            sleeper.wait()
        self.assertFalse(s.commands.kill(sleeper.pid))

    def test_03_files(self):
        s = self.sbx
        s.files.write("/home/user/p.txt", "python text")
        self.assertEqual(s.files.read("/home/user/p.txt"), "python text")
        s.files.write("/home/user/deep/er/b.bin", b"\x00\x01\xff")
        self.assertEqual(bytes(s.files.read("/home/user/deep/er/b.bin", format="bytes")), b"\x00\x01\xff")
        info = s.files.get_info("/home/user/p.txt")
        self.assertEqual((info.name, info.size), ("p.txt", 11))
        self.assertIn("p.txt", [e.name for e in s.files.list("/home/user")])
        self.assertIn("/home/user/deep/er/b.bin", [e.path for e in s.files.list("/home/user", depth=3)])
        self.assertTrue(s.files.make_dir("/home/user/d1"))
        self.assertFalse(s.files.make_dir("/home/user/d1"))
        s.files.rename("/home/user/p.txt", "/home/user/q.txt")
        self.assertFalse(s.files.exists("/home/user/p.txt"))
        s.files.remove("/home/user/q.txt")
        self.assertFalse(s.files.exists("/home/user/q.txt"))
        with self.assertRaises(FileNotFoundException):
            s.files.read("/home/user/missing")

    def test_04_watch(self):
        s = self.sbx
        s.files.make_dir("/home/user/pw")
        handle = s.files.watch_dir("/home/user/pw", recursive=True, include_entry=True)
        s.files.write("/home/user/pw/a.txt", "x")
        seen = []

        def got():
            seen.extend(handle.get_new_events())
            return any(e.name == "a.txt" and e.type == FilesystemEventType.WRITE for e in seen)

        wait_for("a watch event", got, 60)
        # A new file is seen as envd's is: created, its owner set, written.
        self.assertEqual([e.type for e in seen], [FilesystemEventType.CREATE, FilesystemEventType.CHMOD, FilesystemEventType.WRITE])
        self.assertEqual((seen[2].entry.name, seen[2].entry.path), ("a.txt", "/home/user/pw/a.txt"))
        handle.stop()

    def test_05_pty(self):
        s = self.sbx
        out = bytearray()
        term = s.pty.create(PtySize(rows=24, cols=80))
        s.pty.send_stdin(term.pid, b"stty size; exit\n")
        term.wait(on_pty=lambda d: out.extend(d))
        self.assertIn(b"24 80", bytes(out))

    def test_06_info_list_host(self):
        s = self.sbx
        info = s.get_info()
        self.assertEqual((info.sandbox_id, info.metadata["run"]), (s.sandbox_id, RUN))
        pages = Sandbox.list(query=SandboxQuery(metadata={"run": RUN}), limit=1)
        ids = []
        while pages.has_next:
            ids += [x.sandbox_id for x in pages.next_items()]
        self.assertEqual(ids, [s.sandbox_id])
        s.commands.run("cd /tmp && echo py > i.html && python3 -m http.server 8010", background=True, timeout=0)
        wait_for("the server", lambda: get(s.get_host(8010), "/i.html") == (200, "py\n"), 60)

    def test_07_pause_connect(self):
        s = self.sbx
        s.files.write("/home/user/keep.txt", "kept")
        self.assertTrue(s.pause())
        self.assertEqual(Sandbox.get_info(s.sandbox_id).state, SandboxState.PAUSED)
        again = Sandbox.connect(s.sandbox_id)
        self.assertEqual(again.files.read("/home/user/keep.txt"), "kept")
        type(self).sbx = again

    def test_08_snapshot_fork(self):
        s = self.sbx
        s.files.write("/home/user/snap.txt", "snap")
        snap = s.create_snapshot()
        child = Sandbox.create(snap.snapshot_id, timeout=600)
        try:
            self.assertEqual(child.files.read("/home/user/snap.txt"), "snap")
        finally:
            child.kill()
        self.assertTrue(Sandbox.delete_snapshot(snap.snapshot_id))
        kids = s.fork(count=1)
        self.assertEqual(len(kids), 1)
        try:
            self.assertEqual(kids[0].files.read("/home/user/snap.txt"), "snap")
        finally:
            kids[0].kill()

    def test_09_bad_input(self):
        with self.assertRaises(SandboxException):
            Sandbox.create("no-such-template-x", timeout=10)
        with self.assertRaises(SandboxNotFoundException):
            Sandbox.connect("nosuchsandbox0000000")
        with self.assertRaises(AuthenticationException):
            Sandbox.list(api_key="e2b_" + "0" * 40).next_items()
        with self.assertRaises((SandboxNotFoundException, NotFoundException)):
            Sandbox.get_info(self.sbx.sandbox_id, api_key=os.environ["AGENTVM_SCOPED_KEY"])
        status, _ = get("49983-%s.%s" % (self.sbx.sandbox_id, DOMAIN), "/health", {"X-Access-Token": "wrong"})
        self.assertEqual(status, 401)
        self.assertFalse(Sandbox.kill("nosuchsandbox0000000"))
        # Templates: built-in images, built templates and snapshots exist by name.
        self.assertTrue(Template.exists("base"))
        self.assertFalse(Template.exists("no-such-template-x"))


def vm_state(name):
    """The sandbox's VM's state in agentvm's own API: E2B's answers call a
    sandbox past its auto-pause timeout paused at once, while the pause is
    still under way."""
    u = urllib.parse.urlsplit(os.environ["AGENTVM_URL"])
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        c.request("GET", "/v1/vms/" + name, headers={"Authorization": "Bearer " + os.environ["AGENTVM_TOKEN"]})
        r = c.getresponse()
        return json.loads(r.read())["state"]
    finally:
        c.close()


class Lifecycle(unittest.TestCase):
    """What the timeout does: a pause a request wakes (auto_resume), and a
    filesystem-only pause that connect resumes with a boot from the disk."""

    def test_auto_resume_and_filesystem_pause(self):
        md = {"suite": "py-lifecycle", "run": RUN}
        auto = Sandbox.create(timeout=600, metadata=md, lifecycle={"on_timeout": "pause", "auto_resume": True})
        disk = Sandbox.create(timeout=600, metadata=md, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
        try:
            self.assertEqual(auto.get_info().lifecycle, {"on_timeout": "pause", "auto_resume": True})
            self.assertEqual(disk.get_info().lifecycle, {"on_timeout": "pause", "auto_resume": False})
            auto.commands.run("cd /tmp && echo woke > w.html && python3 -m http.server 8020", background=True, timeout=0)
            disk.files.write("/home/user/marker.txt", "on disk")
            boot = disk.files.read("/proc/sys/kernel/random/boot_id").strip()
            wait_for("the server", lambda: get(auto.get_host(8020), "/w.html") == (200, "woke\n"), 60)
            # Both reach their timeouts now (a short one is also what the
            # auto-resume gives again).
            disk.set_timeout(1)
            auto.set_timeout(3)
            wait_for("the timeout's pause", lambda: vm_state(auto.sandbox_id) == "suspended", 180)
            wait_for("the timeout's filesystem-only pause", lambda: vm_state(disk.sandbox_id) == "stopped", 180)
            for s in (auto, disk):
                self.assertEqual(Sandbox.get_info(s.sandbox_id).state, SandboxState.PAUSED)
            # Paused, not woken by a request: only auto_resume does that.
            self.assertFalse(disk.is_running())
            self.assertEqual(Sandbox.get_info(disk.sandbox_id).state, SandboxState.PAUSED)
            # A request to a port wakes the auto_resume one, server and all.
            self.assertEqual(get(auto.get_host(8020), "/w.html"), (200, "woke\n"))
            auto.set_timeout(600)  # before its 3 s run out again
            self.assertEqual(Sandbox.get_info(auto.sandbox_id).state, SandboxState.RUNNING)
            self.assertTrue(auto.is_running())
            # Killed under a running command: its wait says so, as E2B's does.
            sleeper = auto.commands.run("sleep 600", background=True, timeout=0)
            auto.kill()
            with self.assertRaises(Exception) as cm:
                sleeper.wait()
            self.assertIn("sandbox was killed or reached its end of life", str(cm.exception))
            again = Sandbox.connect(disk.sandbox_id, request_timeout=600)  # a boot, under TCG
            self.assertEqual(again.files.read("/home/user/marker.txt"), "on disk")
            self.assertNotEqual(again.files.read("/proc/sys/kernel/random/boot_id").strip(), boot)
        finally:
            auto.kill()
            disk.kill()


class AsyncSDK(unittest.IsolatedAsyncioTestCase):
    async def test_async(self):
        s = await AsyncSandbox.create(timeout=600, metadata={"suite": "py-async", "run": RUN})
        try:
            r = await s.commands.run("echo async")
            self.assertEqual(r.stdout, "async\n")
            chunks = []
            await s.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=chunks.append)
            self.assertEqual("".join(chunks), "1\n2\n3\n")
            await s.files.write("/home/user/a.txt", "async file")
            self.assertEqual(await s.files.read("/home/user/a.txt"), "async file")
            events = []
            handle = await s.files.watch_dir("/home/user", events.append)
            await s.files.write("/home/user/b.txt", "b")
            end = time.time() + 60
            while not any(e.name == "b.txt" for e in events):
                self.assertLess(time.time(), end, "no watch event")
                await asyncio.sleep(0.25)
            await handle.stop()
            h = await s.commands.run("sleep 1; echo later", background=True)
            self.assertEqual((await h.wait()).stdout, "later\n")
        finally:
            await s.kill()
        with self.assertRaises(SandboxNotFoundException):
            await AsyncSandbox.connect(s.sandbox_id)


if __name__ == "__main__":
    unittest.main()
