"""A hostile environment: bad log paths, a disk that fills up, invalid settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import dftrace
from dftrace import ConfigError, ai, testing
from dftrace._core.config import OPTIONS

from ._util import assert_valid, clean_env, files, last_line, run, spans, write_script


def test_missing_log_directories_are_created(tmp_path):
    """log_file="a/b/c/run" works: the directories are made."""
    s = dftrace.initialize(log_file=str(tmp_path / "a" / "b" / "c" / "run"), inherit=False)
    with ai.compute.step:
        pass
    dftrace.finalize()
    assert os.path.dirname(s.path) == str(tmp_path / "a" / "b" / "c")
    assert [e["name"] for e in spans(testing.read_events(s.path))] == ["step"]


def test_log_path_under_a_file_fails_at_initialize(tmp_path):
    """A log directory that cannot be made (a parent is a file) is a ConfigError naming log_file."""
    (tmp_path / "plain").write_text("not a directory")
    with pytest.raises(ConfigError, match=r"log_file \(env DFTRACE_LOG_FILE\).*plain"):
        dftrace.initialize(log_file=str(tmp_path / "plain" / "sub" / "run"), inherit=False)
    assert dftrace.session() is None
    with ai.compute.step:  # the program goes on, untraced
        pass


def test_an_entry_with_the_trace_files_name_is_left_alone(tmp_path):
    """Something already has the trace file's name (here a directory): it is not touched,
    and the trace goes to the next free name, ``<base>.1.pfw.zst``."""
    import socket

    from dftrace._core.session import _safe_host

    base = tmp_path / f"t-{_safe_host(socket.gethostname())}-{os.getpid()}"
    (tmp_path / f"{base.name}.pfw.zst").mkdir()
    s = dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False)
    with ai.compute.step:
        pass
    dftrace.finalize()
    assert s.path == f"{base}.1.pfw.zst"
    assert [e["name"] for e in spans(testing.read_events(s.path))] == ["step"]
    assert os.path.isdir(f"{base}.pfw.zst")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
@pytest.mark.parametrize("path", ["/proc/self/run", "/proc/run", "/sys/run"])
def test_unwritable_log_directory_fails_at_initialize(path):
    """A directory where no file can be created is a ConfigError naming log_file
    (``/proc`` and ``/sys`` too for root, whom their mode bits let write)."""
    with pytest.raises(ConfigError, match=rf"log_file \(env DFTRACE_LOG_FILE\)='{path}'"):
        dftrace.initialize(log_file=path, inherit=False)


INITIALIZE = """
    import sys

    import dftrace

    try:
        dftrace.initialize(log_file=sys.argv[1], inherit=False)
    except dftrace.ConfigError as exc:
        print("ConfigError:", exc)
    else:
        print("initialized", dftrace.session().path)
"""


def _without_root_powers() -> list[str]:
    """A command prefix that takes away root's power to write where permissions forbid it
    (CAP_DAC_OVERRIDE), so that a read-only directory is read-only for root too."""
    if os.geteuid() != 0:
        return []
    prefix = [shutil.which("setpriv") or "setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True)
    except OSError:
        pytest.skip("running as root, and setpriv (util-linux) is not installed to drop CAP_DAC_OVERRIDE")
    if probe.returncode != 0:
        pytest.skip(f"running as root, and setpriv cannot drop CAP_DAC_OVERRIDE: {probe.stderr!r}")
    return prefix


def test_read_only_log_directory_fails_at_initialize(tmp_path):
    """A read-only directory is a ConfigError naming log_file (as root too, without its override)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    script = write_script(tmp_path, INITIALIZE)
    try:
        out = subprocess.run([*_without_root_powers(), sys.executable, script, str(ro / "run")],
                             capture_output=True, text=True, timeout=120, env=clean_env())
    finally:
        ro.chmod(0o755)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ConfigError: log_file (env DFTRACE_LOG_FILE)='{ro / 'run'}'"), out.stdout
    assert os.listdir(ro) == []


@pytest.fixture
def read_only_mount(tmp_path):
    """A directory on a read-only file system (a tmpfs mounted read-only; needs root)."""
    where = tmp_path / "ro-fs"
    where.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)],
                                 capture_output=True, text=True)
    except OSError:
        pytest.skip("no mount command")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_read_only_file_system_fails_at_initialize(read_only_mount):
    """A log directory on a read-only file system is a ConfigError naming log_file, even for root."""
    with pytest.raises(ConfigError, match=r"log_file \(env DFTRACE_LOG_FILE\)=.*ro-fs"):
        dftrace.initialize(log_file=str(read_only_mount / "run"), inherit=False)
    assert dftrace.session() is None
    assert os.listdir(read_only_mount) == []


