"""Configuration: keyword arguments over ``DFTRACE_*`` variables, validated early."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import dftrace
from dftrace import ConfigError, testing
from dftrace._core.config import OPTIONS, Config


@pytest.mark.parametrize("var,value,expect", [
    ("DFTRACE_COMPRESSION", "lz4", "expected one of zstd, gzip, none"),
    ("DFTRACE_FLUSH_INTERVAL", "-1", "from 0.01 to 3600"),
    ("DFTRACE_FLUSH_INTERVAL", "soon", "from 0.01 to 3600"),
    ("DFTRACE_FLUSH_INTERVAL", "1e-6", "from 0.01 to 3600"),
    ("DFTRACE_FLUSH_INTERVAL", "inf", "from 0.01 to 3600"),
    ("DFTRACE_BATCH_SIZE", "0", "integer from 1 to"),
    ("DFTRACE_BUFFER_LIMIT", "10", "integer from 1024 to"),
    ("DFTRACE_ON_FULL", "panic", "block, drop"),
    ("DFTRACE_ENABLE", "maybe", "true/false"),
    ("DFTRACE_ENABLE", "ture", "1/0, true/false, yes/no, on/off"),
    ("DFTRACE_MAX_FILE_SIZE", "big", "size in bytes"),
    ("DFTRACE_MAX_FILE_SIZE", "inf", "from 4K to 1P"),
    ("DFTRACE_MAX_FILE_SIZE", "nan", "from 4K to 1P"),
    ("DFTRACE_COMPRESSION_LEVEL", "x", "integer"),
    ("DFTRACE_RANK", "3" * 30, "from 0 to 2147483647"),
    ("DFTRACE_SHUTDOWN_TIMEOUT", "0", "from 0.1 to 3600"),
    ("DFTRACE_MAX_OPEN_SPANS", "1", "from 16 to"),
    ("DFTRACE_SAMPLE_INTERVAL", "0.0001", "(0 = off)"),
    ("RANK", str(2**64 + 1), "from 0 to 2147483647"),
    ("OMPI_COMM_WORLD_RANK", "9" * 40, "from 0 to 2147483647"),
])
def test_invalid_environment_values_name_the_variable(monkeypatch, var, value, expect):
    """A bad ``DFTRACE_*`` value raises at initialize() naming the variable and what is accepted."""
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        dftrace.initialize(log_file="/tmp/never")
    assert var in str(info.value) and expect in str(info.value)


def test_invalid_keyword_names_the_keyword():
    """A bad keyword value names the keyword; an unknown keyword lists the valid ones."""
    with pytest.raises(ConfigError, match=r"^compression \(env DFTRACE_COMPRESSION\)='zip' is invalid"):
        dftrace.initialize(compression="zip")
    with pytest.raises(ConfigError, match="unknown option.*logfile.*valid options"):
        dftrace.initialize(logfile="x")


def test_paths_given_as_bytes_or_objects_are_paths_and_collections_are_refused(tmp_path):
    """A path as bytes or a path object is that path (bytes made a folder named
    ``b'...'`` under the working directory); a list where a string goes is refused,
    naming the option."""
    for given in (str(tmp_path / "run").encode(), tmp_path / "run"):
        assert Config.resolve({"log_file": given}, environ={}).log_file == str(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"data_dir \(env DFTRACE_DATA_DIR\)=.*expected a string, got a list"):
        Config.resolve({"data_dir": ["/a"]}, environ={})


def test_compression_level_is_checked_against_the_codec():
    """zstd accepts 1-22, gzip 1-9."""
    assert Config.resolve({"compression": "zstd", "compression_level": 19}).compression_level == 19
    with pytest.raises(ConfigError, match="from 1 to 9"):
        Config.resolve({"compression": "gzip", "compression_level": 19}, environ={})


def test_keywords_override_environment(monkeypatch, tmp_path):
    """Keyword arguments win over variables, variables over defaults."""
    monkeypatch.setenv("DFTRACE_COMPRESSION", "gzip")
    monkeypatch.setenv("DFTRACE_FLUSH_INTERVAL", "2.5")
    cfg = Config.resolve({"compression": "none"})
    assert (cfg.compression, cfg.flush_interval) == ("none", 2.5)
    assert Config.resolve({}, environ={}).compression == "zstd"


def test_every_option_is_documented():
    """Each option has a variable named DFTRACE_<NAME> and a doc string."""
    for opt in OPTIONS:
        assert opt.env == "DFTRACE_" + opt.name.upper()
        assert len(opt.doc) > 20


def test_unwritable_log_directory_fails_at_initialize(tmp_path):
    """A log path under a regular file raises a ConfigError naming log_file."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="log_file"):
        dftrace.initialize(log_file=str(blocker / "sub" / "run"))


