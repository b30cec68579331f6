"""Terminals over the WebSocket: a command round trip, resize, detach and
reattach with the scrollback, two clients, signals, exit, kill; sync and
async."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import needs_server, until

import agentvm

pytestmark = needs_server


class Collector:
    """Reads a terminal in a thread; wait_for polls what arrived."""

    def __init__(self, term: agentvm.Terminal) -> None:
        self.text = ""
        self.thread = threading.Thread(target=self._run, args=(term,), daemon=True)
        self.thread.start()

    def _run(self, term: agentvm.Terminal) -> None:
        for chunk in term:
            self.text += chunk.decode("utf-8", "replace")

    def wait_for(self, s: str, timeout: float = 60) -> None:
        until(f"terminal output containing {s!r} (got {self.text[-300:]!r})", lambda: s in self.text, timeout=timeout, interval=0.05)

    def done(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the terminal's output did not end"


def test_round_trip_resize_detach_reattach_signals_exit(vm) -> None:
    info = vm.terminals.create("work", cols=100, rows=30)
    assert info.name == "work" and info.user == "root"
    term = vm.terminals.attach("work")
    out = Collector(term)
    term.write("echo marker-$((6*7))\n")
    out.wait_for("marker-42")
    term.resize(132, 43)
    until("the size to apply", lambda: vm.terminals.get("work").cols == 132)
    term.write("stty size\n")
    out.wait_for("43 132")
    vm.terminals.resize("work", 90, 25)
    term.write('echo size-$(stty size | tr " " x)\n')
    out.wait_for("size-25x90")

    # detach: the program keeps running and its output is kept
    term.write("for i in 1 2 3; do echo tick-$i; sleep 0.3; done; echo loop-done; touch /tmp/loop-done\n")
    term.close()
    out.done()
    assert term.exit is None
    until("the loop to finish with nobody attached", lambda: vm.files.exists("/tmp/loop-done"))
    until("the server to see the detach", lambda: [(t.name, t.clients, t.exited) for t in vm.terminals.list()] == [("work", 0, False)])

    term = vm.terminals.attach("work")
    out = Collector(term)
    out.wait_for("loop-done")
    assert "marker-42" in out.text and "tick-3" in out.text  # the scrollback

    other = vm.terminals.attach("work", scrollback=False)
    out2 = Collector(other)
    term.write("echo shared-$((1+1))\n")
    out.wait_for("shared-2")
    out2.wait_for("shared-2")
    assert "marker-42" not in out2.text
    assert vm.terminals.get("work").clients == 2
    other.close()

    term.write("sleep 600\n")
    until("sleep to run", lambda: vm.exec("pgrep -x sleep || true").stdout.strip() != "")
    term.signal("INT")
    term.write("echo after-int-$?\n")
    out.wait_for("after-int-130")
    term.write("sleep 600; echo rest-$?\n")
    until("sleep to run again", lambda: vm.exec("pgrep -x sleep || true").stdout.strip() != "")
    vm.terminals.signal("work", "TERM")
    out.wait_for("rest-143")

    term.write("exit 3\n")
    out.done()
    assert term.exit == {"type": "exit", "exit_code": 3}
    gone = vm.terminals.get("work")
    assert gone.exited and gone.exit_code == 3
    term.close()


def test_a_command_at_a_size_as_a_user_and_kill(vm) -> None:
    vm.terminals.create("py", argv=["python3", "-q"], user="agent", cwd="/tmp", env={"MY_VAR": "xyz"})
    term = vm.terminals.attach("py", cols=77, rows=21)
    out = Collector(term)
    out.wait_for(">>>")
    term.write('import os, shutil; print("env", os.environ["MY_VAR"], os.getcwd(), os.getuid(), tuple(shutil.get_terminal_size()))\n')
    out.wait_for("env xyz /tmp 1000 (77, 21)")
    vm.terminals.kill("py")
    out.done()
    term.close()
    with pytest.raises(agentvm.NotFound):
        vm.terminals.get("py")
    with pytest.raises(agentvm.NotFound):
        vm.terminals.attach("py")


def test_async_terminal(vm) -> None:
    async def go() -> None:
        async with agentvm.AsyncAgentVM() as a:
            v = a.vm(vm.id)
            await v.terminals.create("atty")
            async with await v.terminals.attach("atty") as t:
                await t.write("echo async-$((2+3))\n")
                got = b""
                while b"async-5" not in got:
                    chunk = await asyncio.wait_for(t.read(), 60)
                    assert chunk is not None, got
                    got += chunk
                await t.write("exit 4\n")
                while await asyncio.wait_for(t.read(), 60) is not None:
                    pass
                assert t.exit == {"type": "exit", "exit_code": 4}
            with pytest.raises(agentvm.NotFound):
                await v.terminals.attach("no-such-terminal")

    asyncio.run(go())


def test_close_returns_while_output_floods_unread(vm) -> None:
    vm.terminals.create("flood", argv=["sh", "-c", "seq 1 2000000; sleep 600"])
    term = vm.terminals.attach("flood")
    assert term.read(timeout=60)
    time.sleep(3)  # output piles up, nobody reads it
    t = threading.Thread(target=term.close, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "close() did not return"
    assert term.read() is None
    vm.terminals.kill("flood")
