#!/usr/bin/env bash
# The integration tests as two pytest processes at once, each with the shared Ray clusters it uses
# (tests/conftest.py): the sweeps and the multi-node engine (the two-node cluster, and a one-node
# one for the resume and preflight sweeps) and the rest (serving, engines, benchmarks on one
# ``ray start --head`` node). On two cores either alone leaves
# the CPU idle about half the time (engine starts, Ray's polls); together the suite takes about
# the time of the longer one. Each line is prefixed with its process; a process's summary is
# printed again at the end; the exit status is the first failing one's.
#
# usage: scripts/test_integration.sh PYTHON [PYTEST_ARGS...]
set -uo pipefail
python=$1
shift
two_node=(tests/integration/sweep tests/integration/reference/test_reference_multinode.py)
one_node=(tests/integration "${two_node[@]/#/--ignore=}")
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

run() {  # NAME PYTEST-ARGS...: one pytest, its lines prefixed with [NAME], its exit status in $logs/NAME.rc
    local name=$1
    shift
    { "$python" -m pytest "$@"; echo $? > "$logs/$name.rc"; } 2>&1 | tee "$logs/$name.log" | sed -u "s/^/[$name] /"
}

run two-node "${two_node[@]}" "$@" &
run one-node "${one_node[@]}" "$@" &
wait
status=0
for name in two-node one-node; do
    echo "== $name: $(tail -n 1 "$logs/$name.log")"
    rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
    [ "$status" -ne 0 ] || status=$rc
done
exit "$status"
