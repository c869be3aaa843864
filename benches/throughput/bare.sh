# The bare one-row-per-commit loops run.sh and drain.sh measure against; sourced, with
# $WORK, $BODY, $DURATION, $CONNECTIONS and $THREADS set. Each prints the loop's rate
# (rows a second) alone on its line, and leaves its CPU split in $WORK/bare_cpu.txt.

# CPU per request, split: the whole machine's busy ticks (/proc/stat: user, nice, system,
# irq, softirq, steal) over a run, the load generator's (`/usr/bin/time`), a process's
# (/proc/<pid>/stat), and the rest (the database: its backends, WAL writer, the kernel's
# I/O for it). On two shared cores a request's cost is CPU, not wall time.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
gen_ticks() { # a `/usr/bin/time -f "%U %S"` file -> ticks
  awk -v hz="$(getconf CLK_TCK)" 'NF == 2 && $1 ~ /^[0-9.]+$/ {t = ($1 + $2) * hz} END {printf "%d", t}' "$1"
}
# label, requests, machine ticks, generator ticks, process ticks (or -), process name
cpu_split() {
  python3 - "$@" "$(getconf CLK_TCK)" <<'PY'
import sys
label, n, machine, gen, proc, name, hz = sys.argv[1:8]
n, hz = max(1, int(float(n))), int(hz)
us = lambda t: int(t) * 1e6 / hz / n
machine, gen = us(machine), us(gen)
fields = [f"total={machine:.0f}", f"generator={gen:.0f}"]
if proc != "-":
    p = us(proc)
    fields.append(f"{name}={p:.0f}")
    fields.append(f"rest={machine - gen - p:.0f}")
else:
    fields.append(f"database={machine - gen:.0f}")
print(f"{label} cpu_us_per_request: " + " ".join(fields))
PY
}

# pgbench inserting one row per transaction into a copy of webhook_events in the
# database at URL $1 (where the receiver's migrations ran), at $CONNECTIONS clients.
bare_postgres() {
  cat >"$WORK/insert.sql" <<SQL
\\set n random(1, 9000000000000000)
INSERT INTO bench_events (source, event_id, event_type, body, attempts, locked_until, lock_token)
VALUES ('bench', 'evt_' || :n, 'bench.event', convert_to(repeat('x', $BODY), 'UTF8'), 1,
        clock_timestamp() + interval '60 s', gen_random_uuid())
ON CONFLICT (source, event_id) DO NOTHING;
SQL
  psql "$1" -qc "CREATE TABLE bench_events (LIKE webhook_events INCLUDING ALL)" >/dev/null
  local m0 m1 out
  m0=$(machine_ticks)
  out=$(/usr/bin/time -f "%U %S" -o "$WORK/gen_time.txt" pgbench -n -c "$CONNECTIONS" \
    -j "$THREADS" -T "$DURATION" -f "$WORK/insert.sql" "$1" 2>/dev/null)
  m1=$(machine_ticks)
  cpu_split "postgres bare pgbench" "$(echo "$out" | awk '/transactions actually processed/ {print $NF}' | cut -d/ -f1)" \
    $((m1 - m0)) "$(gen_ticks "$WORK/gen_time.txt")" - - >"$WORK/bare_cpu.txt"
  echo "$out" | awk '/^tps/ {print $3}'
}

# sqlite3 inserting one row per commit in WAL with synchronous=FULL, into the table as
# the receiver's migrations left it in the file $1 (its primary key; no other index).
bare_sqlite() {
  local n=$((DURATION * 1000)) start end
  sqlite3 "$1" "SELECT sql || ';' FROM sqlite_master WHERE name = 'webhook_events'" \
    | sed 's/webhook_events/bench_events/' >"$WORK/schema.sql"
  python3 - "$WORK/loop.sql" "$n" "$BODY" <<'PY'
import sys
out, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(out, "w") as f:
    f.write("PRAGMA journal_mode=WAL;\nPRAGMA synchronous=FULL;\n")
    for i in range(n):
        f.write(f"INSERT INTO bench_events (source, event_id, event_type, body, received_at, attempts, locked_until, lock_token) "
                f"VALUES ('bench', 'evt_{i}', 'bench.event', zeroblob({size}), 0, 1, 60000, 'token-{i}') "
                f"ON CONFLICT (source, event_id) DO NOTHING;\n")
PY
  rm -f "$WORK/bare.db"
  sqlite3 "$WORK/bare.db" <"$WORK/schema.sql"
  local m0; m0=$(machine_ticks)
  start=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$WORK/gen_time.txt" sqlite3 "$WORK/bare.db" <"$WORK/loop.sql" >/dev/null
  end=$(date +%s.%N)
  # The loop is its own database: its ticks are the process's; the rest, the kernel's fsyncs.
  cpu_split "sqlite bare sqlite3" "$n" $(($(machine_ticks) - m0)) 0 \
    "$(gen_ticks "$WORK/gen_time.txt")" sqlite3 >"$WORK/bare_cpu.txt"
  python3 -c "print(f'{$n / ($end - $start):.1f}')"
}
