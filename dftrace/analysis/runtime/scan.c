/* Column extraction from trace lines: the fast path of dftrace.analysis.read.decode.
 *
 * scan_lines(data, fields) walks every line of ``data`` once, without the GIL, and
 * pulls the requested top-level and ``args`` fields of each JSON object into column
 * buffers: integers and booleans as fixed-width arrays with a validity byte, strings
 * as int32 codes into a table of their distinct raw (still escaped) spellings, which
 * the caller decodes once each. Event lines hold few distinct names and categories,
 * so this never builds a Python object per line.
 *
 * It reads only the simple layout every tracer writes: one object per line, values of
 * the requested type and range, nested no deeper than the caller's limit. A line it
 * cannot read is marked (status 2) and the caller looks at it again with a real JSON
 * parser and the rules of dftrace/format/rules.py (which hands down the ranges and the
 * depth: this file holds none of its own); a line that does not start with '{' is
 * marked status 1 (array brackets, blank lines). A key given twice counts with its
 * last value, as JSON parsers read it: a second ``args`` object replaces the first.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* KIND_INT: any number in [lo, hi] (a fraction is truncated); KIND_WHOLE: an integer
 * in [lo, hi]; KIND_STR: a string; KIND_PHASE: a string, or a number kept as its
 * spelling (DFTracer's integer phases). */
enum { KIND_INT = 0, KIND_STR = 1, KIND_BOOL = 2, KIND_FLOAT = 3, KIND_WHOLE = 4, KIND_PHASE = 5 };
enum { WHERE_TOP = 0, WHERE_ARGS = 1 };
enum { LINE_EVENT = 0, LINE_OTHER = 1, LINE_UNREAD = 2 };

typedef struct {
    const char *ptr;
    Py_ssize_t len;
    uint64_t hash;
} Entry;

typedef struct {
    int where, kind;
    long long lo, hi;  /* KIND_INT, KIND_WHOLE: the values allowed */
    const char *key;
    Py_ssize_t key_len;
    /* The column buffers live in the bytes objects handed back (filled before any
     * other reference to them exists), so they are never copied. */
    PyObject *values_obj, *valid_obj;
    int64_t *ints;   /* KIND_INT, KIND_BOOL (0/1), KIND_FLOAT (the double's bits) */
    int32_t *codes;  /* KIND_STR: -1 for null or absent */
    uint8_t *valid;
    /* distinct strings: entries in first-seen order, and an open-addressing index */
    Entry *entries;
    Py_ssize_t n_entries, cap_entries;
    int32_t *slots;
    Py_ssize_t n_slots;
    int32_t last;  /* the entry interned last, or -1 */
} Field;

/* A hash of the n bytes at p, eight at a time (names and categories are short). */
static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    for (w = 0; n > 0; n--) w = (w << 8) | (unsigned char)p[n - 1];
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static int grow_slots(Field *f) {
    Py_ssize_t n = f->n_slots ? f->n_slots * 2 : 64;
    int32_t *slots = malloc(sizeof(int32_t) * n);
    if (!slots) return -1;
    for (Py_ssize_t i = 0; i < n; i++) slots[i] = -1;
    for (Py_ssize_t e = 0; e < f->n_entries; e++) {
        Py_ssize_t s = (Py_ssize_t)(f->entries[e].hash & (uint64_t)(n - 1));
        while (slots[s] >= 0) s = (s + 1) & (n - 1);
        slots[s] = (int32_t)e;
    }
    free(f->slots);
    f->slots = slots;
    f->n_slots = n;
    return 0;
}

/* Whether the n bytes at a and b are the same: a loop for the short keys and values
 * of trace lines, where a call to memcmp costs more than the comparison. */
