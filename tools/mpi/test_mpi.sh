#!/usr/bin/env bash
# issue 28 (docs/DISTRIBUTED.md#testing): `mpirun -np 2` and `-np 3` on both tiny checkpoints,
# resident and at a streaming budget, generate the same ids and text (the --json report; rank 0's
# stdout under mpirun is a pty, where k3 escapes control characters as on any terminal) and
# write the same --dump-logits bytes as one process; a rank with a different checkpoint is refused by name;
# a rank killed mid-generation ends the job within 30 s. Needs a system MPI (mpirun) and a
# `k3` built with `--features mpi` (built here unless K3_BIN is set). Every run is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${K3_BIN:-}" ]; then
    cargo build --quiet --release -p k3-cli --features mpi
    K3_BIN=target/release/k3
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

run_case() { # model, np (0 = no mpirun), budget flags...
    local model=$1 np=$2; shift 2
    local tag="$model-np$np-${*// /_}"
    local cmd=("$K3_BIN" run "fixtures/$model" --ids 637,229,263,638,730 -n 12 --temp 0.8 --seed 3
        -t 1 --print-ids --dump-logits "$tmp/$tag.logits" --json "$tmp/$tag.json" "$@")
    if [ "$np" = 0 ]; then
        timeout 120 "${cmd[@]}" >"$tmp/$tag.out" 2>"$tmp/$tag.err" || fail "$tag: $(tail -3 "$tmp/$tag.err")"
    else
        timeout 120 "${MPIRUN[@]}" -np "$np" "${cmd[@]}" >"$tmp/$tag.out" 2>"$tmp/$tag.err" \
            || fail "$tag: $(tail -5 "$tmp/$tag.err")"
    fi
    grep '^generated ids:' "$tmp/$tag.err" >"$tmp/$tag.ids" || fail "$tag: no ids line"
    [ "$(wc -l <"$tmp/$tag.ids")" = 1 ] || fail "$tag: more than one rank printed ids"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["prompt_ids"], r["generated_ids"], repr(r["generated_text"]))' \
        "$tmp/$tag.json" >"$tmp/$tag.gen" || fail "$tag: no --json report"
    echo "$tag"
}

# the smallest budget of each (every trunk layer streams through one ring slot)
declare -A SMALLEST=([tiny-k3]=0.003 [tiny-k3-wide]=0.006)
for model in tiny-k3 tiny-k3-wide; do
    for budget in "--resident" "--mem-gb ${SMALLEST[$model]}"; do
        # shellcheck disable=SC2086
        one=$(run_case "$model" 0 $budget)
        for np in 2 3; do
            # shellcheck disable=SC2086
            many=$(run_case "$model" "$np" $budget)
            cmp -s "$tmp/$one.gen" "$tmp/$many.gen" || fail "$many: ids or text differ from one process"
            cmp -s "$tmp/$one.ids" "$tmp/$many.ids" || fail "$many: ids differ from one process"
            cmp -s "$tmp/$one.logits" "$tmp/$many.logits" || fail "$many: logits bytes differ"
            echo "ok: $many = one process ($(cat "$tmp/$many.ids"))"
        done
    done
done

# Different checkpoints on different ranks: refused at open, naming the rank.
other="$tmp/other-model"
mkdir -p "$other"
cp fixtures/tiny-k3/* "$other/" 2>/dev/null || true
echo "not the same" >"$other/extra.txt"
set +e
timeout 60 "${MPIRUN[@]}" -np 1 "$K3_BIN" run fixtures/tiny-k3 --ids 1 -n 2 -q : \
    -np 1 "$K3_BIN" run "$other" --ids 1 -n 2 -q >"$tmp/fp.out" 2>"$tmp/fp.err"
rc=$?
set -e
[ "$rc" != 0 ] || fail "different checkpoints were not refused"
grep -q "rank 1 opened a different checkpoint" "$tmp/fp.err" || fail "refusal does not name rank 1: $(cat "$tmp/fp.err")"
[ "$rc" = 2 ] || fail "different checkpoints: exit $rc, want 2"
echo "ok: a rank with a different checkpoint is refused (exit $rc)"

# A rank that cannot open its share (its model directory is missing) ends every rank, named.
set +e
timeout 60 "${MPIRUN[@]}" -np 1 "$K3_BIN" run fixtures/tiny-k3 --ids 1 -n 2 -q : \
    -np 1 "$K3_BIN" run "$tmp/missing-model" --ids 1 -n 2 -q >"$tmp/open.out" 2>"$tmp/open.err"
rc=$?
set -e
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "a rank without its model: exit $rc"
grep -q "rank 1" "$tmp/open.err" || fail "open failure does not name rank 1: $(cat "$tmp/open.err")"
echo "ok: a rank that cannot open its model ends the job (exit $rc), naming rank 1"

# A rank killed mid-generation ends the job within 30 s, naming that rank.
set +e
start=$(date +%s)
timeout 60 "${MPIRUN[@]}" -np 2 bash -c \
    'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 2; kill -9 $$) & fi; exec "$0" "$@"' \
    "$K3_BIN" run fixtures/tiny-k3 --ids 1 -n 100000 --ctx 200000 --ignore-eos -q >"$tmp/kill.out" 2>"$tmp/kill.err"
rc=$?
set -e
took=$(( $(date +%s) - start ))
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "killed rank: exit $rc after ${took}s"
[ "$took" -le 30 ] || fail "killed rank: the job took ${took}s to end"
grep -qi "rank 1" "$tmp/kill.err" || fail "killed rank not named: $(tail -5 "$tmp/kill.err")"
echo "ok: a killed rank ends the job in ${took}s (exit $rc), naming rank 1"
echo "all MPI checks passed"
