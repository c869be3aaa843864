#!/usr/bin/env bash
# The inbox's worker against its front door, in one run:
#
#   benches/throughput/drain.sh [postgres|sqlite|both|brokers]     (default both)
#
# `brokers`: the hand-offs past one host in one run, JetStream's (nats mode) and
# RabbitMQ's (amqp mode), each behind DedupeLayer on a fresh SQLite file and on a fresh
# stream or queue: accept alone and drain alone (and both at once unless QUICK), then the
# ratios of RabbitMQ's to JetStream's. BROKERS_FIRST=amqp runs RabbitMQ first.
#
# The `receiver` example in inbox mode, its processor printing `handled <id>` and
# `finished <id>` (no other work), driven by wrk as in run.sh ($CONNECTIONS connections, $DURATION s, unique
# pre-signed deliveries of $BODY bytes):
#   accept alone   the receiver with no worker (WEBHOOK_WORKER_CONCURRENCY=0);
#   drain alone    the same inbox, the receiver started again with its worker and no
#                  load: the time until every accepted event is handled, and the CPU
#                  the receiver and (PostgreSQL) its database's backends took per route;
#   both at once   a fresh inbox, the worker running while wrk sends: what was processed
#                  while the load ran, and how long the rest took after it;
#   latency        a fresh inbox, pace.py sending at half the accept-alone rate for
#                  $DURATION s: accept (its 2xx) -> processed (its `handled` line), p50/p99;
#   bare loop      run.sh's: pgbench's one-row inserts, or sqlite3's one row per commit.
# PROCESSORS (unset: one processor, `default`) is passed as WEBHOOK_PROCESSORS: a worker
# per processor, names without filters (`a,b,c`): the drain waits for one `handled` line
# per accepted event and processor. The latency phase times PACE_PROCESSOR's `finished
# <id> <processor>` lines (default: the first of PROCESSORS; unset, `handled <id>`), at
# PACE_RATE a second (default: half the accept-alone rate of the same run). ONLY=latency
# runs that phase alone (its rate then needs PACE_RATE); ONLY=accept runs accept alone
# and the bare loop (with PROCESSORS: the accept's cost of routes). WEBHOOK_PROCESSOR_DELAY_MS
# (`slow:3000`) passes through, as the receiver's other variables do.
# Every rate is also printed as a ratio to the bare loop. $WORKERS: the worker's
# concurrency (default 32, the receiver's). DELIVERIES=<file>: presign.py's output of an
# earlier call instead of a new one (BODY and COUNT are then the file's). QUICK=1: accept alone, drain alone and the
# bare loop only. BARE=0: no bare loop (rounds comparing two settings of the crate alone).
# The receiver's other variables (WEBHOOK_RATE, WEBHOOK_PER_OBJECT) pass
# through from the environment. Needs wrk, pgbench, sqlite3, python3 and
# PostgreSQL on 127.0.0.1:5432 (`bash .ci/services`).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHICH=${1:-both}
[ "${ONLY:-}" != accept ] || QUICK=1
DURATION=${DURATION:-6}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
BODY=${BODY:-1024}
WORKERS=${WORKERS:-32}
PG=${PG_URL:-postgres://postgres@127.0.0.1:5432}
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
WORK=$(mktemp -d /tmp/tw-drain.XXXXXX)
DBS=() # databases made, dropped on exit however it ends
drop_dbs() { for db in ${DBS[@]+"${DBS[@]}"}; do psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true; done; DBS=(); }
make_db() { psql "$PG/postgres" -qc "CREATE DATABASE $1" >/dev/null; DBS+=("$1"); }
trap 'kill $(jobs -p) 2>/dev/null || true; drop_dbs; rm -rf "$WORK"' EXIT
. benches/throughput/bare.sh

if [ -z "${RECEIVER:-}" ]; then
  cargo build --release --all-features --example receiver >&2
  RECEIVER=target/release/examples/receiver
fi
if [ -n "${DELIVERIES:-}" ]; then
  # A file presign.py wrote earlier, for rounds on fresh databases (its timestamps need
  # WEBHOOK_TOLERANCE_SECS past its age).
  ln -s "$(realpath "$DELIVERIES")" "$WORK/deliveries.tsv"
  COUNT=$(wc -l <"$DELIVERIES")
else
  COUNT=${COUNT:-$((DURATION * 20000))}
  python3 benches/throughput/presign.py "$SECRET" "$COUNT" "$BODY" "$WORK/deliveries.tsv"
fi

now() { date +%s.%N; }
handled() { grep -c '^handled ' "$WORK/handled.txt" || true; }
# WEBHOOK_PROCESSORS for the receiver, when PROCESSORS names any; the routes per event.
PROCESSOR_ENV=()
ROUTES=1
if [ -n "${PROCESSORS:-}" ]; then
  case "$PROCESSORS" in *=*) echo "drain.sh: PROCESSORS takes names without filters" >&2; exit 2 ;; esac
  PROCESSOR_ENV=(WEBHOOK_PROCESSORS="$PROCESSORS")
  ROUTES=$(tr ',' '\n' <<<"$PROCESSORS" | grep -c .)
  PACE_PROCESSOR=${PACE_PROCESSOR:-${PROCESSORS%%,*}}
