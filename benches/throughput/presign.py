#!/usr/bin/env python3
"""Writes N pre-signed, unique Standard Webhooks deliveries for wrk to replay.

An independent signer (Python's hmac), not the crate's: `presign.py SECRET N BODY_BYTES OUT`.
Each line: `<webhook-id>\t<webhook-timestamp>\t<webhook-signature>\t<body>`. The
timestamp is now, so the file is good for the receiver's 300 s window. The body pads
with `x`; with PAD=random in the environment, with random base64 letters instead (a body
compression cannot shrink, as a sealed one cannot be: PostgreSQL's TOAST compresses a run
of `x` to almost nothing, ciphertext not at all).
"""
import base64
import hashlib
import hmac
import os
import sys
import time

secret, count, size, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
key = base64.b64decode(secret.removeprefix("whsec_"))
now = str(int(time.time()))
random_pad = os.environ.get("PAD") == "random"
with open(out, "w") as f:
    for i in range(count):
        event_id = f"evt_bench_{now}_{i}"
        head = f'{{"id":"{event_id}","type":"bench.event","data":{{"object":{{"id":"obj_{i}"}}}},"pad":"'
        pad = max(0, size - len(head) - 2)
        if random_pad:
            fill = base64.b64encode(os.urandom(pad * 3 // 4 + 3)).decode()[:pad]
        else:
            fill = "x" * pad
        body = head + fill + '"}'
        signed = f"{event_id}.{now}.{body}".encode()
        mac = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        f.write(f"{event_id}\t{now}\tv1,{mac}\t{body}\n")
