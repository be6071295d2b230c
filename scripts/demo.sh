#!/usr/bin/env bash
# Set up quorumlog and run the main job on one machine: a local cluster of three bookies
# on the embedded metadata store, a client example, and the simpletest throughput check.
#   bash scripts/demo.sh [ENTRIES]     (default 100000 entries for simpletest)
set -euo pipefail
cd "$(dirname "$0")/.."
entries="${1:-100000}"

python -m pip install -q --disable-pip-version-check -e . 2>&1 | grep -v '^WARNING' || true

data_dir=$(mktemp -d -t quorumlog-demo.XXXXXX)
log="$data_dir/localbookie.log"
quorumlog localbookie 3 --data-dir "$data_dir" >"$log" 2>&1 &
cluster_pid=$!
cleanup() {
    kill -TERM "$cluster_pid" 2>/dev/null || true
    wait "$cluster_pid" 2>/dev/null || true
    rm -rf "$data_dir"
}
trap cleanup EXIT

for _ in $(seq 1 600); do
    grep -q ready "$log" && break
    kill -0 "$cluster_pid" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.1
done
grep -q ready "$log" || { echo "local cluster did not start"; cat "$log"; exit 1; }
cat "$log"
export QUORUMLOG_METADATA
QUORUMLOG_METADATA=$(sed -n 's/^metadata: //p' "$log" | head -n 1)

echo "--- client example (examples/hello_ledger.py)"
python examples/hello_ledger.py
echo "--- quorumlog shell simpletest --entries $entries (3/3/2, 100-byte entries, journal sync on)"
quorumlog shell simpletest --entries "$entries"
echo "--- quorumlog shell listbookies"
quorumlog shell listbookies
