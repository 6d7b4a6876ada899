/* kept_spans.c: the spans `with` and start() keep open. KeptSpans, a stack's `open`
 * map (the entries themselves, in the order they opened: kept_spans.h has the hot
 * path, push and take the last), here with the mapping Python's paths read it as;
 * OpenSpan, one kept span as an object, made for Python from an entry; and
 * StartedSpans (STATE.open_spans), the spans start() opened, kept the same way. */
#include "kept_spans.h"

/* ------------------------------------------------------------------------- */
/* OpenSpan: a kept span as Python reads it                                    */

/* OpenSpan objects live while Python holds one (a close in Python, restick_open):
   a few are kept for the next ones. */
static freelist_t open_free = {.type = &dft_OpenSpanType};

/* tp_traverse of an entry, and its release (visit NULL): its references cleared. */
static int kept_refs(void *e, visitproc visit, void *arg) {
    kept_t *k = e;
    PyObject **const refs[] = {&k->span.id, &k->span.parent, &k->span.sticky, &k->span.tid,
                               &k->opener, &k->extra};
    return visit_refs(refs, NREFS(refs), visit, arg);
}

static void kept_incref(const kept_t *k) {
    Py_INCREF(k->span.id);
    Py_INCREF(k->span.parent);
    Py_INCREF(k->span.sticky);
    Py_XINCREF(k->span.tid);
    Py_INCREF(k->opener);
    Py_INCREF(k->extra);
}

/* An OpenSpan of entry `k`: with new references (`move` 0), or taking the entry's. */
static PyObject *open_of(void *k, int move) {
    OpenSpanObject *e = AS_OPEN(freelist_alloc(&open_free, &dft_OpenSpanType));
    if (!e)
        return NULL;
    if (!move)
        kept_incref(k);
    e->k = *(kept_t *)k;
    return (PyObject *)e;
}

/* OpenSpan((id, kid, parent, level, sticky, opener, extra, t0)), one tuple: made by
   Python's open_span (engine.py, as engine.new_open) for the spans it opens. */
static PyObject *OpenSpan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *id, *parent, *sticky, *opener, *extra;
    unsigned int kid;
    Py_ssize_t level;
    long long t0;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "OpenSpan() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "(OIOnOOOL)", &id, &kid, &parent, &level, &sticky, &opener, &extra,
                          &t0))
        return NULL;
    unsigned long long idv = PyLong_AsUnsignedLongLong(id);
    if (idv == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    kept_t k = {{.id = id, .idv = idv, .parent = parent, .sticky = sticky, .level = level, .t0 = t0,
                 .kid = kid},
                opener, extra};
    return open_of(&k, 0);
}

static int OpenSpan_traverse(OpenSpanObject *e, visitproc visit, void *arg) { return kept_refs(&e->k, visit, arg); }

static int OpenSpan_clear(OpenSpanObject *e) { return kept_refs(&e->k, NULL, NULL); }

static void OpenSpan_dealloc(OpenSpanObject *e) {
    PyObject_GC_UnTrack(e);
    OpenSpan_clear(e);
    freelist_free(&open_free, (PyObject *)e);
}

static PyObject *OpenSpan_repr(OpenSpanObject *e) {
    const span_t *s = &e->k.span;
    return PyUnicode_FromFormat("OpenSpan(id=%R, kid=%u, parent=%R, level=%zd, t0=%lld)",
                                s->id ? s->id : Py_None, s->kid, s->parent ? s->parent : Py_None, s->level,
                                s->t0);
}

#define OS_KEPT(f) offsetof(OpenSpanObject, k) + offsetof(kept_t, f)
#define OS_SPAN(f) OS_KEPT(span) + offsetof(span_t, f)
static PyMemberDef OpenSpan_members[] = {
    {"id", T_OBJECT, OS_SPAN(id), READONLY, "its id"},
    {"kid", T_UINT, OS_SPAN(kid), READONLY, "its kind"},
    {"parent", T_OBJECT, OS_SPAN(parent), READONLY, "the id below it when it opened (0: none)"},
    {"level", T_PYSSIZET, OS_SPAN(level), READONLY, "its depth"},
    {"sticky", T_OBJECT, OS_SPAN(sticky), READONLY, "the sticky args when it opened"},
    {"opener", T_OBJECT, OS_KEPT(opener), READONLY, "what opened it (with, start())"},
    {"extra", T_OBJECT, OS_KEPT(extra), READONLY, "the opener's own args"},
    {"t0", T_LONGLONG, OS_SPAN(t0), READONLY, "when it opened (ns)"},
    {NULL}};

