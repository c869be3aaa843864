# The bare one-row-per-commit loops run.sh and drain.sh measure against; sourced, with
# $WORK, $BODY, $DURATION, $CONNECTIONS and $THREADS set. Each prints the loop's rate
# (rows a second) alone on its line.

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
  pgbench -n -c "$CONNECTIONS" -j "$THREADS" -T "$DURATION" -f "$WORK/insert.sql" "$1" \
    2>/dev/null | awk '/^tps/ {print $3}'
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
  start=$(date +%s.%N)
  sqlite3 "$WORK/bare.db" <"$WORK/loop.sql" >/dev/null
  end=$(date +%s.%N)
  python3 -c "print(f'{$n / ($end - $start):.1f}')"
}
