#!/usr/bin/env python3
"""Prints the verify bench's ratios as a Markdown table, from target/criterion.

Run after `cargo bench --bench verify`: `python3 benches/report.py`.
Medians; every ratio is between figures of the same `cargo bench` run.
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "target" / "criterion"
SIZES = ["1KiB", "64KiB", "1MiB"]
SCHEMES = ["standard", "stripe", "github", "slack", "shopify"]


def median_ns(group, function, size):
    path = ROOT / group / function / size / "new" / "estimates.json"
    return json.loads(path.read_text())["median"]["point_estimate"]


def fmt(ns):
    return f"{ns / 1000:.2f} µs" if ns < 1e6 else f"{ns / 1e6:.3f} ms"


print("| size | floor: bare HMAC | scheme | 1 secret | ÷ floor | 3 secrets, oldest matches | ÷ floor |")
print("|---|---|---|---|---|---|---|")
for size in SIZES:
    floor = median_ns("floor", "hmac", size)
    for scheme in SCHEMES:
        one = median_ns(scheme, "1-secret", size)
        three = median_ns(scheme, "3-secrets-oldest", size)
        print(f"| {size} | {fmt(floor)} | {scheme} | {fmt(one)} | {one / floor:.3f} | {fmt(three)} | {three / floor:.2f} |")

print()
print("| size | tower-webhook (standard, 1 secret) | svix | ÷ ours | standardwebhooks | ÷ ours |")
print("|---|---|---|---|---|---|")
for size in SIZES:
    ours = median_ns("standard", "1-secret", size)
    svix = median_ns("peer", "svix", size)
    sw = median_ns("peer", "standardwebhooks", size)
    print(f"| {size} | {fmt(ours)} | {fmt(svix)} | {svix / ours:.1f}× | {fmt(sw)} | {sw / ours:.1f}× |")
