/* shm_producer.c: the shared-memory ring this process records into (writer="process").
 * The ring's layout is in common.h, shared with the drainer's side (shm_consumer.c);
 * appending one record (shm_append) is on the hot path, so it is in shm_ring.h. */
#include "shm_ring.h"
#include "encoder.h"
#include "records.h"

shm_hdr_t *dft_shm = NULL;    /* attached: records go to the ring */
static char *shm_base = NULL;
shm_slot_t *dft_shm_cur = NULL; /* the FILLING slot */
static int shm_kinds_full = 0;
int dft_shm_sealed = 0;        /* a slot was sealed since the last wake */
/* 1 while captures run beside the ring: records go to process memory, and the
   writer relays their lines to the ring (shm_append_line) as it hands them on. */
int dft_shm_local = 0;
/* Spans in the ring not yet freed by the drainer, as last counted, plus those
   appended since: buffer_limit bounds the exact count (shm_held). */
Py_ssize_t dft_shm_est = 0;
static Py_buffer shm_view;
static int shm_has_view = 0;
/* This process's own copy of the ring's layout and positions (the region's copy is
   for the drainer and is never read back). */
static uint32_t shm_nslots = 0;
#define OWN_SLOT(i) slot_in(shm_base, SHM_SLOTS_OFF, SHM_SLOT_BYTES, (i))
/* The ring's open-span table (common.h), NULL when no ring is attached. */
rec_t *dft_shm_open = NULL;
static uint64_t shm_next_seq = 0, shm_kinds_len = 0;
static uint32_t shm_nkinds = 0;
uint32_t dft_shm_cur_n = 0, dft_shm_cur_alen = 0; /* records and arena bytes of shm_cur */
static long long shm_owner = 0; /* the pid that attached: a forked child never writes */
/* What a line is encoded with (as the drainer does), for a record too long for one
   slot: it goes into the ring as an encoded line, in pieces. */
static char *shm_pidp = NULL, *shm_hhp = NULL;
static Py_ssize_t shm_npid = 0, shm_nhh = 0;
static long long shm_offset = 0, shm_min_id = 0;

void dft_shm_add_kind(const char *p, Py_ssize_t n) {
    if (!dft_shm || shm_kinds_full)
        return;
    size_t need = 4 + (((size_t)n + 3) & ~(size_t)3);
    if (shm_kinds_len + need > SHM_KINDS_BYTES) {
        shm_kinds_full = 1; /* later kinds are written with name "?" */
        return;
    }
    char *e = shm_base + SHM_HEADER_BYTES + shm_kinds_len;
    uint32_t len = (uint32_t)n;
    memcpy(e, &len, 4);
    memcpy(e + 4, p, (size_t)n);
    shm_kinds_len += need;
    dft_shm->kinds_len = shm_kinds_len;
    __atomic_store_n(&dft_shm->nkinds, ++shm_nkinds, __ATOMIC_RELEASE);
}

void dft_shm_seal(void) {
    if (dft_shm_cur) {
        __atomic_store_n(&dft_shm_cur->state, SLOT_FULL, __ATOMIC_RELEASE);
        dft_shm_cur = NULL;
        dft_shm_sealed = 1;
    }
}

/* Stop recording into the ring without touching it (a child created by fork()
   holds a copy of the parent's mapping: the ring stays the parent's). The view is
   released later, by shm_detach, where the GIL is held. */
static void shm_forget_ring(void) {
    dft_shm = NULL;
    dft_shm_open = NULL;
    dft_shm_cur = NULL;
    dft_shm_sealed = 0;
    dft_shm_local = 0;
    dft_shm_est = 0;
}


/* The spans in the ring the drainer has not written yet: what buffer_limit bounds
   with a ring, as it bounds those waiting in memory for the writer thread. The
   drainer's latest commit says how far it wrote (every record before (seq, pos)):
   the records of a slot it has not freed yet, the one being filled above all, are
   not counted once written. Read from the region, those figures are only an
   estimate's (each slot's count stays within its own), never an address or a size:
   the ring's size bounds what it holds whatever they say. */
