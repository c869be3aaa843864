#!/usr/bin/env python3
"""A storm of signed Standard Webhooks deliveries against a running receiver, as an
independent generator (stdlib only): EVENTS events, each delivered 1-3 times in a
shuffled order (so duplicates also arrive together), over THREADS keep-alive clients;
a delivery answered with anything but 2xx is retried (as a provider would) up to 20
times. Prints the statuses seen. Used for RELIABILITY.md's receiver storm:

    BIND=127.0.0.1:3311 WEBHOOK_MODE=inbox WEBHOOK_SQLITE=storm.db \
      WEBHOOK_SECRETS=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw \
      cargo run --example receiver > handled.txt &
    python3 scripts/receiver_storm.py 3311 32000 64 whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
    # once the worker drains: every event once, none twice
    grep -c ^handled handled.txt; grep ^handled handled.txt | sort | uniq -d | wc -l

Usage: receiver_storm.py PORT EVENTS THREADS WHSEC_SECRET
"""
import base64, hashlib, hmac, http.client, json, random, sys, threading, time, collections
URL_HOST, URL_PORT = "127.0.0.1", int(sys.argv[1])
EVENTS, THREADS = int(sys.argv[2]), int(sys.argv[3])
SECRET = base64.b64decode(sys.argv[4].removeprefix("whsec_"))
deliveries = []
for i in range(EVENTS):
    deliveries += [f"evt_storm_{i}"] * random.choice([1, 1, 2, 3])
random.shuffle(deliveries)
lock = threading.Lock(); statuses = collections.Counter(); it = iter(deliveries)
def worker():
    conn = http.client.HTTPConnection(URL_HOST, URL_PORT, timeout=30)
    while True:
        with lock:
            eid = next(it, None)
        if eid is None: return
        body = json.dumps({"type": "storm", "data": {"n": eid}}).encode()
        ts = str(int(time.time()))
        sig = base64.b64encode(hmac.new(SECRET, f"{eid}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
        h = {"webhook-id": eid, "webhook-timestamp": ts, "webhook-signature": "v1," + sig, "content-type": "application/json"}
        for attempt in range(20):
            try:
                conn.request("POST", "/webhooks", body, h); r = conn.getresponse(); r.read(); s = r.status
            except Exception as e:
                conn.close(); conn = http.client.HTTPConnection(URL_HOST, URL_PORT, timeout=30); s = type(e).__name__
            with lock: statuses[s] += 1
            if s in (200, 202, 204): break
            time.sleep(0.2)
t0 = time.time()
ts_ = [threading.Thread(target=worker) for _ in range(THREADS)]
[t.start() for t in ts_]; [t.join() for t in ts_]
print(json.dumps({"deliveries": len(deliveries), "events": EVENTS, "secs": round(time.time() - t0, 1), "statuses": {str(k): v for k, v in statuses.items()}}))
