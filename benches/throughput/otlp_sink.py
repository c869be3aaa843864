#!/usr/bin/env python3
"""A sink for OTLP/HTTP exports, for the accept benchmark with `otel` on:

    python3 benches/throughput/otlp_sink.py PORT_FILE

Listens on 127.0.0.1 (a free port, written to PORT_FILE), reads each POST's body and
answers 200 with an empty protobuf message (or `{}` for JSON), counting the bytes it
received and the accept spans in them (`webhook.accept` names one, in either encoding);
prints `exports=N bytes=M accept_spans=K` when terminated: fewer accept spans than
accepted deliveries means the exporter dropped some (its queue was full), which would
flatter the rate. What a collector does on another host, at the least cost to this one.
"""
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

received = {"exports": 0, "bytes": 0, "accept_spans": 0}


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        received["accept_spans"] += body.count(b"webhook.accept")
        received["exports"] += 1
        received["bytes"] += length
        json = self.headers.get("Content-Type", "").startswith("application/json")
        body = b"{}" if json else b""
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if json else "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))

    def stop(*_):
        print(f"exports={received['exports']} bytes={received['bytes']} accept_spans={received['accept_spans']}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