Py_ssize_t dft_shm_held(void) {
    uint64_t gen = __atomic_load_n(&dft_shm->commit_gen, __ATOMIC_ACQUIRE), cseq = 0;
    uint32_t cpos = 0;
    if (gen) {
        const shm_commit_t *c = &dft_shm->commit[gen & 1];
        cseq = __atomic_load_n(&c->seq, __ATOMIC_RELAXED);
        cpos = __atomic_load_n(&c->pos, __ATOMIC_RELAXED);
    }
    Py_ssize_t h = 0;
    for (uint32_t i = 0; i < shm_nslots; i++) {
        shm_slot_t *s = OWN_SLOT(i);
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_FREE)
            continue;
        uint32_t n = __atomic_load_n(&s->n, __ATOMIC_ACQUIRE);
        uint64_t raw = SLOT_RAW(s), seq = s->seq;
        uint32_t unwritten = !gen || seq > cseq ? n : seq < cseq ? 0 : n - (cpos < n ? cpos : n);
        uint64_t spans = n > raw ? n - raw : 0;
        h += (Py_ssize_t)(unwritten < spans ? unwritten : spans);
    }
    return h;
}

/* At buffer_limit spans in the ring (counted again only when the estimate says so). */
int dft_shm_at_limit(void) {
    if (dft_shm_est < dft_buf_limit)
        return 0;
    dft_shm_est = dft_shm_held();
    return dft_shm_est >= dft_buf_limit;
}

#ifdef HAVE_WRITE_LOOP
/* fork() from C runs no Python at-fork hook, but it runs these. */
static void shm_after_fork_child(void) { shm_forget_ring(); }
static int shm_atfork_registered = 0;
#endif

/* The lowest FREE slot (few slots stay in use, so few pages are touched). */
shm_slot_t *dft_shm_take(void) {
    if (CURRENT_PID() != shm_owner) { /* a forked child that no hook told */
        shm_forget_ring();
        return NULL;
    }
    for (uint32_t i = 0; i < shm_nslots; i++) {
        shm_slot_t *s = OWN_SLOT(i);
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_FREE) {
            __atomic_store_n(&s->n, 0, __ATOMIC_RELAXED);
            s->alen = 0;
            SLOT_RAW(s) = 0;
            s->seq = shm_next_seq++;
            dft_shm->next_seq = shm_next_seq;
            dft_shm_cur_n = 0;
            dft_shm_cur_alen = 0;
            __atomic_store_n(&s->state, SLOT_FILLING, __ATOMIC_RELEASE);
            return s;
        }
    }
    return NULL;
}

/* A line too long for one slot's arena, in pieces of one slot each (F_RAW, all
   but the last F_MORE); every slot it needs is free before the first piece is
   written, so it is never left cut short by a full ring. A reader writes a line
   only once its last piece is committed. 0, -1 (longer than the ring can hold),
   -2 (not enough free slots now). A span's line (`span`) counts as one span, in
   its last piece's slot. */
static int shm_append_pieces(const char *line, size_t len, int span) {
    size_t k = (len + SHM_ARENA - 1) / SHM_ARENA;
    if (k > SHM_LONG_SLOTS || k + 1 > shm_nslots)
        return -1;
    dft_shm_seal();
    size_t nfree = 0;
    for (uint32_t i = 0; i < shm_nslots; i++)
        nfree += __atomic_load_n(&OWN_SLOT(i)->state, __ATOMIC_ACQUIRE) == SLOT_FREE;
    if (nfree < k)
        return -2;
    for (size_t i = 0; i < k; i++) {
        size_t piece = len - i * SHM_ARENA < SHM_ARENA ? len - i * SHM_ARENA : SHM_ARENA;
        if (!(dft_shm_cur = dft_shm_take()))
            return -2; /* not this process's ring any more (a forked child) */
        rec_t *r = &dft_shm_cur->recs[0];
        memset(r, 0, sizeof(*r));
        r->count = -1;
        r->alen = (uint32_t)piece;
        r->level_flags = (F_RAW | (i + 1 < k ? F_MORE : 0)) << LEVEL_BITS;
        memcpy(dft_shm_cur->arena, line + i * SHM_ARENA, piece);
        SLOT_RAW(dft_shm_cur) = span && i + 1 == k ? 0 : 1;
        dft_shm_est += span && i + 1 == k;
        dft_shm_cur_alen = (uint32_t)piece;
        dft_shm_cur->alen = dft_shm_cur_alen;
        __atomic_store_n(&dft_shm_cur->n, ++dft_shm_cur_n, __ATOMIC_RELEASE);
        dft_shm_seal();
    }
    return 0;
}

/* A record whose args do not fit in one slot: encoded here, as the drainer would,
   and appended in pieces. */
