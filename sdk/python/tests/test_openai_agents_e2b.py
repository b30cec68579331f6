"""openai-agents' own E2B sandbox client, unchanged, against agentvm's
E2B-compatible API (E2B_API_KEY, E2B_API_URL, E2B_DOMAIN pointing at
agentvm): shell, apply_patch, a long command's session, pause on exit
and a resume of the same sandbox."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

pytest.importorskip("agents.extensions.sandbox.e2b", reason="needs openai-agents[e2b]")
if not os.environ.get("E2B_API_KEY"):
    pytest.skip("set E2B_API_KEY, E2B_API_URL and E2B_DOMAIN to an agentvm server's E2B API", allow_module_level=True)

from agents import RunConfig, Runner  # noqa: E402
from agents.extensions.sandbox import E2BSandboxClient, E2BSandboxClientOptions  # noqa: E402
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig  # noqa: E402
from agents.sandbox.entries import File  # noqa: E402
from agents.sandbox.snapshot import NoopSnapshotSpec  # noqa: E402
from test_openai_agents import Scripted, patch, say, shell, tool_outputs  # noqa: E402


def agent(model: Scripted) -> SandboxAgent:
    # E2B's sandboxes run the SDK's file calls as "user": the workspace
    # goes where that user may write (the default /workspace is root's).
    manifest = Manifest(root="/home/user/workspace", entries={"README.md": File(content=b"from the manifest\n")})
    return SandboxAgent(name="e2b-builder", instructions="Use the shell.", model=model, default_manifest=manifest)


def test_the_e2b_client_of_openai_agents_runs_on_agentvm() -> None:
    async def go() -> None:
        client = E2BSandboxClient()
        opts = E2BSandboxClientOptions(sandbox_type="e2b", template="base", pause_on_exit=True)
        m1 = Scripted([
            [shell("cat README.md; pwd; echo kept > state.txt", "c1")],
            [patch("*** Begin Patch\n*** Add File: a.txt\n+patched\n*** End Patch\n", "c2")],
            [shell("cat a.txt; sleep 20; echo slow", "c3", yield_time_ms=5000)],
            [say("done")],
        ])  # fmt: skip
        r1 = await Runner.run(agent(m1), "go", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, options=opts, snapshot=NoopSnapshotSpec())))
        saved = json.loads(json.dumps(r1.to_state().to_json()["sandbox"]["session_state"]))
        try:
            await check(client, r1, saved)
        finally:
            from e2b import AsyncSandbox

            await AsyncSandbox.kill(saved["sandbox_id"])

    async def check(client, r1, saved) -> None:
        outs = tool_outputs(r1)
        assert "from the manifest\n/home/user/workspace" in outs[0], outs[0]
        assert "a.txt" in outs[1], outs[1]
        # a command that outlives its yield leaves a session (what it printed
        # by then depends on the machine's speed: r2 reads the patched file)
        assert "session ID" in outs[2], outs[2]
        m2 = Scripted([[shell("cat state.txt a.txt", "c1")], [say("done")]])
        r2 = await Runner.run(agent(m2), "again", run_config=RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client, session_state=client.deserialize_session_state(saved))))
        assert "kept\npatched" in tool_outputs(r2)[0], tool_outputs(r2)

    asyncio.run(go())