PyTypeObject dft_OpenSpanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.OpenSpan",
    .tp_basicsize = sizeof(OpenSpanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "OpenSpan((id, kid, parent, level, sticky, opener, extra, t0)): a span with or "
              "start() keep open, as its stack's open map gives it to Python.",
    .tp_new = OpenSpan_new,
    .tp_dealloc = (destructor)OpenSpan_dealloc,
    .tp_traverse = (traverseproc)OpenSpan_traverse,
    .tp_clear = (inquiry)OpenSpan_clear,
    .tp_repr = (reprfunc)OpenSpan_repr,
    .tp_members = OpenSpan_members,
};

/* open[i] = OpenSpan (Python's open_span, restick_open): its entry. */
static int kept_entry_of(PyObject *key, PyObject *v, void *out) {
    if (!IS_OPEN_SPAN(v)) {
        PyErr_SetString(PyExc_TypeError, "a kept span is an OpenSpan");
        return -1;
    }
    if (!PyLong_Check(key) || PyObject_RichCompareBool(key, AS_OPEN(v)->k.span.id, Py_EQ) != 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "an OpenSpan is kept under its own id");
        return -1;
    }
    kept_incref(&AS_OPEN(v)->k);
    *(kept_t *)out = AS_OPEN(v)->k;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* StartedSpans' entries                                                       */

/* open_spans[i] = stack (Python's start()): its entry. */
static int started_entry_of(PyObject *key, PyObject *v, void *out) {
    if (!PyLong_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "a started span's key is its id (an int)");
        return -1;
    }
    unsigned long long idv = PyLong_AsUnsignedLongLong(key);
    if (idv == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    Py_INCREF(key);
    Py_INCREF(v);
    *(started_t *)out = (started_t){idv, key, v};
    return 0;
}

static int started_refs(void *e, visitproc visit, void *arg) {
    started_t *s = e;
    PyObject **const refs[] = {&s->id, &s->stk};
    return visit_refs(refs, NREFS(refs), visit, arg);
}

/* What Python reads for an entry: its stack (`move`: the entry's reference). */
static PyObject *stack_of(void *e, int move) {
    started_t *s = e;
    if (move)
        Py_DECREF(s->id);
    else
        Py_INCREF(s->stk);
    return s->stk;
}

/* ------------------------------------------------------------------------- */
/* The two maps: KeptSpans (a stack's `open` map) and StartedSpans             */

/* What sets one map apart from the other: its entries and what Python reads. */
typedef struct {
    const char *name;
    size_t size, idv_at, id_at; /* an entry's bytes; where its id's value and its id are */
    Py_ssize_t first_cap;
    PyObject *(*value)(void *e, int move); /* new reference (`move`: the entry's references taken) */
    int (*refs)(void *e, visitproc visit, void *arg); /* as kept_refs */
    /* map[key] = v from Python: the entry (new references), or -1 with an error */
    int (*entry_of)(PyObject *key, PyObject *v, void *out);
} map_kind_t;

static const map_kind_t KEPT = {"KeptSpans", sizeof(kept_t), offsetof(kept_t, span.idv),
                                offsetof(kept_t, span.id), 8, open_of, kept_refs, kept_entry_of};
static const map_kind_t STARTED = {"StartedSpans", sizeof(started_t), offsetof(started_t, idv),
                                   offsetof(started_t, id), 16, stack_of, started_refs,
                                   started_entry_of};

typedef union {
    kept_t kept;
    started_t started;
} any_entry_t; /* room for an entry of either map */

static const map_kind_t *kind_of(const IdMapObject *m) {
    return Py_TYPE(m) == &dft_KeptSpansType ? &KEPT : &STARTED;
}

static char *entry_at(const IdMapObject *m, const map_kind_t *t, Py_ssize_t i) {
    return (char *)m->e + (size_t)i * t->size;
}

static unsigned long long idv_at(const IdMapObject *m, const map_kind_t *t, Py_ssize_t i) {
    return *(const unsigned long long *)(entry_at(m, t, i) + t->idv_at);
}

