#!/usr/bin/env bash
# What flow control costs the worker at full speed, in one run:
#
#   BASE=<receiver built before the rules> benches/throughput/rules.sh [postgres|sqlite|both]
#
# drain.sh's accept alone and drain alone (QUICK=1, $WORKERS workers, default 64), for:
#   base    the receiver at BASE (no rules in the engine);
#   off     this tree's receiver, no rule set;
#   on      this tree's receiver with a per-object cap of 1 and a rate of 1 000 000/s:
#           every rule evaluated, none binding (each delivery has an object of its own).
# The three alternate, $ROUNDS times (default 2), so drift on a noisy machine falls on
# each; each figure is also a ratio to base's in the same round.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHICH=${1:-both}
: "${BASE:?BASE=<path to a receiver built before the rules>}"
ROUNDS=${ROUNDS:-2}
export WORKERS=${WORKERS:-64} QUICK=1
cargo build --release --all-features --example receiver >&2
HEAD=target/release/examples/receiver
drain() { sed -n 's/.*drain alone: .* rps=\([0-9.]*\).*/\1/p'; }
accept() { sed -n 's/.*accept alone: .* rps=\([0-9.]*\).*/\1/p' | head -1; }
for db in $( [ "$WHICH" = both ] && echo postgres sqlite || echo "$WHICH"); do
  for round in $(seq 1 "$ROUNDS"); do
    base=$(RECEIVER=$BASE benches/throughput/drain.sh "$db")
    off=$(RECEIVER=$HEAD benches/throughput/drain.sh "$db")
    on=$(RECEIVER=$HEAD WEBHOOK_PER_OBJECT=1 WEBHOOK_RATE=1000000/s benches/throughput/drain.sh "$db")
    b=$(drain <<<"$base") f=$(drain <<<"$off") n=$(drain <<<"$on")
    ba=$(accept <<<"$base") fa=$(accept <<<"$off") na=$(accept <<<"$on")
    r() { python3 -c "print(f'{$1 / $2:.2f}')"; }
    echo "RESULT $db round=$round drain: base=$b off=$f ($(r "$f" "$b")x) on=$n ($(r "$n" "$b")x)" \
      "accept: base=$ba off=$fa ($(r "$fa" "$ba")x) on=$na ($(r "$na" "$ba")x)"
  done
done
