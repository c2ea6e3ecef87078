"""One address in front of several service replicas: the dev cluster's stand-in for a
site's load balancer (HAProxy, nginx, a keepalived VIP).

A TCP proxy, not an HTTP one: each client connection goes to the next replica in turn, and
to the one after it when that one refuses or does not answer within CONNECT_TIMEOUT_S. A
connection cut by a dying replica is the client's to retry (agents and workers do), and the
retry lands on a live replica. `python -m client.devcluster.proxy --listen 8000 --backend
8001 --backend 8002`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal

log = logging.getLogger("runyard.proxy")
CONNECT_TIMEOUT_S = 1.0  # a replica on loopback or a LAN answers a SYN in well under this
CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Proxy:
    def __init__(self, host: str, backends: list[int]) -> None:
        self.host, self.backends = host, backends
        self._turn = itertools.cycle(range(len(backends)))

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        first = next(self._turn)
        for i in range(len(self.backends)):
            port = self.backends[(first + i) % len(self.backends)]
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(self.host, port), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                log.info("replica on port %d unreachable; trying the next", port)
        return None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:  # no replica alive: the client sees a closed connection
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(listen: int, backends: list[int], host: str = "127.0.0.1") -> None:
    proxy = Proxy(host, backends)
    server = await asyncio.start_server(proxy.handle, host, listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("proxy on %s:%d -> ports %s", host, listen, backends)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m client.devcluster.proxy")
    parser.add_argument("--listen", type=int, required=True, help="port clients connect to")
    parser.add_argument("--backend", type=int, action="append", required=True, help="a replica")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s proxy %(message)s")
    asyncio.run(serve(args.listen, args.backend))


if __name__ == "__main__":
    main()
