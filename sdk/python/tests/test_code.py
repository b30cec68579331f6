"""The code interpreter: a code-interpreter VM's live kernels (run, stream,
contexts) and its typed errors."""

from __future__ import annotations

import asyncio

import pytest
from conftest import cleanup, create_vm, needs_server, uniq

import agentvm

pytestmark = needs_server


@pytest.fixture(scope="module")
def cvm(av):
    v = av.vms.create(uniq("pycode"), image="code-interpreter", memory=1024)
    yield v
    cleanup(v)


def test_run_keeps_state_results_streams_errors(cvm) -> None:
    assert cvm.info.image == "code-interpreter"
    cvm.code.run("n = 20")
    ex = cvm.code.run('print("half"); n * 2 + 2')
    assert ex.text == "42" and ex.stdout == "half\n"
    assert [e.type for e in cvm.code.stream('import sys; print("e", file=sys.stderr)') if e.type != "count"] == ["stderr", "end"]
    assert cvm.code.run("1 / 0").error.name == "ZeroDivisionError"
    assert cvm.code.run("[1, 2, 3].length", language="javascript").text == "3"

    async def go() -> None:
        async with agentvm.AsyncAgentVM() as a:
            assert (await a.vm(cvm.id).code.run("n + 1")).text == "21"

    asyncio.run(go())


def test_contexts(cvm) -> None:
    ctx = cvm.code.create_context(language="bash", cwd="/tmp")
    assert cvm.code.run("pwd", context=ctx.id).stdout == "/tmp\n"
    assert any(c.id == ctx.id for c in cvm.code.contexts())
    cvm.code.restart_context(ctx.id)
    cvm.code.delete_context(ctx.id)
    with pytest.raises(agentvm.NotFound):
        cvm.code.run("pwd", context=ctx.id)


def test_a_default_image_vm_has_no_kernels(av) -> None:
    plain = create_vm(av, uniq("pynocode"))
    try:
        with pytest.raises(agentvm.Conflict):
            plain.code.run("1")
    finally:
        cleanup(plain)
