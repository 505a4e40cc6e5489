"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for the load generators.

JSON bodies with Content-Length out; Content-Length or chunked answers in. At hundreds of
requests/s on the server's own two cores, httpx spends more CPU per request than the server
does, and the clients' CPU counts against the same cores.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, host: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{head}\r\n".encode() + body
        )
        await self.writer.drain()
        status_line = await self.reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        answer_headers: dict[str, str] = {}
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            answer_headers[name.strip().lower()] = value.strip()
        if "content-length" in answer_headers:
            data = await self.reader.readexactly(int(answer_headers["content-length"]))
        elif answer_headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                data += await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            data = await self.reader.read()
        return status, answer_headers, data

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Idle connections to reuse; a new one whenever all are busy (open-loop load)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.host_header = parts.netloc
        self.idle: list[Connection] = []
        self.opened = 0

    async def request(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        connection = self.idle.pop() if self.idle else None
        if connection is None:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=2**20)
            connection = Connection(reader, writer)
            self.opened += 1
        try:
            status, answer_headers, data = await connection.post(self.host_header, path, headers, body)
        except BaseException:
            connection.close()
            raise
        if answer_headers.get("connection", "").lower() == "close":
            connection.close()
        else:
            self.idle.append(connection)
        return status, data

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()
