#!/usr/bin/env bash
# Instructions a delivery, counted by callgrind: a figure a shared, noisy machine does not
# move, where a rate moves by a third from run to run. The receiver (RECEIVER, a release
# build) accepts alone (no worker) on a fresh SQLite file, or
# on PostgreSQL with DATABASE_URL naming a fresh database; send.py posts SMALL and then
# LARGE presigned deliveries (two runs), on CONNECTIONS at once (default 16, so the
# accepts batch as under load; 1: one at a time). The difference of the two runs' totals
# over LARGE - SMALL is the cost a delivery, start-up and shutdown cancelled out (the
# kernel's share is not counted). OTEL=1: with an exporter to otlp_sink.py (its `exports=`
# line follows each run). MODE=dedupe: the receiver's `DedupeLayer` (a claim and a
# completion a delivery) instead of the inbox's accept. Other receiver variables (OTEL_*)
# pass through.
#
#   RECEIVER=<receiver> [OTEL=1] [MODE=dedupe] [DATABASE_URL=…] benches/throughput/callgrind.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
SMALL=${SMALL:-500} LARGE=${LARGE:-2500} CONNECTIONS=${CONNECTIONS:-16} MODE=${MODE:-inbox}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 benches/throughput/presign.py "$SECRET" "$LARGE" "${BODY:-1024}" "$WORK/deliveries.tsv"
run() { # deliveries; writes $WORK/cg.<n>
  local n=$1 sink="" endpoint=() store=()
  store=(WEBHOOK_SQLITE="$WORK/inbox-$n.db")
  [ -z "${DATABASE_URL:-}" ] || store=(DATABASE_URL="$DATABASE_URL")
  if [ -n "${OTEL:-}" ]; then
    python3 benches/throughput/otlp_sink.py "$WORK/sink.port" >"$WORK/sink.out" 2>&1 &
    sink=$!
    for _ in $(seq 50); do [ -s "$WORK/sink.port" ] && break; sleep 0.1; done
    endpoint=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$(cat "$WORK/sink.port")")
  fi
  env ${endpoint[@]+"${endpoint[@]}"} "${store[@]}" WEBHOOK_MODE="$MODE" WEBHOOK_SECRETS="$SECRET" \
    WEBHOOK_WORKER_CONCURRENCY=0 WEBHOOK_TOLERANCE_SECS=3600 BIND=127.0.0.1:0 \
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$n" "$RECEIVER" >/dev/null 2>"$WORK/err" &
  local pid=$! url=""
  for _ in $(seq 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*/webhooks' "$WORK/err" | head -1 || true)
    [ -n "$url" ] && break
    sleep 0.2
  done
  [ -n "$url" ] || { cat "$WORK/err" >&2; exit 1; }
  python3 benches/throughput/send.py "$url" "$WORK/deliveries.tsv" "$n" "$CONNECTIONS"
  kill -TERM "$pid"; wait "$pid" || true
  if [ -n "$sink" ]; then sleep 1; kill "$sink"; wait "$sink" || true; tail -1 "$WORK/sink.out"; rm -f "$WORK/sink.port"; fi
}
total() { callgrind_annotate "$1" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,; }
run "$SMALL"
if [ -n "${DATABASE_URL:-}" ]; then
  echo "callgrind.sh: the second run needs a fresh database too: give DATABASE_URL_LARGE" >&2
  DATABASE_URL=${DATABASE_URL_LARGE:?}
fi
run "$LARGE"
echo "instructions_per_delivery=$(( ($(total "$WORK/cg.$LARGE") - $(total "$WORK/cg.$SMALL")) / (LARGE - SMALL) ))"