fi
PACE_ARGS=()
[ -z "${PACE_PROCESSOR:-}" ] || PACE_ARGS=(--processor "$PACE_PROCESSOR")

start_receiver() { # concurrency, then env assignments; sets PID and URL
  local workers=$1; shift
  rm -f "$WORK/receiver.err"
  env WEBHOOK_MODE=inbox "$@" ${PROCESSOR_ENV[@]+"${PROCESSOR_ENV[@]}"} WEBHOOK_SECRETS="$SECRET" WEBHOOK_WORKER_CONCURRENCY="$workers" \
    BIND=127.0.0.1:0 "$RECEIVER" >"${OUT:-$WORK/handled.txt}" 2>"$WORK/receiver.err" &
  PID=$!
  URL=""
  for _ in $(seq 1 100); do
    URL=$(grep -o 'http://127.0.0.1:[0-9]*/webhooks' "$WORK/receiver.err" 2>/dev/null | head -1 || true)
    [ -n "$URL" ] && break
    sleep 0.1
  done
  [ -n "$URL" ] || { cat "$WORK/receiver.err" >&2; exit 1; }
}
stop_receiver() { kill "$PID"; wait "$PID" 2>/dev/null || true; }
load() { # prints wrk's RESULT line as "<label> <fields>"
  WRK_THREADS=$THREADS wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --timeout 10s \
    -s benches/throughput/replay.lua "$URL" -- "$WORK/deliveries.tsv" | grep RESULT | sed "s/^RESULT/$1/"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; } # user + system
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
# CPU ticks the receiver and (PostgreSQL) its database's server processes have taken: a
# figure the other loads of a shared machine disturb less than a rate.
run_cpu() {
  local cpu; cpu=$(cpu_ticks "$PID")
  if [ -n "${DRAIN_DB:-}" ]; then
    for p in $(psql "$PG/postgres" -Atc "SELECT pid FROM pg_stat_activity WHERE datname = '$DRAIN_DB'"); do
      cpu=$((cpu + $(cpu_ticks "$p")))
    done
  fi
  echo "$cpu"
}
per() { python3 -c "print(f'{$1 * 1e6 / $(getconf CLK_TCK) / max(1, $2):.0f}')"; } # ticks, n -> µs each
until_handled() { # n, timeout s: waits until n lines; prints the seconds it took
  local n=$1 limit=$2 t0; t0=$(now)
  while [ "$(handled)" -lt "$n" ]; do
    if python3 -c "import sys; sys.exit(0 if $(now) - $t0 > $limit else 1)"; then break; fi
    sleep 0.05
  done
  python3 -c "print(f'{$(now) - $t0:.2f}')"
}

measure() { # db label, then env assignments naming a fresh store; sets ACCEPT
  local db=$1; shift
  # Accept alone.
  start_receiver 0 "$@"
  load "$db accept alone:" | tee "$WORK/accept.txt"
  local cpu; cpu=$(run_cpu)
  stop_receiver
  ACCEPT=$(field rps <"$WORK/accept.txt")
  local accepted; accepted=$(( $(field requests <"$WORK/accept.txt" | cut -d. -f1) - $(field non2xx <"$WORK/accept.txt") ))
  no_replays "$WORK/accept.txt"
  echo "$db accept alone: cpu_us_per_event=$(per "$cpu" "$accepted") (receiver${DRAIN_DB:+ and database backends})"
  echo "rps=0" >"$WORK/drain.txt"
  [ "${ONLY:-}" != accept ] || return 0 # ONLY=accept: no drain (its ratio prints 0)
  # Drain alone: the same inbox, with the worker.
  : >"$WORK/handled.txt"
  start_receiver "$WORKERS" "$@"
  local took; took=$(until_handled "$((accepted * ROUTES))" 300)
  local cpu; cpu=$(run_cpu)
  echo "$db drain alone: processed=$(handled)/$((accepted * ROUTES)) seconds=$took rps=$(python3 -c "print(f'{$(handled) / $took:.1f}')") cpu_us_per_route=$(per "$cpu" "$(handled)")" | tee "$WORK/drain.txt"
  stop_receiver
}