static inline int same_bytes(const char *a, const char *b, Py_ssize_t n) {
    if (n > 16) return memcmp(a, b, n) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* Whether the string whose text starts at p is spelled as the n bytes at ``text``
 * (a string read whole before): the same bytes, then a quote. That quote closes it:
 * the backslashes before it are the text's own, an even number. */
static inline int spelled_at(const char *text, Py_ssize_t n, const char *p, const char *end) {
    return end - p > n && p[n] == '"' && same_bytes(text, p, n);
}

/* The code of string ``p[0:n]`` in field ``f``, adding it when new; -1 on no memory. */
static int32_t intern(Field *f, const char *p, Py_ssize_t n) {
    /* The value of the line before, most often the same: a number where text is
     * expected (DFTracer's integer phases; a string is matched before its scan). */
    if (f->last >= 0 && f->entries[f->last].len == n && same_bytes(f->entries[f->last].ptr, p, n)) return f->last;
    if (f->n_entries * 2 >= f->n_slots && grow_slots(f) < 0) return -1;
    uint64_t h = hash_bytes(p, n);
    Py_ssize_t s = (Py_ssize_t)(h & (uint64_t)(f->n_slots - 1));
    while (f->slots[s] >= 0) {
        Entry *e = &f->entries[f->slots[s]];
        if (e->hash == h && e->len == n && same_bytes(e->ptr, p, n)) return f->last = f->slots[s];
        s = (s + 1) & (f->n_slots - 1);
    }
    if (f->n_entries == f->cap_entries) {
        Py_ssize_t cap = f->cap_entries ? f->cap_entries * 2 : 64;
        Entry *entries = realloc(f->entries, sizeof(Entry) * cap);
        if (!entries) return -1;
        f->entries = entries;
        f->cap_entries = cap;
    }
    if (f->n_entries >= INT32_MAX) return -1;
    f->entries[f->n_entries] = (Entry){p, n, h};
    f->slots[s] = (int32_t)f->n_entries;
    return f->last = (int32_t)f->n_entries++;
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

/* p at the opening quote; returns the position after the closing one, or NULL. */
static const char *scan_string(const char *p, const char *end) {
    p++;
    /* Most strings of a trace line are short: looked through byte by byte first. */
    for (const char *stop = end - p > 24 ? p + 24 : end; p < stop; p++) {
        if (*p == '\\') break;  /* escapes: counted below */
        if (*p == '"') return p + 1;
    }
    while (p < end) {
        const char *q = memchr(p, '"', end - p);
        if (!q) return NULL;
        /* the quote is escaped when an odd number of backslashes precede it */
        const char *b = q;
        while (b > p && b[-1] == '\\') b--;
        if (((q - b) & 1) == 0) return q + 1;
        p = q + 1;
    }
    return NULL;
}

static int is_number_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

static const char *scan_literal(const char *p, const char *end, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return NULL;
    return p + n;
}

/* Skip any JSON value nested at most ``depth`` levels (a scalar: 0, [] or {}: 1);
 * returns the position after it, or NULL if it is not one or is nested deeper. */
static const char *skip_value(const char *p, const char *end, int depth_left) {
    if (p >= end) return NULL;
    switch (*p) {
    case '"':
        return scan_string(p, end);
    case '{':
    case '[': {
        int depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                p = scan_string(p, end);
                if (!p) return NULL;
                continue;
            }
            if (c == '{' || c == '[') {
                if (++depth > depth_left) return NULL;
            } else if (c == '}' || c == ']') {
                if (--depth == 0) return p + 1;
            }
            p++;
        }
        return NULL;
    }
    case 't': return scan_literal(p, end, "true");
    case 'f': return scan_literal(p, end, "false");
    case 'n': return scan_literal(p, end, "null");
    default: {
        const char *start = p;
        while (p < end && is_number_char(*p)) p++;
        return p > start ? p : NULL;
    }
    }
}

/* Read an integer in [lo, hi] (a fraction is truncated, as the slow path does, unless
 * ``whole``, which takes integers only) into *out. Returns the position after it, or
 * NULL if the value is not such a number. */
