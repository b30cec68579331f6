"""Exec: buffered, NDJSON events as produced, and the upgraded stream with
stdin written while the command runs; on both clients."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time

import pytest
from conftest import needs_server, until

import agentvm

pytestmark = needs_server


def test_buffered_shell_argv_exit_stderr_env_cwd_user_stdin(vm) -> None:
    r = vm.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    assert isinstance(r.duration_ms, int)
    assert vm.exec(["printf", "%s|", "a b", "$HOME"]).stdout == "a b|$HOME|"
    e = vm.exec(["sh", "-c", "echo $FOO; pwd; id -un"], env={"FOO": "bar"}, cwd="/tmp", user="agent")
    assert e.stdout == "bar\n/tmp\nagent\n"
    assert vm.exec(["tr", "a-z", "A-Z"], stdin="shout\n").stdout == "SHOUT\n"
    assert vm.exec({"cmd": ["echo", "request form"]}).stdout == "request form\n"


def test_buffered_timeout_signals_missing_command_bad_requests(vm) -> None:
    t = vm.exec("sleep 600", timeout="1s")
    assert t.timed_out and t.signal
    assert vm.exec("kill -TERM $$").signal == "SIGTERM"
    m = vm.exec(["no-such-command-here"])
    assert m.exit_code != 0 and "no-such-command-here" in m.stderr
    with pytest.raises(agentvm.InvalidArgument):
        vm.exec(["true"], cwd="relative")
    with pytest.raises(agentvm.AgentVMError) as ei:
        vm.exec([])
    assert ei.value.status == 400


def test_events_arrive_as_they_are_produced(vm) -> None:
    # The command goes on only once the test has received "one" (and made
    # the file it waits for): without streaming it would wait in vain.
    vm.exec("rm -f /tmp/py-stream-go")
    seen = []
    cmd = "echo one; i=0; until [ -e /tmp/py-stream-go ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; " \
        "[ -e /tmp/py-stream-go ] && echo two >&2; exit 4"
    for ev in vm.exec_stream(cmd):
        seen.append(ev)
        if ev.type == "stdout":
            vm.exec("touch /tmp/py-stream-go")
    assert [e.type for e in seen] == ["stdout", "stderr", "exit"], seen
    assert seen[0].data == "one\n" and seen[1].data == "two\n" and seen[2].exit_code == 4
    binary = list(vm.exec_stream(["printf", "\\377\\000\\376"]))
    assert binary[0].type == "stdout_base64"
    assert [e.data for e in vm.exec_stream(["cat"], stdin="piped") if e.type == "stdout"] == ["piped"]


def test_a_conversation_with_a_running_process(vm) -> None:
    with vm.spawn(["sh", "-c", 'while read l; do echo "out:$l"; echo "err:$l" >&2; done; echo bye; exit 7']) as p:
        out, err = b"", b""
        for word in ["alpha", "beta", "gamma"]:
            p.write(word + "\n")
            while f"out:{word}\n".encode() not in out or f"err:{word}\n".encode() not in err:
                kind, data = p.read()
                if kind == "stdout":
                    out += data
                else:
                    err += data
        assert p.exit_status is None
        p.close_stdin()
        rest = p.wait()
    assert rest.exit_code == 7
    assert out + rest.stdout == b"out:alpha\nout:beta\nout:gamma\nbye\n"
    assert err + rest.stderr == b"err:alpha\nerr:beta\nerr:gamma\n"


def test_big_input_binary_output_run(vm) -> None:
    data = os.urandom(3 << 20)
    want = hashlib.sha256(data).hexdigest()
    pieces = (data[i : i + 100_000] for i in range(0, len(data), 100_000))
    r = vm.run('sha256sum | cut -d" " -f1', stdin=pieces)
    assert r.exit_code == 0 and r.text.strip() == want
    echoed = vm.run(["cat"], stdin=data)  # output read while input is written
    assert echoed.stdout == data
    p = vm.spawn(["head", "-c", "1000000", "/dev/zero"])
    p.close_stdin()
    n = sum(len(d) for k, d in p if k == "stdout")
    assert n == 1_000_000 and p.exit_status.exit_code == 0
    missing = vm.run(["no-such-command-here"])
    assert missing.exit_code != 0 and b"no-such-command-here" in missing.stderr


def test_signals_and_closing_kills_the_command(vm) -> None:
    p = vm.spawn("echo started; exec sleep 600")
    assert p.read() == ("stdout", b"started\n")
    p.signal("TERM")
    assert p.wait().signal == "SIGTERM"

    q = vm.spawn(["sh", "-c", "echo $$ > /tmp/py-killed.pid; exec sleep 600"])
    until("the pid file", lambda: vm.exec("cat /tmp/py-killed.pid").stdout.strip() != "")
    q.kill()
    with pytest.raises(agentvm.StreamLost):
        q.wait()
    until("the killed command to be gone", lambda: vm.exec("kill -0 $(cat /tmp/py-killed.pid)").exit_code != 0)


def test_the_async_client_runs_the_same_calls(av, vm) -> None:
    async def go() -> None:
        async with agentvm.AsyncAgentVM() as a:
            v = a.vm(vm.id)
            assert (await v.exec("echo async")).stdout == "async\n"
            assert [e.type async for e in await v.exec_stream("echo s; exit 2")] == ["stdout", "exit"]
            p = await v.spawn(["sh", "-c", "read l; echo got:$l; exit 5"])
            await p.write("x\n")
            assert await p.read() == ("stdout", b"got:x\n")
            assert (await p.wait()).exit_code == 5
            data = os.urandom(2 << 20)
            assert (await v.run(["cat"], stdin=data)).stdout == data

            async def chunks():
                for i in range(0, len(data), 65536):
                    yield data[i : i + 65536]

            assert (await v.run("sha256sum", stdin=chunks())).text.split()[0] == hashlib.sha256(data).hexdigest()
            results = await asyncio.gather(*(v.exec(f"echo {i}") for i in range(8)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
            q = await v.spawn("exec sleep 600")
            await q.kill()
            with pytest.raises(agentvm.StreamLost):
                await q.wait()

    asyncio.run(go())


def test_kill_from_another_thread_ends_a_blocked_wait(vm) -> None:
    p = vm.spawn("echo up; exec sleep 600")
    assert p.read() == ("stdout", b"up\n")
    errs: list[BaseException] = []

    def wait() -> None:
        try:
            p.wait()
        except BaseException as err:  # noqa: BLE001 - checked below
            errs.append(err)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    time.sleep(0.5)
    p.kill()
    t.join(60)
    assert not t.is_alive(), "a wait blocked in another thread did not end"
    assert errs and isinstance(errs[0], agentvm.StreamLost), errs
    until("the killed command to be gone", lambda: "sleep 600" not in vm.exec("ps -eo args").stdout)


def test_a_failing_stdin_source_ends_the_command_with_its_error(av, vm) -> None:
    def source():
        yield b"first\n"
        raise ValueError("the source broke")

    with pytest.raises(ValueError, match="the source broke"):
        vm.run(["cat"], stdin=source())

    async def go() -> None:
        async with agentvm.AsyncAgentVM() as a:
            v = a.vm(vm.id)

            async def asource():
                yield b"first\n"
                raise ValueError("the async source broke")

            with pytest.raises(ValueError, match="the async source broke"):
                await v.run(["cat"], stdin=asource())
            # a stream lost under run() is StreamLost on the async client too,
            # not an exception group: revoking the token ends it
            tok = av.tokens.create(vm=vm.id, allow=["exec"], ttl="10m")
            async with agentvm.AsyncAgentVM(av.url, tok.token) as scoped:

                async def revoke_soon() -> None:
                    # once the command runs (revoked before the request
                    # arrives, it would be refused, not lost)
                    await asyncio.to_thread(
                        until, "the command to run", lambda: "sleep 613" in vm.exec("ps -eo args").stdout
                    )
                    await asyncio.to_thread(av.tokens.revoke, tok.id)

                task = asyncio.create_task(revoke_soon())
                with pytest.raises(agentvm.StreamLost):
                    await scoped.vm(vm.id).run("echo up; exec sleep 613", stdin=b"")
                await task

    asyncio.run(go())
