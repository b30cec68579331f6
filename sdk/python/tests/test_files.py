"""Files: atomic writes (buffered and streamed), reads (whole, ranges,
streamed), metadata, directories, users, errors, and tar streams (Python's
own tarfile reads and writes them)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile

import pytest
from conftest import needs_server

import agentvm

pytestmark = needs_server


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_write_read_stat_exists_ranges(vm) -> None:
    fi = vm.files.write("/root/py/notes/a.txt", "hello files\n", mkdirs=True, mode=0o640)
    assert (fi.size, fi.mode, fi.type) == (12, 0o640, "file")
    assert vm.files.read_text("/root/py/notes/a.txt") == "hello files\n"
    assert vm.exec("stat -c %a /root/py/notes/a.txt").stdout == "640\n"
    st = vm.files.stat("/root/py/notes/a.txt")
    assert st.size == 12 and st.owner == "root"
    assert vm.files.exists("/root/py/notes/a.txt") and not vm.files.exists("/root/py/notes/none")
    assert vm.files.read("/root/py/notes/a.txt", offset=6, length=5) == b"files"
    vm.files.write("/root/py/notes/a.txt", b"v2")
    assert vm.files.stat("/root/py/notes/a.txt").mode == 0o640  # a replaced file keeps its mode


def test_streamed_upload_and_download(vm, tmp_path) -> None:
    data = os.urandom(5 << 20)
    fi = vm.files.write("/root/py/big.bin", (data[i : i + (256 << 10)] for i in range(0, len(data), 256 << 10)))
    assert fi.size == len(data)
    assert vm.exec("sha256sum /root/py/big.bin | cut -d' ' -f1").stdout.strip() == sha(data)
    with vm.files.stream("/root/py/big.bin") as s:
        assert s.info.size == len(data)
        assert sha(b"".join(s)) == sha(data)
    local = tmp_path / "up.bin"
    local.write_bytes(data[:777_777])
    with local.open("rb") as f:
        assert vm.files.write("/root/py/from-file.bin", f).size == 777_777
    assert sha(vm.files.read("/root/py/from-file.bin")) == sha(data[:777_777])


def test_directories(vm) -> None:
    assert vm.files.mkdir("/root/py/tree/a/b", mode=0o750).type == "dir"
    vm.files.write("/root/py/tree/a/one.txt", "1")
    vm.files.write("/root/py/tree/a/two.txt", "22")
    assert [(e.name, e.type) for e in vm.files.list("/root/py/tree/a")] == [("b", "dir"), ("one.txt", "file"), ("two.txt", "file")]
    assert vm.files.rename("/root/py/tree/a/one.txt", "/root/py/tree/a/b/uno.txt").path == "/root/py/tree/a/b/uno.txt"
    with pytest.raises(agentvm.Conflict):
        vm.files.rename("/root/py/tree/a/two.txt", "/root/py/tree/a/b/uno.txt")
    vm.files.rename("/root/py/tree/a/two.txt", "/root/py/tree/a/b/uno.txt", overwrite=True)
    assert vm.files.read_text("/root/py/tree/a/b/uno.txt") == "22"
    with pytest.raises(agentvm.Conflict) as ei:
        vm.files.remove("/root/py/tree")
    assert ei.value.code == "not_empty"
    vm.files.remove("/root/py/tree", recursive=True)
    assert not vm.files.exists("/root/py/tree")
    with pytest.raises(agentvm.NotFound):
        vm.files.read("/root/py/tree/a/b/uno.txt")


def test_files_as_another_user(vm) -> None:
    assert vm.files.write("notes.txt", "mine", user="agent").path == "/home/agent/notes.txt"
    assert vm.files.stat("/home/agent/notes.txt").owner == "agent"
    with pytest.raises(agentvm.Forbidden) as ei:
        vm.files.write("/root/nope.txt", "x", user="agent")
    assert ei.value.code == "permission_denied"


def _tar(entries: dict[str, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, content in entries.items():
            ti = tarfile.TarInfo(name)
            if content is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
            else:
                ti.size = len(content)
                t.addfile(ti, io.BytesIO(content))
    return buf.getvalue()


def test_tar_a_tree_out_and_in(vm) -> None:
    vm.exec("mkdir -p /root/py/src/sub && echo alpha > /root/py/src/a.txt && echo beta > /root/py/src/sub/b.txt && ln -sf a.txt /root/py/src/link")
    with vm.files.read_tar("/root/py/src") as s:
        raw = s.read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        names = {m.name.removeprefix("./"): m for m in t.getmembers()}
        assert t.extractfile(names["a.txt"]).read() == b"alpha\n"
        assert t.extractfile(names["sub/b.txt"]).read() == b"beta\n"
        assert names["link"].issym() and names["link"].linkname == "a.txt"
    res = vm.files.write_tar("/root/py/copy", raw)
    assert res["files"] >= 2
    assert vm.exec("diff -r /root/py/src /root/py/copy && readlink /root/py/copy/link").stdout == "a.txt\n"
    mine = _tar({"made": None, "made/here.txt": b"made in python\n"})
    assert vm.files.write_tar("/root/py/mine", iter([mine[:700], mine[700:]]))["files"] == 1
    assert vm.files.read_text("/root/py/mine/made/here.txt") == "made in python\n"
    with pytest.raises(agentvm.InvalidArgument):
        vm.files.write_tar("/root/py/evil", _tar({"../escape.txt": b"x"}))


def test_async_files(vm, tmp_path) -> None:
    async def go() -> None:
        async with agentvm.AsyncAgentVM() as a:
            v = a.vm(vm.id)
            data = os.urandom(3 << 20)

            async def parts():
                for i in range(0, len(data), 1 << 20):
                    yield data[i : i + (1 << 20)]

            assert (await v.files.write("/root/py/async.bin", parts())).size == len(data)
            s = await v.files.stream("/root/py/async.bin")
            assert sha(await s.aread()) == sha(data)
            assert await v.files.exists("/root/py/async.bin")
            local = tmp_path / "async-up.bin"
            local.write_bytes(data[:300_000])
            with local.open("rb") as f:  # a file object on the async client
                assert (await v.files.write("/root/py/async-file.bin", f)).size == 300_000
            assert (await v.files.write("/root/py/async-list.bin", [b"a", b"bc"])).size == 3
            with pytest.raises(agentvm.NotFound):
                await v.files.read("/root/py/none")

    asyncio.run(go())
