"""A traced program that ends in a chosen way (run as a script by test_exits.py).

``python _ends.py MODE OUT_DIR``: records N ``forward`` spans with a long flush
interval (so nothing is on disk until the end unless said otherwise), then ends as
MODE says. Prints ``ready`` when a parent may send it a signal.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time

N = 200
OPEN = 5000  # start()s never stopped, for sigkill-many-open


def _held_on_a_thread(hold) -> None:
    """Run ``hold(opened)`` on a thread of its own: it opens a span, sets the event
    ``opened`` and waits with the span open. Returns once the span is open."""
    import threading

    opened = threading.Event()
    threading.Thread(target=hold, args=(opened,), daemon=True).start()
    opened.wait(30)


def _wait(opened) -> None:
    opened.set()
    time.sleep(60)


def _forward_waits() -> None:
    """A decorated call (``compute.forward``) that says ``ready`` and waits."""
    from dftrace import ai

    @ai.compute.forward
    def forward_waits():
        print("ready", flush=True)
        time.sleep(60)

    forward_waits()


def main(mode: str, out: str) -> None:
    import dftrace
    from dftrace import ai

    faulthandler.dump_traceback_later(30, exit=True)  # a hang shows where, then ends
    stop = []
    if mode.startswith("app-handler"):
        # The application's own SIGTERM handler, installed before tracing starts.
        def on_term(signum, frame):
            with open(os.path.join(out, "handler-ran"), "w") as fh:
                fh.write(str(signum))
            if mode == "app-handler-exit":
                sys.exit(3)
            stop.append(signum)

        signal.signal(signal.SIGTERM, on_term)

    os.makedirs(out, exist_ok=True)
    flush = 0.1 if mode in ("os-exit", "sigkill") else 60
    dftrace.initialize(log_file=os.path.join(out, "t"), compression="zstd", flush_interval=flush)

    @ai.compute.forward
    def step(i):
        return i

    for i in range(N):
        step(i)

    if mode == "return":
        pass
    elif mode == "sys-exit":
        sys.exit(7)
    elif mode == "raise":
        raise RuntimeError("boom")
    elif mode in ("sigterm", "sigint", "sighup"):
        with ai.pipeline.epoch:
            print("ready", flush=True)
            time.sleep(60)
    elif mode in ("sigterm-in-loops", "raise-in-loops"):  # ends in epoch 1's third batch
        with ai.pipeline.train:
            for epoch in ai.pipeline.epoch.iter(range(3)):
                for batch in ai.dataloader.fetch.iter(range(4)):
                    if (epoch, batch) != (1, 2):
                        continue
                    if mode == "raise-in-loops":
                        raise RuntimeError("boom")
                    print("ready", flush=True)
                    time.sleep(60)
    elif mode.startswith("app-handler"):
        print("ready", flush=True)
        deadline = time.time() + 60
        while not stop and time.time() < deadline:
            time.sleep(0.01)
        with ai.compute.step:  # the run goes on after the application's handler
            pass
    elif mode == "sigkill-open":  # killed in train > epoch 1 > batch 2 > forward; a start() on a thread
        _held_on_a_thread(lambda opened: (ai.data.item.start(), _wait(opened)))  # never stopped
        with ai.pipeline.train:
            for epoch in ai.pipeline.epoch.iter(range(3)):
                for batch in ai.dataloader.fetch.iter(range(4)):
                    if (epoch, batch) == (1, 2):
                        _forward_waits()
    elif mode in ("sigterm-in-calls", "sigterm-in-a-call"):  # in train > a decorated call
        if mode == "sigterm-in-calls":  # and another, running on a thread
            _held_on_a_thread(ai.data.preprocess(_wait))
        with ai.pipeline.train:
            _forward_waits()
    elif mode == "sigkill-many-open":  # more spans open than the drainer is told of
        for _ in range(OPEN):
            ai.data.item.start()
        print("ready", flush=True)
        time.sleep(60)
    elif mode in ("os-exit", "sigkill"):
        from dftrace import testing

        path = dftrace.session().path
        deadline = time.time() + 60
        while time.time() < deadline:  # until a periodic flush has put the N spans on disk
            if os.path.exists(path) and len(testing.spans(testing.read_events(path))) >= N:
                break
            time.sleep(0.01)
        for i in range(5):
            with ai.compute.backward:
                pass
        if mode == "os-exit":
            os._exit(5)
        print("ready", flush=True)
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