DISK_FULL = """
    import os
    import resource
    import signal
    import sys

    import dftrace
    from dftrace import ai

    # Simulate a disk that fills up: files may not grow past 64 KiB. Ignoring
    # SIGXFSZ turns the kernel's kill into an EFBIG error, as a full disk gives.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    dftrace.initialize(log_file=sys.argv[1] + "/t", compression=sys.argv[2], flush_interval=60)
    s = dftrace.session()
    for step in range(400):
        with ai.compute.step(args={"step": step, "pad": os.urandom(150).hex()}):
            pass
        if step % 20 == 19:
            s.writer.flush()  # the disk fills up in the middle of the run
    total = sum(i * i for i in range(1000))  # the training goes on
    print("done", total, s.sink.failed is not None)
"""


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_disk_full_mid_run_warns_once_and_keeps_the_file_readable(tmp_path, compression):
    """Writes failing mid-run: a warning then, the count in all at the end, the run
    finishes, the file holds whole events only."""
    script = write_script(tmp_path, DISK_FULL)
    out = run([script, str(tmp_path / "traces"), compression])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["done", str(sum(i * i for i in range(1000))), "True"]
    assert out.stderr.count("dftrace:") == 2, out.stderr
    assert "tracing stops, the run goes on" in out.stderr
    (path,) = files(tmp_path / "traces")
    assert os.path.getsize(path) <= 64 * 1024
    assert_valid([path], complete=False)  # no half-written line or frame
    lost = int(out.stderr.split(" events could not be written")[0].rsplit(" ", 1)[-1])
    if last_line(path) == b"]":  # its end fitted: the file says what it misses
        (record,) = [e for e in testing.read_events(path) if e.get("name") == "dropped"]
        assert record["args"]["count"] == lost
    else:
        assert "the record of the loss is in" in out.stderr
    steps = [e["args"]["step"] for e in spans(testing.read_events(path), "step")]
    assert steps and steps == list(range(len(steps)))  # a prefix, nothing garbled


# A value each option rejects, and words its message must contain.
BAD = {
    "enable": ("maybe", "1/0, true/false"),
    "log_file": ("  ", "non-empty"),
    "data_dir": None,  # free text
    "compression": ("lz4", "zstd, gzip, none"),
    "compression_level": ("x", "integer"),
    "flush_interval": ("0", "from 0.01 to 3600"),
    "batch_size": ("0", "from 1 to 1073741824"),
    "buffer_limit": ("100", "from 1024 to 1073741824"),
    "on_full": ("wait", "block, drop"),
    "max_arg_length": ("3", "from 16 to 1048576"),
    "max_file_size": ("1X", "500M"),
    "process_name": None,  # free text
    "rank": ("-1", "from 0 to 2147483647"),
    "sample_interval": ("-2", "from 0.01 to 3600 (0 = off)"),
    "inherit": ("perhaps", "1/0, true/false"),
    "shutdown_timeout": ("0.01", "from 0.1 to 3600"),
    "max_open_spans": ("10", "from 16 to 134217728"),
    "writer": ("disk", "thread, process"),
    "nvtx": ("maybe", "1/0, true/false"),
    "auto": ("sometimes", "1/0, true/false"),
    "io": ("files", "1/0, true/false"),
    "io_max_rate": ("-5", "from 0 to 1099511627776"),
}


def test_every_option_has_a_bad_value_here():
    """Each configuration option is covered by the invalid-value tests below."""
    assert set(BAD) == {o.name for o in OPTIONS}


# A blank variable counts as unset, so log_file has no bad value in the environment.
@pytest.mark.parametrize("opt", [o for o in OPTIONS if BAD.get(o.name) and BAD[o.name][0].strip()],
                         ids=lambda o: o.env)
def test_invalid_environment_value_fails_at_initialize(tmp_path, monkeypatch, opt):
    """A bad DFTRACE_* value is a ConfigError naming the variable and what it accepts."""
    value, accepted = BAD[opt.name]
    monkeypatch.setenv(opt.env, value)
    with pytest.raises(ConfigError) as err:
        dftrace.initialize(log_file=str(tmp_path / "t"))
    assert opt.env in str(err.value) and repr(value) in str(err.value)
    assert accepted in str(err.value)
    assert dftrace.session() is None and files(tmp_path) == []


@pytest.mark.parametrize("opt", [o for o in OPTIONS if BAD.get(o.name)], ids=lambda o: o.name)
def test_invalid_keyword_value_fails_at_initialize(tmp_path, opt):
    """A bad keyword value is a ConfigError naming the keyword, its variable and what it accepts."""
    value, accepted = BAD[opt.name]
    with pytest.raises(ConfigError) as err:
        dftrace.initialize(**{"log_file": str(tmp_path / "t"), opt.name: value})
    assert str(err.value).startswith(f"{opt.name} (env {opt.env})={value!r} is invalid")
    assert accepted in str(err.value)


def test_compression_level_out_of_range_for_the_codec(tmp_path):
    """A level valid for gzip but not zstd (or the reverse) names the codec's range."""
    with pytest.raises(ConfigError, match="DFTRACE_COMPRESSION_LEVEL.*from 1 to 9"):
        dftrace.initialize(log_file=str(tmp_path / "t"), compression="gzip", compression_level=12)


def test_invalid_variable_in_a_child_leaves_it_untraced_with_one_warning(tmp_path):
    """With DFTRACE_ENABLE=1 a bad variable never stops the program: it runs untraced,
    and one warning names the variable and what it accepts."""
    out = run(["-c", "import dftrace; print('ran')"], DFTRACE_ENABLE="1",
              DFTRACE_ON_FULL="later", DFTRACE_LOG_FILE=str(tmp_path / "t"))
    assert out.returncode == 0 and out.stdout.strip() == "ran", out.stderr
    assert out.stderr.count("dftrace:") == 1, out.stderr
    assert "DFTRACE_ON_FULL='later' is invalid: expected one of block, drop" in out.stderr
    assert files(tmp_path) == []
