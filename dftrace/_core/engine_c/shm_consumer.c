#include "shm_consumer.h"
#include "encoder.h"
#include "writer.h"

/* ------------------------------------------------------------------------- */
/* ShmReader: the drainer's side of one producer's ring                      */
/*
 * The producer can write the region at any time, so the reader checks the layout
 * once (at attach) and keeps it; it copies the records it encodes into its own
 * memory and checks each (args inside the slot's arena, a known kind), so that
 * nothing the producer writes later makes it read or write out of bounds. A ring
 * found inconsistent raises RingError: the drainer drops that producer.
 */

static PyObject *RingError = NULL;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    shm_hdr_t *h;
    char *base;
    /* the layout, read and checked once */
    uint32_t nslots;
    size_t slots_off, slot_size, kinds_off, kinds_cap;
    size_t open_off, open_cap; /* the open-span table */
    uint64_t next_seq; /* the slot to encode next ... */
    uint32_t pos;      /* ... from this record on */
    uint64_t done_seq; /* the position of the last commit */
    uint32_t done_pos;
    kind_t *ks;
    Py_ssize_t nk, capk, maxk;
    uint64_t koff;
    rec_t *recs;  /* the records being encoded, copied out of the ring */
    size_t crecs; /* their capacity */
    char *buf, *zb; /* drain_write's lines and compressed frame, kept between calls */
    size_t cap, zcap;
} ShmReader;

static void ShmReader_release(ShmReader *self) {
    if (self->has_view) {
        self->has_view = 0;
        PyBuffer_Release(&self->view);
    }
    self->h = NULL;
    self->base = NULL;
}

static void ShmReader_dealloc(ShmReader *self) {
    ShmReader_release(self);
    PyMem_Free(self->ks);
    PyMem_RawFree(self->recs);
    PyMem_RawFree(self->buf);
    PyMem_RawFree(self->zb);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline shm_slot_t *reader_slot(ShmReader *self, uint32_t i) {
    return slot_in(self->base, self->slots_off, self->slot_size, i);
}

/* The latest commit, copied (NULL when none was made). */
static int reader_commit_of(ShmReader *self, shm_commit_t *out) {
    uint64_t gen = __atomic_load_n(&self->h->commit_gen, __ATOMIC_ACQUIRE);
    if (!gen)
        return 0;
    memcpy(out, &self->h->commit[gen & 1], sizeof(*out));
    return out->valid == 1;
}

/* Slots whose every record was written: FREE for the producer. */
static void reader_free_before(ShmReader *self, uint64_t seq) {
    for (uint32_t i = 0; i < self->nslots; i++) {
        shm_slot_t *c = reader_slot(self, i);
        if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == SLOT_FULL && c->seq < seq)
            __atomic_store_n(&c->state, SLOT_FREE, __ATOMIC_RELEASE);
    }
}

static int ShmReader_init(ShmReader *self, PyObject *args, PyObject *kw) {
    PyObject *obj;
    int resume = 0;
    if (!PyArg_ParseTuple(args, "O|p", &obj, &resume))
        return -1;
    ShmReader_release(self);
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    shm_hdr_t *h = (shm_hdr_t *)self->view.buf;
    size_t len = (size_t)self->view.len;
    if (len < SHM_HEADER_BYTES || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC ||
        h->version != SHM_VERSION) {
        ShmReader_release(self);
        PyErr_SetString(RingError, "not a dftrace ring (or another version)");
        return -1;
    }
    /* One read of each field: the checks and the use see the same values. */
    uint64_t nslots = h->nslots, slot_size = h->slot_size, slots_off = h->slots_off;
    uint64_t kinds_off = h->kinds_off, kinds_cap = h->kinds_cap;
    uint64_t open_off = h->open_off, open_cap = h->open_cap;
    if (slot_size < sizeof(shm_slot_t) || slot_size % 8 || slots_off % 8 || kinds_off % 4 ||
        kinds_off < sizeof(shm_hdr_t) || kinds_cap > len || kinds_off > len - kinds_cap ||
        kinds_off + kinds_cap > slots_off || slots_off > len || nslots == 0 ||
        nslots > (len - slots_off) / slot_size || open_off % 8 || open_cap > (1u << 20) ||
        open_off < kinds_off + kinds_cap || open_off > slots_off ||
        open_cap > (slots_off - open_off) / sizeof(rec_t)) {
        ShmReader_release(self);
        PyErr_SetString(RingError, "the ring's layout does not fit its region");
        return -1;
    }
    self->h = h;
    self->base = (char *)h;
    self->nslots = (uint32_t)nslots;
    self->slot_size = (size_t)slot_size;
    self->slots_off = (size_t)slots_off;
    self->kinds_off = (size_t)kinds_off;
    self->kinds_cap = (size_t)kinds_cap;
    self->open_off = (size_t)open_off;
    self->open_cap = (size_t)open_cap;
    self->next_seq = 0;
    self->pos = 0;
    if (resume) { /* go on from the last commit: what was written before it stays */
        shm_commit_t c;
        if (reader_commit_of(self, &c)) {
            self->next_seq = c.seq;
            self->pos = c.pos;
        }
        reader_free_before(self, self->next_seq);
    }
    self->done_seq = self->next_seq;
    self->done_pos = self->pos;
    self->nk = 0;
    self->maxk = 0;
    self->koff = 0;
    return 0;
}

