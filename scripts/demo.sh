#!/usr/bin/env bash
# Set up quorumlog and run the main job on one machine: a local cluster of three bookies
# on the embedded metadata store, three instances of the replicated dice application (one
# leads, two follow: all print the same sequence), a client example, and the simpletest
# throughput check.
#   bash scripts/demo.sh [ENTRIES]     (default 100000 entries for simpletest)
#   DICE_SECONDS=30 bash scripts/demo.sh   (how long the dice instances run; default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
entries="${1:-100000}"
dice_seconds="${DICE_SECONDS:-10}"

echo "--- installing quorumlog from this checkout (pip install -e .): its dependencies and the"
echo "    package's build; a minute or more on a first run, about 20 s once installed"
install_started=$SECONDS
python -m pip install -q --disable-pip-version-check -e . 2>&1 | grep -v '^WARNING' || true
echo "    installed in $((SECONDS - install_started)) s"

data_dir=$(mktemp -d -t quorumlog-demo.XXXXXX)
log="$data_dir/localbookie.log"
echo "--- starting a local cluster: quorumlog localbookie 3 --data-dir $data_dir"
quorumlog localbookie 3 --data-dir "$data_dir" >"$log" 2>&1 &
cluster_pid=$!
dice_pids=()
cleanup() {
    for pid in "${dice_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
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

echo "--- three dice instances for ${dice_seconds} s (more: quorumlog dice --metadata \$QUORUMLOG_METADATA)"
for n in 1 2 3; do
    quorumlog dice --interval-ms 500 >"$data_dir/dice-$n.log" 2>&1 &
    dice_pids+=("$!")
    sleep 0.5
done
sleep "$dice_seconds"
for pid in "${dice_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
wait "${dice_pids[@]}" 2>/dev/null || true
dice_pids=()
for n in 1 2 3; do sed "s/^/[dice-$n] /" "$data_dir/dice-$n.log"; done

echo "--- a three-replica database (quorumlog db serve): write through one, read from another"
db_ports=()
for n in 1 2 3; do
    port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    db_ports+=("$port")
    quorumlog db serve --name demo --data-dir "$data_dir/db-$n" --http-addr "127.0.0.1:$port" \
        --node-id "db-$n" >"$data_dir/db-$n.log" 2>&1 &
    dice_pids+=("$!")
done
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:${db_ports[0]}/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
quorumlog db shell --addr "127.0.0.1:${db_ports[0]}" \
    "CREATE TABLE fruit (id INTEGER PRIMARY KEY, name TEXT)" \
    "INSERT INTO fruit(name) VALUES ('apple'), ('pear')"
echo "read from replica db-3 (level strong):"
quorumlog db shell --addr "127.0.0.1:${db_ports[2]}" --level strong "SELECT * FROM fruit"
quorumlog db nodes --addr "127.0.0.1:${db_ports[1]}"
for pid in "${dice_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
wait "${dice_pids[@]}" 2>/dev/null || true
dice_pids=()

echo "--- client example (examples/hello_ledger.py)"
python examples/hello_ledger.py
echo "--- quorumlog shell simpletest --entries $entries (3/3/2, 100-byte entries, journal sync on)"
quorumlog shell simpletest --entries "$entries"
echo "--- quorumlog shell listbookies"
quorumlog shell listbookies
