"""Configuration: every option, its ``DFTRACE_*`` variable, its parser and its doc.

This is the one place that reads the environment. ``initialize(**kwargs)`` takes
keyword arguments whose defaults come from the variables below; an invalid value
raises :class:`ConfigError` naming the variable (or keyword) and what is accepted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Config", "ConfigError", "OPTIONS", "env_disabled"]

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


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        s = str(raw).strip().lower()
        if s not in choices:
            raise ValueError("expected one of " + ", ".join(choices))
        return s

    return parse


def _positive_float(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number of seconds > 0")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds > 0") from None
    if not v > 0 or v == float("inf"):
        raise ValueError("expected a number of seconds > 0")
    return v


def _nonneg_float(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number >= 0")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number >= 0") from None
    if not v >= 0 or v == float("inf"):
        raise ValueError("expected a number >= 0")
    return v


def _int_range(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    desc = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def parse(raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError("expected " + desc)
        try:
            v = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:
            raise ValueError("expected " + desc) from None
        if v < lo or (hi is not None and v > hi):
            raise ValueError("expected " + desc)
        return v

    return parse


def _size(raw: Any) -> int:
    """Bytes, with an optional K/M/G suffix (powers of 1024); 0 means no limit."""
    if isinstance(raw, bool):
        raise ValueError("expected a size in bytes like 500M or 1G (0 = no limit)")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError("expected a size in bytes like 500M or 1G (0 = no limit)")
        return raw
    s = str(raw).strip().upper().removesuffix("B")
    mult = 1
    if s and s[-1] in "KMG":
        mult = 1024 ** ("KMG".index(s[-1]) + 1)
        s = s[:-1]
    try:
        v = int(float(s) * mult)
    except ValueError:
        raise ValueError("expected a size in bytes like 500M or 1G (0 = no limit)") from None
    if v < 0:
        raise ValueError("expected a size in bytes like 500M or 1G (0 = no limit)")
    return v


def _str(raw: Any) -> str:
    s = str(raw)
    if not s.strip():
        raise ValueError("expected a non-empty string")
    return s


def _opt_str(raw: Any) -> str | None:
    if raw is None:
        return None
    s = str(raw)
    return s if s.strip() else None


def _opt_int(raw: Any) -> int | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    return _int_range(0)(raw)


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


OPTIONS: tuple[Option, ...] = (
    Option("enable", "DFTRACE_ENABLE", None, _bool,
           "Tracing on/off. Unset: off until initialize() is called. 1: initialize at import "
           "(and in every child process). 0: off for good — decorators return the original "
           "function and .iter() returns its argument."),
    Option("log_file", "DFTRACE_LOG_FILE", "dftrace", _str,
           "Path prefix of the trace files; each process writes "
           "<prefix>[-rank<R>]-<host>-<pid>.pfw[.zst|.gz]. Missing directories are created."),
    Option("data_dir", "DFTRACE_DATA_DIR", None, _opt_str,
           "Recorded in the process metadata (accepted for DFTracer compatibility)."),
    Option("compression", "DFTRACE_COMPRESSION", "zstd", _choice("zstd", "gzip", "none"),
           "File compression: zstd (.pfw.zst), gzip (.pfw.gz, what DFAnalyzer reads) or none (.pfw)."),
    Option("compression_level", "DFTRACE_COMPRESSION_LEVEL", None, _opt_int,
           "Compression level (zstd 1-22, default 3; gzip 1-9, default 6)."),
    Option("flush_interval", "DFTRACE_FLUSH_INTERVAL", 1.0, _positive_float,
           "Seconds between flushes; a killed process loses at most this much."),
    Option("batch_size", "DFTRACE_BATCH_SIZE", 65536, _int_range(1),
           "Buffered events that wake the writer before the flush interval ends."),
    Option("buffer_limit", "DFTRACE_BUFFER_LIMIT", 1_048_576, _int_range(1024),
           "Most events held in memory; past it the tracing thread waits (on_full=block) or "
           "events are dropped and counted (on_full=drop)."),
    Option("on_full", "DFTRACE_ON_FULL", "block", _choice("block", "drop"),
           "What happens when the buffer is full: block (lossless) or drop (count drops)."),
    Option("max_arg_length", "DFTRACE_MAX_ARG_LENGTH", 1024, _int_range(16),
           "Longest string kept in an arg; longer ones are cut with a visible marker."),
    Option("max_file_size", "DFTRACE_MAX_FILE_SIZE", 0, _size,
           "Rotate to numbered part files past this many bytes (e.g. 512M); 0 = never."),
    Option("process_name", "DFTRACE_PROCESS_NAME", None, _opt_str,
           "Overrides the process name shown in Perfetto."),
    Option("rank", "DFTRACE_RANK", None, _opt_int,
           "Rank of this process; default from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID."),
    Option("sample_interval", "DFTRACE_SAMPLE_INTERVAL", 0.0, _nonneg_float,
           "Seconds between resource samples (CPU %, RSS, I/O bytes as counter events); 0 = off."),
    Option("inherit", "DFTRACE_INHERIT", True, _bool,
           "Export the configuration to the environment so child processes (spawn, "
           "forkserver, subprocesses) trace too."),
)

_BY_NAME = {o.name: o for o in OPTIONS}


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
                raw, where = overrides[opt.name], f"{opt.name}= (env {opt.env})"
            elif env.get(opt.env, "").strip() != "":
                raw, where = env[opt.env], opt.env
            else:
                values[opt.name] = opt.default
                continue
            try:
                values[opt.name] = opt.parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{where}={raw!r} is invalid: {exc}") from None
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
        out["DFTRACE_LOG_FILE"] = os.path.abspath(self.log_file)
        return out


def env_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment switches tracing off for good (``DFTRACE_ENABLE=0``)."""
    raw = (os.environ if environ is None else environ).get("DFTRACE_ENABLE", "").strip().lower()
    return raw in _FALSE


def env_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for tracing from import on (``DFTRACE_ENABLE=1``)."""
    raw = (os.environ if environ is None else environ).get("DFTRACE_ENABLE", "").strip().lower()
    return raw in _TRUE