/* Kind pieces committed since the last call (they stay where they are: a producer
   rewriting one changes its own lines' text, never their length). */
static int reader_kinds(ShmReader *self) {
    shm_hdr_t *h = self->h;
    uint32_t n = __atomic_load_n(&h->nkinds, __ATOMIC_ACQUIRE);
    const char *area = self->base + self->kinds_off;
    while ((uint32_t)self->nk < n) {
        if (self->nk == self->capk) {
            Py_ssize_t cap = self->capk ? self->capk * 2 : 256;
            kind_t *g = PyMem_Realloc(self->ks, sizeof(kind_t) * (size_t)cap);
            if (!g) {
                PyErr_NoMemory();
                return -1;
            }
            self->ks = g;
            self->capk = cap;
        }
        uint32_t len;
        if (self->koff + 4 > self->kinds_cap)
            break;
        memcpy(&len, area + self->koff, 4);
        if (self->koff + 4 + (uint64_t)len > self->kinds_cap)
            break;
        self->ks[self->nk].piece = (char *)area + self->koff + 4;
        self->ks[self->nk].n = len;
        if ((Py_ssize_t)len > self->maxk)
            self->maxk = len;
        self->koff += 4 + (((uint64_t)len + 3) & ~(uint64_t)3);
        self->nk++;
    }
    return 0;
}

#define READ_RANGES 64
typedef struct {
    shm_slot_t *s;
    const rec_t *recs; /* the range's records, copied (index 0 is record `from`) */
    uint32_t from, to;
} range_t;

/* What one drain takes: its ranges, their records, an upper bound of their encoded
   size, and where the reader stands after them. */
typedef struct {
    range_t rg[READ_RANGES];
    int nr;
    Py_ssize_t n;
    size_t upper;
    uint64_t seq;
    uint32_t pos;
} take_t;

/* The ranges of records to encode next, in sequence order: the sealed slots (and,
   with `partial`, the records committed so far in the slot being filled), at most
   about maxn records, copied into the reader's memory and checked; `npieces` the
   bytes of the pid and hostname pieces each line gets. 0, or -1 with RingError (or
   MemoryError). */
