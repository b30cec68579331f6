"""What needs no server: the frame codec, errors, queries, defaults, the
one-code-path driver, and refusals of bad input before a request."""

from __future__ import annotations

import asyncio
import struct

import httpx
import pytest

import agentvm
from agentvm import errors
from agentvm._transport import AsyncTransport, Call, SyncTransport, default_token, op, query, seg
from agentvm.exec import EXIT, STDERR, STDOUT, FrameDecoder, _ProcState, encode_frame, exec_request, signal_number


def test_frames_survive_any_split() -> None:
    stream = encode_frame(STDOUT, b"hello") + encode_frame(STDERR, b"") + encode_frame(EXIT, b'{"exit_code":3,"duration_ms":5}')
    for cut in range(1, len(stream)):
        d = FrameDecoder()
        got = d.push(stream[:cut]) + d.push(stream[cut:])
        assert [k for k, _ in got] == [STDOUT, STDERR, EXIT]
        assert got[0][1] == b"hello"
        assert d.pending == 0


def test_a_frame_too_large_is_refused() -> None:
    with pytest.raises(agentvm.StreamLost, match="larger than"):
        FrameDecoder().push(struct.pack(">BI", STDOUT, (16 << 20) + 1))


def test_process_state_reads_output_errors_and_exit() -> None:
    st = _ProcState()
    st.feed(encode_frame(STDOUT, b"a") + encode_frame(6, b'{"message":"sh: nope: not found"}') + encode_frame(EXIT, b'{"exit_code":127,"duration_ms":1}'))
    assert list(st.events) == [("stdout", b"a"), ("stderr", b"sh: nope: not found\n")]
    assert st.exit is not None and st.exit.exit_code == 127
    assert "nope" in str(st.lost())
    with pytest.raises(agentvm.StreamLost, match="bad exit frame"):
        _ProcState().feed(encode_frame(EXIT, b"{not json"))


def test_errors_by_code_and_status() -> None:
    e = errors.error_from_body(404, '{"error":{"code":"not_found","message":"no VM x"}}')
    assert isinstance(e, agentvm.NotFound) and e.status == 404 and e.code == "not_found" and str(e) == "no VM x"
    assert isinstance(errors.error_from_body(409, '{"error":{"code":"not_empty","message":"m"}}'), agentvm.Conflict)
    assert isinstance(errors.error_from_body(403, '{"error":{"code":"permission_denied","message":"m"}}'), agentvm.Forbidden)
    plain = errors.error_from_body(502, "Bad Gateway\n")
    assert isinstance(plain, agentvm.Unavailable) and plain.code == "http" and str(plain) == "Bad Gateway"
    assert type(errors.error_from_body(418, "")) is agentvm.AgentVMError
    assert str(errors.error_from_body(418, "")) == "HTTP 418"


def test_requests_are_built_as_the_api_wants() -> None:
    assert exec_request("echo hi") == {"shell": "echo hi"}
    assert exec_request(["ls", "-l"], env={"A": "1"}, cwd="/tmp", user="agent", timeout="3s", stdin="x") == {"cmd": ["ls", "-l"], "env": {"A": "1"}, "cwd": "/tmp", "user": "agent", "timeout": "3s", "stdin": "x"}
    assert query(a=None, b=False, c=True, d=3, e=["x", "y"], f=[]) == {"c": "1", "d": "3", "e": ["x", "y"]}
    assert seg("a/b c") == "a%2Fb%20c"
    assert signal_number("SIGTERM") == 15 and signal_number("kill") == 9 and signal_number(2) == 2 and signal_number("10") == 10
    with pytest.raises(ValueError, match="unknown signal"):
        signal_number("NOPE")


