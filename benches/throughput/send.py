#!/usr/bin/env python3
"""Sends presign.py's deliveries one request at a time on each of C keep-alive
connections (C=1: strictly one after another), for a receiver under callgrind, which runs
too slowly for wrk's timeouts:

    python3 benches/throughput/send.py URL DELIVERIES N [C]

Prints how many were sent and how many were answered other than 2xx.
"""
import http.client
import sys
import threading
import urllib.parse

url, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = int(sys.argv[4]) if len(sys.argv) > 4 else 1
u = urllib.parse.urlparse(url)
with open(path) as f:
    lines = [line.rstrip("\n").split("\t", 3) for _, line in zip(range(n), f)]
refused = []


def send(k):
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    for wid, ts, sig, body in lines[k::c]:
        headers = {"webhook-id": wid, "webhook-timestamp": ts, "webhook-signature": sig,
                   "content-type": "application/json"}
        conn.request("POST", u.path, body=body.encode(), headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status >= 300:
            refused.append(response.status)


threads = [threading.Thread(target=send, args=(k,)) for k in range(c)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"sent={len(lines)} refused={len(refused)}")
