#!/usr/bin/env python3
"""Sends presign.py's deliveries at a steady rate and times each from accepted to processed.

`pace.py [--processor NAME] URL DELIVERIES RATE SECONDS CONNECTIONS HANDLED_FIFO`

Request i goes out at start + i / RATE on connection i % CONNECTIONS (keep-alive, one
request in flight per connection). An event is *accepted* when its 2xx arrives and
*processed* when the receiver prints `handled <id>` on its stdout, read here from
HANDLED_FIFO: both clocks are this process's. With `--processor NAME` (the receiver run
with WEBHOOK_PROCESSORS), processed is instead its `finished <id> NAME` line: when that
processor's handler returned, whatever the other processors do. Prints one RESULT line:
the rate reached, how many were accepted and processed, and the accept -> processed
latency's p50, p99 and max in milliseconds.
"""
import asyncio
import sys
import time
from urllib.parse import urlsplit

args = sys.argv[1:]
processor = None
if args[:1] == ["--processor"]:
    processor, args = args[1].encode(), args[2:]
url, path, rate, seconds, connections, fifo = args[:6]
rate, seconds, connections = float(rate), float(seconds), int(connections)
target = urlsplit(url)
count = int(rate * seconds)

requests = []
with open(path) as f:
    for line in f:
        if len(requests) == count:
            break
        event_id, ts, sig, body = line.rstrip("\n").split("\t", 3)
        body = body.encode()
        head = (
            f"POST {target.path} HTTP/1.1\r\nhost: {target.netloc}\r\n"
            f"content-type: application/json\r\nwebhook-id: {event_id}\r\n"
            f"webhook-timestamp: {ts}\r\nwebhook-signature: {sig}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        requests.append((event_id, head + body))
if len(requests) < count:
    sys.exit(f"pace.py: {path} holds {len(requests)} deliveries, {count} needed")

accepted, handled, refused = {}, {}, 0


async def read_handled():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), open(fifo, "rb"))
    while line := await reader.readline():
        words = line.split()
        if processor is None and len(words) == 2 and words[0] == b"handled":
            handled.setdefault(words[1].decode(), time.monotonic())
        elif processor is not None and words[:1] == [b"finished"] and words[2:] == [processor]:
            handled.setdefault(words[1].decode(), time.monotonic())


async def response(reader):
    """Reads one response; returns its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for h in lines[1:]:
        if h.lower().startswith("content-length:"):
            length = int(h.split(":", 1)[1])
    if length:
        await reader.readexactly(length)
    return status


async def connection(k, start):
    global refused
    reader, writer = await asyncio.open_connection(target.hostname, target.port)
    for i in range(k, count, connections):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        event_id, raw = requests[i]
        writer.write(raw)
        status = await response(reader)
        if 200 <= status < 300:
            accepted[event_id] = time.monotonic()
        else:
            refused += 1
    writer.close()


async def main():
    reading = asyncio.create_task(read_handled())
    start = time.monotonic()
    await asyncio.gather(*(connection(k, start) for k in range(connections)))
    sent_for = time.monotonic() - start
    # Give the worker up to 30 s to process the last of them.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(e not in handled for e in accepted):
        await asyncio.sleep(0.05)
    reading.cancel()
    # Processed before its 204 reached this client counts as 0.
    waits = sorted(max(0.0, handled[e] - t) * 1000 for e, t in accepted.items() if e in handled)
    pick = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))] if waits else float("nan")
    print(
        f"RESULT rate={len(accepted) / sent_for:.1f} target_rate={rate:.0f} accepted={len(accepted)} "
        f"processed={len(waits)} refused={refused} latency_p50_ms={pick(0.50):.1f} "
        f"latency_p99_ms={pick(0.99):.1f} latency_max_ms={waits[-1] if waits else float('nan'):.1f}",
        flush=True,
    )


asyncio.run(main())