both() { # db label, then env assignments naming a fresh store
  local db=$1; shift
  : >"$WORK/handled.txt"
  start_receiver "$WORKERS" "$@"
  load "$db both at once:" | tee "$WORK/both.txt"
  no_replays "$WORK/both.txt"
  local during; during=$(handled)
  local accepted; accepted=$(( $(field requests <"$WORK/both.txt" | cut -d. -f1) - $(field non2xx <"$WORK/both.txt") ))
  local after; after=$(until_handled "$((accepted * ROUTES))" 300)
  echo "$db both at once: processed_during_load=$during/$((accepted * ROUTES)) processed_rps_during_load=$(python3 -c "print(f'{$during / $DURATION:.1f}')") drained_after_s=$after"
  stop_receiver
}

latency() { # db label, then env assignments naming a fresh store
  local db=$1; shift
  mkfifo "$WORK/handled.fifo"
  exec 3<>"$WORK/handled.fifo" # held open, so the receiver's open of it does not wait
  OUT="$WORK/handled.fifo" start_receiver "$WORKERS" "$@"
  python3 benches/throughput/pace.py ${PACE_ARGS[@]+"${PACE_ARGS[@]}"} "$URL" "$WORK/deliveries.tsv" \
    "${PACE_RATE:-$(python3 -c "print($ACCEPT / 2)")}" "$DURATION" 16 "$WORK/handled.fifo" \
    | sed "s|^RESULT|$db latency at ${PACE_RATE:-half the accept rate}${PACE_RATE:+/s}${PACE_PROCESSOR:+ ($PACE_PROCESSOR)}:|"
  stop_receiver
  exec 3>&-
  rm -f "$WORK/handled.fifo"
}

# Each wrk thread replays its own slice once through it: those requests are duplicates,
# counted by wrk and never new to the drain, which would wait for them: refuse the run.
no_replays() { # a load's result file; refuses it too when more than 1 % was refused
  local refused requests; refused=$(field non2xx <"$1"); requests=$(field requests <"$1" | cut -d. -f1)
  if [ "$((refused * 100))" -gt "${requests:-0}" ]; then
    echo "drain.sh: $refused of $requests requests were refused (not 2xx): not an accept rate (an expired DELIVERIES file needs WEBHOOK_TOLERANCE_SECS past its age)" >&2
    exit 3
  fi
  local n; n=$(field replayed <"$1")
  if [ -z "$n" ]; then
    echo "drain.sh: no replayed= in wrk's result (did wrk run replay.lua?)" >&2
    exit 3
  fi
  if [ "$n" != 0 ]; then
    echo "drain.sh: $n requests replayed a wrk thread's slice of the $COUNT pre-signed deliveries (duplicates); raise COUNT" >&2
    exit 3
  fi
}

ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }

