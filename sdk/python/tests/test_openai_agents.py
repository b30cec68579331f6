"""The OpenAI Agents SDK's real Runner driving a SandboxAgent in agentvm
VMs, with a scripted model (a Model that returns planned tool calls, so no
API key or network is needed): it writes files, runs commands, reads
results, survives a pause and a resume, and a fork gives sessions that
diverge."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from conftest import needs_server, uniq, until

import agentvm

agents = pytest.importorskip("agents", reason="the provider's tests need openai-agents (pip install 'agentvm-sdk[agents]')")

from agents import RunConfig, Runner  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig  # noqa: E402
from agents.sandbox.entries import File  # noqa: E402
from agents.sandbox.errors import ExecTransportError  # noqa: E402
from agents.sandbox.snapshot import NoopSnapshotSpec  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    Response,
    ResponseCompletedEvent,
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from agentvm.openai_agents import AgentVMSandboxClient, AgentVMSandboxClientOptions  # noqa: E402

pytestmark = needs_server


def shell(cmd: str, call_id: str, **extra: Any) -> ResponseFunctionToolCall:
    """A call of the sandbox's exec_command tool."""
    return ResponseFunctionToolCall(id="fc_" + call_id, call_id=call_id, type="function_call", name="exec_command", arguments=json.dumps({"cmd": cmd, **extra}))


def stdin(session_id: int, chars: str, call_id: str, **extra: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(id="fc_" + call_id, call_id=call_id, type="function_call", name="write_stdin", arguments=json.dumps({"session_id": session_id, "chars": chars, **extra}))


def patch(text: str, call_id: str) -> ResponseCustomToolCall:
    return ResponseCustomToolCall(id="ct_" + call_id, call_id=call_id, type="custom_tool_call", name="apply_patch", input=text)


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed", content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


class Scripted(Model):
    """Answers each model call with the next planned output. A turn may be
    a function of the tool outputs so far (to use a session id it got)."""

    def __init__(self, turns: list[Any]) -> None:
        self.turns = list(turns)
        self.outputs: list[str] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, *, previous_response_id, conversation_id, prompt) -> ModelResponse:  # noqa: A002
        if isinstance(input, list):
            self.outputs = [str(i.get("output")) for i in input if isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output")]
        turn = self.turns.pop(0)
        out = turn(self.outputs) if callable(turn) else turn
        return ModelResponse(output=out, usage=Usage(requests=1), response_id=None)

    async def stream_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, *, previous_response_id, conversation_id, prompt):  # noqa: A002
        r = await self.get_response(system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)
        yield ResponseCompletedEvent(
            type="response.completed", sequence_number=0,
            response=Response(id="resp_1", created_at=0, model="scripted", object="response", output=r.output, tool_choice="auto", tools=[], parallel_tool_calls=False, status="completed"),
        )  # fmt: skip


def agent(model: Scripted) -> SandboxAgent:
    return SandboxAgent(name="builder", instructions="Use the shell.", model=model, default_manifest=Manifest(entries={"README.md": File(content=b"from the manifest\n")}))


def tool_outputs(result) -> list[str]:
    return [str(i.output) for i in result.new_items if i.type == "tool_call_output_item"]


def run(coro):
    return asyncio.run(coro)


def test_an_agent_writes_runs_and_reads_in_a_vm(av) -> None:
    label = uniq("py-agents")

    def poll(outputs: list[str]):
        sid = int(outputs[-1].split("session ID ")[1].split()[0])
        return [stdin(sid, "", "c5", yield_time_ms=30_000)]

    model = Scripted([
        [shell("cat README.md; pwd; id -un", "c1")],
        [patch("*** Begin Patch\n*** Add File: app/main.py\n+print('hello from the agent')\n*** End Patch\n", "c2")],
        [shell("python3 app/main.py > out.txt; cat out.txt", "c3")],
        # a command longer than the tool's wait: it goes on in a session the next call reads
        [shell("sleep 3; echo slow-done", "c4", yield_time_ms=500)],
        poll,
        [say("built it")],
    ])  # fmt: skip

    async def go():
        client = AgentVMSandboxClient()
        opts = AgentVMSandboxClientOptions(memory=512, labels={"suite": label})
        return await Runner.run(agent(model), "build", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, options=opts, snapshot=NoopSnapshotSpec())))

    result = run(go())
    outs = tool_outputs(result)
    assert "from the manifest\n/workspace\nroot" in outs[0], outs[0]
    assert "Created app/main.py" in outs[1] or "app/main.py" in outs[1], outs[1]
    assert "hello from the agent" in outs[2], outs[2]
    assert "Process running with session ID" in outs[3], outs[3]
    assert "slow-done" in outs[4] and "exited with code 0" in outs[4], outs[4]
    assert result.final_output == "built it"
    # the run's VM is gone with the run (no pause_on_exit)
    assert av.vms.list(labels={"suite": label}) == []


