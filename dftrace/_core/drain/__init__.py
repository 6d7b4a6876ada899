"""The default writer, ``writer="process"``: a drainer process writes the trace file
from shared memory, so that no thread of the traced process touches the storage.

The room holds both sides and the handshake between them:

- :mod:`.process_writer`, in the traced process: the session's writer, and when to
  drain. It makes the ring (a sealed memfd the C engine records into,
  ``engine_c/shm_producer.c``), registers it with a drainer, wakes the drainer as
  slots fill, and asks it to write everything at a flush or at the end;
- where the records go besides: :mod:`.relay` (while in-memory traces run, through
  process memory, encoded here, then on to the ring) and :mod:`.fallback` (the
  drainer gone or answering anything unexpected: this process writes the ring itself,
  from the drainer's last commit);
- :mod:`.registration`: finding the job's drainer (``DFTRACE_DRAINER``) or starting
  one, checking who answers, and registering a ring with it;
- :mod:`.drainer`, the drainer process (``python -m dftrace._core.drain.drainer``): for
  each ring it reads the records (``engine_c/shm_consumer.c``), encodes them as the
  writer thread would, writes the file and commits how far it got, and ends the file
  of a process gone without finalizing (the spans it had open included).
"""
