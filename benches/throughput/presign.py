#!/usr/bin/env python3
"""Writes N pre-signed, unique Standard Webhooks deliveries for wrk to replay.

An independent signer (Python's hmac), not the crate's: `presign.py SECRET N BODY_BYTES OUT`.
Each line: `<webhook-id>\t<webhook-timestamp>\t<webhook-signature>\t<body>`. The
timestamp is now, so the file is good for the receiver's 300 s window.
"""
import base64
import hashlib
import hmac
import sys
import time

secret, count, size, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
key = base64.b64decode(secret.removeprefix("whsec_"))
now = str(int(time.time()))
with open(out, "w") as f:
    for i in range(count):
        event_id = f"evt_bench_{now}_{i}"
        head = f'{{"id":"{event_id}","type":"bench.event","data":{{"object":{{"id":"obj_{i}"}}}},"pad":"'
        body = head + "x" * max(0, size - len(head) - 2) + '"}'
        signed = f"{event_id}.{now}.{body}".encode()
        mac = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        f.write(f"{event_id}\t{now}\tv1,{mac}\t{body}\n")