def test_pause_on_exit_suspends_and_a_later_run_resumes_it(av) -> None:
    async def go() -> None:
        client = AgentVMSandboxClient()
        opts = AgentVMSandboxClientOptions(memory=512, pause_on_exit=True)
        m1 = Scripted([[shell("echo kept > state.txt; nohup sleep 900 >/dev/null 2>&1 & echo started", "c1")], [say("ok")]])
        r1 = await Runner.run(agent(m1), "one", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, options=opts, snapshot=NoopSnapshotSpec())))
        # what an application stores between runs: JSON
        saved = json.loads(json.dumps(r1.to_state().to_json()["sandbox"]["session_state"]))
        vm = av.vm(saved["vm_id"])
        try:
            assert vm.refresh().state.root == "suspended"
            m2 = Scripted([[shell("cat state.txt; pgrep -xc sleep", "c1")], [say("ok")]])
            state = client.deserialize_session_state(saved)
            r2 = await Runner.run(agent(m2), "two", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, session_state=state)))
            outs = tool_outputs(r2)
            assert "kept\n1" in outs[0], outs[0]  # the file and the process survived
            assert vm.refresh().state.root == "suspended"
        finally:
            vm.delete()

    run(go())


def test_fork_gives_sessions_that_diverge_and_previews_carry_a_token(av) -> None:
    client = AgentVMSandboxClient()

    async def go() -> None:
        s = await client.create(manifest=Manifest(), options=AgentVMSandboxClientOptions(memory=512, exposed_ports=(8000,)))
        async with s:
            await s.exec("echo base > f.txt; (python3 -m http.server 8000 >/dev/null 2>&1 &)")
            kids = await client.fork(s, 2)
            try:
                for i, k in enumerate(kids):
                    m = Scripted([[shell(f"echo child-{i} >> f.txt; cat f.txt", "c1")], [say("ok")]])
                    r = await Runner.run(agent(m), "x", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(session=k)))
                    assert f"base\nchild-{i}" in tool_outputs(r)[0]
                assert (await s.exec("cat f.txt")).stdout == b"base\n"
                got = [(await k.exec("cat f.txt")).stdout for k in kids]
                assert got == [b"base\nchild-0\n", b"base\nchild-1\n"]
                ep = await s.resolve_exposed_port(8000)
                assert ep.query.startswith("agentvm_token=avt_")
                assert "avt_" not in json.dumps(s.state.model_dump(mode="json"))  # not in what apps store
                assert (await s.exec("printf '\\377\\000'")).stdout == b"\xff\x00"  # bytes, as they are
                proxy = av.health().proxy

                def fetch() -> bool:
                    r = httpx.get(f"http://{proxy}/?{ep.query}", headers={"Host": f"{ep.host}"}, follow_redirects=False, timeout=30)
                    return r.status_code in (200, 302, 303, 307)

                await asyncio.to_thread(until, "the preview to answer with the endpoint's token", fetch)
                r = await asyncio.to_thread(httpx.get, f"http://{proxy}/", headers={"Host": ep.host}, timeout=30)
                assert r.status_code == 401  # and not without it
                kid_ep = await kids[1].resolve_exposed_port(8000)
                await kids[1].aclose()  # its token is revoked with it
                r = await asyncio.to_thread(httpx.get, f"http://{proxy}/?{kid_ep.query}", headers={"Host": kid_ep.host}, timeout=30)
                assert r.status_code == 401, r.status_code
                snap = await client.snapshot(kids[0], uniq("pyagentsnap"))
                try:
                    t = await client.create(manifest=Manifest(), options=AgentVMSandboxClientOptions(from_snapshot=snap))
                    async with t:
                        assert (await t.exec("cat f.txt")).stdout == b"base\nchild-0\n"
                finally:
                    av.snapshots.delete(snap)
            finally:
                for k in kids:
                    await k.aclose()

    run(go())


