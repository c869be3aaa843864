#!/usr/bin/env python3
"""Writes N pre-signed, unique Standard Webhooks deliveries for wrk to replay.

An independent signer (Python's hmac), not the crate's: `presign.py SECRET N BODY_BYTES OUT`.
Each line: `<webhook-id>\t<webhook-timestamp>\t<webhook-signature>\t<body>`. The
timestamp is now, so the file is good for the receiver's 300 s window. The body pads
with `x`; with PAD=random in the environment, with random base64 letters instead (a body
compression cannot shrink, as a sealed one cannot be: PostgreSQL's TOAST compresses a run
of `x` to almost nothing, ciphertext not at all); with PAD=json, with invoice lines (random
ids, amounts and words from a small vocabulary, as a provider's events hold: JSON that
compresses about as much as real payloads do, far less than a run of `x`).
"""
import base64
import hashlib
import hmac
import os
import random
import sys
import time

secret, count, size, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
key = base64.b64decode(secret.removeprefix("whsec_"))
now = str(int(time.time()))
random_pad = os.environ.get("PAD") == "random"
json_pad = os.environ.get("PAD") == "json"
WORDS = "annual monthly seat storage plan pro team basic add-on support usage overage credit tax discount".split()


def lines(i, size):
    """A body of invoice lines, `size` bytes long."""
    head = f'{{"id":"{event_id}","type":"invoice.paid","data":{{"object":{{"id":"in_{i}","lines":['
    items, length = [], len(head) + 4
    while True:
        item = (f'{{"id":"il_{random.getrandbits(64):016x}","amount":{random.randrange(100, 1000000)},'
                f'"currency":"usd","description":"{random.choice(WORDS)} {random.choice(WORDS)}",'
                f'"quantity":{random.randrange(1, 50)},"period":{{"start":{int(now) - random.randrange(86400 * 31)},'
                f'"end":{int(now)}}}}}')
        if length + len(item) + 1 > size:
            break
        items.append(item)
        length += len(item) + 1
    body = head + ",".join(items) + "]}}}"
    return body + " " * (size - len(body))

with open(out, "w") as f:
    for i in range(count):
        event_id = f"evt_bench_{now}_{i}"
        head = f'{{"id":"{event_id}","type":"bench.event","data":{{"object":{{"id":"obj_{i}"}}}},"pad":"'
        pad = max(0, size - len(head) - 2)
        if random_pad:
            fill = base64.b64encode(os.urandom(pad * 3 // 4 + 3)).decode()[:pad]
        else:
            fill = "x" * pad
        body = lines(i, size) if json_pad else head + fill + '"}'
        signed = f"{event_id}.{now}.{body}".encode()
        mac = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        f.write(f"{event_id}\t{now}\tv1,{mac}\t{body}\n")
