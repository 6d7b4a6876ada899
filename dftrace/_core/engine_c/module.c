/* module.c: the module dftrace._core._speedups. register(), the one point where
 * Python hands the engine the objects it calls back into and the classes it fills;
 * the attribute names it reads (interned once, and published as ENGINE_READS so
 * that a test can check them against the real classes); PyInit, which adds each
 * unit's functions and types. A new function of the module: static in the unit it
 * belongs to, listed in that unit's method table (dft_<unit>_methods, declared in the
 * unit's header and added here with the others). */
#include "module.h"
#include "auto_hooks.h"
#include "encoder.h"
#include "io_lines.h"
#include "kept_spans.h"
#include "records.h"
#include "shm_consumer.h"
#include "shm_ring.h"
#include "signal_sender.h"
#include "spans.h"
#include "traceable.h"
#include "writer.h"

recstate_t dft_calls = {0};
hookstate_t dft_hooks = {0};
PyObject *dft_update_slow = NULL; /* Node._update_py */
PyObject *dft_gate = NULL;        /* dft_hooks.gate (borrowed): what a use forced on follows */
slot_t dft_slot_frag, dft_slot_mask, dft_slot_args, dft_slot_obj, dft_slot_stk, dft_slot_id,
    dft_slot_gate_on = {NULL, NULL, -1};

/* ------------------------------------------------------------------------- */
/* register(**objects): the one registration point                            */

enum { ANY, CALLABLE, TYPE };
typedef struct {
    const char *name;
    PyObject **slot;
    int kind;
} reg_t;

/* Every object the engine holds, by the keyword register() takes it under: the
   names, and what each one is, are those of REGISTER_DOC. */
static const reg_t REGISTRY[] = {
    {"local", &dft_calls.local, ANY},
    {"resolve", &dft_calls.resolve, CALLABLE},
    {"wait_room", &dft_calls.wait_room, CALLABLE},
    {"wake", &dft_calls.wake, CALLABLE},
    {"unwind", &dft_calls.unwind, CALLABLE},
    {"with_error", &dft_calls.with_error, CALLABLE},
    {"merge", &dft_calls.merge, CALLABLE},
    {"to_extra", &dft_calls.to_extra, CALLABLE},
    {"sticky_of", &dft_calls.sticky_of, CALLABLE},
    {"extra_type", &dft_calls.extra_type, TYPE},
    {"slow_exit", &dft_calls.slow_exit, CALLABLE},
    {"iter_end", &dft_calls.iter_end, CALLABLE},
    {"task_stack", &dft_calls.task_stack, ANY},
    {"state", &dft_hooks.state, ANY},
    {"span_type", (PyObject **)&dft_hooks.span, TYPE},
    {"no_span", &dft_hooks.no_span, ANY},
    {"start_slow", &dft_hooks.start_slow, CALLABLE},
    {"stop_slow", &dft_hooks.stop_slow, CALLABLE},
    {"use_type", (PyObject **)&dft_hooks.use, TYPE},
    {"call_slow", &dft_hooks.call_slow, CALLABLE},
    {"span_stop_slow", &dft_hooks.span_stop_slow, CALLABLE},
    {"record_slow", &dft_hooks.record_slow, CALLABLE},
    {"gate", &dft_hooks.gate, ANY},
    {"update_slow", &dft_update_slow, CALLABLE},
    {"off_use", &dft_hooks.off_use, ANY},
};
#define NREG ((Py_ssize_t)(sizeof(REGISTRY) / sizeof(REGISTRY[0])))