static const char *read_int(const char *p, const char *end, int whole, long long lo, long long hi, int64_t *out) {
    const char *start = p;
    int negative = 0;
    if (p < end && *p == '-') { negative = 1; p++; }
    const char *digits = p;
    uint64_t value = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (value > (UINT64_MAX - 9) / 10) return NULL;
        value = value * 10 + (uint64_t)(*p - '0');
        p++;
    }
    if (p == digits) return NULL;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) {
        if (whole) return NULL;
        char buf[64];
        const char *q = start;
        while (q < end && is_number_char(*q)) q++;
        if (q - start >= (Py_ssize_t)sizeof(buf)) return NULL;
        memcpy(buf, start, q - start);
        buf[q - start] = 0;
        char *stop;
        double d = strtod(buf, &stop);
        if (stop != buf + (q - start) || !isfinite(d) || d >= 9.2e18 || d <= -9.2e18) return NULL;
        if (d < (double)lo || d > (double)hi) return NULL;
        *out = (int64_t)d;
        return q;
    }
    if (negative) {
        if (value > (uint64_t)INT64_MAX + 1) return NULL;
        *out = (int64_t)(0 - value);
    } else {
        if (value > (uint64_t)INT64_MAX) return NULL;
        *out = (int64_t)value;
    }
    if (*out < lo || *out > hi) return NULL;
    return p;
}

/* Read the value at p into field f for row i. Returns the position after the value,
 * or NULL when it is not of the field's type (or is not JSON). */
static const char *read_field(Field *f, Py_ssize_t i, const char *p, const char *end) {
    if (*p == 'n') {
        const char *q = scan_literal(p, end, "null");
        if (q) {
            f->valid[i] = 0;
            if (f->kind == KIND_STR || f->kind == KIND_PHASE) f->codes[i] = -1;
        }
        return q;
    }
    if (f->kind == KIND_INT || f->kind == KIND_WHOLE) {
        const char *q = read_int(p, end, f->kind == KIND_WHOLE, f->lo, f->hi, &f->ints[i]);
        if (q) f->valid[i] = 1;
        return q;
    }
    if (f->kind == KIND_FLOAT) {
        const char *q = p;
        while (q < end && is_number_char(*q)) q++;
        char buf[64];
        if (q == p || q - p >= (Py_ssize_t)sizeof(buf)) return NULL;
        memcpy(buf, p, q - p);
        buf[q - p] = 0;
        char *stop;
        double d = strtod(buf, &stop);
        if (stop != buf + (q - p)) return NULL;
        memcpy(&f->ints[i], &d, sizeof(d));
        f->valid[i] = 1;
        return q;
    }
    if (f->kind == KIND_BOOL) {
        const char *q = scan_literal(p, end, "true");
        if (q) f->ints[i] = 1;
        else if ((q = scan_literal(p, end, "false"))) f->ints[i] = 0;
        if (q) f->valid[i] = 1;
        return q;
    }
    const char *q;
    int32_t code;
    if (f->kind == KIND_PHASE && (*p == '-' || (*p >= '0' && *p <= '9'))) {
        /* a number where a phase is expected (DFTracer's integer phases): its spelling */
        q = skip_value(p, end, 0);
        if (!q) return NULL;
        code = intern(f, p, q - p);
        if (code < 0) return NULL;
        f->codes[i] = code;
        f->valid[i] = 1;
        return q;
    }
    if (*p != '"') return NULL;
    if (f->last >= 0 && spelled_at(f->entries[f->last].ptr, f->entries[f->last].len, p + 1, end)) {
        /* the value of the line before: the same bytes, then its closing quote */
        f->codes[i] = f->last;
        f->valid[i] = 1;
        return p + 2 + f->entries[f->last].len;
    }
    q = scan_string(p, end);
    if (!q) return NULL;
    code = intern(f, p + 1, q - p - 2);
    if (code < 0) return NULL;
    f->codes[i] = code;
    f->valid[i] = 1;
    return q;
}

