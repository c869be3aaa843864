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
# and the receiver's resident memory: idle, and its peak under the load. Each run also
# prints its CPU per request (`cpu_us_per_request`: the machine's, the load generator's,
# the receiver's and the rest — the database), and the bare loops their CPU per row.
# PERF=1: `perf record` samples the receiver under the load, and the functions taking
# the most of its CPU are printed (self time, ≥ 1.5 %), after its split by object (the
# kernel, the receiver, libc).
# FRONT=1: first, the front door alone: the receiver under the same load with a secret
# that signed none of the deliveries, so each is read, its HMAC computed and refused (401)
# before any store: HTTP and verification without a database, the rate no store's path
# can pass on this machine, and its CPU a request (run alone: `FRONT=1 BARE=0 run.sh none`).
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
. benches/throughput/bare.sh

# RECEIVER: another build of the receiver to measure (an earlier commit's, say).
if [ -z "${RECEIVER:-}" ]; then
  cargo build --release --all-features --example receiver >&2
  RECEIVER=target/release/examples/receiver
fi
# BARE=0: the receiver only, without the bare loops.
BARE=${BARE:-1}
# SIZES=1: after the receiver, what webhook_events takes on disk per row (its table,
# TOAST and indexes; SQLite: the whole file once checkpointed): what a claim writes.
SIZES=${SIZES:-0}

# Enough fresh deliveries for the run at up to 20 000 requests a second.
COUNT=${COUNT:-$((DURATION * 20000))}
python3 benches/throughput/presign.py "$SECRET" "$COUNT" "$BODY" "$WORK/deliveries.tsv"

# The database's transactions so far (PostgreSQL, $COMMITS_URL): a receiver's per request
# shows how many requests each commit carries.
commits() {
  [ -n "${COMMITS_URL:-}" ] || { echo 0; return; }
  psql "$COMMITS_URL" -Atc "SELECT xact_commit + xact_rollback FROM pg_stat_database
    WHERE datname = current_database()"
}

receiver_run() { # label, then env assignments for the receiver
  local label=$1; shift
  env WEBHOOK_SECRETS="$SECRET" "$@" WEBHOOK_MODE="$MODE" BIND=127.0.0.1:0 \
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
  local m0 r0 result perf=""
  if [ "${PERF:-0}" = 1 ]; then
    perf record -q -F 499 -g -p "$pid" -o "$WORK/perf.data" >/dev/null 2>&1 & perf=$!
  fi
  local c0; c0=$(commits)
  m0=$(machine_ticks) r0=$(proc_ticks "$pid")
  result=$(WRK_THREADS=$THREADS /usr/bin/time -f "%U %S" -o "$WORK/gen_time.txt" wrk -t"$THREADS" \
    -c"$CONNECTIONS" -d"${DURATION}s" --timeout 10s -s benches/throughput/replay.lua "$url" \
    -- "$WORK/deliveries.tsv" | grep RESULT | sed "s/^RESULT/$label receiver ($MODE)/")
  echo "$result"
  cpu_split "$label receiver ($MODE)" "$(echo "$result" | sed -n 's/.*requests=\([0-9]*\).*/\1/p')" \
    $(($(machine_ticks) - m0)) "$(gen_ticks "$WORK/gen_time.txt")" $(($(proc_ticks "$pid") - r0)) receiver
  if [ -n "${COMMITS_URL:-}" ]; then
    sleep 1 # a backend reports its counts to the statistics within a second of its last
    echo "$label receiver ($MODE) commits_per_request=$(python3 -c "print(f'{($(commits) - $c0) / max(1, $(echo "$result" | sed -n 's/.*requests=\([0-9]*\).*/\1/p')):.2f}')")"
  fi
  if [ -n "$perf" ]; then
    kill -INT "$perf"; wait "$perf" 2>/dev/null || true
    for sort in dso symbol; do
      perf report -i "$WORK/perf.data" --no-children --sort "$sort" --percent-limit 1.5 \
        --stdio -g none 2>/dev/null | grep -E '^ +[0-9.]+%' | sed -e 's/  *-  *-  *$//' \
        -e 's/ *$//' -e "s/^ */$label receiver perf by $sort: /"
    done
  fi
  # The receiver's resident memory: before the load, and its peak (the kernel's high-water
  # mark) beside the bodies that can be in flight at once (one per connection).
  awk -v idle="$idle_kb" -v inflight=$((CONNECTIONS * BODY)) '/^VmHWM/ {
    printf "%s receiver memory: idle_rss_mb=%.1f peak_rss_mb=%.1f bodies_in_flight_mb=%.1f\n",
      label, idle / 1024, $2 / 1024, inflight / 1048576 }' label="$label" "/proc/$pid/status"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

if [ "${FRONT:-0}" = 1 ]; then
  receiver_run front WEBHOOK_SQLITE="$WORK/front.db" DATABASE_URL= \
    WEBHOOK_SECRETS=whsec_dGhlIGZyb250IGRvb3IgYWxvbmUsIG5vIHN0b3Jl
fi

if [ "$WHICH" = postgres ] || [ "$WHICH" = both ]; then
  DB=tw_throughput_$$
  psql "$PG/postgres" -qc "CREATE DATABASE $DB" >/dev/null
  COMMITS_URL="$PG/$DB" receiver_run postgres DATABASE_URL="$PG/$DB"
  if [ "$SIZES" = 1 ]; then
    psql "$PG/$DB" -Atc "SELECT 'postgres webhook_events: rows=' || count(*) || ' bytes_per_row='
      || pg_total_relation_size('webhook_events') / greatest(count(*), 1) FROM webhook_events"
  fi
  if [ "$BARE" = 1 ]; then
    echo "postgres bare pgbench insert: rps=$(bare_postgres "$PG/$DB")"
    cat "$WORK/bare_cpu.txt"
  fi
  psql "$PG/postgres" -qc "DROP DATABASE $DB WITH (FORCE)" >/dev/null
fi

if [ "$WHICH" = sqlite ] || [ "$WHICH" = both ]; then
  receiver_run sqlite WEBHOOK_SQLITE="$WORK/receiver.db" DATABASE_URL=
  if [ "$SIZES" = 1 ]; then
    sqlite3 "$WORK/receiver.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
    rows=$(sqlite3 "$WORK/receiver.db" "SELECT count(*) FROM webhook_events")
    bytes=$(stat -c %s "$WORK/receiver.db")
    echo "sqlite webhook_events: rows=$rows bytes_per_row=$((bytes / (rows > 0 ? rows : 1)))"
  fi
  [ "$BARE" = 1 ] || exit 0
  echo "sqlite bare sqlite3 loop: rps=$(bare_sqlite "$WORK/receiver.db")"
  cat "$WORK/bare_cpu.txt"
fi