#define REGISTER_DOC \
    "register(**objects): hand the engine the Python objects it calls back into and\n" \
    "the classes it fills, by name; any subset per call (engine.py registers the\n" \
    "recorder's, tree.py the tree's), a name given again replaces its object. An\n" \
    "unknown name, or a callable or class that is not one, raises TypeError and\n" \
    "registers nothing.\n\n" \
    "The recorder (dftrace._core.engine):\n" \
    "  local       LOCAL, the threading.local whose .stk/.thread_stk are the stacks\n" \
    "  resolve     resolve() -> Stack: the stack of this thread or asyncio task\n" \
    "  wait_room   wait_for_room(): wait until the writer made room (may raise)\n" \
    "  wake        wake_consumer(): a batch is ready\n" \
    "  unwind      _unwind(stk, i, t): close what is left open above span i at t\n" \
    "  with_error  with_error(extra, exc) -> Extra: args with args.error\n" \
    "  merge       Extra.joined(base, own) -> Extra: own args win over sticky ones\n" \
    "  to_extra    to_extra(obj) -> Extra: args given as a dict, encoded\n" \
    "  sticky_of   sticky_of(node) -> Extra or None: refresh after update()\n" \
    "  extra_type  Extra, the class of encoded args (its slots are read in place)\n" \
    "  slow_exit   cm_exit(self, et, ev, tb): __exit__ for all but the common case\n" \
    "  task_stack  TASK_STACK, the context variable holding an asyncio task's stack\n" \
    "The iterators (dftrace._core.iterators):\n" \
    "  iter_end    record_end(node, t0, t1, extra, count): the next() that found an\n" \
    "              .iter() pass over, its <leaf>.end span\n" \
    "The tree (dftrace._core.tree):\n" \
    "  state           STATE, the recorder's state (open_spans, max_open_spans)\n" \
    "  span_type       Span, the token start() returns (made and filled here)\n" \
    "  no_span         the Span returned when nothing is recorded\n" \
    "  start_slow      _Traceable._start_py: start() for all but the common case\n" \
    "  stop_slow       _Traceable._stop_py: stop() for all but the common case\n" \
    "  use_type        Use, made here for node(args={...})\n" \
    "  call_slow       _Traceable._call_py: node(...) for all but node(args={...})\n" \
    "  span_stop_slow  Span._stop_py: Span.stop() for all but the common case\n" \
    "  record_slow     _Traceable._record_py: record() for all but the common case\n" \
    "  gate            GATE, what a use forced on follows\n" \
    "  update_slow     Node._update_py: update() for all but plain values\n" \
    "  off_use         OFF_USE, what node(...) returns when off by configuration"

static void find_slot(slot_t *s, PyObject *type, PyObject *name) {
    s->type = type && PyType_Check(type) ? (PyTypeObject *)type : NULL;
    s->name = name;
    s->off = -1;
    PyObject *d = s->type ? PyDict_GetItemWithError(s->type->tp_dict, name) : NULL;
    if (d && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            s->off = m->offset;
    }
    PyErr_Clear();
}

static const reg_t *reg_find(PyObject *key) {
    for (Py_ssize_t k = 0; k < NREG; k++)
        if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, REGISTRY[k].name) == 0)
            return &REGISTRY[k];
    return NULL;
}