def test_missing_log_directory_is_created(tmp_path):
    """``log_file="traces/run"`` works when ``traces/`` does not exist yet."""
    with testing.trace_to(tmp_path, log_file=str(tmp_path / "a" / "b" / "run")) as t:
        with dftrace.ai.compute.step:
            pass
    assert os.path.dirname(t.paths[0]) == str(tmp_path / "a" / "b")


def test_a_log_file_ending_in_a_slash_is_the_directory_of_the_files(tmp_path):
    """``log_file="traces/"`` names a directory: the files go in it (named as by
    default), not beside it as ``traces-<host>-<pid>``."""
    with testing.trace_to(tmp_path, log_file=str(tmp_path / "traces") + "/") as t:
        with dftrace.ai.compute.step:
            pass
    [path] = t.paths
    assert os.path.dirname(path) == str(tmp_path / "traces")
    assert os.path.basename(path).startswith("dftrace-")


def test_a_rank_variable_that_is_no_number_is_passed_over_with_a_warning(tmp_path, monkeypatch):
    """RANK may be another program's: set to something else than a number it is not
    read, and one warning names it."""
    monkeypatch.setenv("RANK", "abc")
    with pytest.warns(RuntimeWarning, match="RANK='abc' is not a rank"):
        with testing.trace_to(tmp_path) as t:
            with dftrace.ai.compute.step:
                pass
    assert "-rank" not in os.path.basename(t.paths[0])


def test_initialize_exports_configuration_for_children(tmp_path):
    """initialize() sets DFTRACE_* so child processes trace; finalize() restores the environment."""
    os.environ.pop("DFTRACE_ENABLE", None)
    dftrace.initialize(log_file=str(tmp_path / "run"), compression="gzip")
    assert os.environ["DFTRACE_ENABLE"] == "1"
    assert os.environ["DFTRACE_LOG_FILE"] == str(tmp_path / "run")
    assert os.environ["DFTRACE_COMPRESSION"] == "gzip"
    dftrace.finalize()
    assert "DFTRACE_ENABLE" not in os.environ


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full)


def test_environment_alone_starts_tracing(tmp_path):
    """``DFTRACE_ENABLE=1 DFTRACE_LOG_FILE=...`` traces a program that only imports dftrace."""
    out = _run("""
        from dftrace import ai
        with ai.compute.forward:
            pass
    """, {"DFTRACE_ENABLE": "1", "DFTRACE_LOG_FILE": str(tmp_path / "env")})
    assert out.returncode == 0, out.stderr
    events = testing.read_events(tmp_path)
    assert [e["name"] for e in testing.spans(events)] == ["forward"]


def test_off_by_configuration_returns_the_original_function(tmp_path):
    """With ``DFTRACE_ENABLE=0`` decorators return the function itself, ``.iter(x)`` ``iter(x)``,
    and nothing is written even if initialize() is called."""
    out = _run("""
        import dftrace
        from dftrace import ai
        def f(): return 1
        assert ai.compute.forward(f) is f
        data = (x for x in [1, 2])
        assert ai.dataloader.fetch.iter(data) is data and list(ai.dataloader.fetch.iter([1, 2])) == [1, 2]
        assert dftrace.initialize() is None
        with ai.compute.forward:
            pass
        print("ok")
    """, {"DFTRACE_ENABLE": "0", "DFTRACE_LOG_FILE": str(tmp_path / "off")})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("env", [
    {"DFTRACE_ENABLE": "1", "DFTRACE_COMPRESSION": "lz4"},
    {"DFTRACE_ENABLE": "ture"},
    {"DFTRACE_ENABLE": "1", "RANK": str(2**64 + 5)},
    {"DFTRACE_ENABLE": "1", "DFTRACE_MAX_FILE_SIZE": "inf"},
    {"DFTRACE_ENABLE": "1", "DFTRACE_FLUSH_INTERVAL": "1e-6"},
])
def test_bad_variable_at_import_warns_once_and_leaves_the_program_untraced(tmp_path, env):
    """``DFTRACE_ENABLE=1`` with a bad value: the program runs (exit 0) untraced, with
    one warning naming the variable and what it accepts."""
    name = next(k for k in env if k != "DFTRACE_ENABLE") if len(env) > 1 else "DFTRACE_ENABLE"
    out = _run("""
        import dftrace
        from dftrace import ai
        with ai.compute.forward:
            pass
        print("ran", dftrace.session())
    """, {**env, "DFTRACE_LOG_FILE": str(tmp_path / "x")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ran None"
    assert out.stderr.count("dftrace: tracing is off") == 1, out.stderr
    assert name in out.stderr and "is invalid: expected" in out.stderr
    assert os.listdir(tmp_path) == []


def test_nul_in_log_file_is_a_config_error():
    with pytest.raises(ConfigError, match="log_file.*NUL"):
        dftrace.initialize(log_file="traces/a\0b")
