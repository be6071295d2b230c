"""Servers' settings from ``--config FILE`` (TOML) and ``QUORUMLOG_<SERVER>_<KEY>``:
the command line wins over the environment, which wins over the file, which wins over
the default; an unknown key or a value of the wrong type is an error naming it and the
file; docs/CONFIGURATION.md lists every key, generated from the same table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from quorumlog.commands import build_parser
from quorumlog.commands.config_file import (
    ConfigError,
    keys,
    reference_markdown,
    resolve,
    server_parsers,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    return resolve(parser.parse_args(argv), argv, parser)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(text)
    return path


def test_a_file_sets_what_no_flag_or_variable_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUORUMLOG_BOOKIE_PORT", raising=False)
    config = _toml(
        tmp_path,
        'data_dir = "/srv/data"\nport = 3181\nno_journal_sync = true\n'
        'bind_address = "0.0.0.0"\nadvertised_address = "b1.example.com"\n'
        "disk_usage_threshold = 0.9\n",
    )
    args = _parse(["bookie", "--config", str(config)])
    assert args.data_dir == Path("/srv/data")  # the option's own type: a Path
    assert args.port == 3181 and args.no_journal_sync is True
    assert (args.bind_address, args.advertised_address) == ("0.0.0.0", "b1.example.com")
    assert args.disk_usage_threshold == 0.9
    assert (
        args.gc_interval_ms
        == build_parser().parse_args(["bookie", "--data-dir", "x"]).gc_interval_ms
    )


def test_flags_win_over_variables_which_win_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _toml(tmp_path, 'data_dir = "/from/file"\nport = 1\nhttp_port = 2\n')
    monkeypatch.setenv("QUORUMLOG_BOOKIE_PORT", "10")
    monkeypatch.setenv("QUORUMLOG_BOOKIE_HTTP_PORT", "20")
    args = _parse(["bookie", "--config", str(config), "--http-port", "200"])
    assert (args.data_dir, args.port, args.http_port) == (Path("/from/file"), 10, 200)


def test_the_environment_alone_configures_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUORUMLOG_DB_NAME", "shop")
    monkeypatch.setenv("QUORUMLOG_DB_DATA_DIR", "/var/lib/db")
    monkeypatch.setenv("QUORUMLOG_DB_VERBOSE", "yes")
    monkeypatch.setenv("QUORUMLOG_DB_ENSEMBLE", "5")
    args = _parse(["db", "serve"])
    assert (args.name, args.data_dir, args.verbose, args.ensemble) == (
        "shop",
        "/var/lib/db",
        True,
        5,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('data_dir = "/d"\njournal_dirs = "/j"\n', "unknown key 'journal_dirs'"),
        ('data_dir = "/d"\ndatadir = "/d"\n', "did you mean data_dir?"),
        ('data_dir = "/d"\nport = "3181"\n', "key 'port': expected an int, got '3181'"),
        ('data_dir = "/d"\nport = 31.5\n', "key 'port': expected an int"),
        ('data_dir = "/d"\nno_journal_sync = 1\n', "key 'no_journal_sync': expected a bool"),
        ('data_dir = "/d"\nlog_level = "LOUD"\n', "key 'log_level': expected one of DEBUG"),
        ("data_dir = \n", "not TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key_and_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    config = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        _parse(["bookie", "--config", str(config)])
    assert message in str(refused.value) and str(config) in str(refused.value)


def test_bad_variables_and_missing_required_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUORUMLOG_DB_ENSEMBLE", "0")
    monkeypatch.setenv("QUORUMLOG_DB_NAME", "shop")
    with pytest.raises(ConfigError, match=r"QUORUMLOG_DB_ENSEMBLE='0'.*at least 1"):
        _parse(["db", "serve", "--data-dir", "/d"])
    monkeypatch.delenv("QUORUMLOG_DB_ENSEMBLE")
    with pytest.raises(ConfigError, match=r"--data-dir is required .*QUORUMLOG_DB_DATA_DIR"):
        _parse(["db", "serve"])


def test_every_server_option_is_a_key_with_its_default() -> None:
    parsers = server_parsers()
    assert set(parsers) == {"bookie", "autorecovery", "db"}
    bookie = {key.name: key for key in keys(parsers["bookie"])}
    assert bookie["journal_dir"].env == "QUORUMLOG_BOOKIE_JOURNAL_DIR"
    assert bookie["data_dir"].required and not bookie["journal_dir"].required
    assert bookie["bind_address"].flag == "--bind-address"
    assert "config" not in bookie and "help" not in bookie


def test_docs_configuration_lists_every_key_as_generated() -> None:
    expected = reference_markdown()
    assert DOC.read_text() == expected, (
        "docs/CONFIGURATION.md is stale: python -m quorumlog.commands.config_file "
        "> docs/CONFIGURATION.md"
    )
    for parser in server_parsers().values():
        for key in keys(parser):
            assert f"| `{key.name}` |" in expected and key.env in expected


def test_the_deployment_guide_s_configuration_files_are_valid(tmp_path: Path) -> None:
    """Every TOML example of docs/DEPLOYMENT.md is accepted by the server it is for."""
    import re

    guide = (DOC.parent / "DEPLOYMENT.md").read_text()
    servers = {"bookie": "bookie", "autorecovery": "autorecovery", "db-": "db"}
    checked = []
    for match in re.finditer(r"```toml\n(.*?)```", guide, re.S):
        named = re.findall(r"/etc/quorumlog/(bookie|autorecovery|db-)", guide[: match.start()])
        server = servers[named[-1]]
        config = _toml(tmp_path, match.group(1))
        argv = ["db", "serve"] if server == "db" else [server]
        args = _parse([*argv, "--config", str(config)])
        assert args.metadata.startswith("zk://")
        checked.append(server)
    assert sorted(set(checked)) == ["autorecovery", "bookie", "db"]


def test_the_gc_walk_s_pace_reaches_the_server_and_0_means_no_limit() -> None:
    from quorumlog.server.options import configs_from_args

    argv = ["bookie", "--data-dir", "x", "--metadata", "sqlite:///tmp/m.db"]
    assert configs_from_args(_parse(argv))[1].gc_metadata_reads_per_s == 100.0
    unpaced = _parse([*argv, "--gc-metadata-reads-per-s", "0"])
    assert configs_from_args(unpaced)[1].gc_metadata_reads_per_s is None
