"""Which Host headers the viewer answers.

A page on another site can point its own name at 127.0.0.1 (DNS rebinding) and read the viewer
from the user's browser as a same-origin page: its requests carry that name in `Host`. So the
viewer answers only the address it listens on, the loopback names of it (`127.0.0.1`,
`localhost`, `[::1]`) with its port, and names the user adds (`shardsmith view --allow-host`);
anything else gets 421 and a line saying which hosts it answers.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def name_of(host_header: str) -> str:
    """The host name of a Host header value, lower case, an IPv6 address in brackets."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[:value.find("]") + 1]
    return value.partition(":")[0]


def is_loopback(address: str) -> bool:
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed(listen_host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host values (name:port) a viewer listening on listen_host:port answers."""
    listen = f"[{listen_host}]" if ":" in listen_host and not listen_host.startswith("[") else listen_host
    names = {listen.lower(), *(n.strip().lower() for n in extra if n.strip())}
    if is_loopback(listen_host):
        names |= set(LOOPBACK_NAMES)
    return frozenset(f"{n}:{port}" for n in names) | (frozenset(names) if port == 80 else frozenset())


def refusal(host_header: str | None, hosts: frozenset[str] | None) -> str | None:
    """Why a request with this Host is refused, or None. hosts None (an app not served by
    `shardsmith view`, e.g. a test client): loopback names on any port."""
    value = (host_header or "").strip().lower()
    ok = name_of(value) in LOOPBACK_NAMES if hosts is None else value in hosts
    if ok:
        return None
    answered = "the loopback names" if hosts is None else ", ".join(sorted(hosts))
    return (f"this viewer answers only {answered}, not Host {value[:100]!r} "
            "(another name for it: shardsmith view --allow-host NAME)")