def test_token_and_url_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("AGENTVM_TOKEN", raising=False)
    monkeypatch.delenv("AGENTVM_URL", raising=False)
    (tmp_path / "admin.token").write_text("avm_from_file\n")
    assert default_token(str(tmp_path)) == "avm_from_file"
    monkeypatch.setenv("AGENTVM_DATA_DIR", str(tmp_path))
    c = agentvm.AgentVM()
    assert c.url == "http://127.0.0.1:7070" and c._t.headers["Authorization"] == "Bearer avm_from_file"
    monkeypatch.setenv("AGENTVM_TOKEN", "avm_env")
    assert default_token(str(tmp_path)) == "avm_env"
    assert "Authorization" not in agentvm.AgentVM("http://h:1/", token="")._t.headers
    # the environment's token goes only to the environment's server
    assert "Authorization" not in agentvm.AgentVM("http://elsewhere:1")._t.headers
    assert agentvm.AgentVM("http://elsewhere:1", token="t2")._t.headers["Authorization"] == "Bearer t2"
    # a data dir given with a URL is read: the caller named that server's token
    assert agentvm.AgentVM("http://elsewhere:1", data_dir=str(tmp_path))._t.headers["Authorization"] == "Bearer avm_from_file"
    with pytest.raises(ValueError, match="must start with http"):
        agentvm.AgentVM("127.0.0.1:7070")


class _Thing:
    """An op over a fake server: the same method serves both clients."""

    def __init__(self, t) -> None:
        self._t = t

    @op
    def two_calls(self, name: str):
        r = yield Call("GET", "/v1/vms/" + seg(name))
        first = r.json()["id"]
        try:
            yield Call("GET", "/v1/missing")
        except agentvm.NotFound as err:
            return first, str(err)
        return first, "not raised"


def _handler(req: httpx.Request) -> httpx.Response:
    assert req.headers["authorization"] == "Bearer t"
    if req.url.raw_path == b"/v1/vms/a%2Fb":
        return httpx.Response(200, json={"id": "vm-1"})
    return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such thing"}})


def test_one_op_serves_the_sync_and_the_async_client() -> None:
    st = SyncTransport("http://x", "t")
    st.client = httpx.Client(transport=httpx.MockTransport(_handler))
    assert _Thing(st).two_calls("a/b") == ("vm-1", "no such thing")
    at = AsyncTransport("http://x", "t")
    at.client = httpx.AsyncClient(transport=httpx.MockTransport(_handler))
    coro = _Thing(at).two_calls("a/b")
    assert asyncio.iscoroutine(coro)
    assert asyncio.run(coro) == ("vm-1", "no such thing")


def test_an_answer_of_a_newer_server_still_parses() -> None:
    from agentvm._streams import parse
    from agentvm.models import VM

    v = parse(VM, {"id": "vm-1", "name": "a", "state": "some-new-state", "image": "a-new-image", "new_field": 1})
    assert v.id == "vm-1" and v.image == "a-new-image"


def test_unreachable_server_is_a_typed_error() -> None:
    with pytest.raises(agentvm.ConnectionFailed) as ei:
        agentvm.AgentVM("http://127.0.0.1:9", token="x").health()
    assert ei.value.status == 0 and ei.value.code == "connection_failed" and "is `agentvm serve` running?" in str(ei.value)

    async def go() -> None:
        async with agentvm.AsyncAgentVM("http://127.0.0.1:9", token="x") as a:
            await a.vms.list()

    with pytest.raises(agentvm.ConnectionFailed):
        asyncio.run(go())