static int collect_ranges(ShmReader *self, Py_ssize_t maxn, Py_ssize_t npieces, int partial, take_t *t) {
    size_t per = (size_t)(REC_FIXED + self->maxk + npieces);
    range_t *rg = t->rg;
    int nr = 0;
    Py_ssize_t n = 0;
    size_t upper = 0;
    uint64_t seq = self->next_seq;
    uint32_t pos = self->pos;
    size_t need = (size_t)(maxn > 0 ? maxn : 1) + CHUNK_RECS;
    if (self->crecs < need) {
        rec_t *g = PyMem_RawRealloc(self->recs, need * sizeof(rec_t));
        if (!g) {
            PyErr_NoMemory();
            return -1;
        }
        self->recs = g;
        self->crecs = need;
    }
    size_t used = 0;
    typedef struct {
        int open, range;
        uint32_t k;
        uint64_t seq;
        uint32_t pos;
        Py_ssize_t n;
        size_t upper;
    } group_t;
    group_t g = {0, 0, 0, 0, 0, 0, 0};
    while (nr < READ_RANGES && (n == 0 || n < maxn)) {
        shm_slot_t *s = NULL;
        for (uint32_t i = 0; i < self->nslots; i++) {
            shm_slot_t *c = reader_slot(self, i);
            if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != SLOT_FREE &&
                __atomic_load_n(&c->seq, __ATOMIC_RELAXED) == seq) {
                s = c;
                break;
            }
        }
        if (!s)
            break;
        int full = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_FULL;
        uint32_t cnt = __atomic_load_n(&s->n, __ATOMIC_ACQUIRE);
        if (cnt > CHUNK_RECS) {
            PyErr_SetString(RingError, "a slot of the ring claims more records than it holds");
            return -1;
        }
        if (!full && !partial)
            break;
        if (pos > cnt)
            pos = cnt;
        uint32_t take = cnt - pos;
        rec_t *copy = self->recs + used;
        const rec_t *from = &s->recs[pos];
        for (uint32_t k = 0; k < take; k++) {
            /* copied and checked in one pass; the copy is what is checked and encoded */
            copy[k] = from[k];
            const rec_t *r = &copy[k];
            if ((size_t)r->aoff + r->alen > SHM_ARENA) {
                PyErr_SetString(RingError, "a record of the ring points outside its slot");
                return -1;
            }
            if ((r->level_flags >> LEVEL_BITS) & F_MORE) {
                if (!g.open) /* a line in pieces begins: where to stop if it is not whole */
                    g = (group_t){1, nr, k, seq, pos + k, n + k, upper};
            } else {
                g.open = 0;
            }
            upper += per + r->alen;
        }
        rg[nr].s = s;
        rg[nr].recs = copy;
        rg[nr].from = pos;
        rg[nr].to = cnt;
        used += take;
        n += take;
        nr++;
        if (!full) {
            pos = cnt;
            break;
        }
        seq++;
        pos = 0;
    }
    if (g.open) { /* the last line is not whole yet: stop before its first piece */
        nr = g.k ? g.range + 1 : g.range;
        if (g.k)
            rg[g.range].to = rg[g.range].from + g.k;
        n = g.n;
        upper = g.upper;
        seq = g.seq;
        pos = g.pos;
    }
    t->nr = nr;
    t->n = n;
    t->upper = upper;
    t->seq = seq;
    t->pos = pos;
    return 0;
}

/* Encode the ranges at o (no GIL). */
static char *encode_ranges(char *o, const take_t *t, const kind_t *ks, Py_ssize_t nk,
                           const char *pidp, Py_ssize_t npid, const char *hhp, Py_ssize_t nhh,
                           long long off, long long min_id) {
    for (int k = 0; k < t->nr; k++) {
        const range_t *r = &t->rg[k];
        o = dft_encode_recs(o, r->recs, 0, r->to - r->from, r->s->arena, ks, nk, pidp, npid, hhp, nhh,
                            off, min_id);
    }
    return o;
}

/* Ready to read: the ring is attached and its kind table read. -1 with an error. */
static int reader_ready(ShmReader *self) {
    if (!self->h) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return -1;
    }
    return reader_kinds(self);
}

/* The ranges taken were encoded; they are freed at the next commit. */
static void reader_advance(ShmReader *self, const take_t *t) {
    self->next_seq = t->seq;
    self->pos = t->pos;
}

static PyObject *ShmReader_drain(ShmReader *self, PyObject *args) {
    Py_ssize_t maxn, npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id;
    int partial;
    if (!PyArg_ParseTuple(args, "ny#y#LLp", &maxn, &pidp, &npid, &hhp, &nhh, &off, &min_id,
                          &partial))
        return NULL;
    take_t t;
    if (reader_ready(self) < 0 || collect_ranges(self, maxn, npid + nhh, partial, &t) < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)t.upper);
    if (!out)
        return NULL;
    char *o0 = PyBytes_AS_STRING(out), *o = o0;
    kind_t *ks = self->ks;
    Py_ssize_t nk = self->nk;
    Py_BEGIN_ALLOW_THREADS
    o = encode_ranges(o0, &t, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    Py_END_ALLOW_THREADS
    reader_advance(self, &t);
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - o0)) < 0)
        return NULL;
    return Py_BuildValue("(Nn)", out, t.n);
}

/* open_spans(pid_piece, hh_piece, offset_ns, min_id, t_end) -> (lines, records,
   not_kept): the spans the producer had open, from its open-span table, as lines
   flagged incomplete that end at t_end (a producer that died: call it after the
   last drain), oldest first; and how many open spans the table had no room for. */
static int by_id(const void *a, const void *b) {
    uint64_t x = ((const rec_t *)a)->id, y = ((const rec_t *)b)->id;
    return x < y ? -1 : x > y;
}

