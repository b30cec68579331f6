"""Who is connecting: the uid that owns a loopback client's socket.

The server runs any code it is sent, as its own user (who may have sudo),
and every user of the guest can reach 127.0.0.1.  So a connection is only
accepted when the socket on the other end belongs to an allowed uid (root,
i.e. the guest agent, and the server's own user by default).

The owner is found in /proc/net/tcp and /proc/net/tcp6: the client's socket
is the line whose local_address is the client's ip:port and whose
rem_address is the server's ip:port; its "uid" column is the owner.  The
client's socket is only visible there if it lives in this network namespace,
so connections from other machines are refused too.

Only sockets that a process still holds count (inode column not 0):
timewait entries, which the kernel prints with uid 0, include a client
socket that was closed right after sending its request (an orphaned
FIN_WAIT2 socket becomes one, shown in state FIN_WAIT2), so a process that
sends a request and closes its socket would otherwise pass as root.  A
well-behaved client keeps its socket open until it has read the response.
The lookup runs when the connection is accepted, before the request is read.
"""

import ipaddress
import logging
import struct

log = logging.getLogger("codeinterp")

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_TIME_WAIT = 0x06


def _hex_addr(ip, port, v6):
    """ip:port as printed in /proc/net/tcp{,6}: the address as native-endian
    32-bit words in hex, the port in hex."""
    if v6:
        words = struct.unpack("=4I", ipaddress.IPv6Address(ip).packed)
        addr = "".join("%08X" % w for w in words)
    else:
        addr = "%08X" % struct.unpack("=I", ipaddress.IPv4Address(ip).packed)[0]
    return f"{addr}:{port:04X}"


def _forms(ip):
    """(table index in PROC_NET_TCP, v6, address) for each way ip can
    appear in the tables."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if addr.version == 4:
        # An IPv4 client may show up in tcp, or in tcp6 as ::ffff:a.b.c.d.
        return [(0, False, str(addr)), (1, True, "::ffff:" + str(addr))]
    if addr.ipv4_mapped is not None:
        return [(0, False, str(addr.ipv4_mapped)), (1, True, str(addr))]
    return [(1, True, str(addr))]


def socket_owners(client, server, paths=PROC_NET_TCP):
    """The uids owning a socket whose local end is client (ip, port) and
    whose remote end is server (ip, port), from /proc/net/tcp{,6} (paths).
    Usually one; empty when none is found (or the tables are unreadable)."""
    client_forms = _forms(client[0])
    server_forms = {i: a for i, _, a in _forms(server[0])}
    uids = set()
    for idx, v6, caddr in client_forms:
        if idx >= len(paths) or idx not in server_forms:
            continue
        local = _hex_addr(caddr, client[1], v6)
        remote = _hex_addr(server_forms[idx], server[1], v6)
        try:
            with open(paths[idx], encoding="ascii", errors="replace") as f:
                next(f, None)  # header
                for line in f:
                    fields = line.split()
                    # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
                    if len(fields) < 10 or fields[1] != local or fields[2] != remote:
                        continue
                    try:
                        if int(fields[3], 16) == TCP_TIME_WAIT or int(fields[9]) == 0:
                            continue  # timewait or orphaned: the uid is not the owner's
                        uids.add(int(fields[7]))
                    except ValueError:
                        continue
        except OSError:
            continue
    return uids


def parse_uids(spec, own_uid):
    """--allow-uids: comma-separated uids or user names; "" means the
    default, root and own_uid."""
    if not spec.strip():
        return {0, own_uid}
    out = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit():
            out.add(int(part))
            continue
        import pwd
        try:
            out.add(pwd.getpwnam(part).pw_uid)
        except KeyError:
            raise ValueError(f"unknown user {part!r} in --allow-uids") from None
    return out


def peer_allowed(request, client_address, allowed_uids, paths=PROC_NET_TCP):
    """Whether the connection (an accepted socket) comes from an allowed uid;
    logs a warning when not."""
    try:
        server = request.getsockname()
        uids = socket_owners(client_address, server, paths)
    except (OSError, ValueError) as e:
        log.warning("refused a connection from %s: cannot find its owner: %s", client_address, e)
        return False
    if not uids:
        log.warning("refused a connection from %s:%s: its socket is not in %s (not a local process?)",
                    client_address[0], client_address[1], " or ".join(paths))
        return False
    if not uids <= set(allowed_uids):
        log.warning("refused a connection from %s:%s owned by uid %s (allowed: %s)",
                    client_address[0], client_address[1], ",".join(map(str, sorted(uids))),
                    ",".join(map(str, sorted(allowed_uids))))
        return False
    return True

