"""Configuration: every option, its ``DFTRACE_*`` variable, its parser and its doc.

This is the one place that reads the environment. ``initialize(**kwargs)`` takes
keyword arguments whose defaults come from the variables below; an invalid value
raises :class:`ConfigError` naming the variable (or keyword) and what is accepted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Config", "ConfigError", "DEFAULT_STEM", "OPTIONS", "RANK_MAX", "auto_unless_set", "env_disabled",
           "env_enable", "env_enabled"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A configuration value was invalid; the message names the setting."""


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    s = str(raw).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


_bool.range = "1/0, true/false, yes/no, on/off"  # type: ignore[attr-defined]


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        s = str(raw).strip().lower()
        if s not in choices:
            raise ValueError("expected one of " + ", ".join(choices))
        return s

    parse.choices = choices  # type: ignore[attr-defined]
    return parse


def _number(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError
    try:
        v = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError, OverflowError):
        raise ValueError from None
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError
    return v


def _seconds(lo: float, hi: float, zero_off: bool = False) -> Callable[[Any], float]:
    """Seconds from ``lo`` to ``hi`` (and 0, meaning off, when ``zero_off``)."""
    desc = f"a number of seconds from {lo:g} to {hi:g}" + (" (0 = off)" if zero_off else "")

    def parse(raw: Any) -> float:
        try:
            v = _number(raw)
        except ValueError:
            raise ValueError("expected " + desc) from None
        if (zero_off and v == 0) or lo <= v <= hi:
            return v
        raise ValueError("expected " + desc)

    parse.range = desc  # type: ignore[attr-defined]
    return parse


def _whole(raw: Any, desc: str, from_text: Callable[[str], int]) -> int:
    """``raw`` as an int: an int as given (not a bool), else ``from_text`` of its
    stripped text; ValueError("expected <desc>") when it is neither."""
    if isinstance(raw, bool):
        raise ValueError("expected " + desc)
    if isinstance(raw, int):
        return raw
    try:
        return from_text(str(raw).strip())
    except (ValueError, OverflowError):
        raise ValueError("expected " + desc) from None


