"""writer="process": a process of the same user answering at the drainer's recorded
name (``DFTRACE_DRAINER``) with an answer that is not a drainer's is passed over at
once, without waiting for the registration's timeout, for a drainer of the
process's own; the trace is complete. See docs/reliability.md, "Shared nodes".
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

from dftrace import testing

from ._util import assert_valid, clean_env, files, spans, write_script
from .test_shared_node import needs_ring

#: Binds the name, prints its pid, and answers every connection's registration
#: with argv[2] (``PREFIX``: the start of a true answer, ``k`` + its pid, cut short),
#: keeping the connection open.
PEER = """
    import os, socket, sys
    name, answer = sys.argv[1], sys.argv[2]
    if answer == "PREFIX":
        answer = "k" + str(os.getpid())[:-1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\\0" + name)
    listener.listen(8)
    print(os.getpid(), flush=True)
    kept = []
    while True:
        conn, _ = listener.accept()
        kept.append(conn)
        conn.recv(1 << 20)
        conn.sendall(answer.encode())
"""


@needs_ring
@pytest.mark.parametrize("answer", ["no", "PREFIX", "HTTP/1.1 400 Bad Request"])
def test_a_peer_answering_wrongly_is_passed_over_at_once(tmp_path, answer):
    """A wrong answer, or a true answer's start cut short, ends the wait for the
    registration's answer at once (the test gives the registration ten minutes,
    which the run would wait out otherwise): the process gets a drainer of its own
    and every span is written."""
    name = f"dftrace-drainer-test-{uuid.uuid4().hex[:12]}"
    peer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PEER), name, answer],
                            stdout=subprocess.PIPE, text=True)
    try:
        peer_pid = int(peer.stdout.readline())
        script = write_script(tmp_path, """
            import sys
            import dftrace
            from dftrace._core.drain import registration
            registration.REGISTER_TIMEOUT_S = 600.0
            s = dftrace.initialize(log_file=sys.argv[1], writer="process")
            print(s.writer.drainer_pid)
            for i in range(1000):
                with dftrace.ai.compute.forward(args={"i": i}):
                    pass
        """)
        out = subprocess.run([sys.executable, script, str(tmp_path / "t" / "t")],
                             capture_output=True, text=True, timeout=120,
                             env=clean_env(DFTRACE_DRAINER=f"{name}:{peer_pid}"))
    finally:
        peer.kill()
        peer.wait()
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert int(out.stdout.split()[0]) != peer_pid
    paths = files(tmp_path / "t")
    assert_valid(paths)
    got = sorted(e["args"]["i"] for e in spans(testing.read_events(tmp_path / "t"), "forward"))
    assert got == list(range(1000))
