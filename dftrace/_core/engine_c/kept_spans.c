/* kept_spans.c: the spans `with` and start() keep open. KeptSpans, a stack's `open`
 * map (the entries themselves, in the order they opened: kept_spans.h has the hot
 * path, push and take the last), here with the mapping Python's paths read it as;
 * and OpenSpan, one kept span as an object, made for Python from an entry. */
#include "engine.h"

/* ------------------------------------------------------------------------- */
/* OpenSpan: a kept span as Python reads it                                    */

/* OpenSpan objects live while Python holds one (a close in Python, restick_open):
   a few are kept for the next ones, as CPython keeps its tuples. */
#define OPEN_FREE_MAX 16
static PyObject *open_free[OPEN_FREE_MAX];
static int open_nfree = 0;

static OpenSpanObject *open_alloc(void) {
    PyObject *o;
    if (open_nfree) {
        o = open_free[--open_nfree];
        PyObject_Init(o, &dft_OpenSpanType);
    } else {
        o = (PyObject *)PyObject_GC_New(OpenSpanObject, &dft_OpenSpanType);
        if (!o)
            return NULL;
    }
    memset((char *)o + sizeof(PyObject), 0, sizeof(OpenSpanObject) - sizeof(PyObject));
    PyObject_GC_Track(o);
    return AS_OPEN(o);
}

static void kept_incref(const kept_t *k) {
    Py_INCREF(k->span.id);
    Py_INCREF(k->span.parent);
    Py_INCREF(k->span.sticky);
    Py_XINCREF(k->span.tid);
    Py_INCREF(k->opener);
    Py_INCREF(k->extra);
}

static void kept_release(kept_t *k) {
    span_release(&k->span);
    Py_CLEAR(k->opener);
    Py_CLEAR(k->extra);
}

/* An OpenSpan of entry `k`: with new references (`move` 0), or taking the entry's. */
static PyObject *open_of(const kept_t *k, int move) {
    OpenSpanObject *e = open_alloc();
    if (!e)
        return NULL;
    if (!move)
        kept_incref(k);
    e->span = k->span;
    e->opener = k->opener;
    e->extra = k->extra;
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
    OpenSpanObject *e = open_alloc();
    if (!e)
        return NULL;
    Py_INCREF(id); Py_INCREF(parent); Py_INCREF(sticky); Py_INCREF(opener); Py_INCREF(extra);
    e->span.id = id;
    e->span.idv = idv;
    e->span.kid = kid;
    e->span.parent = parent;
    e->span.level = level;
    e->span.sticky = sticky;
    e->span.t0 = t0;
    e->opener = opener;
    e->extra = extra;
    return (PyObject *)e;
}

static int OpenSpan_traverse(OpenSpanObject *e, visitproc visit, void *arg) {
    Py_VISIT(e->span.id);
    Py_VISIT(e->span.parent);
    Py_VISIT(e->span.sticky);
    Py_VISIT(e->span.tid);
    Py_VISIT(e->opener);
    Py_VISIT(e->extra);
    return 0;
}

static int OpenSpan_clear(OpenSpanObject *e) {
    span_release(&e->span);
    Py_CLEAR(e->opener);
    Py_CLEAR(e->extra);
    return 0;
}

static void OpenSpan_dealloc(OpenSpanObject *e) {
    PyObject_GC_UnTrack(e);
    OpenSpan_clear(e);
    if (open_nfree < OPEN_FREE_MAX)
        open_free[open_nfree++] = (PyObject *)e;
    else
        PyObject_GC_Del(e);
}

static PyObject *OpenSpan_repr(OpenSpanObject *e) {
    return PyUnicode_FromFormat("OpenSpan(id=%R, kid=%u, parent=%R, level=%zd, t0=%lld)",
                                e->span.id ? e->span.id : Py_None, e->span.kid,
                                e->span.parent ? e->span.parent : Py_None, e->span.level, e->span.t0);
}