static Field *find_field(Field *fields, Py_ssize_t n, int where, const char *key, Py_ssize_t len) {
    for (Py_ssize_t k = 0; k < n; k++) {
        if (fields[k].where == where && fields[k].key_len == len && memcmp(fields[k].key, key, len) == 0)
            return &fields[k];
    }
    return NULL;
}

/* Writers put the keys of every event in the same order, so the key at a given place
 * in an object is most often the one found there on the line before: each place
 * remembers its last key (a pointer into the data) and what it matched, wanted or
 * not. A key spelled the same is taken without scanning it first; one that differs
 * is looked up among the fields. */
#define MEMO_PLACES 32
typedef struct {
    const char *key;
    Py_ssize_t len;
    Field *field;
} Memo;

/* The field of a key its place did not hold on the line before, remembered there. */
static Field *lookup(Memo *memo, Py_ssize_t place, Field *fields, Py_ssize_t n, int where, const char *key,
                     Py_ssize_t len) {
    Field *f = find_field(fields, n, where, key, len);
    if (place < MEMO_PLACES) memo[place] = (Memo){key, len, f};
    return f;
}

/* Forget the ``args`` fields read for ``row``: a second ``args`` key replaces the first. */
static void clear_args(Field *fields, Py_ssize_t n_fields, Py_ssize_t row) {
    for (Py_ssize_t k = 0; k < n_fields; k++) {
        if (fields[k].where != WHERE_ARGS) continue;
        fields[k].valid[row] = 0;
        if (fields[k].kind == KIND_STR || fields[k].kind == KIND_PHASE) fields[k].codes[row] = -1;
    }
}

/* Walk the object at p (at '{'), whose values may nest ``depth_left`` levels; returns
 * the position after its '}' or NULL. */
static const char *scan_object(Field *fields, Py_ssize_t n_fields, Memo *memo, int where, Py_ssize_t row,
                               const char *p, const char *end, int want_args, int depth_left) {
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return p + 1;
    Memo *own = memo + where * MEMO_PLACES;
    for (Py_ssize_t place = 0; p < end; place++) {
        if (*p != '"') return NULL;
        const char *key = p + 1, *q;
        Py_ssize_t key_len;
        Field *f;
        Memo *m = place < MEMO_PLACES ? &own[place] : NULL;
        if (m && m->key && spelled_at(m->key, m->len, key, end)) {
            /* the key this place held on the line before */
            key_len = m->len;
            q = key + key_len + 1;
            f = m->field;
        } else {
            q = scan_string(p, end);
            if (!q) return NULL;
            key_len = q - key - 1;
            f = lookup(own, place, fields, n_fields, where, key, key_len);
        }
        p = skip_ws(q, end);
        if (p >= end || *p != ':') return NULL;
        p = skip_ws(p + 1, end);
        if (p >= end) return NULL;
        if (f) {
            p = read_field(f, row, p, end);
        } else if (where == WHERE_TOP && key_len == 4 && memcmp(key, "args", 4) == 0) {
            /* args: an object (or null, as if absent); anything else breaks the line */
            clear_args(fields, n_fields, row);
            if (*p == '{' && want_args && depth_left >= 1)
                p = scan_object(fields, n_fields, memo, WHERE_ARGS, row, p, end, 0, depth_left - 1);
            else
                p = *p == '{' || *p == 'n' ? skip_value(p, end, depth_left) : NULL;
        } else {
            p = skip_value(p, end, depth_left);
        }
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == '}') return p + 1;
        return NULL;
    }
    return NULL;
}

static void free_fields(Field *fields, Py_ssize_t n) {
    if (!fields) return;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_XDECREF(fields[k].values_obj);
        Py_XDECREF(fields[k].valid_obj);
        free(fields[k].entries);
        free(fields[k].slots);
    }
    free(fields);
}