static PyObject *ShmReader_open_spans(ShmReader *self, PyObject *args) {
    Py_ssize_t npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id, t_end;
    if (!PyArg_ParseTuple(args, "y#y#LLL", &pidp, &npid, &hhp, &nhh, &off, &min_id, &t_end))
        return NULL;
    if (reader_ready(self) < 0)
        return NULL;
    size_t cap = self->open_cap ? self->open_cap : 1;
    rec_t *recs = PyMem_RawMalloc(cap * sizeof(rec_t));
    if (!recs)
        return PyErr_NoMemory();
    const rec_t *tab = (const rec_t *)(self->base + self->open_off);
    size_t n = 0;
    for (size_t i = 0; i < self->open_cap; i++) {
        if (!__atomic_load_n(&tab[i].id, __ATOMIC_ACQUIRE))
            continue;
        rec_t r = tab[i]; /* the copy is what is checked and encoded */
        if (!r.id || ((r.level_flags >> LEVEL_BITS) & F_OPEN_WRITTEN))
            continue; /* written already, by a finalize */
        r.aoff = r.alen = 0;
        r.level_flags = (r.level_flags & LEVEL_MASK) | (F_INCOMPLETE << LEVEL_BITS);
        r.t1 = t_end > r.t0 ? t_end : r.t0;
        if (r.count < -1)
            r.count = -1;
        recs[n++] = r;
    }
    qsort(recs, n, sizeof(rec_t), by_id);
    size_t per = (size_t)(REC_FIXED + self->maxk + npid + nhh);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * per));
    if (!out) {
        PyMem_RawFree(recs);
        return NULL;
    }
    char *o0 = PyBytes_AS_STRING(out);
    char *o = dft_encode_recs(o0, recs, 0, (uint32_t)n, "", self->ks, self->nk, pidp, npid, hhp, nhh,
                              off, min_id);
    PyMem_RawFree(recs);
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - o0)) < 0)
        return NULL;
    long long missed = __atomic_load_n(&self->h->open_not_kept, __ATOMIC_ACQUIRE);
    return Py_BuildValue("(NnL)", out, (Py_ssize_t)n, missed > 0 ? missed : 0LL);
}

#ifdef HAVE_NATIVE_WRITE
/* drain_write(fd, level, max_records, pid_piece, hh_piece, offset_ns, min_id, partial)
   -> (records, bytes written, errno, st_nlink): as drain(), then the lines are
   compressed (level < 0: not) and appended to fd as one frame, without the GIL:
   the drainer writes the way the writer thread does. */
static PyObject *ShmReader_drain_write(ShmReader *self, PyObject *args) {
    int fd, level, partial;
    Py_ssize_t maxn, npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "iiny#y#LLp", &fd, &level, &maxn, &pidp, &npid, &hhp, &nhh, &off,
                          &min_id, &partial))
        return NULL;
    if (reader_ready(self) < 0)
        return NULL;
    if (level >= 0 && !dft_load_zstd()) {
        PyErr_SetString(PyExc_RuntimeError, "zstd is not available to the C engine");
        return NULL;
    }
    take_t t;
    if (collect_ranges(self, maxn, npid + nhh, partial, &t) < 0)
        return NULL;
    if (dft_ensure(&self->buf, &self->cap, t.upper + 1) < 0)
        return PyErr_NoMemory();
    kind_t *ks = self->ks;
    Py_ssize_t nk = self->nk;
    size_t written = 0;
    int err = 0;
    long nlink = -1;
    Py_BEGIN_ALLOW_THREADS
    char *o = encode_ranges(self->buf, &t, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    err = dft_compress_write(fd, level, self->buf, (size_t)(o - self->buf), &self->zb, &self->zcap,
                         &written);
    if (!err && written) {
        struct stat st;
        if (fstat(fd, &st) == 0)
            nlink = (long)st.st_nlink;
    }
    Py_END_ALLOW_THREADS
    reader_advance(self, &t);
    return Py_BuildValue("(nnil)", t.n, (Py_ssize_t)written, err, nlink);
}
#endif

/* commit(run, part, size, advance=True): what was drained is in the file
   <base>[.run][.part<part>], whose first `size` bytes are whole frames (size < 0:
   no file of its own, a FIFO). Publishes where a successor goes on reading (without
   `advance`: where the last commit said, the file having changed), then frees the
   slots read through. */
static PyObject *ShmReader_commit(ShmReader *self, PyObject *args) {
    unsigned int run, part;
    long long size;
    int advance = 1;
    if (!PyArg_ParseTuple(args, "IIL|p", &run, &part, &size, &advance))
        return NULL;
    if (!self->h) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return NULL;
    }
    if (advance) {
        self->done_seq = self->next_seq;
        self->done_pos = self->pos;
    }
    shm_hdr_t *h = self->h;
    uint64_t gen = __atomic_load_n(&h->commit_gen, __ATOMIC_RELAXED) + 1;
    shm_commit_t *c = &h->commit[gen & 1];
    c->valid = 0;
    c->seq = self->done_seq;
    c->pos = self->done_pos;
    c->run = run;
    c->part = part;
    c->size = size < 0 ? NO_FILE : (uint64_t)size;
    c->valid = 1;
    __atomic_store_n(&h->commit_gen, gen, __ATOMIC_RELEASE);
    reader_free_before(self, self->done_seq);
    Py_RETURN_NONE;
}

