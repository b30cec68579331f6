"""Access: scoped tokens, ports and previews (private, public), TCP
exposures and tunnels, custom domains, private networks and egress; and
what goes wrong: a bad token, a stream cut midway, a VM deleted under a
running command."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
from conftest import cleanup, create_vm, needs_server, uniq, until

import agentvm

pytestmark = needs_server


@pytest.fixture(scope="module")
def web(av):
    v = create_vm(av, uniq("pyweb"))
    v.files.write("/srv/index.html", "hello from the preview\n", mkdirs=True)
    r = v.exec("nohup python3 -m http.server 8000 --directory /srv >/tmp/web.log 2>&1 & for i in $(seq 600); do curl -sf -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; cat /tmp/web.log; exit 1")
    assert r.exit_code == 0, r.stdout + r.stderr
    yield v
    cleanup(v)


def proxy_get(av, host: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """A request to the preview proxy with a Host header (no *.localhost resolution needed)."""
    return httpx.get(f"http://{av.health().proxy}/", headers={**(headers or {}), "Host": host}, timeout=60)


def raw_get(send, recv) -> bytes:
    send(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    out = b""
    while chunk := recv(65536):
        out += chunk
    return out


def test_scoped_tokens(av, web) -> None:
    tok = av.tokens.create(vm=web.name, allow=["exec", "files"], ttl="10m", name="py-sdk")
    assert tok.token.startswith("avt_") and tok.vm_id == web.id and tok.allow == ["exec", "files"]
    scoped = agentvm.AgentVM(av.url, token=tok.token)
    mine = scoped.vm(web.name)
    assert mine.exec("echo scoped").stdout == "scoped\n"
    assert mine.files.read_text("/srv/index.html") == "hello from the preview\n"
    with pytest.raises(agentvm.Forbidden) as ei:
        scoped.vms.list()
    assert ei.value.status == 403 and ei.value.code == "forbidden"
    with pytest.raises(agentvm.Forbidden):
        mine.terminals.list()  # no term permission
    with pytest.raises(agentvm.Forbidden):
        mine.suspend()  # lifecycle is the admin's
    assert any(t.id == tok.id and not t.token for t in av.tokens.list(vm=web.id))
    # revoking ends what the token has open: a running streamed command too
    p = mine.spawn("echo up; exec sleep 600")
    assert p.read() == ("stdout", b"up\n")
    av.tokens.revoke(tok.id)
    with pytest.raises(agentvm.StreamLost):
        p.wait()
    with pytest.raises(agentvm.Unauthorized):
        mine.exec("true")
    with pytest.raises(agentvm.NotFound):
        av.tokens.revoke(tok.id)
    info = av.ssh()
    assert info.enabled and info.host_key.startswith("ssh-ed25519 ")


def test_ports_previews_tcp_tunnel_domain(av, web) -> None:
    host = f"8000-{web.name}.{av.health().domain}"
    priv = web.ports.expose(8000)
    assert priv.kind == "http" and not priv.public and f"8000-{web.name}." in priv.url
    assert proxy_get(av, host).status_code == 401
    tok = av.tokens.create(vm=web.id, allow=["preview"])
    assert proxy_get(av, host, {"Authorization": "Bearer " + tok.token}).text == "hello from the preview\n"
    assert web.ports.expose(8000, public=True).public
    assert proxy_get(av, host).text == "hello from the preview\n"

    tcp = web.ports.expose(8000, tcp=True)
    h, port = tcp.host.rsplit(":", 1)
    with socket.create_connection((h, int(port)), timeout=60) as s:
        assert b"hello from the preview" in raw_get(s.sendall, s.recv)
    assert sorted(f"{x.port}/{x.kind}" for x in web.ports.list()) == ["8000/http", "8000/tcp"]
    web.ports.unexpose(8000, "tcp")
    web.ports.unexpose(8000)
    assert web.ports.list() == []
    assert proxy_get(av, host).status_code == 401

    with web.connect(8000) as c:  # a raw TCP stream through the API
        assert b"hello from the preview" in raw_get(c.send, c.recv)

    domain = f"{uniq('app')}.example.test"
    assert av.domains.add(domain, web.name, 8000).domain == domain
    assert any(d.domain == domain for d in av.domains.list())
    web.ports.expose(8000, public=True)
    assert proxy_get(av, domain).text == "hello from the preview\n"
    av.domains.delete(domain)
    assert not any(d.domain == domain for d in av.domains.list())
    web.ports.unexpose(8000)
    av.tokens.revoke(tok.id)


def test_private_network_and_egress(av, web) -> None:
    name = uniq("pynet")
    assert av.networks.create(name).name == name
    peer = create_vm(av, uniq("pypeer"), network=name)
    try:
        assert peer.info.network == name
        assert web.set_network(name).network == name
        assert sorted(av.networks.get(name).vms or []) == sorted([peer.name, web.name])

        def reach() -> str:
            return peer.exec(f"curl -s -m 10 http://{web.name}:8000/").stdout

        until("the peer to reach the web VM by name", lambda: reach() == "hello from the preview\n")
        assert av.networks.set_egress(name, {"mode": "deny"}).egress.mode == "deny"
        assert reach() == "hello from the preview\n"  # members still talk
        assert peer.set_egress({"mode": "deny"}).egress.mode == "deny"
        assert peer.set_egress(None).egress is None
        with pytest.raises(agentvm.Conflict):
            av.networks.delete(name)  # VMs are on it
        assert web.set_network(None).network is None
    finally:
        cleanup(peer)
    av.networks.delete(name)
    with pytest.raises(agentvm.NotFound):
        av.networks.get(name)


def test_a_vm_deleted_under_a_running_command(av) -> None:
    doomed = create_vm(av, uniq("pydoomed"))
    p = doomed.spawn("echo up; exec sleep 600")
    assert p.read() == ("stdout", b"up\n")
    errs: list[BaseException] = []

    def buffered() -> None:
        try:
            doomed.exec("sleep 601")
        except agentvm.AgentVMError as err:
            errs.append(err)

    t = threading.Thread(target=buffered, daemon=True)
    t.start()
    until("the buffered exec to run", lambda: "sleep 601" in doomed.exec("ps -eo args").stdout)
    doomed.delete()
    with pytest.raises(agentvm.StreamLost):
        p.wait()
    t.join(120)
    assert not t.is_alive(), "a buffered exec on a deleted VM did not end"
    assert errs and isinstance(errs[0], agentvm.AgentVMError), errs
    with pytest.raises(agentvm.NotFound):
        doomed.exec("true")