/* The lines of buf[0:n]: its line breaks, and a last line without one. A loop the
   compiler turns into vector compares, in blocks whose byte counters cannot wrap:
   several times faster than finding each break with memchr. */
static Py_ssize_t count_lines(const char *buf, Py_ssize_t n) {
    Py_ssize_t breaks = 0;
    for (Py_ssize_t at = 0; at < n; at += 255) {
        Py_ssize_t stop = n - at < 255 ? n - at : 255;
        uint8_t block = 0;
        for (Py_ssize_t i = 0; i < stop; i++) block += buf[at + i] == '\n';
        breaks += block;
    }
    return breaks + (n > 0 && buf[n - 1] != '\n');
}

static PyObject *scan_lines(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *spec;
    int max_depth;
    if (!PyArg_ParseTuple(args, "y*O!i:scan_lines", &data, &PyTuple_Type, &spec, &max_depth)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_fields = PyTuple_GET_SIZE(spec);
    Field *fields = calloc(n_fields ? n_fields : 1, sizeof(Field));
    PyObject *starts_obj = NULL, *status_obj = NULL;
    if (!fields) { PyErr_NoMemory(); goto done; }
    const char *buf = data.buf, *end = buf + data.len;
    Py_ssize_t n_lines = count_lines(buf, data.len);
    int want_args = 0;
    for (Py_ssize_t k = 0; k < n_fields; k++) {
        Field *f = &fields[k];
        const char *key;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spec, k), "iy#iLL", &f->where, &key, &f->key_len, &f->kind, &f->lo,
                              &f->hi))
            goto done;
        f->key = key;
        f->last = -1;
        want_args |= f->where == WHERE_ARGS;
        int text = f->kind == KIND_STR || f->kind == KIND_PHASE;
        Py_ssize_t width = text ? (Py_ssize_t)sizeof(int32_t) : (Py_ssize_t)sizeof(int64_t);
        f->valid_obj = PyBytes_FromStringAndSize(NULL, n_lines);
        f->values_obj = PyBytes_FromStringAndSize(NULL, width * n_lines);
        if (!f->valid_obj || !f->values_obj) goto done;
        f->valid = (uint8_t *)PyBytes_AS_STRING(f->valid_obj);
        memset(f->valid, 0, n_lines);
        if (f->kind == KIND_STR || f->kind == KIND_PHASE) {
            f->codes = (int32_t *)PyBytes_AS_STRING(f->values_obj);
            memset(f->codes, 0xff, sizeof(int32_t) * n_lines);
        } else {
            f->ints = (int64_t *)PyBytes_AS_STRING(f->values_obj);
            memset(f->ints, 0, sizeof(int64_t) * n_lines);
        }
    }
    starts_obj = PyBytes_FromStringAndSize(NULL, sizeof(int64_t) * (n_lines + 1));
    status_obj = PyBytes_FromStringAndSize(NULL, n_lines);
    if (!starts_obj || !status_obj) goto done;
    int64_t *starts = (int64_t *)PyBytes_AS_STRING(starts_obj);
    uint8_t *status = (uint8_t *)PyBytes_AS_STRING(status_obj);

    Memo memo[2 * MEMO_PLACES];
    memset(memo, 0, sizeof(memo));
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t row = 0;
    for (const char *p = buf; p < end; row++) {
        const char *nl = memchr(p, '\n', end - p);
        const char *line_end = nl ? nl : end;
        starts[row] = p - buf;
        const char *q = skip_ws(p, line_end);
        if (q >= line_end || *q != '{') {
            status[row] = LINE_OTHER;
        } else {
            /* the line's object is level 1: its values may nest max_depth - 1 more */
            q = scan_object(fields, n_fields, memo, WHERE_TOP, row, q, line_end, want_args, max_depth - 1);
            if (q) {
                q = skip_ws(q, line_end);
                if (q < line_end && *q == ',') q = skip_ws(q + 1, line_end);
            }
            status[row] = (q && q == line_end) ? LINE_EVENT : LINE_UNREAD;
        }
        p = nl ? nl + 1 : end;
    }
    starts[n_lines] = data.len;
    Py_END_ALLOW_THREADS

    PyObject *columns = PyList_New(n_fields);
    if (!columns) goto done;
    for (Py_ssize_t k = 0; k < n_fields; k++) {
        Field *f = &fields[k];
        PyObject *item;
        if (f->kind == KIND_STR || f->kind == KIND_PHASE) {
            PyObject *distinct = PyList_New(f->n_entries);
            if (!distinct) { Py_DECREF(columns); goto done; }
            for (Py_ssize_t e = 0; e < f->n_entries; e++) {
                PyObject *raw = PyBytes_FromStringAndSize(f->entries[e].ptr, f->entries[e].len);
                if (!raw) { Py_DECREF(distinct); Py_DECREF(columns); goto done; }
                PyList_SET_ITEM(distinct, e, raw);
            }
            item = Py_BuildValue("(NO)", distinct, f->values_obj);
        } else {
            item = Py_BuildValue("(OO)", f->values_obj, f->valid_obj);
        }
        if (!item) { Py_DECREF(columns); goto done; }
        PyList_SET_ITEM(columns, k, item);
    }
    result = Py_BuildValue("(OON)", starts_obj, status_obj, columns);