if [ "$WHICH" = brokers ]; then
  TAG="bench_$$_$RANDOM"
  # Best effort: the stream and its buckets, the queues (left on the servers otherwise).
  forget_brokers() {
    python3 - "$TAG" <<'PY' || true
import socket, sys
tag = sys.argv[1]
s = socket.create_connection(("127.0.0.1", 4222), timeout=5)
s.recv(4096)
s.sendall(b"CONNECT {\"verbose\":false}\r\n")
for t in [tag, f"{tag}-2"]:
  for name in [t, f"{t}-dead", f"{t}-paused", f"KV_{t}-pauses", f"KV_{t}-held"]:
    s.sendall(f"PUB $JS.API.STREAM.DELETE.{name} 0\r\n\r\n".encode())
s.sendall(b"PING\r\n")
s.recv(4096)
PY
    for q in $(rabbitmqctl -q list_queues name 2>/dev/null | grep "^$TAG" || true); do
      rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
    done
  }
  trap 'kill $(jobs -p) 2>/dev/null || true; forget_brokers; rm -rf "$WORK"' EXIT
  broker() { # nats|amqp: sets ACCEPT_<broker>, DRAIN_<broker>
    local mode=$1 env
    env=(WEBHOOK_MODE="$mode" WEBHOOK_SQLITE="$WORK/$mode-claims.db" DATABASE_URL= NATS_STREAM="$TAG"
      AMQP_EXCHANGE="$TAG" AMQP_QUEUE="$TAG")
    measure "$mode" "${env[@]}"
    printf -v "ACCEPT_$mode" %s "$ACCEPT"
    printf -v "DRAIN_$mode" %s "$(field rps <"$WORK/drain.txt")"
    if [ -z "${QUICK:-}" ]; then
      env[1]=WEBHOOK_SQLITE="$WORK/$mode-claims-2.db"
      env[3]=NATS_STREAM="$TAG-2" env[4]=AMQP_EXCHANGE="$TAG-2" env[5]=AMQP_QUEUE="$TAG-2"
      both "$mode" "${env[@]}"
    fi
  }
  if [ "${BROKERS_FIRST:-nats}" = amqp ]; then broker amqp; broker nats; else broker nats; broker amqp; fi
  echo "brokers: RabbitMQ to JetStream: accept_alone=$(ratio "$ACCEPT_amqp" "$ACCEPT_nats") drain_alone=$(ratio "$DRAIN_amqp" "$DRAIN_nats")"
  exit 0
fi

if [ "${ONLY:-}" = latency ]; then
  [ -n "${PACE_RATE:-}" ] || { echo "drain.sh: ONLY=latency needs PACE_RATE" >&2; exit 2; }
  if [ "$WHICH" = postgres ] || [ "$WHICH" = both ]; then
    make_db "tw_drain_$$_3"
    psql "$PG/postgres" -qc CHECKPOINT # as for the accept below
    latency postgres DATABASE_URL="$PG/tw_drain_$$_3"
    drop_dbs
  fi
  if [ "$WHICH" = sqlite ] || [ "$WHICH" = both ]; then
    latency sqlite WEBHOOK_SQLITE="$WORK/three.db" DATABASE_URL=
  fi
  exit 0
fi

if [ "$WHICH" = postgres ] || [ "$WHICH" = both ]; then
  for n in 1 2 3; do make_db "tw_drain_$$_$n"; done
  # Each run starts from a checkpoint: the WAL an earlier run (or the bare loop's
  # pgbench) filled would have its checkpoint's full-page images paid by this one.
  psql "$PG/postgres" -qc CHECKPOINT
  DRAIN_DB="tw_drain_$$_1" measure postgres DATABASE_URL="$PG/tw_drain_$$_1"
  [ -n "${QUICK:-}" ] || both postgres DATABASE_URL="$PG/tw_drain_$$_2"
  if [ "${BARE:-1}" != 0 ]; then
    BARE_RPS=$(bare_postgres "$PG/tw_drain_$$_1")
    echo "postgres bare pgbench insert: rps=$BARE_RPS"
    echo "postgres ratios to the bare loop: accept_alone=$(ratio "$ACCEPT" "$BARE_RPS") drain_alone=$(ratio "$(field rps <"$WORK/drain.txt")" "$BARE_RPS")"
  fi
  [ -n "${QUICK:-}" ] || latency postgres DATABASE_URL="$PG/tw_drain_$$_3"
  drop_dbs
fi

if [ "$WHICH" = sqlite ] || [ "$WHICH" = both ]; then
  measure sqlite WEBHOOK_SQLITE="$WORK/one.db" DATABASE_URL=
  [ -n "${QUICK:-}" ] || both sqlite WEBHOOK_SQLITE="$WORK/two.db" DATABASE_URL=
  if [ "${BARE:-1}" != 0 ]; then
    BARE_RPS=$(bare_sqlite "$WORK/one.db")
    echo "sqlite bare sqlite3 loop: rps=$BARE_RPS"
    echo "sqlite ratios to the bare loop: accept_alone=$(ratio "$ACCEPT" "$BARE_RPS") drain_alone=$(ratio "$(field rps <"$WORK/drain.txt")" "$BARE_RPS")"
  fi
  [ -n "${QUICK:-}" ] || latency sqlite WEBHOOK_SQLITE="$WORK/three.db" DATABASE_URL=
fi
