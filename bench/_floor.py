"""The least a Python gateway can do per relayed event: the floor under any Python relay.

A bare uvloop relay (no framework, no HTTP library): it forwards each request to the upstream
as it came, and relays the response, decoding every server-sent event's JSON and encoding it
again (what any gateway that reads the events does, and tokenwire must: it checks every id).
No routing, no validation, no tokenizer, no error handling: not a gateway, a measure of what
the interpreter, the event loop and the kernel cost per event. bench/gateways.py runs it
beside the real gateways.

    python bench/_floor.py --port 8200 --upstream 127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvloop


def _dechunk(buf: bytearray) -> tuple[bytes, bool]:
    """The payload of every whole chunk in `buf` (taken out of it); True at the last chunk."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n")
        if eol < 0:
            return bytes(out), False
        size = int(buf[:eol], 16)
        if size == 0:
            return bytes(out), True
        if len(buf) < eol + 2 + size + 2:
            return bytes(out), False
        out += buf[eol + 2:eol + 2 + size]
        del buf[:eol + 2 + size + 2]


def _events(data: bytes) -> bytes:
    """Each `data:` line decoded and encoded again, framed as events."""
    out = []
    for line in data.split(b"\n"):
        if line.startswith(b"data: ["):
            out.append(line + b"\n\n")
        elif line.startswith(b"data:"):
            out.append(b"data: " + json.dumps(json.loads(line[5:]),
                                              separators=(",", ":")).encode() + b"\n\n")
    return b"".join(out)


def serve(port: int, upstream: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        ur, uw = await asyncio.open_connection(*upstream)
        request = head.split(b"\r\n", 1)[0]
        uw.write(request + b"\r\nHost: upstream\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        status, _, headers = (await ur.readuntil(b"\r\n\r\n")).partition(b"\r\n")
        sse = b"text/event-stream" in headers.lower()
        if not sse:  # a whole body: as it came, to the end
            rest = await ur.read()
            writer.write(status + b"\r\nContent-Length: %d\r\nConnection: close\r\n"
                         b"Content-Type: application/json\r\n\r\n" % len(rest) + rest)
        else:
            writer.write(status + b"\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            buf, pending, last = bytearray(), b"", False
            while not last:
                data = await ur.read(65536)
                if not data:
                    break
                buf += data
                payload, last = _dechunk(buf)
                pending += payload
                cut = pending.rfind(b"\n\n")
                if cut >= 0:
                    frames = _events(pending[:cut])
                    pending = pending[cut + 2:]
                    writer.write(b"%x\r\n%s\r\n" % (len(frames), frames))
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()
        uw.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="host:port")
    a = p.parse_args()
    host, _, up_port = a.upstream.rpartition(":")
    serve(a.port, (host, int(up_port)))
