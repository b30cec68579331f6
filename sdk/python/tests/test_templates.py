"""Templates: a build from a tar with its progress as it happens, a VM made
from the template with its service already answering, a failing step, a
refused Dockerfile, list, get, delete; the async client too."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest
from conftest import needs_server, uniq

import agentvm

pytestmark = needs_server


def tar_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, body in files.items():
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


CONTEXT = tar_of({
    "Dockerfile": 'FROM default\nCOPY www/ /srv/www/\nEXPOSE 8000\nCMD ["python3", "-m", "http.server", "8000", "--directory", "/srv/www"]\n',
    "www/index.html": "<p>python sdk</p>\n",
})  # fmt: skip


def test_build_create_list_get_delete(av: agentvm.AgentVM) -> None:
    name = uniq("pytpl")
    events = list(av.templates.build(name, CONTEXT, memory="512M"))
    last = events[-1]
    assert "template" in last, events
    assert last["template"]["start"][0] == "python3"
    assert any(e.get("instruction") == "COPY www/ /srv/www/" and e.get("step") == 2 for e in events), events
    try:
        vm = av.vms.create(template=name)
        try:
            r = vm.exec("curl -sS --max-time 10 http://127.0.0.1:8000/index.html")
            assert r.stdout == "<p>python sdk</p>\n"
        finally:
            vm.delete()
        assert any(t.name == name for t in av.templates.list())
        assert av.templates.get(name).dockerfile.startswith("FROM default")
        # Tags: the same build again (every step cached) as name:v2, then v1 on it.
        events = list(av.templates.build(f"{name}:v2", CONTEXT, memory="512M", tags=["v3"]))
        assert "template" in events[-1], events
        assert av.templates.tag(f"{name}:v2", ["v1"]).name == f"{name}:v2"
        snap = av.templates.get(name).snapshot
        assert [av.templates.get(f"{name}:{t}").snapshot for t in ("v1", "v2", "v3")] == [snap] * 3
        for t in ("v1", "v2", "v3"):
            av.templates.delete(f"{name}:{t}")
        with pytest.raises(agentvm.NotFound):
            av.templates.get(f"{name}:v1")
    finally:
        av.templates.delete(name)
    with pytest.raises(agentvm.NotFound):
        av.templates.get(name)


def test_failing_step_and_refused_dockerfile(av: agentvm.AgentVM) -> None:
    events = list(av.templates.build(uniq("pybad"), tar_of({"Dockerfile": "FROM default\nRUN echo nope; exit 6\n"}), memory="512M"))
    err = events[-1]["error"]
    assert (err["step"], err["line"], err["exit_code"]) == (2, 2, 6) and "nope" in err["output"], err
    with pytest.raises(agentvm.InvalidArgument, match="line 2: VOLUME"):
        list(av.templates.build(uniq("pybad"), tar_of({"Dockerfile": "FROM default\nVOLUME /x\n"})))


def test_async_list() -> None:
    async def go() -> list:
        async with agentvm.AsyncAgentVM() as c:
            return await c.templates.list()

    assert isinstance(asyncio.run(go()), list)