done:
    Py_XDECREF(starts_obj);
    Py_XDECREF(status_obj);
    free_fields(fields, n_fields);
    PyBuffer_Release(&data);
    return result;
}

/* The interval sweeps of the summary, in sweeps.c. */
PyObject *sweeps_innermost(PyObject *self, PyObject *args);
PyObject *sweeps_union(PyObject *self, PyObject *args);
PyObject *sweeps_masks(PyObject *self, PyObject *args);
PyObject *sweeps_cover(PyObject *self, PyObject *args);
PyObject *sweeps_steps(PyObject *self, PyObject *args);
PyObject *sweeps_across(PyObject *self, PyObject *args);
PyObject *sweeps_extents(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"scan_lines", scan_lines, METH_VARARGS,
     "scan_lines(data, fields, max_depth) -> (starts, status, columns): see dftrace.analysis.read.decode."},
    {"innermost", sweeps_innermost, METH_VARARGS,
     "innermost(tid, ts, end, level, level_valid, group, order) -> (groups, starts, ends, self_us) or None: "
     "see sweeps.c."},
    {"union", sweeps_union, METH_VARARGS, "union(key, starts, ends, n_keys) -> (rows, starts, ends): see sweeps.c."},
    {"masks", sweeps_masks, METH_VARARGS,
     "masks(group, start, end, size, alone_bit) -> (totals, alone_starts, alone_ends): see sweeps.c."},
    {"cover", sweeps_cover, METH_VARARGS,
     "cover(pieces, size, alone_bit, emit_bit) -> (totals, alone_starts, alone_ends, emit_starts, emit_ends) "
     "or None: see sweeps.c."},
    {"steps", sweeps_steps, METH_VARARGS,
     "steps(code, start, end, n, is_work, cuts, epoch_span[, after_work[, cut_ends]]) -> (rows, starts, ends, "
     "counts): see sweeps.c."},
    {"across", sweeps_across, METH_VARARGS,
     "across(code, start, dur, order) -> (rows, counts, starts, lows, middles, highs, slowest): see sweeps.c."},
    {"extents", sweeps_extents, METH_VARARGS,
     "extents(keys, k, start, end, values, taken) -> (rows, starts, ends, counts, sums): see sweeps.c."},
    {NULL, NULL, 0, NULL}};

/* The module keeps no state (its functions read only their arguments), so every
   interpreter of a process can load its own, each with its own GIL. */
static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dftrace.analysis.runtime._kernels",
                                    "Column extraction from trace lines, and the summary's interval sweeps.",
                                    0, methods, slots};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModuleDef_Init(&module); }