def _digits(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 30:
        raise ValueError
    return int(text)


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    desc = f"an integer from {lo} to {hi}"

    def parse(raw: Any) -> int:
        v = _whole(raw, desc, _digits)
        if not lo <= v <= hi:
            raise ValueError("expected " + desc)
        return v

    parse.range = desc  # type: ignore[attr-defined]
    return parse


#: Smallest and largest part-file size accepted by max_file_size (besides 0).
_SIZE_MIN, _SIZE_MAX = 4096, 1 << 50
_SIZE_DESC = "a size in bytes like 500M or 1G, from 4K to 1P (0 = no limit)"


def _size(raw: Any) -> int:
    """Bytes, with an optional K/M/G/T/P suffix (powers of 1024); 0 means no limit."""
    v = _whole(raw, _SIZE_DESC, _bytes)
    if v != 0 and not _SIZE_MIN <= v <= _SIZE_MAX:
        raise ValueError("expected " + _SIZE_DESC)
    return v


def _bytes(text: str) -> int:
    s = text.upper().removesuffix("B")
    mult = 1
    if s and s[-1] in "KMGTP":
        mult = 1024 ** ("KMGTP".index(s[-1]) + 1)
        s = s[:-1]
    return int(_number(s) * mult)


_size.range = _SIZE_DESC  # type: ignore[attr-defined]


def _text(raw: Any) -> str:
    """``raw`` as text: a path object or bytes (a file name) as the file system names
    it; a collection is refused (it was written as its repr: a log_file of
    ``b'/runs/t'`` made a folder of that name)."""
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if isinstance(raw, (list, tuple, set, frozenset, dict)):
        raise ValueError(f"expected a string, got a {type(raw).__name__}")
    s = str(raw)
    if "\0" in s:
        raise ValueError("contains a NUL character")
    return s


def _str(raw: Any) -> str:
    s = _text(raw)
    if not s.strip():
        raise ValueError("expected a non-empty string")
    return s


def _opt_str(raw: Any) -> str | None:
    if raw is None:
        return None
    s = _text(raw)
    return s if s.strip() else None


#: Ranks fit a signed 32-bit integer (MPI's int).
RANK_MAX = 2**31 - 1
_rank = _int_range(0, RANK_MAX)


def _opt_int(parse: Callable[[Any], int]) -> Callable[[Any], int | None]:
    def opt(raw: Any) -> int | None:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        return parse(raw)

    opt.range = parse.range  # type: ignore[attr-defined]
    return opt


class Option:
    """One setting: keyword, variable, default, parser and documentation."""

    __slots__ = ("name", "env", "default", "parse", "doc")

    def __init__(self, name: str, env: str, default: Any, parse: Callable[[Any], Any], doc: str):
        self.name = name
        self.env = env
        self.default = default
        self.parse = parse
        self.doc = doc

    def __repr__(self) -> str:
        return f"Option({self.name!r}, {self.env!r}, default={self.default!r})"


#: The file names' prefix where ``log_file`` names none (a directory, or the default).
DEFAULT_STEM = "dftrace"

OPTIONS: tuple[Option, ...] = (
    Option("enable", "DFTRACE_ENABLE", None, _bool,
           "Tracing on/off. Unset: off until initialize() is called. 1: initialize at import "
           "(and in every child process). 0: off for good — decorators return the original "
           "function and .iter() returns its argument."),
    Option("log_file", "DFTRACE_LOG_FILE", DEFAULT_STEM, _str,
           "Path prefix of the trace files; each process writes "
           "<prefix>[-rank<R>]-<host>-<pid>.pfw[.zst|.gz] (a path ending in / is a directory: "
           f"<path>/{DEFAULT_STEM}-...). Missing directories are created."),
    Option("data_dir", "DFTRACE_DATA_DIR", None, _opt_str,
           "With io: the files traced, as colon-separated path prefixes matched on the "
           "absolute path (relative paths and *at calls resolved); unset or all: every "
           "file but the built-in exclusions. Recorded in the process metadata."),
    Option("io", "DFTRACE_IO", False, _bool,
           "Trace the program's file I/O: libc's open, read, write, pread, close, stat, "
           "fopen, fread ... calls, from Python, C extensions and threads, in this "
           "process and in its Python children (DataLoader workers, pools, "
           "subprocesses), as POSIX/STDIO events with bytes and offsets (Linux)."),
    Option("io_max_rate", "DFTRACE_IO_MAX_RATE", 200_000, _int_range(0, 1 << 40),
           "Most file I/O calls per second written one by one; past it, the rest of "
           "each interval's calls are written as one aggregate per file and call "
           "(args.calls counts them); each drain writes at least 50 ms' worth one by "
           "one. 0: no limit."),
    Option("compression", "DFTRACE_COMPRESSION", "zstd", _choice("zstd", "gzip", "none"),
           "File compression: zstd (.pfw.zst), gzip (.pfw.gz, what DFAnalyzer reads) or none (.pfw)."),
    Option("compression_level", "DFTRACE_COMPRESSION_LEVEL", None, _opt_int(_int_range(0, 22)),
           "Compression level (zstd 1-22, default 1; gzip 1-9, default 1)."),
    Option("flush_interval", "DFTRACE_FLUSH_INTERVAL", 1.0, _seconds(0.01, 3600),
           "Seconds between flushes; a killed process loses at most this much."),
    Option("batch_size", "DFTRACE_BATCH_SIZE", 16384, _int_range(1, 1 << 30),
           "Buffered events that wake the writer before the flush interval ends (one frame's worth)."),
    Option("buffer_limit", "DFTRACE_BUFFER_LIMIT", 1_048_576, _int_range(1024, 1 << 30),
           "Most spans waiting to be written: in memory (writer thread), or in the ring "
           "and not yet written by the drainer (writer process); past it the tracing thread waits "
           "(on_full=block) or events are dropped and counted (on_full=drop)."),
    Option("on_full", "DFTRACE_ON_FULL", "block", _choice("block", "drop"),
           "What happens when the buffer is full: block (lossless) or drop (count drops)."),
    Option("max_arg_length", "DFTRACE_MAX_ARG_LENGTH", 1024, _int_range(16, 1 << 20),
           "Longest string kept in an arg; longer ones are cut with a visible marker."),
    Option("max_file_size", "DFTRACE_MAX_FILE_SIZE", 0, _size,
           "Rotate to numbered part files past this many bytes (e.g. 512M); 0 = never."),
    Option("process_name", "DFTRACE_PROCESS_NAME", None, _opt_str,
           "Overrides the process name shown in Perfetto."),
    Option("rank", "DFTRACE_RANK", None, _opt_int(_rank),
           "Rank of this process; default from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID."),
    Option("sample_interval", "DFTRACE_SAMPLE_INTERVAL", 0.0, _seconds(0.01, 3600, zero_off=True),
           "Seconds between resource samples (CPU %, RSS, I/O bytes as counter events); 0 = off."),
    Option("inherit", "DFTRACE_INHERIT", True, _bool,
           "Export the configuration to the environment so child processes (spawn, "
           "forkserver, subprocesses) trace too."),
    Option("shutdown_timeout", "DFTRACE_SHUTDOWN_TIMEOUT", 5.0, _seconds(0.1, 3600),
           "Longest time finalize (at exit, on a signal, at the end of a multiprocessing "
           "child) waits for the trace file without progress (while frames keep reaching "
           "the storage it waits on, 300 s in all at most); storage that makes no progress "
           "for longer is abandoned with a warning that counts the events not written."),
    Option("writer", "DFTRACE_WRITER", "process", _choice("thread", "process"),
           "Who writes the trace file: process (a drainer process, one per job and host, "
           "reading the records from shared memory: a SIGKILL loses nothing recorded, hung "
           "storage never holds the traced process) or thread (a thread of the traced "
           "process). Where the drainer cannot be had, thread, with one warning (none "
           "where the platform has no shared ring: not Linux, or the C engine is off, "
           "and writer is not set)."),
    Option("max_open_spans", "DFTRACE_MAX_OPEN_SPANS", 100_000, _int_range(16, 1 << 27),
           "Most spans opened with start() and not yet stopped; further start() calls record "
           "nothing, warn once and are counted in a dropped line (reason open spans)."),
    Option("auto", "DFTRACE_AUTO", False, _bool,
           "Trace what a PyTorch program does without annotations: DataLoader fetches, the "
           "outermost module's forward, backward and optimizer steps numbered by optimizer "
           "step, epochs, collectives, DDP's gradient buckets and the rank; Hugging Face and "
           "Lightning trainers get their callbacks, and Keras' fit, evaluate and predict "
           "theirs. What you annotate yourself is not recorded twice. On by default with "
           "dftrace run and DFTRACE_ENABLE=1."),
    Option("nvtx", "DFTRACE_NVTX", False, _bool,
           "Every span also opens an NVTX range named <cat>.<name>, so Nsight Systems shows "
           "the ai tree above the CUDA kernels (needs pip install 'dftrace[nvtx]')."),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def auto_unless_set(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``auto=True`` unless they or ``DFTRACE_AUTO`` say otherwise:
    tracing switched on from outside the program (``dftrace run``, ``DFTRACE_ENABLE=1``)
    traces what it does without annotations too."""
    if options.get("auto") is None and not os.environ.get("DFTRACE_AUTO", "").strip():
        return {**options, "auto": True}
    return options


class Config:
    """Validated settings of one tracing session (read-only; one attribute per option)."""

    __slots__ = tuple(o.name for o in OPTIONS)

    def __init__(self, **values: Any):
        unknown = set(values) - set(_BY_NAME)
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
        for opt in OPTIONS:
            object.__setattr__(self, opt.name, values.get(opt.name, opt.default))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is read-only; start a new session with other options")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"

    def as_dict(self) -> dict[str, Any]:
        """Every option and its value."""
        return {opt.name: getattr(self, opt.name) for opt in OPTIONS}

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
        """Defaults, then ``DFTRACE_*`` variables, then keyword overrides; all validated."""
        env = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(_BY_NAME))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(_BY_NAME))}")
        values: dict[str, Any] = {}
        for opt in OPTIONS:
            if opt.name in overrides and overrides[opt.name] is not None:
                raw, where = overrides[opt.name], f"{opt.name} (env {opt.env})"
            elif env.get(opt.env, "").strip() != "":
                raw, where = env[opt.env], opt.env
            else:
                values[opt.name] = opt.default
                continue
            try:
                values[opt.name] = opt.parse(raw)
            except (ValueError, TypeError, OverflowError) as exc:
                raise ConfigError(f"{where}={_shown(raw)} is invalid: {exc}") from None
        cfg = cls(**values)
        cfg._check_levels()
        return cfg

    def _check_levels(self) -> None:
        lvl = self.compression_level
        if lvl is None:
            return
        lo, hi = {"zstd": (1, 22), "gzip": (1, 9), "none": (0, 99)}[self.compression]
        if not lo <= lvl <= hi:
            raise ConfigError(
                f"compression_level (env DFTRACE_COMPRESSION_LEVEL)={lvl!r} is invalid for "
                f"{self.compression}: expected an integer from {lo} to {hi}")

    def absolute_log_file(self) -> str:
        """``log_file`` as a child process, started in any directory, must be given it:
        absolute, ``~`` expanded, a folder's trailing separator kept (without it the
        child wrote its files beside the folder, named after it)."""
        folder = self.log_file.endswith(("/", os.sep))
        return os.path.abspath(os.path.expanduser(self.log_file)) + (os.sep if folder else "")

    def to_env(self) -> dict[str, str]:
        """The variables that make a child process start with this configuration."""
        out: dict[str, str] = {}
        for opt in OPTIONS:
            v = getattr(self, opt.name)
            if v is None or opt.name in ("rank", "process_name"):
                continue
            if isinstance(v, bool):
                v = int(v)
            out[opt.env] = str(v)
        out["DFTRACE_ENABLE"] = "1"
        # Paths as this process names them now: a child may start in another directory.
        out["DFTRACE_LOG_FILE"] = self.absolute_log_file()
        if self.data_dir and self.data_dir.strip().lower() != "all":
            out["DFTRACE_DATA_DIR"] = ":".join(os.path.abspath(p) for p in self.data_dir.split(":") if p.strip())
        return out


def _shown(raw: Any) -> str:
    """A value as an error message shows it (non-UTF-8 bytes as replacement characters)."""
    try:
        text = repr(raw)
        text.encode("utf-8")
        return text
    except Exception:
        return repr(str(raw).encode("utf-8", "surrogateescape").decode("utf-8", "replace"))


def env_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment switches tracing off for good (``DFTRACE_ENABLE=0``)."""
    raw = (os.environ if environ is None else environ).get("DFTRACE_ENABLE", "").strip().lower()
    return raw in _FALSE


def env_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for tracing from import on (``DFTRACE_ENABLE=1``)."""
    raw = (os.environ if environ is None else environ).get("DFTRACE_ENABLE", "").strip().lower()
    return raw in _TRUE


def env_enable(environ: Mapping[str, str] | None = None) -> bool | None:
    """``DFTRACE_ENABLE`` parsed: True, False, or None when unset or blank. Any other
    value raises :class:`ConfigError` naming the variable and the accepted values."""
    raw = (os.environ if environ is None else environ).get("DFTRACE_ENABLE", "")
    if not raw.strip():
        return None
    try:
        return _bool(raw)
    except ValueError as exc:
        raise ConfigError(f"DFTRACE_ENABLE={_shown(raw)} is invalid: {exc}") from None