#define OS_SPAN(f) offsetof(OpenSpanObject, span) + offsetof(span_t, f)
static PyMemberDef OpenSpan_members[] = {
    {"id", T_OBJECT, OS_SPAN(id), READONLY, "its id"},
    {"kid", T_UINT, OS_SPAN(kid), READONLY, "its kind"},
    {"parent", T_OBJECT, OS_SPAN(parent), READONLY, "the id below it when it opened (0: none)"},
    {"level", T_PYSSIZET, OS_SPAN(level), READONLY, "its depth"},
    {"sticky", T_OBJECT, OS_SPAN(sticky), READONLY, "the sticky args when it opened"},
    {"opener", T_OBJECT, offsetof(OpenSpanObject, opener), READONLY, "what opened it (with, start())"},
    {"extra", T_OBJECT, offsetof(OpenSpanObject, extra), READONLY, "the opener's own args"},
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

/* ------------------------------------------------------------------------- */
/* KeptSpans: a stack's `open` map                                             */

/* Where id `v` is, or would go (the first entry with an id not below it). */
static Py_ssize_t kept_find(const KeptSpansObject *m, unsigned long long v) {
    Py_ssize_t lo = 0, hi = m->n;
    if (hi && m->k[hi - 1].span.idv == v) /* the common case: the newest */
        return hi - 1;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (m->k[mid].span.idv < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry of key `key` (an int), or NULL (no error set: not one of ours). */
static kept_t *kept_get(KeptSpansObject *m, PyObject *key, Py_ssize_t *at) {
    if (!PyLong_Check(key))
        return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(key);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    Py_ssize_t i = kept_find(m, v);
    if (i >= m->n || m->k[i].span.idv != v)
        return NULL;
    if (at)
        *at = i;
    return &m->k[i];
}

static int kept_grow(KeptSpansObject *m) {
    Py_ssize_t cap = m->cap ? m->cap * 2 : 8;
    if ((size_t)cap > PY_SSIZE_T_MAX / sizeof(kept_t)) {
        PyErr_NoMemory();
        return -1;
    }
    kept_t *k = PyMem_Realloc(m->k, (size_t)cap * sizeof(kept_t));
    if (!k) {
        PyErr_NoMemory();
        return -1;
    }
    m->k = k;
    m->cap = cap;
    return 0;
}

int dft_kept_put(KeptSpansObject *m, const kept_t *k) {
    Py_ssize_t i = kept_find(m, k->span.idv);
    if (i < m->n && m->k[i].span.idv == k->span.idv) { /* a new version of a kept span */
        kept_t old = m->k[i];
        m->k[i] = *k;
        kept_release(&old); /* may run code: the entry is in place already */
        return 0;
    }
    if (m->n == m->cap && kept_grow(m) < 0)
        return -1;
    memmove(&m->k[i + 1], &m->k[i], (size_t)(m->n - i) * sizeof(kept_t));
    m->k[i] = *k;
    m->n++;
    return 0;
}

/* Take entry i out (its references go to *out). */
static void kept_remove(KeptSpansObject *m, Py_ssize_t i, kept_t *out) {
    *out = m->k[i];
    memmove(&m->k[i], &m->k[i + 1], (size_t)(m->n - i - 1) * sizeof(kept_t));
    m->n--;
}

static PyObject *Kept_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "KeptSpans() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static int Kept_traverse(KeptSpansObject *m, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < m->n; i++) {
        kept_t *k = &m->k[i];
        Py_VISIT(k->span.id);
        Py_VISIT(k->span.parent);
        Py_VISIT(k->span.sticky);
        Py_VISIT(k->span.tid);
        Py_VISIT(k->opener);
        Py_VISIT(k->extra);
    }
    return 0;
}

static int Kept_clear(KeptSpansObject *m) {
    while (m->n) {
        kept_t k;
        kept_remove(m, m->n - 1, &k);
        kept_release(&k);
    }
    return 0;
}

static void Kept_dealloc(KeptSpansObject *m) {
    PyObject_GC_UnTrack(m);
    Kept_clear(m);
    PyMem_Free(m->k);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t Kept_len(KeptSpansObject *m) { return m->n; }

static PyObject *Kept_subscript(KeptSpansObject *m, PyObject *key) {
    kept_t *k = kept_get(m, key, NULL);
    if (!k) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return open_of(k, 0);
}

/* open[i] = OpenSpan (Python's open_span, restick_open); del open[i]. */
static int Kept_ass_subscript(KeptSpansObject *m, PyObject *key, PyObject *v) {
    if (v == NULL) {
        Py_ssize_t i;
        if (!kept_get(m, key, &i)) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        kept_t k;
        kept_remove(m, i, &k);
        kept_release(&k);
        return 0;
    }
    if (!IS_OPEN_SPAN(v)) {
        PyErr_SetString(PyExc_TypeError, "a kept span is an OpenSpan");
        return -1;
    }
    if (!PyLong_Check(key) || PyObject_RichCompareBool(key, AS_OPEN(v)->span.id, Py_EQ) != 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "an OpenSpan is kept under its own id");
        return -1;
    }
    OpenSpanObject *e = AS_OPEN(v);
    kept_t k = {e->span, e->opener, e->extra};
    kept_incref(&k);
    if (dft_kept_put(m, &k) < 0) {
        kept_release(&k);
        return -1;
    }
    return 0;
}

static int Kept_contains(KeptSpansObject *m, PyObject *key) { return kept_get(m, key, NULL) != NULL; }

static PyObject *Kept_get(KeptSpansObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    kept_t *k = kept_get(m, args[0], NULL);
    if (k)
        return open_of(k, 0);
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(d);
    return d;
}

static PyObject *Kept_pop(KeptSpansObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    Py_ssize_t i;
    if (!kept_get(m, args[0], &i)) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    kept_t k;
    kept_remove(m, i, &k);
    PyObject *e = open_of(&k, 1);
    if (!e)
        kept_release(&k); /* out of memory: the span is gone, unrecorded */
    return e;
}

/* [(id, OpenSpan)] in the order they opened (a list: a snapshot). */
static PyObject *Kept_items(KeptSpansObject *m, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < m->n; i++) {
        PyObject *e = open_of(&m->k[i], 0);
        PyObject *pair = e ? PyTuple_Pack(2, m->k[i].span.id, e) : NULL;
        Py_XDECREF(e);
        if (!pair || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    return out;
}

static PyObject *Kept_keys(KeptSpansObject *m, PyObject *unused) {
    PyObject *out = PyList_New(m->n);
    for (Py_ssize_t i = 0; out && i < m->n; i++) {
        Py_INCREF(m->k[i].span.id);
        PyList_SET_ITEM(out, i, m->k[i].span.id);
    }
    return out;
}

static PyObject *Kept_iter(KeptSpansObject *m) {
    PyObject *keys = Kept_keys(m, NULL);
    PyObject *it = keys ? PyObject_GetIter(keys) : NULL;
    Py_XDECREF(keys);
    return it;
}

static PyObject *Kept_repr(KeptSpansObject *m) {
    PyObject *keys = Kept_keys(m, NULL);
    PyObject *r = keys ? PyUnicode_FromFormat("<KeptSpans %R>", keys) : NULL;
    Py_XDECREF(keys);
    return r;
}

static PyMethodDef Kept_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Kept_get, METH_FASTCALL, "get(id, default=None) -> OpenSpan"},
    {"pop", (PyCFunction)(void (*)(void))Kept_pop, METH_FASTCALL,
     "pop(id[, default]) -> OpenSpan: take the span out (it is no longer kept)"},
    {"items", (PyCFunction)Kept_items, METH_NOARGS, "[(id, OpenSpan)], oldest first"},
    {"keys", (PyCFunction)Kept_keys, METH_NOARGS, "[id], oldest first"},
    {NULL, NULL, 0, NULL}};

