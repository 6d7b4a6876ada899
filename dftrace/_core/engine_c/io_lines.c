/* io_lines.c: the file-I/O interposer's calls (dftrace._core._io's drain()) made
 * records of the trace, one per call or aggregate, with the kinds Python registered
 * for the calls' names. The args are made here, in the thread that drains: the
 * calling thread wrote only a binary record. */
#include "io_lines.h"
#include "digits.h"
#include "records.h"

/* The drain's record (dftrace/_core/io_c/io.h, io_rec_t), read field by field. */
typedef struct {
    uint64_t calls; /* the calls it covers */
    int64_t t0, dur;
    uint64_t fhash;
    int64_t ret, count, offset;
    uint32_t tid;
    uint8_t op, err;
    uint16_t aggregated;
} io_line_rec_t;

typedef char io_line_rec_is_64_bytes[sizeof(io_line_rec_t) == 64 ? 1 : -1];

/* io_emit(records, kids) -> (written, dropped): kids[op] the kind of each call's
   name. */
static PyObject *io_emit(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *kids;
    if (!PyArg_ParseTuple(args, "y*O!", &buf, &PyTuple_Type, &kids))
        return NULL;
    Py_ssize_t nkids = PyTuple_GET_SIZE(kids);
    uint32_t kid_of[256];
    for (Py_ssize_t i = 0; i < 256; i++)
        kid_of[i] = UINT32_MAX;
    for (Py_ssize_t i = 0; i < nkids && i < 256; i++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(kids, i));
        if (k == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        kid_of[i] = (uint32_t)k;
    }
    const io_line_rec_t *recs = buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(io_line_rec_t);
    long long written = 0, dropped = 0;
    char a[256];
    for (Py_ssize_t i = 0; i < n; i++) {
        const io_line_rec_t *r = &recs[i];
        uint32_t kid = kid_of[r->op];
        if (kid == UINT32_MAX || AT_LIMIT()) {
            dropped++;
            continue;
        }
        char *o = put(a, LIT(",\"fhash\":\""));
        o = put_hex16(o, r->fhash);
        o = put(o, LIT("\",\"ret\":"));
        o = put_int(o, r->ret);
        if (r->offset >= 0) {
            o = put(o, LIT(",\"offset\":"));
            o = put_int(o, r->offset);
        }
        if (r->ret < 0 && r->err) {
            o = put(o, LIT(",\"errno\":"));
            o = put_int(o, r->err);
        }
        if (r->aggregated) {
            o = put(o, LIT(",\"calls\":"));
            o = put_uint(o, r->calls);
            o = put(o, LIT(",\"aggregated\":true"));
        }
        int rc = native_append(kid, r->t0, r->t0 + r->dur, dft_next_id_val, 0, 0, r->tid, F_UNNESTED,
                               r->count >= 0 ? r->count : -1, a, o - a, NULL, 0);
        if (rc < 0) {
            dropped++;
            continue;
        }
        dft_next_id_val++;
        written++;
    }
    PyBuffer_Release(&buf);
    if (dropped)
        COUNT_DROP(dropped);
    if (written) {
        if (dft_shm_sealed) {
            dft_shm_sealed = 0;
            dft_woken = 0;
        }
        wake_writer();
    }
    return Py_BuildValue("(LL)", written, dropped);
}

/* The module's functions of this file (module.c adds them). */
PyMethodDef dft_io_lines_methods[] = {
    {"io_emit", io_emit, METH_VARARGS,
     "io_emit(records, kids) -> (written, dropped): the file-I/O calls drained (64-byte "
     "records) as trace records, kids[op] the kind of each call's name"},
    {NULL, NULL, 0, NULL}};