/* Where id `v` is, or would go (the first entry with an id not below it). */
static Py_ssize_t map_find(const IdMapObject *m, unsigned long long v) {
    const map_kind_t *t = kind_of(m);
    Py_ssize_t lo = 0, hi = m->n;
    if (hi && idv_at(m, t, hi - 1) == v) /* the common case: the newest */
        return hi - 1;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (idv_at(m, t, mid) < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The index of the entry of id `v`, or -1. */
static Py_ssize_t map_index_of(const IdMapObject *m, unsigned long long v) {
    Py_ssize_t i = map_find(m, v);
    return i < m->n && idv_at(m, kind_of(m), i) == v ? i : -1;
}

/* The index of key `key` (an int), or -1 (no error set: not one of ours). */
static Py_ssize_t map_index(const IdMapObject *m, PyObject *key) {
    if (!PyLong_Check(key))
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(key);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return map_index_of(m, v);
}

int dft_map_put(IdMapObject *m, const void *e) {
    const map_kind_t *t = kind_of(m);
    unsigned long long v = *(const unsigned long long *)((const char *)e + t->idv_at);
    Py_ssize_t i = map_find(m, v);
    if (i < m->n && idv_at(m, t, i) == v) { /* a new version of an entry */
        any_entry_t old;
        memcpy(&old, entry_at(m, t, i), t->size);
        memcpy(entry_at(m, t, i), e, t->size);
        t->refs(&old, NULL, NULL); /* may run code: the entry is in place already */
        return 0;
    }
    if (m->n == m->cap) {
        Py_ssize_t cap = m->cap ? m->cap * 2 : t->first_cap;
        void *grown = (size_t)cap <= PY_SSIZE_T_MAX / t->size ? PyMem_Realloc(m->e, (size_t)cap * t->size) : NULL;
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        m->e = grown;
        m->cap = cap;
    }
    memmove(entry_at(m, t, i + 1), entry_at(m, t, i), (size_t)(m->n - i) * t->size);
    memcpy(entry_at(m, t, i), e, t->size);
    m->n++;
    return 0;
}

/* Take entry i out (its references go to *out). */
static void map_take(IdMapObject *m, Py_ssize_t i, any_entry_t *out) {
    const map_kind_t *t = kind_of(m);
    memcpy(out, entry_at(m, t, i), t->size);
    memmove(entry_at(m, t, i), entry_at(m, t, i + 1), (size_t)(m->n - i - 1) * t->size);
    m->n--;
}

/* Take entry i out and let its references go. */
static void map_drop(IdMapObject *m, Py_ssize_t i) {
    any_entry_t e;
    map_take(m, i, &e);
    kind_of(m)->refs(&e, NULL, NULL);
}

int dft_map_remove(IdMapObject *m, unsigned long long idv) {
    Py_ssize_t i = map_index_of(m, idv);
    if (i < 0)
        return 0;
    map_drop(m, i);
    return 1;
}

static PyObject *Map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments", type == &dft_KeptSpansType ? KEPT.name : STARTED.name);
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static int Map_traverse(IdMapObject *m, visitproc visit, void *arg) {
    const map_kind_t *t = kind_of(m);
    for (Py_ssize_t i = 0; i < m->n; i++) {
        int r = t->refs(entry_at(m, t, i), visit, arg);
        if (r)
            return r;
    }
    return 0;
}

static int Map_clear(IdMapObject *m) {
    while (m->n)
        map_drop(m, m->n - 1);
    return 0;
}

static void Map_dealloc(IdMapObject *m) {
    PyObject_GC_UnTrack(m);
    Map_clear(m);
    PyMem_Free(m->e);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t Map_len(IdMapObject *m) { return m->n; }

static int Map_contains(IdMapObject *m, PyObject *key) { return map_index(m, key) >= 0; }

static PyObject *Map_subscript(IdMapObject *m, PyObject *key) {
    Py_ssize_t i = map_index(m, key);
    if (i < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return kind_of(m)->value(entry_at(m, kind_of(m), i), 0);
}

/* map[key] = v; del map[key] */
static int Map_ass_subscript(IdMapObject *m, PyObject *key, PyObject *v) {
    const map_kind_t *t = kind_of(m);
    any_entry_t e;
    if (v == NULL) {
        Py_ssize_t i = map_index(m, key);
        if (i < 0) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        map_drop(m, i);
        return 0;
    }
    if (t->entry_of(key, v, &e) < 0)
        return -1;
    if (dft_map_put(m, &e) < 0) {
        t->refs(&e, NULL, NULL);
        return -1;
    }
    return 0;
}

static PyObject *Map_get(IdMapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    Py_ssize_t i = map_index(m, args[0]);
    if (i >= 0)
        return kind_of(m)->value(entry_at(m, kind_of(m), i), 0);
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(d);
    return d;
}

static PyObject *Map_pop(IdMapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    Py_ssize_t i = map_index(m, args[0]);
    if (i < 0) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    any_entry_t e;
    map_take(m, i, &e);
    PyObject *v = kind_of(m)->value(&e, 1);
    if (!v) /* out of memory: the span is gone, unrecorded */
        kind_of(m)->refs(&e, NULL, NULL);
    return v;
}

static PyObject *Map_keys(IdMapObject *m, PyObject *unused) {
    const map_kind_t *t = kind_of(m);
    PyObject *out = PyList_New(m->n);
    for (Py_ssize_t i = 0; out && i < m->n; i++) {
        PyObject *id = *(PyObject **)(entry_at(m, t, i) + t->id_at);
        Py_INCREF(id);
        PyList_SET_ITEM(out, i, id);
    }
    return out;
}

/* [(id, OpenSpan)] in the order they opened (a list: a snapshot). */
static PyObject *Map_items(IdMapObject *m, PyObject *unused) {
    const map_kind_t *t = kind_of(m);
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < m->n; i++) {
        char *e = entry_at(m, t, i);
        PyObject *v = t->value(e, 0);
        PyObject *pair = v ? PyTuple_Pack(2, *(PyObject **)(e + t->id_at), v) : NULL;
        Py_XDECREF(v);
        if (!pair || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    return out;
}

static PyObject *Map_iter(IdMapObject *m) {
    PyObject *keys = Map_keys(m, NULL);
    PyObject *it = keys ? PyObject_GetIter(keys) : NULL;
    Py_XDECREF(keys);
    return it;
}

static PyObject *Map_repr(IdMapObject *m) {
    PyObject *keys = Map_keys(m, NULL);
    PyObject *r = keys ? PyUnicode_FromFormat("<%s %R>", kind_of(m)->name, keys) : NULL;
    Py_XDECREF(keys);
    return r;
}

static PyMethodDef Kept_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Map_get, METH_FASTCALL, "get(id, default=None) -> OpenSpan"},
    {"pop", (PyCFunction)(void (*)(void))Map_pop, METH_FASTCALL,
     "pop(id[, default]) -> OpenSpan: take the span out (it is no longer kept)"},
    {"items", (PyCFunction)Map_items, METH_NOARGS, "[(id, OpenSpan)], oldest first"},
    {"keys", (PyCFunction)Map_keys, METH_NOARGS, "[id], oldest first"},
    {NULL, NULL, 0, NULL}};

static PyMethodDef Started_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Map_get, METH_FASTCALL, "get(id, default=None) -> its stack"},
    {"pop", (PyCFunction)(void (*)(void))Map_pop, METH_FASTCALL,
     "pop(id[, default]) -> its stack: it is no longer started"},
    {"keys", (PyCFunction)Map_keys, METH_NOARGS, "[id], oldest first"},
    {NULL, NULL, 0, NULL}};

static PyMappingMethods Map_as_mapping = {
    .mp_length = (lenfunc)Map_len,
    .mp_subscript = (binaryfunc)Map_subscript,
    .mp_ass_subscript = (objobjargproc)Map_ass_subscript,
};

static PySequenceMethods Map_as_sequence = {
    .sq_contains = (objobjproc)Map_contains,
};

/* Filled by map_type_ready. */
PyTypeObject dft_KeptSpansType = {PyVarObject_HEAD_INIT(NULL, 0)};
PyTypeObject dft_StartedSpansType = {PyVarObject_HEAD_INIT(NULL, 0)};

/* One of the two map classes: the slots they share, and what sets it apart. */
static int map_type_ready(PyTypeObject *t, const char *name, const char *doc, PyMethodDef *methods) {
    t->tp_name = name;
    t->tp_doc = doc;
    t->tp_methods = methods;
    t->tp_as_mapping = &Map_as_mapping;
    t->tp_basicsize = sizeof(IdMapObject);
    t->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    t->tp_new = Map_new;
    t->tp_dealloc = (destructor)Map_dealloc;
    t->tp_traverse = (traverseproc)Map_traverse;
    t->tp_clear = (inquiry)Map_clear;
    t->tp_repr = (reprfunc)Map_repr;
    t->tp_iter = (getiterfunc)Map_iter;
    t->tp_as_sequence = &Map_as_sequence;
    return PyType_Ready(t);
}

int dft_kept_spans_ready(void) {
    if (PyType_Ready(&dft_OpenSpanType) < 0)
        return -1;
    if (map_type_ready(&dft_KeptSpansType, "dftrace._core._speedups.KeptSpans",
                       "A stack's open map: span id -> OpenSpan for the spans with and start() keep "
                       "open on it, held in place, in the order they opened.",
                       Kept_methods) < 0)
        return -1;
    return map_type_ready(&dft_StartedSpansType, "dftrace._core._speedups.StartedSpans",
                          "STATE.open_spans: span id -> its stack for the spans start() opened and no "
                          "stop() ended yet, in the order they started.",
                          Started_methods);
}

/* ------------------------------------------------------------------------- */
/* STATE.open_spans, as last read (open_spans)                                 */

PyObject *dft_open_spans_cache = NULL;

void dft_open_spans_forget(void) { Py_CLEAR(dft_open_spans_cache); }