static PyMappingMethods Kept_as_mapping = {
    .mp_length = (lenfunc)Kept_len,
    .mp_subscript = (binaryfunc)Kept_subscript,
    .mp_ass_subscript = (objobjargproc)Kept_ass_subscript,
};

static PySequenceMethods Kept_as_sequence = {
    .sq_contains = (objobjproc)Kept_contains,
};

PyTypeObject dft_KeptSpansType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.KeptSpans",
    .tp_basicsize = sizeof(KeptSpansObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A stack's open map: span id -> OpenSpan for the spans with and start() keep "
              "open on it, held in place, in the order they opened.",
    .tp_new = Kept_new,
    .tp_dealloc = (destructor)Kept_dealloc,
    .tp_traverse = (traverseproc)Kept_traverse,
    .tp_clear = (inquiry)Kept_clear,
    .tp_repr = (reprfunc)Kept_repr,
    .tp_iter = (getiterfunc)Kept_iter,
    .tp_as_mapping = &Kept_as_mapping,
    .tp_as_sequence = &Kept_as_sequence,
    .tp_methods = Kept_methods,
};

/* ------------------------------------------------------------------------- */
/* StartedSpans: STATE.open_spans (kept_spans.h)                               */

static Py_ssize_t started_find(const StartedSpansObject *m, unsigned long long v) {
    Py_ssize_t lo = 0, hi = m->n;
    if (hi && m->s[hi - 1].idv == v)
        return hi - 1;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (m->s[mid].idv < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The index of key `key` (an int), or -1 (no error set: not one of ours). */
static Py_ssize_t started_index(StartedSpansObject *m, PyObject *key) {
    if (!PyLong_Check(key))
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(key);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t i = started_find(m, v);
    return i < m->n && m->s[i].idv == v ? i : -1;
}

int dft_started_put(StartedSpansObject *m, unsigned long long idv, PyObject *id, PyObject *stk) {
    Py_ssize_t i = started_find(m, idv);
    Py_INCREF(id);
    Py_INCREF(stk);
    if (i < m->n && m->s[i].idv == idv) { /* started again under the same id: its new stack */
        started_t old = m->s[i];
        m->s[i] = (started_t){idv, id, stk};
        Py_DECREF(old.id);
        Py_DECREF(old.stk);
        return 0;
    }
    if (m->n == m->cap) {
        Py_ssize_t cap = m->cap ? m->cap * 2 : 16;
        started_t *s = (size_t)cap <= PY_SSIZE_T_MAX / sizeof(started_t)
                           ? PyMem_Realloc(m->s, (size_t)cap * sizeof(started_t)) : NULL;
        if (!s) {
            Py_DECREF(id);
            Py_DECREF(stk);
            PyErr_NoMemory();
            return -1;
        }
        m->s = s;
        m->cap = cap;
    }
    memmove(&m->s[i + 1], &m->s[i], (size_t)(m->n - i) * sizeof(started_t));
    m->s[i] = (started_t){idv, id, stk};
    m->n++;
    return 0;
}

/* Take entry i out: its references go to *out. */
static void started_take(StartedSpansObject *m, Py_ssize_t i, started_t *out) {
    *out = m->s[i];
    memmove(&m->s[i], &m->s[i + 1], (size_t)(m->n - i - 1) * sizeof(started_t));
    m->n--;
}

int dft_started_remove(StartedSpansObject *m, unsigned long long idv) {
    Py_ssize_t i = started_find(m, idv);
    if (i >= m->n || m->s[i].idv != idv)
        return 0;
    started_t e;
    started_take(m, i, &e);
    Py_DECREF(e.id);
    Py_DECREF(e.stk);
    return 1;
}

static PyObject *Started_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "StartedSpans() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static int Started_traverse(StartedSpansObject *m, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < m->n; i++) {
        Py_VISIT(m->s[i].id);
        Py_VISIT(m->s[i].stk);
    }
    return 0;
}

