"""A loopback port for a server this process starts.

A port found free is released before the server binds it, so another process can take it first
(seen under load): `on_free_port` then picks another. A port the caller named is theirs to free,
so its failure is raised, not moved elsewhere."""
from __future__ import annotations

import socket
from typing import Callable, TypeVar

HOST = "127.0.0.1"
TRIES = 3

T = TypeVar("T")


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def on_free_port(launch: Callable[[int], T], port: int | None, taken: type[BaseException],
                 on_retry: Callable[[], None] = lambda: None) -> T:
    """`launch(port)`, where `launch` raises `taken` when the server could not bind its port. With
    no `port`, a free one is picked, and picked again (up to TRIES) after `taken`."""
    for attempt in range(1, TRIES + 1):
        try:
            return launch(port or free_port())
        except taken:
            if port or attempt == TRIES:
                raise
            on_retry()
    raise AssertionError("unreachable")