/* committed -> (run, part, size) of the latest commit's file, or None. */
static PyObject *ShmReader_get_committed(ShmReader *self, void *unused) {
    shm_commit_t c;
    if (!self->h || !reader_commit_of(self, &c) || c.size == NO_FILE)
        Py_RETURN_NONE;
    return Py_BuildValue("(IIK)", c.run, c.part, (unsigned long long)c.size);
}

static PyObject *ShmReader_set_busy(ShmReader *self, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (self->h)
        __atomic_store_n(&self->h->drainer_busy_ns, (int64_t)v, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *ShmReader_close(ShmReader *self, PyObject *unused) {
    ShmReader_release(self);
    Py_RETURN_NONE;
}

static PyObject *ShmReader_get_finalized(ShmReader *self, void *c) {
    return PyBool_FromLong(self->h && __atomic_load_n(&self->h->finalized, __ATOMIC_ACQUIRE));
}

static PyObject *ShmReader_get_dropped(ShmReader *self, void *c) {
    long long d = self->h ? (long long)__atomic_load_n(&self->h->dropped, __ATOMIC_RELAXED) : 0;
    return PyLong_FromLongLong(d > 0 ? d : 0);
}

static PyObject *ShmReader_get_pid(ShmReader *self, void *c) {
    return PyLong_FromLongLong(self->h ? (long long)self->h->producer_pid : 0);
}

static PyMethodDef ShmReader_methods[] = {
    {"drain", (PyCFunction)ShmReader_drain, METH_VARARGS,
     "drain(max_records, pid_piece, hh_piece, offset_ns, min_id, partial) -> (bytes, n)"},
    {"open_spans", (PyCFunction)ShmReader_open_spans, METH_VARARGS,
     "open_spans(pid_piece, hh_piece, offset_ns, min_id, t_end) -> (bytes, n, not_kept): the "
     "spans open in the producer, ending at t_end, flagged incomplete"},
#ifdef HAVE_NATIVE_WRITE
    {"drain_write", (PyCFunction)ShmReader_drain_write, METH_VARARGS,
     "drain_write(fd, level, max_records, pid_piece, hh_piece, offset_ns, min_id, partial) "
     "-> (records, bytes written, errno, st_nlink): drain() compressed and appended to fd"},
#endif
    {"commit", (PyCFunction)ShmReader_commit, METH_VARARGS,
     "commit(run, part, size, advance=True): what was drained is written in that file"},
    {"set_busy", (PyCFunction)ShmReader_set_busy, METH_O,
     "set_busy(ns): when the write under way began (CLOCK_MONOTONIC), 0 when idle"},
    {"close", (PyCFunction)ShmReader_close, METH_NOARGS, "Let go of the region."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef ShmReader_getset[] = {
    {"finalized", (getter)ShmReader_get_finalized, NULL, "the producer finalized", NULL},
    {"dropped", (getter)ShmReader_get_dropped, NULL, "the producer's counted drops", NULL},
    {"pid", (getter)ShmReader_get_pid, NULL, "the producer's pid", NULL},
    {"committed", (getter)ShmReader_get_committed, NULL,
     "(run, part, size) of the latest commit, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ShmReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace._core._speedups.ShmReader",
    .tp_basicsize = sizeof(ShmReader),
    .tp_dealloc = (destructor)ShmReader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ShmReader(region, resume=False): read the records of one producer's "
              "shared-memory ring; drained records are freed for the producer at the next "
              "commit(), once written. With resume: from the last commit on.",
    .tp_methods = ShmReader_methods,
    .tp_getset = ShmReader_getset,
    .tp_init = (initproc)ShmReader_init,
    .tp_new = PyType_GenericNew,
};

int dft_shm_consumer_add(PyObject *m) {
    if (PyType_Ready(&ShmReaderType) < 0)
        return -1;
    if (!RingError &&
        !(RingError = PyErr_NewException("dftrace._core._speedups.RingError", PyExc_ValueError, NULL)))
        return -1;
    if (PyModule_AddObjectRef(m, "RingError", RingError) < 0 ||
        PyModule_AddObjectRef(m, "ShmReader", (PyObject *)&ShmReaderType) < 0)
        return -1;
    return 0;
}
