"""The durable record: a hosted repository the VM clones at create and
pushes to with no credential, what changed on its disk, and its exec
recordings."""

from __future__ import annotations

import json

import pytest
from conftest import cleanup, create_vm, needs_server, uniq

import agentvm

pytestmark = needs_server

REPO = uniq("pyrepo")


@pytest.fixture(scope="module")
def vm(av):
    av.repos.create(REPO)
    v = create_vm(av, uniq("pyrec"), repo=REPO)
    yield v
    cleanup(v)
    try:
        av.repos.delete(REPO)
    except agentvm.NotFound:
        pass


def test_repo_push_from_the_vm(av, vm):
    r = av.repos.get(REPO)
    assert r.url == f"/git/{REPO}.git" and r.head == "main"
    assert any(x.name == REPO for x in av.repos.list())
    res = vm.exec(f"cd /home/agent/{REPO} && echo hi > a.txt && git add a.txt && git commit -qm one && git push -q origin HEAD:main && git rev-parse HEAD", user="agent")
    assert res.exit_code == 0, res.stderr
    assert av.repos.get(REPO).branches["main"] == res.stdout.strip()
    assert any(e.type == "push" and e.actor == f"vm:{vm.id}" for e in av.repos.events(REPO))
    tok = av.repos.token(REPO, access="write", branches="agent/*", ttl="10m")
    assert tok.repo == REPO and tok.allow == ["read", "write"] and tok.branches == "agent/*"
    hook = av.repos.add_hook(REPO, "http://127.0.0.1:9/hook", allow_private=True)
    assert len(hook.secret) == 48
    av.repos.remove_hook(REPO, hook.id)
    av.tokens.revoke(tok.id)


def test_diff_and_recordings(vm):
    vm.exec('printf "x\\n" > /root/py-diff.txt && sync')
    d = vm.diff(diffs=True)
    added = [e for e in d.added if e.path == "/root/py-diff.txt"]
    assert added and "+x\n" in added[0].diff, [e.path for e in d.added]
    assert d.since == "create"
    assert vm.recordings.enabled()
    recs = vm.recordings.list()
    ex = [r for r in recs if r.kind == "exec" and "py-diff.txt" in r.title]
    assert ex, recs
    line = json.loads(vm.recordings.get(ex[0].id))
    assert line["exit_code"] == 0 and line["via"] == "api"
    assert vm.recordings.export()[:2] == b"\x1f\x8b"
    vm.recordings.set_enabled(False)
    assert not vm.recordings.enabled()
