#!/usr/bin/env python3
"""What a per-object cap costs the SQLite inbox's claim, statement by statement:

    benches/sql/claim.py [ROUNDS] [REV ...]     (default: 3 rounds, the work tree)

For each git revision (or the work tree, `.`), it takes that revision's own SQL — the
migrations, `CLAIM_DUE` and `PROCESSED` from src/sql/sqlite/queue.rs and the on-demand
object index from src/sql/mod.rs — and, on a fresh copy of one database of 60 000 due
1 KiB rows (each its own object), drains it in claims of 64 and one commit of outcomes
each, as the worker does:
  off       no cap (no index): the baseline of the same round;
  cap       a per-object cap of 1, its index made.
Then one claim of 64 over a hot object with 3 000 rows queued (only its first may run).
Times are the process's CPU time (SQLite runs in it), steadier than the wall clock on a
shared machine; each figure is also a ratio to `off` of the same round.

Only revisions from before fan-out (issue 33), whose queue was webhook_events itself:
since, the queue is webhook_routes and the cap's index `webhook_routes_by_object`, which
`benches/throughput/rules.sh` measures end to end. A later revision is refused by name.
"""
import os, re, shutil, sqlite3, subprocess, sys, tempfile, time, uuid

ROOT = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()


def source(rev, path):
    if rev == ".":
        return open(os.path.join(ROOT, path)).read()
    return subprocess.check_output(["git", "-C", ROOT, "show", f"{rev}:{path}"], text=True)


def rust_const(text, name):
    return re.search(rf'const {name}: &str = "(.*?)";', text, re.S).group(1)


def statements(rev):
    queue = source(rev, "src/sql/sqlite/queue.rs")
    index = re.search(r'" IF NOT EXISTS webhook_events_(?:by_)?object(.*?)"', source(rev, "src/sql/mod.rs"), re.S)
    if index is None:
        sys.exit(f"claim.py: {rev} queues in webhook_routes (fan-out): this measures only "
                 "revisions before it; see benches/throughput/rules.sh")
    files = subprocess.check_output(["git", "-C", ROOT, "ls-tree", "--name-only", rev if rev != "." else "HEAD", "migrations/sqlite/"], text=True).split()
    schema = "\n".join(source(rev, f) for f in sorted(files))
    return schema, rust_const(queue, "CLAIM_DUE"), rust_const(queue, "PROCESSED"), "CREATE INDEX IF NOT EXISTS webhook_events_by_object" + index.group(1)


def database(dir, schema, rows):
    path = os.path.join(dir, "seed.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(schema)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO webhook_events (source, event_id, event_type, object_id, livemode, body,"
        " received_at, attempts, next_attempt_at) VALUES (?, ?, 't', ?, 0, ?, ?, 0, ?)", rows)
    db.execute("COMMIT")
    db.close()
    return path


def opened(dir, seed):
    path = os.path.join(dir, "run.db")
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f):
            os.remove(f)
    shutil.copy(seed, path)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def claim(db, sql, now, cap):
    token = uuid.uuid4().hex
    db.execute("BEGIN IMMEDIATE")
    args = (now, 60000, token, 64, 8, "crashed", cap, "[]", "[]")
    if max(int(n) for n in re.findall(r"\?(\d+)", sql)) == 8:
        args = args[:5] + args[6:]  # since the claim leaves burying to its own statement
    rows = db.execute(sql, args).fetchall()
    db.execute("COMMIT")
    return token, rows


def drain(dir, seed, stmts, cap):
    _, claim_due, processed, index = stmts
    db = opened(dir, seed)
    if cap:
        db.execute(index)
    now, n, started = int(time.time() * 1000), 0, time.process_time()
    while True:
        token, rows = claim(db, claim_due, now, cap)
        if not rows:
            break
        db.execute("BEGIN IMMEDIATE")
        for r in rows:
            db.execute(processed, (r[0], r[1], token, now))
        db.execute("COMMIT")
        n += len(rows)
    spent = time.process_time() - started
    db.close()
    return n / spent


def hot_claim(dir, seed, stmts):
    _, claim_due, _, index = stmts
    db = opened(dir, seed)
    db.execute(index)
    started = time.process_time()
    _, rows = claim(db, claim_due, int(time.time() * 1000), 1)
    spent = time.process_time() - started
    db.close()
    assert len(rows) == 1, rows
    return spent


def main():
    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 3
    revs = args or ["."]
    now = int(time.time() * 1000)
    spread = [("s", f"evt_{i}", f"o_{i}", b"x" * 1024, now - 100000 + i, now - 100000 + i) for i in range(60000)]
    hot = [("s", f"evt_{i}", "o_hot", b"x" * 1024, now - 100000 + i, now - 100000 + i) for i in range(3000)]
    with tempfile.TemporaryDirectory() as dir:
        for rev in revs:
            stmts = statements(rev)
            seeds = {}
            for name, rows in (("spread", spread), ("hot", hot)):
                seeds[name] = database(dir, stmts[0], rows)
                os.rename(seeds[name], os.path.join(dir, f"{name}.db"))
                seeds[name] = os.path.join(dir, f"{name}.db")
            for round in range(1, rounds + 1):
                off = drain(dir, seeds["spread"], stmts, None)
                cap = drain(dir, seeds["spread"], stmts, 1)
                hot_s = hot_claim(dir, seeds["hot"], stmts)
                print(f"RESULT rev={rev} round={round} drain rows/cpu-s: off={off:.0f} cap={cap:.0f} "
                      f"({cap / off:.2f}x)  one claim over a hot object of 3000: {hot_s * 1000:.1f} ms "
                      f"({hot_s * off / 64:.1f}x a claim of 64 uncapped)", flush=True)


main()