int dft_shm_append_long(uint32_t kid, long long t0, long long t1, unsigned long long id,
                           unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                           uint32_t flags, long long count, const char *a, Py_ssize_t na,
                           const char *b, Py_ssize_t nb) {
    size_t need = (size_t)(na + nb);
    if (need > (size_t)SHM_LONG_SLOTS * SHM_ARENA || need > UINT32_MAX)
        return -1;
    if ((flags & F_RAW) && !nb)
        return shm_append_pieces(a, need, 0);
    char *args = PyMem_RawMalloc(need ? need : 1);
    size_t cap = REC_FIXED + (size_t)dft_max_kind_len + (size_t)shm_npid + (size_t)shm_nhh + need;
    char *line = PyMem_RawMalloc(cap);
    int rc = -1;
    if (args && line) {
        memcpy(args, a, (size_t)na);
        if (nb)
            memcpy(args + na, b, (size_t)nb);
        rec_t r = {.t0 = t0, .t1 = t1, .id = id, .parent = p, .kind = kid,
                   .level_flags = ((uint32_t)lvl & LEVEL_MASK) | (flags << LEVEL_BITS),
                   .tid = tid, .count = count, .aoff = 0, .alen = (uint32_t)need};
        char *end = dft_encode_recs(line, &r, 0, 1, args, dft_kinds, dft_nkinds, shm_pidp, shm_npid,
                                shm_hhp, shm_nhh, shm_offset, shm_min_id);
        rc = end == line ? 0 : shm_append_pieces(line, (size_t)(end - line), 1);
    }
    PyMem_RawFree(args);
    PyMem_RawFree(line);
    return rc;
}


static void shm_release(void) {
    shm_forget_ring();
    shm_base = NULL;
    shm_nslots = 0;
    if (shm_has_view) {
        shm_has_view = 0;
        PyBuffer_Release(&shm_view);
    }
}


/* A copy of a bytes piece (replacing *dst). */
static int keep_piece(char **dst, Py_ssize_t *ndst, const char *src, Py_ssize_t n) {
    char *c = PyMem_RawMalloc((size_t)(n ? n : 1));
    if (!c) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(c, src, (size_t)n);
    PyMem_RawFree(*dst);
    *dst = c;
    *ndst = n;
    return 0;
}

/* shm_attach(buffer, pid, pid_piece, hh_piece, offset_ns, min_id): record into this
   writable region from now on (the pieces and numbers are the encoder's, for lines
   too long for one slot). */
static PyObject *shm_attach(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long pid, off, min_id;
    const char *pidp, *hhp;
    Py_ssize_t npid, nhh;
    if (!PyArg_ParseTuple(args, "OLy#y#LL", &obj, &pid, &pidp, &npid, &hhp, &nhh, &off, &min_id))
        return NULL;
    if (keep_piece(&shm_pidp, &shm_npid, pidp, npid) < 0 ||
        keep_piece(&shm_hhp, &shm_nhh, hhp, nhh) < 0)
        return NULL;
    shm_offset = off;
    shm_min_id = min_id;
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_WRITABLE) < 0)
        return NULL;
    size_t fixed = SHM_SLOTS_OFF;
    if ((size_t)v.len < fixed + 2 * SHM_SLOT_BYTES ||
        ((size_t)v.len - fixed) / SHM_SLOT_BYTES > UINT32_MAX) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "shared-memory region too small or too large");
        return NULL;
    }
#ifdef HAVE_WRITE_LOOP
    if (!shm_atfork_registered) {
        pthread_atfork(NULL, NULL, shm_after_fork_child);
        shm_atfork_registered = 1;
    }
#endif
    shm_release();
    shm_view = v;
    shm_has_view = 1;
    shm_base = (char *)v.buf;
    shm_hdr_t *h = (shm_hdr_t *)shm_base;
    shm_nslots = (uint32_t)(((size_t)v.len - fixed) / SHM_SLOT_BYTES);
    shm_next_seq = 0;
    shm_kinds_len = 0;
    shm_nkinds = 0;
    shm_owner = pid;
    /* all else 0; the magic last, once the rest is written (below) */
    *h = (shm_hdr_t){.version = SHM_VERSION, .nslots = shm_nslots, .slot_size = SHM_SLOT_BYTES,
                     .slots_off = fixed, .kinds_off = SHM_HEADER_BYTES, .kinds_cap = SHM_KINDS_BYTES,
                     .dropped = dft_ndropped, .producer_pid = pid,
                     .open_off = SHM_HEADER_BYTES + SHM_KINDS_BYTES, .open_cap = SHM_OPEN_SLOTS};
    memset(shm_base + SHM_HEADER_BYTES + SHM_KINDS_BYTES, 0, SHM_OPEN_BYTES);
    shm_kinds_full = 0;
    dft_shm = h;
    dft_shm_open = (rec_t *)(shm_base + SHM_HEADER_BYTES + SHM_KINDS_BYTES);
    for (Py_ssize_t k = 0; k < dft_nkinds; k++)
        dft_shm_add_kind(dft_kinds[k].piece, dft_kinds[k].n);
    /* what the in-process buffer held is not this session's */
    dft_discard_buffered();
    __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* shm_detach(): record into process memory again (a forked child's copy of the
   region belongs to its parent and is never written). */
