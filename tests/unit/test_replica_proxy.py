"""The dev cluster's replica proxy: a connection goes to a live replica when the one whose
turn it is refuses (client/devcluster/proxy.py)."""

from __future__ import annotations

import asyncio
import socket

from client.devcluster.proxy import Proxy


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


async def _roundtrips() -> list[bytes]:
    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"live:" + await reader.readline())
        await writer.drain()
        writer.close()

    live = await asyncio.start_server(replica, "127.0.0.1", 0)
    live_port = live.sockets[0].getsockname()[1]
    proxy = Proxy("127.0.0.1", [closed_port(), live_port])
    front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    front_port = front.sockets[0].getsockname()[1]
    answers = []
    for i in range(3):  # every turn, the dead replica's included, reaches the live one
        reader, writer = await asyncio.open_connection("127.0.0.1", front_port)
        writer.write(f"hello {i}\n".encode())
        await writer.drain()
        answers.append(await asyncio.wait_for(reader.read(), 5))
        writer.close()
    front.close()
    live.close()
    return answers


def test_a_dead_replica_is_skipped() -> None:
    assert asyncio.run(_roundtrips()) == [b"live:hello 0\n", b"live:hello 1\n", b"live:hello 2\n"]
