/* io_lines.c: the engine's side of a file-I/O drain (io_sink.h). Each call the
 * interposer recorded becomes a record of the trace, outside the span tree (F_IO):
 * the file's hash in its parent field, errno in its level bits, the rest of the
 * call's values raw in its args. Nothing is formatted here: the writer makes the line
 * (encoder.c), in the drainer process by default. */
#include "io_lines.h"
#include "io_sink.h"
#include "records.h"

/* The calls as records: into the shared-memory ring (`ring`), or process memory. */
ALWAYS_INLINE size_t record_calls(int ring, const uint32_t kid_of[256],
                                  const dft_io_call_t *const *calls, const uint64_t *ncalls,
                                  size_t n) {
    size_t kept = 0;
    int ask = !ROOM_FOR(n);
    for (size_t k = 0; k < n; k++) {
        const dft_io_call_t *c = calls[k];
        uint32_t kid = kid_of[c->op];
        if (kid == UINT32_MAX || (ask && AT_LIMIT()))
            continue;
        dft_io_args_t a = {c->ret, c->offset, ncalls ? ncalls[k] : 0};
        int rc = ring ? shm_append(kid, c->t0, c->t0 + c->dur, dft_next_id_val, c->fhash,
                                   (Py_ssize_t)c->err, c->tid, F_IO, c->count, (const char *)&a,
                                   (Py_ssize_t)sizeof(a), NULL, 0)
                      : native_append(kid, c->t0, c->t0 + c->dur, dft_next_id_val, c->fhash,
                                      (Py_ssize_t)c->err, c->tid, F_IO, c->count, (const char *)&a,
                                      (Py_ssize_t)sizeof(a), NULL, 0);
        if (rc < 0)
            continue;
        dft_next_id_val++;
        kept++;
    }
    return kept;
}

static size_t io_record_calls(const uint32_t kid_of[256], const dft_io_call_t *const *calls,
                              const uint64_t *ncalls, size_t n) {
    if (ncalls) /* aggregates: a few per drain */
        return record_calls(dft_shm && !dft_shm_local, kid_of, calls, ncalls, n);
    return dft_shm && !dft_shm_local ? record_calls(1, kid_of, calls, NULL, n)
                                     : record_calls(0, kid_of, calls, NULL, n);
}

static void io_drained(long long kept, long long dropped) {
    if (dropped)
        COUNT_DROP(dropped);
    if (kept) {
        if (dft_shm_sealed) {
            dft_shm_sealed = 0;
            dft_woken = 0;
        }
        if (wake_writer() < 0) { /* Ctrl-C while wake() ran: raised again in the main thread */
            int interrupted = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
            PyErr_Clear();
            if (interrupted)
                PyErr_SetInterrupt();
        }
    }
}

static const dft_io_sink_t sink = {io_record_calls, io_drained};

static PyObject *io_sink(PyObject *self, PyObject *unused) {
    return PyCapsule_New((void *)&sink, DFT_IO_SINK_CAPSULE, NULL);
}

/* The module's functions of this file (module.c adds them). */
PyMethodDef dft_io_lines_methods[] = {
    {"io_sink", io_sink, METH_NOARGS,
     "io_sink() -> capsule: where dftrace._core._io's drain() hands the file-I/O calls it "
     "reads (io_sink.h)"},
    {NULL, NULL, 0, NULL}};