static PyObject *shm_detach(PyObject *self, PyObject *unused) {
    shm_release();
    Py_RETURN_NONE;
}

/* shm_local(on) -> before: with `on`, record into process memory while the ring stays
   attached (captures run: the writer hands the lines to them and relays them to the
   ring with shm_append_line); without, into the ring again. */
static PyObject *shm_set_local(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int before = dft_shm_local;
    dft_shm_local = dft_shm ? on : 0;
    return PyBool_FromLong(before);
}

/* shm_seal_now(): seal the slot being filled, so the drainer can write it whole and
   free it (a producer waiting for room). */
static PyObject *shm_seal_now(PyObject *self, PyObject *unused) {
    if (dft_shm)
        dft_shm_seal();
    Py_RETURN_NONE;
}

/* shm_finish(): seal the slot being filled and mark the ring finalized. */
static PyObject *shm_finish(PyObject *self, PyObject *unused) {
    if (dft_shm) {
        dft_shm_seal();
        __atomic_store_n(&dft_shm->finalized, 1u, __ATOMIC_RELEASE);
    }
    Py_RETURN_NONE;
}

/* shm_state() -> (free slots, slots, drainer_busy_ns, commits) or None when not
   attached; commits counts the drainer's commits (its progress). */
static PyObject *shm_state(PyObject *self, PyObject *unused) {
    if (!dft_shm)
        Py_RETURN_NONE;
    uint32_t nfree = 0;
    for (uint32_t i = 0; i < shm_nslots; i++)
        nfree += __atomic_load_n(&OWN_SLOT(i)->state, __ATOMIC_ACQUIRE) == SLOT_FREE;
    return Py_BuildValue("(IILK)", nfree, shm_nslots,
                         (long long)__atomic_load_n(&dft_shm->drainer_busy_ns, __ATOMIC_ACQUIRE),
                         (unsigned long long)__atomic_load_n(&dft_shm->commit_gen, __ATOMIC_ACQUIRE));
}

/* shm_append_line(line): one line encoded already (metadata, counters, instants,
   the trailer's lines), in order with the spans. False when it was dropped. */
