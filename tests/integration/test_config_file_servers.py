"""``quorumlog bookie --config FILE`` as a supervisor would run it: every setting in the
file, nothing on the command line; a file with an unknown key stops it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support import poll_until

_ENV = {k: v for k, v in os.environ.items() if not k.startswith("QUORUMLOG_")}
_ENV["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])


def test_a_bookie_runs_from_its_configuration_file_alone(tmp_path: Path) -> None:
    config = tmp_path / "bookie.toml"
    config.write_text(
        f'metadata = "sqlite://{tmp_path}/meta/metadata.db"\n'
        f'data_dir = "{tmp_path}/data"\n'
        f'journal_dir = "{tmp_path}/journal"\n'
        'bind_address = "0.0.0.0"\n'
        'advertised_address = "localhost"\n'
        "no_journal_sync = true\n"
    )
    out = tmp_path / "stdout"
    with open(out, "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "quorumlog", "bookie", "--config", str(config)],
            stdout=stdout,
            stderr=stderr,
            env=_ENV,
        )
    try:
        poll_until(
            lambda: b" ready" in out.read_bytes() or process.poll() is not None,
            timeout_s=60,
            what="bookie ready",
        )
        assert out.read_bytes().startswith(b"bookie localhost:"), (tmp_path / "stderr").read_text()
        assert (tmp_path / "journal" / "COOKIE").exists()
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        assert process.wait(30) == 0


def test_a_server_with_an_unknown_key_in_its_file_does_not_start(tmp_path: Path) -> None:
    config = tmp_path / "autorecovery.toml"
    config.write_text('metadata = "sqlite:///nowhere.db"\naudit_interval = 60\n')
    done = subprocess.run(
        [sys.executable, "-m", "quorumlog", "autorecovery", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_ENV,
        check=False,
    )
    assert done.returncode == 2
    assert f"{config}: unknown key 'audit_interval'" in done.stderr
    assert "Traceback" not in done.stderr