static PyObject *register_objects(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args)) {
        PyErr_SetString(PyExc_TypeError, "register() takes keyword arguments only");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    /* check everything first: a call that fails registers nothing */
    while (kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
        const reg_t *r = reg_find(key);
        if (!r) {
            PyErr_Format(PyExc_TypeError, "register() got an unknown name %R", key);
            return NULL;
        }
        if ((r->kind == CALLABLE && !PyCallable_Check(value)) ||
            (r->kind == TYPE && !PyType_Check(value))) {
            PyErr_Format(PyExc_TypeError, "register(%s=...) takes a %s, not %.100s", r->name,
                         r->kind == TYPE ? "class" : "callable", Py_TYPE(value)->tp_name);
            return NULL;
        }
    }
    pos = 0;
    while (kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
        const reg_t *r = reg_find(key);
        Py_INCREF(value);
        Py_XSETREF(*r->slot, value);
    }
    if (kwargs && PyDict_GetItemString(kwargs, "local")) {
        /* the stack cache needs LOCAL to be per thread: a real threading.local */
        PyObject *thread = PyImport_ImportModule("_thread");
        PyObject *local_type = thread ? PyObject_GetAttrString(thread, "_local") : NULL;
        int real = local_type ? PyObject_IsInstance(dft_calls.local, local_type) : -1;
        Py_XDECREF(local_type);
        Py_XDECREF(thread);
        if (real < 0)
            PyErr_Clear();
        dft_stack_cache_allow(real == 1);
    }
    find_slot(&dft_slot_frag, dft_calls.extra_type, dft_str_frag);
    find_slot(&dft_slot_mask, dft_calls.extra_type, dft_str_mask);
    find_slot(&dft_slot_args, dft_calls.extra_type, dft_str__args);
    find_slot(&dft_slot_obj, (PyObject *)dft_hooks.span, dft_str__obj);
    find_slot(&dft_slot_stk, (PyObject *)dft_hooks.span, dft_str__stk);
    find_slot(&dft_slot_id, (PyObject *)dft_hooks.span, dft_str__id);
    dft_gate = dft_hooks.gate;
    if (dft_gate)
        find_slot(&dft_slot_gate_on, (PyObject *)Py_TYPE(dft_gate), dft_str_on);
    dft_extra_serve();
    if (dft_traceable_subclasses() < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* registered() -> {name: object or None} */
static PyObject *registered(PyObject *self, PyObject *unused) {
    PyObject *d = PyDict_New();
    for (Py_ssize_t k = 0; d && k < NREG; k++) {
        PyObject *v = *REGISTRY[k].slot ? *REGISTRY[k].slot : Py_None;
        if (PyDict_SetItemString(d, REGISTRY[k].name, v) < 0)
            Py_CLEAR(d);
    }
    return d;
}

/* ------------------------------------------------------------------------- */
/* the names the engine reads                                                 */

PyObject *dft_str_thread_stk, *dft_str_stk, *dft_str_on, *dft_str_kid, *dft_str_ikid,
    *dft_str_bkid, *dft_str_tid, *dft_str_open, *dft_str_extra, *dft_str_node, *dft_str_frag,
    *dft_str_mask, *dft_str_sgen, *dft_str_sticky, *dft_str__args, *dft_str__obj, *dft_str__stk, *dft_str__id,
    *dft_str_open_spans, *dft_str_max_open_spans, *dft_str_args_kw, *dft_str_args_attr,
    *dft_str_asyncio, *dft_str_owner;

/* Each attribute (or keyword) the engine reads by name, with the Python object it
   reads it from ("module:qualname"), and the variable holding it interned (NULL:
   read with a C string). Published as ENGINE_READS {owner: (names...)}. A name read
   from several owners is one variable, interned once. */
typedef struct {
    const char *owner, *name;
    PyObject **interned;
} read_t;
static const read_t READS[] = {
    {"dftrace._core.engine:LOCAL", "stk", &dft_str_stk},
    {"dftrace._core.engine:LOCAL", "thread_stk", &dft_str_thread_stk},
    {"dftrace._core.engine:Stack", "tid", &dft_str_tid},
    {"dftrace._core.engine:Stack", "open", &dft_str_open},
    {"dftrace._core.engine:Stack", "owner", &dft_str_owner},
    {"dftrace._core.engine:STATE", "open_spans", &dft_str_open_spans},
    {"dftrace._core.engine:STATE", "max_open_spans", &dft_str_max_open_spans},
    {"dftrace._core.records:Extra", "frag", &dft_str_frag},
    {"dftrace._core.records:Extra", "mask", &dft_str_mask},
    {"dftrace._core.records:Extra", "_args", &dft_str__args},
    {"dftrace._core.records:Extra", "args", &dft_str_args_attr},
    {"dftrace._core.tree:Span", "_obj", &dft_str__obj},
    {"dftrace._core.tree:Span", "_stk", &dft_str__stk},
    {"dftrace._core.tree:Span", "_id", &dft_str__id},
    /* a node or use that is not a TraceableBase (the C fields) is read by name */
    {"dftrace._core.tree:Node", "_on", &dft_str_on},
    {"dftrace._core.tree:Node", "_node", &dft_str_node},
    {"dftrace._core.tree:Node", "_extra", &dft_str_extra},
    {"dftrace._core.tree:Node", "_sgen", &dft_str_sgen},
    {"dftrace._core.tree:Node", "_sticky", &dft_str_sticky},
    {"dftrace._core.tree:Node", "_kid", &dft_str_kid},
    {"dftrace._core.tree:Node", "_ikid", &dft_str_ikid},
    {"dftrace._core.tree:Node", "_bkid", &dft_str_bkid},
    {"dftrace._core.tree:Use", "_on", &dft_str_on},
    {"dftrace._core.tree:Use", "_node", &dft_str_node},
    {"dftrace._core.tree:Use", "_extra", &dft_str_extra},
    {"dftrace._core.tree:GATE", "_on", &dft_str_on},
    /* keywords parsed in C: node(args={...}) and span.stop(args=...); the Python
       methods their other cases go to take them too */
    {"dftrace._core.tree:_Traceable._call_py", "args", &dft_str_args_kw},
    {"dftrace._core.tree:Span._stop_py", "args", &dft_str_args_kw},
    {"sys:modules", "asyncio", &dft_str_asyncio},
    {"asyncio", "_get_running_loop", NULL},
    {"asyncio.tasks", "_current_tasks", NULL}, /* before 3.12; from 3.12 _asyncio.current_task */
};

static int intern_names(void) {
    for (size_t k = 0; k < sizeof(READS) / sizeof(READS[0]); k++)
        if (READS[k].interned && !*READS[k].interned &&
            !(*READS[k].interned = PyUnicode_InternFromString(READS[k].name)))
            return -1;
    return 0;
}

static PyObject *engine_reads(void) {
    PyObject *d = PyDict_New();
    for (size_t k = 0; d && k < sizeof(READS) / sizeof(READS[0]); k++) {
        PyObject *names = PyDict_GetItemString(d, READS[k].owner);
        PyObject *name = PyUnicode_FromString(READS[k].name);
        PyObject *grown = NULL;
        if (name) {
            PyObject *one = PyTuple_Pack(1, name);
            grown = one && names ? PySequence_Concat(names, one) : one;
            if (grown != one)
                Py_XDECREF(one);
        }
        if (!grown || PyDict_SetItemString(d, READS[k].owner, grown) < 0)
            Py_CLEAR(d);
        Py_XDECREF(grown);
        Py_XDECREF(name);
    }
    return d;
}

/* ------------------------------------------------------------------------- */
/* the module                                                                 */

static PyMethodDef methods[] = {
    {"register", (PyCFunction)(void (*)(void))register_objects, METH_VARARGS | METH_KEYWORDS,
     REGISTER_DOC},
    {"registered", registered, METH_NOARGS,
     "registered() -> {name: object or None}: what register() was given so far."},
    {NULL, NULL, 0, NULL}};

/* The rest of the module's functions, each unit's table (its header declares it). */
static PyMethodDef *const UNIT_METHODS[] = {dft_records_methods, dft_io_lines_methods, dft_encoder_methods,
                                            dft_writer_methods, dft_shm_producer_methods, dft_spans_methods,
                                            dft_signal_sender_methods};

/* The engine's state (what register() was given, the buffer, the static types) is
   one per process, held by the interpreter that loaded it: another interpreter of
   the process cannot share it, so the module loads in the main interpreter only and
   a sub-interpreter's import raises ImportError (dftrace there runs the pure-Python
   engine). Python 3.12 and later refuse such an import before anything is made, by
   the slot; older ones reach this check first thing. */
static int speedups_exec(PyObject *m) {
#ifndef Py_mod_multiple_interpreters
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(PyExc_ImportError,
                        "dftrace._core._speedups loads in the main interpreter only");
        return -1;
    }
#endif
    if (intern_names() < 0)
        return -1;
    dft_qlock_fork_safe();
    for (size_t k = 0; k < sizeof(UNIT_METHODS) / sizeof(UNIT_METHODS[0]); k++)
        if (PyModule_AddFunctions(m, UNIT_METHODS[k]) < 0)
            return -1;
    if (PyType_Ready(&dft_SpanWrapperType) < 0 || dft_traceable_ready() < 0 ||
        PyType_Ready(&dft_SpanIterType) < 0 || dft_kept_spans_ready() < 0 ||
        PyType_Ready(&dft_SpanBaseType) < 0 || dft_shm_consumer_add(m) < 0 ||
        dft_auto_hooks_add(m) < 0)
        return -1;
    PyObject *reads = engine_reads();
    if (!reads)
        return -1;
    if (PyModule_AddObjectRef(m, "ENGINE_READS", reads) < 0 ||
        PyModule_AddObjectRef(m, "SpanWrapper", (PyObject *)&dft_SpanWrapperType) < 0 ||
        PyModule_AddObjectRef(m, "SpanIter", (PyObject *)&dft_SpanIterType) < 0 ||
        PyModule_AddObjectRef(m, "OpenSpan", (PyObject *)&dft_OpenSpanType) < 0 ||
        PyModule_AddObjectRef(m, "KeptSpans", (PyObject *)&dft_KeptSpansType) < 0 ||
        PyModule_AddObjectRef(m, "StartedSpans", (PyObject *)&dft_StartedSpansType) < 0 ||
        PyModule_AddObjectRef(m, "TraceableBase", (PyObject *)&dft_TraceableBaseType) < 0 ||
        PyModule_AddObjectRef(m, "SpanBase", (PyObject *)&dft_SpanBaseType) < 0 ||
        PyModule_AddIntConstant(m, "SHM_FIXED_BYTES", (long)SHM_SLOTS_OFF) < 0 ||
        PyModule_AddIntConstant(m, "SHM_SLOT_BYTES", (long)SHM_SLOT_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "SHM_SLOT_RECORDS", (long)CHUNK_RECS) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(rec_t)) < 0 ||
        PyModule_AddIntConstant(m, "CHUNK_RECORDS", (long)CHUNK_RECS) < 0) {
        Py_DECREF(reads);
        return -1;
    }
    Py_DECREF(reads);
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, speedups_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_speedups",
                                       "dftrace's recording engine in C.", 0, methods, slots};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModuleDef_Init(&moduledef); }
