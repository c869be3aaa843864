#!/usr/bin/env bash
# The durable stores' throughput against their bare insert loops, in one run:
#
#   benches/throughput/run.sh [postgres|sqlite|both]     (default both)
#
# Receiver: the `receiver` example (verify + dedupe) on the store, driven by wrk at
# $CONNECTIONS connections for $DURATION s, replaying pre-signed unique Standard Webhooks
# deliveries of $BODY bytes (presign.py: Python's hmac, not the crate). Baselines, right
# after, on the same server: pgbench running a one-row `INSERT … ON CONFLICT DO NOTHING`
# into a copy of webhook_events at the same client count; sqlite3 inserting one row per
# commit in WAL with synchronous=FULL. Prints one line per measurement and the ratios,
# and the receiver's resident memory: idle, and its peak under the load.
# Needs wrk, pgbench, sqlite3 and PostgreSQL on 127.0.0.1:5432 (`bash .ci/services`).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHICH=${1:-both}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
BODY=${BODY:-1024}
MODE=${WEBHOOK_MODE:-dedupe}
PG=${PG_URL:-postgres://postgres@127.0.0.1:5432}
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
WORK=$(mktemp -d /tmp/tw-throughput.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

# RECEIVER: another build of the receiver to measure (an earlier commit's, say).
if [ -z "${RECEIVER:-}" ]; then
  cargo build --release --all-features --example receiver >&2
  RECEIVER=target/release/examples/receiver
fi
# BARE=0: the receiver only, without the bare loops.
BARE=${BARE:-1}

# Enough fresh deliveries for the run at up to 20 000 requests a second.
COUNT=${COUNT:-$((DURATION * 20000))}
python3 benches/throughput/presign.py "$SECRET" "$COUNT" "$BODY" "$WORK/deliveries.tsv"

receiver_run() { # label, then env assignments for the receiver
  local label=$1; shift
  env "$@" WEBHOOK_SECRETS="$SECRET" WEBHOOK_MODE="$MODE" BIND=127.0.0.1:0 \
    "$RECEIVER" >"$WORK/handled.txt" 2>"$WORK/receiver.err" &
  local pid=$!
  local url=""
  for _ in $(seq 1 100); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*/webhooks' "$WORK/receiver.err" | head -1 || true)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$WORK/receiver.err" >&2; exit 1; }
  local idle_kb
  idle_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  WRK_THREADS=$THREADS wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --timeout 10s \
    -s benches/throughput/replay.lua "$url" -- "$WORK/deliveries.tsv" | grep RESULT \
    | sed "s/^RESULT/$label receiver ($MODE)/"
  # The receiver's resident memory: before the load, and its peak (the kernel's high-water
  # mark) beside the bodies that can be in flight at once (one per connection).
  awk -v idle="$idle_kb" -v inflight=$((CONNECTIONS * BODY)) '/^VmHWM/ {
    printf "%s receiver memory: idle_rss_mb=%.1f peak_rss_mb=%.1f bodies_in_flight_mb=%.1f\n",
      label, idle / 1024, $2 / 1024, inflight / 1048576 }' label="$label" "/proc/$pid/status"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

if [ "$WHICH" = postgres ] || [ "$WHICH" = both ]; then
  DB=tw_throughput_$$
  psql "$PG/postgres" -qc "CREATE DATABASE $DB" >/dev/null
  receiver_run postgres DATABASE_URL="$PG/$DB"
  if [ "$BARE" = 1 ]; then
  psql "$PG/$DB" -qc "CREATE TABLE bench_events (LIKE webhook_events INCLUDING ALL)" >/dev/null
  cat >"$WORK/insert.sql" <<SQL
\\set n random(1, 9000000000000000)
INSERT INTO bench_events (source, event_id, event_type, body, attempts, locked_until, lock_token)
VALUES ('bench', 'evt_' || :n, 'bench.event', convert_to(repeat('x', $BODY), 'UTF8'), 1,
        clock_timestamp() + interval '60 s', gen_random_uuid())
ON CONFLICT (source, event_id) DO NOTHING;
SQL
  pgbench -n -c "$CONNECTIONS" -j "$THREADS" -T "$DURATION" -f "$WORK/insert.sql" "$PG/$DB" \
    2>/dev/null | awk '/^tps/ {printf "postgres bare pgbench insert: rps=%s\n", $3} /latency average/ {print "postgres bare pgbench latency_avg_ms=" $4}'
  fi
  psql "$PG/postgres" -qc "DROP DATABASE $DB WITH (FORCE)" >/dev/null
fi

if [ "$WHICH" = sqlite ] || [ "$WHICH" = both ]; then
  receiver_run sqlite WEBHOOK_SQLITE="$WORK/receiver.db" DATABASE_URL=
  [ "$BARE" = 1 ] || exit 0
  N=$((DURATION * 1000))
  # The table as the receiver's migrations left it (its primary key; no other index).
  sqlite3 "$WORK/receiver.db" "SELECT sql || ';' FROM sqlite_master WHERE name = 'webhook_events'" \
    | sed 's/webhook_events/bench_events/' >"$WORK/schema.sql"
  python3 - "$WORK/loop.sql" "$N" "$BODY" <<'PY'
import sys
out, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(out, "w") as f:
    f.write("PRAGMA journal_mode=WAL;\nPRAGMA synchronous=FULL;\n")
    for i in range(n):
        f.write(f"INSERT INTO bench_events (source, event_id, event_type, body, received_at, attempts, locked_until, lock_token) "
                f"VALUES ('bench', 'evt_{i}', 'bench.event', zeroblob({size}), 0, 1, 60000, 'token-{i}') "
                f"ON CONFLICT (source, event_id) DO NOTHING;\n")
PY
  sqlite3 "$WORK/bare.db" <"$WORK/schema.sql"
  START=$(date +%s.%N)
  sqlite3 "$WORK/bare.db" <"$WORK/loop.sql" >/dev/null
  END=$(date +%s.%N)
  python3 -c "print(f'sqlite bare sqlite3 loop: rps={$N / ($END - $START):.1f}')"
fi