def test_websocket_messages_pings_fragments_and_close() -> None:
    import wsproto.events as wse
    from wsproto.connection import Connection, ConnectionType

    from agentvm._ws import WebSocket, check_accept, handshake_headers

    server = Connection(ConnectionType.SERVER)
    ws = WebSocket()
    wire = server.send(wse.BytesMessage(data=b"out", message_finished=False)) + server.send(wse.BytesMessage(data=b"put"))
    wire += server.send(wse.Ping(payload=b"p1")) + server.send(wse.TextMessage(data='{"type":"exit"}'))
    msgs, reply = ws.receive(wire[:7])  # cut mid-frame
    more, reply2 = ws.receive(wire[7:])
    assert msgs + more == [(True, b"output"), (False, '{"type":"exit"}')]
    server.receive_data(reply + reply2)
    assert [type(e).__name__ for e in server.events()] == ["Pong"]
    server.receive_data(ws.send("hi") + ws.send(b"\x00\x01"))
    got = list(server.events())
    assert got[0].data == "hi" and got[1].data == b"\x00\x01"
    _, reply = ws.receive(server.send(wse.CloseConnection(code=1000)))
    assert ws.closed and reply  # the close is answered
    with pytest.raises(agentvm.StreamLost):
        ws.send(b"late")
    h = handshake_headers()
    with pytest.raises(agentvm.StreamLost, match="Sec-WebSocket-Accept"):
        check_accept(h, {"Sec-WebSocket-Accept": "wrong"})


def test_terminal_exit_message_without_a_code_is_a_clean_exit() -> None:
    import wsproto.events as wse
    from wsproto.connection import Connection, ConnectionType

    from agentvm.terminals import _TermState

    server = Connection(ConnectionType.SERVER)
    st = _TermState()
    st.take(server.send(wse.BytesMessage(data=b"bye\r\n")) + server.send(wse.TextMessage(data='{"type":"exit"}')))
    assert list(st.out) == [b"bye\r\n"] and st.exit == {"type": "exit", "exit_code": 0}