static int Started_clear(StartedSpansObject *m) {
    while (m->n) {
        started_t e;
        started_take(m, m->n - 1, &e);
        Py_DECREF(e.id);
        Py_DECREF(e.stk);
    }
    return 0;
}

static void Started_dealloc(StartedSpansObject *m) {
    PyObject_GC_UnTrack(m);
    Started_clear(m);
    PyMem_Free(m->s);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t Started_len(StartedSpansObject *m) { return m->n; }

static PyObject *Started_subscript(StartedSpansObject *m, PyObject *key) {
    Py_ssize_t i = started_index(m, key);
    if (i < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    Py_INCREF(m->s[i].stk);
    return m->s[i].stk;
}

/* open_spans[i] = stack (Python's start()); del open_spans[i]. */
static int Started_ass_subscript(StartedSpansObject *m, PyObject *key, PyObject *v) {
    if (v == NULL) {
        Py_ssize_t i = started_index(m, key);
        if (i < 0) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        started_t e;
        started_take(m, i, &e);
        Py_DECREF(e.id);
        Py_DECREF(e.stk);
        return 0;
    }
    if (!PyLong_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "a started span's key is its id (an int)");
        return -1;
    }
    unsigned long long idv = PyLong_AsUnsignedLongLong(key);
    if (idv == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return dft_started_put(m, idv, key, v);
}

static int Started_contains(StartedSpansObject *m, PyObject *key) { return started_index(m, key) >= 0; }

static PyObject *Started_get(StartedSpansObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    Py_ssize_t i = started_index(m, args[0]);
    PyObject *r = i >= 0 ? m->s[i].stk : nargs == 2 ? args[1] : Py_None;
    Py_INCREF(r);
    return r;
}

static PyObject *Started_pop(StartedSpansObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    Py_ssize_t i = started_index(m, args[0]);
    if (i < 0) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    started_t e;
    started_take(m, i, &e);
    Py_DECREF(e.id);
    return e.stk; /* the entry's reference */
}

static PyObject *Started_keys(StartedSpansObject *m, PyObject *unused) {
    PyObject *out = PyList_New(m->n);
    for (Py_ssize_t i = 0; out && i < m->n; i++) {
        Py_INCREF(m->s[i].id);
        PyList_SET_ITEM(out, i, m->s[i].id);
    }
    return out;
}

static PyObject *Started_iter(StartedSpansObject *m) {
    PyObject *keys = Started_keys(m, NULL);
    PyObject *it = keys ? PyObject_GetIter(keys) : NULL;
    Py_XDECREF(keys);
    return it;
}

static PyObject *Started_repr(StartedSpansObject *m) {
    PyObject *keys = Started_keys(m, NULL);
    PyObject *r = keys ? PyUnicode_FromFormat("<StartedSpans %R>", keys) : NULL;
    Py_XDECREF(keys);
    return r;
}

static PyMethodDef Started_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Started_get, METH_FASTCALL, "get(id, default=None) -> its stack"},
    {"pop", (PyCFunction)(void (*)(void))Started_pop, METH_FASTCALL,
     "pop(id[, default]) -> its stack: it is no longer started"},
    {"keys", (PyCFunction)Started_keys, METH_NOARGS, "[id], oldest first"},
    {NULL, NULL, 0, NULL}};

static PyMappingMethods Started_as_mapping = {
    .mp_length = (lenfunc)Started_len,
    .mp_subscript = (binaryfunc)Started_subscript,
    .mp_ass_subscript = (objobjargproc)Started_ass_subscript,
};

static PySequenceMethods Started_as_sequence = {
    .sq_contains = (objobjproc)Started_contains,
};

PyTypeObject dft_StartedSpansType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.StartedSpans",
    .tp_basicsize = sizeof(StartedSpansObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "STATE.open_spans: span id -> its stack for the spans start() opened and no "
              "stop() ended yet, in the order they started.",
    .tp_new = Started_new,
    .tp_dealloc = (destructor)Started_dealloc,
    .tp_traverse = (traverseproc)Started_traverse,
    .tp_clear = (inquiry)Started_clear,
    .tp_repr = (reprfunc)Started_repr,
    .tp_iter = (getiterfunc)Started_iter,
    .tp_as_mapping = &Started_as_mapping,
    .tp_as_sequence = &Started_as_sequence,
    .tp_methods = Started_methods,
};