static PyObject *shm_append_line(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "shm_append_line() takes bytes");
        return NULL;
    }
    if (!dft_shm)
        Py_RETURN_FALSE;
    const char *s = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    int rc = shm_append(0, 0, 0, 0, 0, 0, 0, F_RAW, -1, s, n, NULL, 0);
    if (rc == -2) {
        if (dft_make_room() < 0)
            return NULL;
        rc = dft_shm ? shm_append(0, 0, 0, 0, 0, 0, 0, F_RAW, -1, s, n, NULL, 0) : -1;
    }
    if (rc < 0) {
        COUNT_DROP(1);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* The module's functions of this file (module.c adds them). */
/* shm_end_open_spans(t1, tracks, t_tracks, args) -> [ids]: the spans open now in the
   open-span table (on any thread, of any C style), recorded as ending at t1 (those
   of the tracks in the set `tracks` at t_tracks: the finalizing thread's, whose
   other spans ended then), flagged incomplete, with the args fragment `args` (a
   dict) gives by id, and marked written there: their ends, if they come, record
   nothing (a finalize: they would end too late). Those the ring had no room for are
   left (counted late). */
static PyObject *shm_end_open_spans(PyObject *self, PyObject *args) {
    long long t1, t_tracks;
    PyObject *tracks, *frags;
    if (!PyArg_ParseTuple(args, "LO!LO!", &t1, &PySet_Type, &tracks, &t_tracks, &PyDict_Type, &frags))
        return NULL;
    PyObject *ids = PyList_New(0);
    rec_t *tab = dft_shm_open;
    for (uint32_t i = 0; ids && tab && i < SHM_OPEN_SLOTS; i++) {
        rec_t *e = &tab[i];
        if (!e->id || ((e->level_flags >> LEVEL_BITS) & F_OPEN_WRITTEN))
            continue;
        PyObject *id = PyLong_FromUnsignedLongLong(e->id);
        if (!id) {
            Py_CLEAR(ids);
            break;
        }
        PyObject *frag = PyDict_GetItemWithError(frags, id); /* borrowed */
        if (!frag)
            PyErr_Clear();
        const char *a = frag && PyBytes_Check(frag) ? PyBytes_AS_STRING(frag) : NULL;
        Py_ssize_t na = a ? PyBytes_GET_SIZE(frag) : 0;
        long long end = t1;
        if (PySet_GET_SIZE(tracks)) {
            PyObject *tid = PyLong_FromUnsignedLongLong(e->tid);
            int here = tid ? PySet_Contains(tracks, tid) : -1;
            Py_XDECREF(tid);
            if (here < 0)
                PyErr_Clear();
            else if (here)
                end = t_tracks;
        }
        if (native_append(e->kind, e->t0, end > e->t0 ? end : e->t0, e->id, e->parent,
                          (Py_ssize_t)(e->level_flags & LEVEL_MASK), e->tid, F_INCOMPLETE,
                          e->count, a, na, NULL, 0) < 0) {
            Py_DECREF(id);
            continue;
        }
        e->level_flags |= F_OPEN_WRITTEN << LEVEL_BITS;
        if (PyList_Append(ids, id) < 0)
            Py_CLEAR(ids);
        Py_DECREF(id);
    }
    return ids;
}

/* shm_keep_open(kid, t0, id, parent, level, tid) -> bool: span `id`, opened from
   Python (a generator's, which no stack holds), kept in the ring's open-span table
   until it is recorded (record() frees its slot), so that the drainer writes it,
   incomplete, if this process dies first. False: no ring, or no room (then it is
   not counted as kept). */
static PyObject *shm_keep_open(PyObject *self, PyObject *args) {
    unsigned int kid;
    long long t0;
    unsigned long long idv, pv, tv;
    Py_ssize_t lvl;
    if (!PyArg_ParseTuple(args, "ILKKnK", &kid, &t0, &idv, &pv, &lvl, &tv))
        return NULL;
    if (!dft_shm_open || CURRENT_PID() != shm_owner)
        Py_RETURN_FALSE;
    uint32_t where;
    rec_t *e = shm_open_slot(idv, &where);
    if (!e) {
        if (where == OPEN_NOT_KEPT && dft_shm->open_not_kept > 0)
            dft_shm->open_not_kept--; /* no room: not kept, and not counted as kept */
        Py_RETURN_FALSE;
    }
    rec_fill(e, kid, t0, 0, 0, pv, lvl, tv, F_INCOMPLETE, -1);
    e->aoff = e->alen = 0;
    shm_open_publish(e, idv);
    Py_RETURN_TRUE;
}

PyMethodDef dft_shm_producer_methods[] = {
    {"shm_keep_open", shm_keep_open, METH_VARARGS,
     "shm_keep_open(kid, t0, id, parent, level, tid) -> bool: a span opened from Python, "
     "kept in the ring's open-span table until it is recorded"},
    {"shm_end_open_spans", shm_end_open_spans, METH_VARARGS,
     "shm_end_open_spans(t1, tracks, t_tracks, args) -> [ids]: the spans open now, recorded "
     "incomplete, ending at t1 (those of the tracks in the set tracks at t_tracks), with "
     "the args fragments the dict args gives by id"},
    {"shm_attach", shm_attach, METH_VARARGS,
     "shm_attach(region, pid, pid_piece, hh_piece, offset_ns, min_id): record into a shared-memory ring"},
    {"shm_detach", shm_detach, METH_NOARGS,
     "Record into process memory again."},
    {"shm_finish", shm_finish, METH_NOARGS,
     "Seal the ring's last slot and mark it finalized."},
    {"shm_local", shm_set_local, METH_O,
     "shm_local(on) -> before: record into process memory while captures run"},
    {"shm_seal_now", shm_seal_now, METH_NOARGS,
     "Seal the ring's slot being filled."},
    {"shm_state", shm_state, METH_NOARGS,
     "(free slots, slots, drainer_busy_ns, commits), or None"},
    {"shm_append_line", shm_append_line, METH_O,
     "shm_append_line(line) -> recorded (bool)"},
    {NULL, NULL, 0, NULL}};
