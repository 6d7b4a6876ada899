"""File I/O of C libraries loaded once tracing runs: bound as they load, so their
first calls are seen, to the byte, as the library counts them."""

from __future__ import annotations

import pytest

from _io_util import NEEDS_IO, READS, START, WRITES, IOTrace, run_traced

pytestmark = NEEDS_IO

#: A C library loaded after initialize, called at once: it writes a file with
#: STDIO, reads it back with POSIX calls, and loads a plugin library of its own that
#: reads it too.
_LIBRARY_C = r"""
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
long run(const char *path, const char *plugin) {
    char buf[1000] = {0};
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 7; i++)
        fwrite(buf, 1, sizeof(buf), f);
    fclose(f);
    int fd = open(path, O_RDONLY);
    long got = 0, n;
    while ((n = read(fd, buf, 300)) > 0)
        got += n;
    got += pread(fd, buf, 500, 100);
    close(fd);
    void *h = dlopen(plugin, RTLD_NOW);
    long (*plugged)(const char *) = h ? (long (*)(const char *))dlsym(h, "plugged") : 0;
    return plugged ? got + plugged(path) : -1;
}
"""
_PLUGIN_C = r"""
#include <fcntl.h>
#include <unistd.h>
long plugged(const char *path) {
    char buf[4096];
    int fd = open(path, O_RDONLY);
    long got = pread(fd, buf, sizeof(buf), 0);
    close(fd);
    return got;
}
"""
LOADED_LATER = START + """
    import ctypes
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    lib = ctypes.CDLL(sys.argv[2])
    lib.run.restype = ctypes.c_long
    got = lib.run(os.path.join(data, "c.bin").encode(), sys.argv[3].encode())
    print(json.dumps({"read": got, "path": os.path.join(data, "c.bin")}))
"""


def test_a_library_loaded_after_initialize_is_traced_from_its_first_call(tmp_path, monkeypatch):
    """A C library loaded with ctypes once tracing runs, and a plugin it loads itself,
    each called at once (no drain in between): every call is seen, to the byte
    (7,000 written; 7,000 read by 300s, 500 by pread, 4,096 by the plugin's pread)."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the library")
    libs = {}
    for name, source in (("lib", _LIBRARY_C), ("plugin", _PLUGIN_C)):
        (tmp_path / f"{name}.c").write_text(source)
        libs[name] = str(tmp_path / f"{name}.so")
        subprocess.run([cc, "-shared", "-fPIC", "-o", libs[name], str(tmp_path / f"{name}.c"), "-ldl"], check=True)
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, LOADED_LATER, libs["lib"], libs["plugin"])
    assert truth["read"] == 7000 + 500 + 4096
    trace = IOTrace(tmp_path / "trace")
    assert trace.bytes(truth["path"], WRITES) == 7000
    assert trace.bytes(truth["path"], READS) == truth["read"]
    calls = trace.calls(truth["path"])
    assert (calls["fopen"], calls["fwrite"], calls["fclose"], calls["open"], calls["pread"], calls["close"]) \
        == (1, 7, 1, 2, 2, 2), calls
    assert calls["read"] == 7000 // 300 + 2  # 23 full, one of 100 bytes, the end