def test_errors_after_a_request_was_sent_are_not_connection_failures() -> None:
    def broken(req: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("server hung up", request=req)

    st = SyncTransport("http://x", "t")
    st.client = httpx.Client(transport=httpx.MockTransport(broken))
    with pytest.raises(agentvm.StreamLost, match="may have been carried out"):
        _Thing(st).two_calls("a/b")


def test_a_stream_is_closed_unless_the_op_keeps_it() -> None:
    def ok(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter([b"line\n"]))  # a body not read yet

    st = SyncTransport("http://x", "t")
    st.client = httpx.Client(transport=httpx.MockTransport(ok))
    seen: list[httpx.Response] = []

    class Ops:
        _t = st

        @op
        def keeps(self):
            r = yield Call("GET", "/s", stream=True)
            seen.append(r)
            return r

        @op
        def fails(self):
            r = yield Call("GET", "/s", stream=True)
            seen.append(r)
            raise ValueError("the op failed")

    kept = Ops().keeps()
    assert not kept.is_closed
    kept.close()
    with pytest.raises(ValueError):
        Ops().fails()
    assert seen[1].is_closed


def test_open_enums_take_a_newer_servers_values() -> None:
    from agentvm.models import Port, VMState

    assert VMState.model_validate("hibernating").root == "hibernating"
    assert Port.model_validate({"kind": "udp"}).kind == "udp"


class _Resp:
    """What Terminal needs of the 101 response: its connection."""

    def __init__(self, sock) -> None:
        from httpcore._backends.sync import SyncStream

        self.extensions = {"network_stream": SyncStream(sock)}
        self.headers: dict[str, str] = {}

    def close(self) -> None:
        pass


def _terminal_pair():
    import socket

    from wsproto.connection import Connection, ConnectionType

    from agentvm.terminals import Terminal

    a, b = socket.socketpair()
    return Terminal(_Resp(a)), b, Connection(ConnectionType.SERVER)


def test_terminal_read_timeouts_poll_and_survive_a_writer() -> None:
    import threading
    import time

    import wsproto.events as wse

    term, peer, server = _terminal_pair()
    with pytest.raises(TimeoutError):
        term.read(timeout=0)  # a poll, and the terminal goes on
    peer.sendall(server.send(wse.BytesMessage(data=b"after the poll")))
    assert term.read(timeout=5) == b"after the poll"

    stop = threading.Event()

    def drain() -> None:
        peer.settimeout(0.1)
        while not stop.is_set():
            try:
                peer.recv(65536)
            except OSError:
                pass

    def keystrokes() -> None:
        while not stop.is_set():
            term.write(b"x")
            time.sleep(0.001)

    threads = [threading.Thread(target=drain, daemon=True), threading.Thread(target=keystrokes, daemon=True)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        term.read(timeout=0.3)  # a writer in another thread does not undo the timeout
    assert time.monotonic() - t0 < 10
    stop.set()
    for t in threads:
        t.join(5)
    term.close()
    peer.close()


def test_terminal_close_returns_while_a_writer_is_stuck() -> None:
    import threading

    term, peer, _ = _terminal_pair()
    stuck = threading.Thread(target=lambda: _write_forever(term), daemon=True)
    stuck.start()
    stuck.join(1)  # the peer reads nothing: the writer blocks on a full buffer
    closer = threading.Thread(target=term.close, daemon=True)
    closer.start()
    closer.join(15)
    assert not closer.is_alive(), "close() waited for a stuck writer"
    stuck.join(15)
    assert not stuck.is_alive(), "the stuck writer did not end with the close"
    peer.close()


def test_terminal_reads_what_came_with_the_upgrade() -> None:
    # The scrollback can arrive in the same segment as the 101 answer:
    # httpcore's upgraded stream then holds it, and the socket has nothing
    # more to read (a poll on it waited for ever).
    import socket

    import wsproto.events as wse
    from httpcore._backends.sync import SyncStream
    from httpcore._sync.http11 import HTTP11UpgradeStream
    from wsproto.connection import Connection, ConnectionType

    from agentvm.terminals import Terminal

    a, b = socket.socketpair()
    server = Connection(ConnectionType.SERVER)
    resp = _Resp(a)
    resp.extensions["network_stream"] = HTTP11UpgradeStream(SyncStream(a), server.send(wse.BytesMessage(data=b"scrollback")))
    term = Terminal(resp)
    assert term.read(timeout=5) == b"scrollback"
    term.close()
    b.close()


def test_terminal_read_after_close_is_none_with_output_buffered() -> None:
    import wsproto.events as wse

    term, peer, server = _terminal_pair()
    # two frames in one read: the second waits in the buffer
    peer.sendall(server.send(wse.BytesMessage(data=b"one")) + server.send(wse.BytesMessage(data=b"two")))
    assert term.read(timeout=5) == b"one"
    term.close()
    assert term.read() is None  # not the buffered b"two"
    peer.close()


def _write_forever(term) -> None:
    try:
        while True:
            term.write(b"y" * 65536)
    except agentvm.StreamLost:
        pass


def test_terminal_protocol_errors_are_stream_lost_after_the_output_before_them() -> None:
    import wsproto.events as wse

    term, peer, server = _terminal_pair()
    peer.sendall(server.send(wse.BytesMessage(data=b"good")) + b"\x82\x81\x00\x00\x00\x00x")  # then a masked frame, which no server may send
    assert term.read(timeout=5) == b"good"
    with pytest.raises(agentvm.StreamLost):
        term.read(timeout=5)
    assert term.read(timeout=5) is None
    term.close()
    peer.close()


def test_provider_prunes_the_least_recently_used_session() -> None:
    pytest.importorskip("agents", reason="needs openai-agents")
    from agentvm.openai_agents import AgentVMSandboxSession, _Pty

    s = AgentVMSandboxSession.__new__(AgentVMSandboxSession)
    s._ptys = {}
    for pid in range(1000, 1064):
        s._ptys[pid] = _Pty(last_used=float(pid))
    s._ptys[1000].last_used = 10_000.0  # the oldest, but just used
    pruned = s._prune()
    assert pruned is not None and 1001 not in s._ptys and 1000 in s._ptys
    s._ptys[1030].done.set()
    assert s._prune() is not None and 1030 not in s._ptys  # a finished one goes first