def test_a_vm_deleted_under_a_running_agent_is_a_clear_error(av) -> None:
    client = AgentVMSandboxClient()

    async def go() -> None:
        s = await client.create(manifest=Manifest(), options=AgentVMSandboxClientOptions(memory=512))
        await s.start()
        av.vm(s.state.vm_id).delete()
        with pytest.raises(ExecTransportError) as ei:
            await s.exec("true")
        assert isinstance(ei.value.__cause__, agentvm.NotFound)
        await s.shutdown()  # the VM is already gone: not an error

    run(go())


def test_a_scoped_client_runs_commands_but_cannot_expose_ports(av) -> None:
    """Exposing a port (and minting the preview token a private one's
    endpoint carries) is the admin's: a scoped client is told so."""
    vm = av.vms.create(uniq("pyagentscoped"), memory=512)
    tok = av.tokens.create(vm=vm.id, allow=["exec", "files", "preview"], ttl="10m")
    try:

        async def go() -> None:
            from agents.sandbox.errors import ExposedPortUnavailableError
            from agents.sandbox.snapshot import NoopSnapshot

            from agentvm.openai_agents import AgentVMSandboxSessionState

            client = AgentVMSandboxClient(agentvm.AsyncAgentVM(av.url, tok.token))
            state = AgentVMSandboxSessionState(
                session_id="00000000-0000-0000-0000-000000000002", manifest=Manifest(), snapshot=NoopSnapshot(id="x"), vm_id=vm.id, exposed_ports=(8000,),
            )  # fmt: skip
            s = await client.resume(state)
            assert (await s.exec("echo scoped")).stdout == b"scoped\n"
            with pytest.raises(ExposedPortUnavailableError) as ei:
                await s.resolve_exposed_port(8000)
            assert "needs the admin token" in str(ei.value.context)  # exposing a port is the admin's

        run(go())
    finally:
        av.tokens.revoke(tok.id)
        vm.delete()


def test_a_lost_vm_comes_back_from_the_workspace_snapshot(av, tmp_path) -> None:
    """Without pause_on_exit the run's VM is deleted, and the SDK keeps a
    tar of the workspace (made in the VM, without the manifest's ephemeral
    paths); a later run gets a new VM filled from it."""
    from agents.sandbox import LocalSnapshotSpec

    async def go() -> None:
        client = AgentVMSandboxClient()
        label = uniq("py-agents-lost")
        opts = AgentVMSandboxClientOptions(memory=512, labels={"suite": label})
        snaps = LocalSnapshotSpec(base_path=tmp_path)
        m1 = Scripted([[shell("mkdir -p src && echo 'print(1)' > src/app.py && ln -s src/app.py link.py && echo done", "c1")], [say("ok")]])
        r1 = await Runner.run(agent(m1), "one", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, options=opts, snapshot=snaps)))
        saved = json.loads(json.dumps(r1.to_state().to_json()["sandbox"]["session_state"]))
        first = saved["vm_id"]
        assert av.vms.list(labels={"suite": label}) == []  # deleted with the run
        m2 = Scripted([[shell("cat src/app.py README.md; readlink link.py", "c1")], [say("ok")]])
        r2 = await Runner.run(agent(m2), "two", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, session_state=client.deserialize_session_state(saved))))
        out = tool_outputs(r2)[0]
        assert "print(1)\nfrom the manifest\nsrc/app.py" in out, out
        assert r2.to_state().to_json()["sandbox"]["session_state"]["vm_id"] != first

    run(go())


def test_a_terminal_session_across_tool_calls(av) -> None:
    """exec_command with tty runs in an agentvm terminal; write_stdin, a
    later tool call (another task), types into it and reads the answer."""

    def answer(outputs: list[str]):
        sid = int(outputs[-1].split("session ID ")[1].split()[0])
        return [stdin(sid, "hello\n", "c2", yield_time_ms=30_000)]

    model = Scripted([
        [shell("read x; echo got-$x; exit 0", "c1", tty=True, yield_time_ms=500)],
        answer,
        [shell("tty; echo exit-$?", "c3", tty=True, yield_time_ms=30_000)],
        [say("done")],
    ])  # fmt: skip

    async def go():
        client = AgentVMSandboxClient()
        opts = AgentVMSandboxClientOptions(memory=512)
        return await Runner.run(agent(model), "talk", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, options=opts, snapshot=NoopSnapshotSpec())))

    outs = tool_outputs(run(go()))
    assert "Process running with session ID" in outs[0], outs[0]
    assert "got-hello" in outs[1] and "Process exited with code 0" in outs[1], outs[1]
    assert "/dev/pts/" in outs[2] and "exit-0" in outs[2] and "exited with code 0" in outs[2], outs[2]
