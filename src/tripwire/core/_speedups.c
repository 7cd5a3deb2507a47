/* The loop watcher's per-call bookkeeping, compiled: an optional accelerator for
 * tripwire.core.watch; and, below it, the other hot spots of a tool span's end: the volatile-key
 * walk and the signature of JSON text (tripwire.core.signature), the mapping of the common tool
 * span (tripwire.otel.conventions binds the attribute keys) and the call-id memory
 * (tripwire.otel.processor). Each has a Python twin that stays the reference.
 *
 * tripwire.core.watch holds the reference implementation in Python (RunState, evaluate) and is
 * the only documentation of what happens here. This module does the same bookkeeping on the
 * same per-run state for every call (the key ring and its counts, the period runs, the evidence
 * rings, error/result streaks, revisits) and answers the common case, "no rule tripped and the
 * run is working", without running any Python. Everything else (failures, the rules that
 * tripped, the verdict) is handed to the same Python functions the reference uses, bound at
 * import time by watch.py. tests/core/test_speedups.py checks the two implementations against
 * each other call by call.
 *
 * Differences in representation, none visible in behaviour:
 * - the window's keys are counted in an open-addressing table keyed by a 32-bit fold of the key
 *   (equality is still Python ==), not a dict;
 * - period runs, results, marks and the revisit memory are C arrays; the attributes of the
 *   same names return fresh Python copies (the Python helpers only read them).
 *
 * Set TRIPWIRE_NO_EXTENSIONS=1 to run the reference implementation instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ---- bound by tripwire.core.watch (bind()) ------------------------------------------------ */

static PyObject *py_failure_step = NULL; /* _failure_step(state, call, sig, args_key, index, policy, normalizer) */
static PyObject *py_judge = NULL;        /* _judge(state, call, sig, key, hits, index, policy, normalizer, now_s, prior) */
static PyObject *py_quiet = NULL;        /* _quiet(state, call, index, policy, normalizer) */
static PyObject *tool_args_mode = NULL;  /* KeyMode.TOOL_ARGS */
static PyObject *verdict_working = NULL; /* Verdict.WORKING */

static PyObject *s_tool, *s_arguments, *s_result_digest, *s_progress, *s_error_type, *s_retryable;
static PyObject *s_key, *s_signature, *s_tool_signature, *s_verdict, *s_window, *s_trip_limits;
static PyObject *s_revisit, *s_revisit_share, *s_revisit_memory, *s_max_period;

/* ---- attribute reads on the hot path ---------------------------------------------------------
 * ToolCall and Signature are msgspec Structs whose fields are member descriptors. For the type
 * seen last, the descriptor is kept and called directly, skipping the generic lookup; any other
 * object goes through PyObject_GetAttr. */

typedef struct {
    PyObject *name;  /* interned attribute name */
    PyTypeObject *type;
    PyObject *descr; /* a member descriptor of `type` for `name` */
} AttrCache;

static AttrCache a_tool, a_arguments, a_result_digest, a_progress, a_error_type, a_retryable, a_key;

static PyObject *
get_attr(PyObject *obj, AttrCache *c)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type == c->type)
        return Py_TYPE(c->descr)->tp_descr_get(c->descr, obj, (PyObject *)type);
    PyObject *value = PyObject_GetAttr(obj, c->name);
    if (value == NULL)
        return NULL;
    PyObject *descr = PyObject_GetAttr((PyObject *)type, c->name);
    if (descr == NULL) {
        PyErr_Clear();
        return value;
    }
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_INCREF(type);
        Py_XSETREF(c->type, type);
        Py_XSETREF(c->descr, descr);
    }
    else {
        Py_DECREF(descr);
    }
    return value;
}

/* ---- the per-run state --------------------------------------------------------------------- */

/* A key's 32-bit table hash: its low 64 bits folded (signature keys are uniform digests), or
 * its Python hash folded when it is not an int. Equality is always Python ==. */
typedef uint32_t khash_t;

typedef struct {
    PyObject *key;   /* owned; NULL marks an empty slot */
    khash_t h;
    uint32_t count;
} Entry;

typedef struct {
    PyObject_HEAD
    Py_ssize_t window;
    Py_ssize_t max_period;
    Py_ssize_t calls;
    PyObject **keys;       /* ring of `window` owned keys (NULL = empty slot) */
    khash_t *khash;        /* their hashes */
    Entry *table;          /* key -> occurrences in the ring */
    size_t tmask;
    int tshift;
    PyObject **recent;     /* the last max_period keys, newest first (owned, NULL = none) */
    khash_t *rhash;
    Py_ssize_t *runs;      /* runs[p], p = 1..max_period */
    Py_ssize_t nruns;      /* how many runs[p] are non-zero */
    int64_t *results;      /* ring of result hashes (0 = none), NULL until the first result */
    PyObject **progress;   /* ring of owned fingerprints (NULL = None), NULL until the first */
    unsigned char *marks;  /* ring of marks (bit 0 failed, bit 1 revisit), NULL until needed */
    uint64_t *seen;        /* revisit memory, NULL until the first result */
    Py_ssize_t seen_len;
    Py_ssize_t seen_at;
    PyObject *failures;    /* dict or NULL (None) */
    PyObject *last_tool, *last_result, *last_error; /* owned or NULL (None) */
    PyObject *lease;       /* owned or NULL (None) */
    PyObject *current;     /* owned or NULL (None) */
    int current_working;   /* current is not None and current.verdict is Verdict.WORKING */
    Py_ssize_t outcome_run, revisit_run, error_run, failed_recent, revisits_recent;
    Py_ssize_t last_trip, confirm_streak;
    /* the policy this state was last evaluated with, and what the hot path needs of it */
    PyObject *policy;
    int key_is_args;
    int track_revisit;
    Py_ssize_t revisit_memory;
    long long limits[6];
} RunState;

static PyTypeObject RunStateType;

#define FIB 2654435769u

static inline size_t
home(const RunState *s, khash_t h)
{
    return (size_t)((uint32_t)(h * FIB) >> s->tshift);
}

/* The key's 64-bit table hash: an int's low 64 bits (signature keys are uniform digests),
 * any other key's Python hash. Returns 0 with an exception set on error. */
static int
key_hash(PyObject *key, khash_t *out)
{
    if (PyLong_Check(key)) {
        unsigned long long v = PyLong_AsUnsignedLongLongMask(key);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return 0;
        *out = (khash_t)(v ^ (v >> 32));
        return 1;
    }
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1)
        return 0;
    *out = (khash_t)((uint64_t)h ^ ((uint64_t)h >> 32));
    return 1;
}

/* 1 when a and b (hashes ha, hb) are equal keys, 0 when not, -1 on error. */
static inline int
same_key(PyObject *a, khash_t ha, PyObject *b, khash_t hb)
{
    if (a == NULL || ha != hb)
        return 0;
    if (a == b)
        return 1;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The slot holding `key`, or the empty slot where it would go; (size_t)-1 on error. */
static size_t
table_find(RunState *s, PyObject *key, khash_t h)
{
    Entry *t = s->table;
    size_t i = home(s, h);
    while (t[i].key != NULL) {
        int c = same_key(t[i].key, t[i].h, key, h);
        if (c < 0)
            return (size_t)-1;
        if (c)
            return i;
        i = (i + 1) & s->tmask;
    }
    return i;
}

static void
table_delete(RunState *s, size_t i)
{
    Entry *t = s->table;
    size_t j = i;
    Py_CLEAR(t[i].key);
    for (;;) {
        j = (j + 1) & s->tmask;
        if (t[j].key == NULL)
            break;
        size_t k = home(s, t[j].h);
        /* t[j] stays unless its home lies outside the cyclic interval (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        t[i] = t[j];
        t[j].key = NULL;
        t[j].count = 0;
        i = j;
    }
}

static PyObject *
opt(PyObject *o)
{
    /* a new reference to o, or to None for NULL */
    if (o == NULL)
        Py_RETURN_NONE;
    Py_INCREF(o);
    return o;
}

static int
RunState_init_arrays(RunState *s, Py_ssize_t window, Py_ssize_t max_period)
{
    s->window = window;
    s->max_period = max_period;
    size_t cap = 4;
    int bits = 2;
    while (cap < (size_t)window + (size_t)window / 2 + 1) { /* load at most 2/3 */
        cap <<= 1;
        bits++;
    }
    s->tmask = cap - 1;
    s->tshift = 32 - bits;
    s->keys = PyMem_Calloc((size_t)window, sizeof(PyObject *));
    s->khash = PyMem_Calloc((size_t)window, sizeof(khash_t));
    s->table = PyMem_Calloc(cap, sizeof(Entry));
    s->recent = PyMem_Calloc((size_t)max_period, sizeof(PyObject *));
    s->rhash = PyMem_Calloc((size_t)max_period, sizeof(khash_t));
    s->runs = PyMem_Calloc((size_t)max_period + 1, sizeof(Py_ssize_t));
    if (!s->keys || !s->khash || !s->table || !s->recent || !s->rhash || !s->runs) {
        PyErr_NoMemory();
        return -1;
    }
    s->last_trip = -1000000000;
    return 0;
}

static PyObject *
RunState_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"window", "max_period", NULL};
    Py_ssize_t window, max_period;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn:RunState", kwlist, &window, &max_period))
        return NULL;
    if (window < 1 || max_period < 1 || window > (1 << 28) || max_period > (1 << 28)) {
        PyErr_SetString(PyExc_ValueError, "RunState: window and max_period must be from 1 to 2**28");
        return NULL;
    }
    RunState *s = (RunState *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    if (RunState_init_arrays(s, window, max_period) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static int
RunState_traverse(RunState *s, visitproc visit, void *arg)
{
    if (s->keys)
        for (Py_ssize_t i = 0; i < s->window; i++)
            Py_VISIT(s->keys[i]);
    if (s->table)
        for (size_t i = 0; i <= s->tmask; i++)
            Py_VISIT(s->table[i].key);
    if (s->recent)
        for (Py_ssize_t i = 0; i < s->max_period; i++)
            Py_VISIT(s->recent[i]);
    if (s->progress)
        for (Py_ssize_t i = 0; i < s->window; i++)
            Py_VISIT(s->progress[i]);
    Py_VISIT(s->failures);
    Py_VISIT(s->last_tool);
    Py_VISIT(s->last_result);
    Py_VISIT(s->last_error);
    Py_VISIT(s->lease);
    Py_VISIT(s->current);
    Py_VISIT(s->policy);
    return 0;
}

static int
RunState_clear(RunState *s)
{
    if (s->keys)
        for (Py_ssize_t i = 0; i < s->window; i++)
            Py_CLEAR(s->keys[i]);
    if (s->table) {
        for (size_t i = 0; i <= s->tmask; i++) {
            Py_CLEAR(s->table[i].key);
            s->table[i].count = 0;
        }
    }
    if (s->recent)
        for (Py_ssize_t i = 0; i < s->max_period; i++)
            Py_CLEAR(s->recent[i]);
    if (s->progress)
        for (Py_ssize_t i = 0; i < s->window; i++)
            Py_CLEAR(s->progress[i]);
    Py_CLEAR(s->failures);
    Py_CLEAR(s->last_tool);
    Py_CLEAR(s->last_result);
    Py_CLEAR(s->last_error);
    Py_CLEAR(s->lease);
    Py_CLEAR(s->current);
    s->current_working = 0;
    Py_CLEAR(s->policy);
    return 0;
}

static void
RunState_dealloc(RunState *s)
{
    PyObject_GC_UnTrack(s);
    RunState_clear(s);
    PyMem_Free(s->keys);
    PyMem_Free(s->khash);
    PyMem_Free(s->table);
    PyMem_Free(s->recent);
    PyMem_Free(s->rhash);
    PyMem_Free(s->runs);
    PyMem_Free(s->results);
    PyMem_Free(s->progress);
    PyMem_Free(s->marks);
    PyMem_Free(s->seen);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* ---- RunState.new(policy) and __sizeof__ --------------------------------------------------- */

static PyObject *
RunState_classnew(PyObject *cls, PyObject *policy)
{
    PyObject *window = PyObject_GetAttr(policy, s_window);
    if (window == NULL)
        return NULL;
    PyObject *mp = PyObject_GetAttr(policy, s_max_period);
    if (mp == NULL) {
        Py_DECREF(window);
        return NULL;
    }
    if (mp == Py_None || !PyObject_IsTrue(mp)) {
        Py_DECREF(mp);
        mp = PyLong_FromLong(1);
        if (mp == NULL) {
            Py_DECREF(window);
            return NULL;
        }
    }
    PyObject *state = PyObject_CallFunctionObjArgs(cls, window, mp, NULL);
    Py_DECREF(window);
    Py_DECREF(mp);
    return state;
}

static PyObject *
RunState_sizeof(RunState *s, PyObject *Py_UNUSED(ignored))
{
    size_t n = (size_t)Py_TYPE(s)->tp_basicsize;
    size_t w = (size_t)s->window, mp = (size_t)s->max_period;
    n += w * (sizeof(PyObject *) + sizeof(khash_t));
    n += (s->tmask + 1) * sizeof(Entry);
    n += mp * (sizeof(PyObject *) + sizeof(khash_t)) + (mp + 1) * sizeof(Py_ssize_t);
    if (s->results)
        n += w * sizeof(int64_t);
    if (s->progress)
        n += w * sizeof(PyObject *);
    if (s->marks)
        n += w;
    if (s->seen)
        n += (size_t)s->seen_len * sizeof(uint64_t);
    return PyLong_FromSize_t(n);
}

/* ---- attributes: the reference implementation's names ------------------------------------- */

/* A new list of the n objects in items (None for NULL). */
static PyObject *
list_of(PyObject **items, Py_ssize_t n)
{
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(out, i, opt(items[i]));
    return out;
}

/* out[key] = n; -1 on error. */
static int
set_count(PyObject *out, PyObject *key, Py_ssize_t n)
{
    PyObject *v = PyLong_FromSsize_t(n);
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(out, key, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *
get_keys(RunState *s, void *c)
{
    return list_of(s->keys, s->window);
}

static PyObject *
get_counts(RunState *s, void *c)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i <= s->tmask; i++) {
        if (s->table[i].key != NULL && set_count(out, s->table[i].key, s->table[i].count) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *
get_recent(RunState *s, void *c)
{
    return list_of(s->recent, s->max_period);
}

static PyObject *
get_runs(RunState *s, void *c)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (Py_ssize_t p = 1; p <= s->max_period; p++) {
        if (s->runs[p] == 0)
            continue;
        PyObject *k = PyLong_FromSsize_t(p);
        int rc = k == NULL ? -1 : set_count(out, k, s->runs[p]);
        Py_XDECREF(k);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *
get_results(RunState *s, void *c)
{
    if (s->results == NULL)
        Py_RETURN_NONE;
    PyObject *out = PyList_New(s->window);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < s->window; i++) {
        PyObject *v = PyLong_FromLongLong(s->results[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *
get_progress(RunState *s, void *c)
{
    if (s->progress == NULL)
        Py_RETURN_NONE;
    return list_of(s->progress, s->window);
}

static PyObject *
get_marks(RunState *s, void *c)
{
    if (s->marks == NULL)
        Py_RETURN_NONE;
    return PyByteArray_FromStringAndSize((const char *)s->marks, s->window);
}

static PyObject *
get_seen(RunState *s, void *c)
{
    if (s->seen == NULL)
        Py_RETURN_NONE;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, s->seen_len * 8);
    if (out == NULL)
        return NULL;
    unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < s->seen_len; i++)
        for (int k = 0; k < 8; k++)
            b[i * 8 + k] = (unsigned char)(s->seen[i] >> (8 * k));
    return out;
}

/* Object attributes that Python may set (None is stored as NULL). */
#define OBJ_ATTR(name)                                                                        \
    static PyObject *get_##name(RunState *s, void *c) { return opt(s->name); }                \
    static int set_##name(RunState *s, PyObject *v, void *c)                                  \
    {                                                                                         \
        if (v == NULL) {                                                                      \
            PyErr_SetString(PyExc_AttributeError, "cannot delete " #name);                   \
            return -1;                                                                        \
        }                                                                                     \
        PyObject *old = s->name;                                                              \
        if (v == Py_None) {                                                                   \
            s->name = NULL;                                                                   \
        }                                                                                     \
        else {                                                                                \
            Py_INCREF(v);                                                                     \
            s->name = v;                                                                      \
        }                                                                                     \
        Py_XDECREF(old);                                                                      \
        return 0;                                                                             \
    }

OBJ_ATTR(failures)
OBJ_ATTR(last_tool)
OBJ_ATTR(last_result)
OBJ_ATTR(last_error)
OBJ_ATTR(lease)

static PyObject *
get_current(RunState *s, void *c)
{
    return opt(s->current);
}

static int
set_current(RunState *s, PyObject *v, void *c)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete current");
        return -1;
    }
    int working = 0;
    if (v != Py_None) {
        PyObject *verdict = PyObject_GetAttr(v, s_verdict);
        if (verdict == NULL)
            return -1;
        working = verdict == verdict_working;
        Py_DECREF(verdict);
    }
    PyObject *old = s->current;
    if (v == Py_None) {
        s->current = NULL;
    }
    else {
        Py_INCREF(v);
        s->current = v;
    }
    s->current_working = working;
    Py_XDECREF(old);
    return 0;
}

static PyGetSetDef RunState_getset[] = {
    {"keys", (getter)get_keys, NULL, "Ring of the last window keys (a copy).", NULL},
    {"counts", (getter)get_counts, NULL, "Occurrences of each key in the ring (a copy).", NULL},
    {"recent", (getter)get_recent, NULL, "The last max_period keys, newest first (a copy).", NULL},
    {"runs", (getter)get_runs, NULL, "Non-zero period runs by period (a copy).", NULL},
    {"results", (getter)get_results, NULL, "Ring of result hashes, or None (a copy).", NULL},
    {"progress", (getter)get_progress, NULL, "Ring of progress fingerprints, or None (a copy).", NULL},
    {"marks", (getter)get_marks, NULL, "Ring of per-call marks, or None (a copy).", NULL},
    {"seen", (getter)get_seen, NULL, "The revisit memory, or None (a copy).", NULL},
    {"failures", (getter)get_failures, (setter)set_failures, NULL, NULL},
    {"last_tool", (getter)get_last_tool, (setter)set_last_tool, NULL, NULL},
    {"last_result", (getter)get_last_result, (setter)set_last_result, NULL, NULL},
    {"last_error", (getter)get_last_error, (setter)set_last_error, NULL, NULL},
    {"lease", (getter)get_lease, (setter)set_lease, NULL, NULL},
    {"current", (getter)get_current, (setter)set_current, NULL, NULL},
    {NULL},
};

static PyMemberDef RunState_members[] = {
    {"calls", T_PYSSIZET, offsetof(RunState, calls), READONLY, NULL},
    {"seen_at", T_PYSSIZET, offsetof(RunState, seen_at), READONLY, NULL},
    {"outcome_run", T_PYSSIZET, offsetof(RunState, outcome_run), READONLY, NULL},
    {"revisit_run", T_PYSSIZET, offsetof(RunState, revisit_run), READONLY, NULL},
    {"error_run", T_PYSSIZET, offsetof(RunState, error_run), READONLY, NULL},
    {"failed_recent", T_PYSSIZET, offsetof(RunState, failed_recent), READONLY, NULL},
    {"revisits_recent", T_PYSSIZET, offsetof(RunState, revisits_recent), READONLY, NULL},
    {"last_trip", T_PYSSIZET, offsetof(RunState, last_trip), 0, NULL},
    {"confirm_streak", T_PYSSIZET, offsetof(RunState, confirm_streak), 0, NULL},
    {NULL},
};

static PyMethodDef RunState_methods[] = {
    {"new", (PyCFunction)RunState_classnew, METH_O | METH_CLASS,
     "new(policy)\n--\n\nEmpty state sized for policy."},
    {"__sizeof__", (PyCFunction)RunState_sizeof, METH_NOARGS, NULL},
    {NULL},
};

static PyTypeObject RunStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tripwire.core._speedups.RunState",
    .tp_doc = "All mutable per-run state of the loop watcher (compiled; see tripwire.core.watch).",
    .tp_basicsize = sizeof(RunState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = RunState_new,
    .tp_dealloc = (destructor)RunState_dealloc,
    .tp_traverse = (traverseproc)RunState_traverse,
    .tp_clear = (inquiry)RunState_clear,
    .tp_getset = RunState_getset,
    .tp_members = RunState_members,
    .tp_methods = RunState_methods,
};

/* ---- evaluate -------------------------------------------------------------------------------- */

static int
load_policy(RunState *s, PyObject *policy)
{
    PyObject *v = NULL;
    Py_ssize_t window;
    v = PyObject_GetAttr(policy, s_window);
    if (v == NULL)
        return -1;
    window = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (window == -1 && PyErr_Occurred())
        return -1;
    if (window != s->window) {
        PyErr_Format(PyExc_ValueError,
                     "the policy's window (%zd) differs from the run state's (%zd): "
                     "build the state with RunState.new(policy)",
                     window, s->window);
        return -1;
    }
    v = PyObject_GetAttr(policy, s_key);
    if (v == NULL)
        return -1;
    s->key_is_args = v == tool_args_mode;
    Py_DECREF(v);
    v = PyObject_GetAttr(policy, s_trip_limits);
    if (v == NULL)
        return -1;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 6) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_TypeError, "policy.trip_limits must be a tuple of 6 ints");
        return -1;
    }
    for (int i = 0; i < 6; i++) {
        s->limits[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(v, i));
        if (s->limits[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
    }
    Py_DECREF(v);
    PyObject *rv = PyObject_GetAttr(policy, s_revisit);
    if (rv == NULL)
        return -1;
    PyObject *rs = PyObject_GetAttr(policy, s_revisit_share);
    if (rs == NULL) {
        Py_DECREF(rv);
        return -1;
    }
    s->track_revisit = rv != Py_None || rs != Py_None;
    Py_DECREF(rv);
    Py_DECREF(rs);
    v = PyObject_GetAttr(policy, s_revisit_memory);
    if (v == NULL)
        return -1;
    s->revisit_memory = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (s->revisit_memory == -1 && PyErr_Occurred())
        return -1;
    if (s->revisit_memory < 1) {
        PyErr_SetString(PyExc_ValueError, "policy.revisit_memory must be at least 1");
        return -1;
    }
    Py_INCREF(policy);
    Py_XSETREF(s->policy, policy);
    return 0;
}

static const char *const param_names[6] = {"state", "call", "policy", "normalizer", "signature", "now_s"};
static PyObject *param_interned[6];

static int
parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    if (nargs > 4) {
        PyErr_Format(PyExc_TypeError, "evaluate() takes 4 positional arguments but %zd were given", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            int found = -1;
            for (int j = 0; j < 6; j++) {
                if (name == param_interned[j]) {
                    found = j;
                    break;
                }
            }
            for (int j = 0; found < 0 && j < 6; j++) {
                if (PyUnicode_CompareWithASCIIString(name, param_names[j]) == 0)
                    found = j;
            }
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "evaluate() got an unexpected keyword argument '%U'", name);
                return -1;
            }
            if (out[found] != NULL) {
                PyErr_Format(PyExc_TypeError, "evaluate() got multiple values for argument '%s'",
                             param_names[found]);
                return -1;
            }
            out[found] = args[nargs + k];
        }
    }
    for (int j = 0; j < 4; j++) {
        if (out[j] == NULL) {
            PyErr_Format(PyExc_TypeError, "evaluate() missing required argument '%s'", param_names[j]);
            return -1;
        }
    }
    return 0;
}

/* Track a (signature, result) pair in the revisit memory; 1 when it was seen before. */
static int
track_revisit(RunState *s, PyObject *args_key, Py_hash_t result_hash)
{
    if (s->seen == NULL) {
        s->seen = PyMem_Calloc((size_t)s->revisit_memory, sizeof(uint64_t));
        if (s->seen == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->seen_len = s->revisit_memory;
    }
    unsigned long long low = PyLong_AsUnsignedLongLongMask(args_key);
    if (low == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    uint64_t packed = (uint64_t)low ^ (uint64_t)result_hash;
    if (packed == 0)
        packed = 1;
    for (Py_ssize_t i = 0; i < s->seen_len; i++) {
        if (s->seen[i] == packed) {
            s->revisit_run++;
            return 1;
        }
    }
    s->revisit_run = 0;
    s->seen[s->seen_at] = packed;
    s->seen_at = (s->seen_at + 1) % s->seen_len;
    return 0;
}

static int
ensure_marks(RunState *s)
{
    if (s->marks == NULL) {
        s->marks = PyMem_Calloc((size_t)s->window, 1);
        if (s->marks == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

static PyObject *
evaluate(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (parse_args(args, nargs, kwnames, a) < 0)
        return NULL;
    if (py_judge == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tripwire.core._speedups is not bound; import tripwire.core.watch");
        return NULL;
    }
    if (!PyObject_TypeCheck(a[0], &RunStateType)) {
        PyErr_Format(PyExc_TypeError, "evaluate() needs a RunState built by RunState.new(policy), not %.100s",
                     Py_TYPE(a[0])->tp_name);
        return NULL;
    }
    RunState *s = (RunState *)a[0];
    PyObject *call = a[1], *policy = a[2], *normalizer = a[3];
    PyObject *signature = a[4], *now_s = a[5] ? a[5] : Py_None;

    PyObject *sig = NULL, *args_key = NULL, *key = NULL, *tool = NULL, *digest = NULL;
    PyObject *progress = NULL, *error = NULL, *retryable = NULL, *prior = NULL, *result = NULL;
    PyObject *tmp = NULL;

    if (policy != s->policy && load_policy(s, policy) < 0)
        return NULL;

    tool = get_attr(call, &a_tool);
    if (tool == NULL)
        goto error;
    if (signature == NULL || signature == Py_None) {
        PyObject *arguments = get_attr(call, &a_arguments);
        if (arguments == NULL)
            goto error;
        PyObject *margs[3] = {normalizer, tool, arguments};
        sig = PyObject_VectorcallMethod(s_signature, margs, 3, NULL);
        Py_DECREF(arguments);
        if (sig == NULL)
            goto error;
    }
    else {
        Py_INCREF(signature);
        sig = signature;
    }
    args_key = get_attr(sig, &a_key);
    if (args_key == NULL)
        goto error;
    if (s->key_is_args) {
        Py_INCREF(args_key);
        key = args_key;
    }
    else {
        PyObject *margs[2] = {normalizer, tool};
        tmp = PyObject_VectorcallMethod(s_tool_signature, margs, 2, NULL);
        if (tmp == NULL)
            goto error;
        key = PyObject_GetAttr(tmp, s_key);
        Py_CLEAR(tmp);
        if (key == NULL)
            goto error;
    }
    khash_t h;
    if (!key_hash(key, &h))
        goto error;

    Py_ssize_t window = s->window;
    Py_ssize_t index = ++s->calls;
    Py_ssize_t slot = (index - 1) % window;

    /* the call goes into the ring */
    PyObject *old = s->keys[slot];
    if (old != NULL) {
        size_t i = table_find(s, old, s->khash[slot]);
        if (i == (size_t)-1)
            goto error;
        if (--s->table[i].count == 0)
            table_delete(s, i);
        s->keys[slot] = NULL;
        Py_DECREF(old);
    }
    Py_INCREF(key);
    s->keys[slot] = key;
    s->khash[slot] = h;
    size_t at = table_find(s, key, h);
    if (at == (size_t)-1)
        goto error;
    if (s->table[at].key == NULL) {
        Py_INCREF(key);
        s->table[at].key = key;
        s->table[at].h = h;
        s->table[at].count = 0;
    }
    Py_ssize_t hits = ++s->table[at].count;

    /* period runs: the run at period p continues where this key equals the key p calls back,
     * and breaks everywhere else */
    Py_ssize_t mp = s->max_period, nruns = 0;
    for (Py_ssize_t p = 0; p < mp; p++) {
        int c = same_key(s->recent[p], s->rhash[p], key, h);
        if (c < 0)
            goto error;
        s->runs[p + 1] = c ? s->runs[p + 1] + 1 : 0;
        nruns += c;
    }
    s->nruns = nruns;
    Py_XDECREF(s->recent[mp - 1]);
    memmove(s->recent + 1, s->recent, (size_t)(mp - 1) * sizeof(PyObject *));
    memmove(s->rhash + 1, s->rhash, (size_t)(mp - 1) * sizeof(khash_t));
    Py_INCREF(key);
    s->recent[0] = key;
    s->rhash[0] = h;

    /* evidence rings */
    digest = get_attr(call, &a_result_digest);
    if (digest == NULL)
        goto error;
    Py_hash_t digest_hash = 0;
    if (digest != Py_None) {
        digest_hash = PyObject_Hash(digest);
        if (digest_hash == -1)
            goto error;
    }
    if (digest != Py_None || s->results != NULL) {
        if (s->results == NULL) {
            s->results = PyMem_Calloc((size_t)window, sizeof(int64_t));
            if (s->results == NULL) {
                PyErr_NoMemory();
                goto error;
            }
        }
        /* 0 marks "no result"; a digest hashing to 0 is stored as 1 */
        s->results[slot] = digest != Py_None ? (digest_hash ? (int64_t)digest_hash : 1) : 0;
    }
    progress = get_attr(call, &a_progress);
    if (progress == NULL)
        goto error;
    if (progress != Py_None || s->progress != NULL) {
        if (s->progress == NULL) {
            s->progress = PyMem_Calloc((size_t)window, sizeof(PyObject *));
            if (s->progress == NULL) {
                PyErr_NoMemory();
                goto error;
            }
        }
        PyObject *was = s->progress[slot];
        if (progress != Py_None) {
            Py_INCREF(progress);
            s->progress[slot] = progress;
        }
        else {
            s->progress[slot] = NULL;
        }
        Py_XDECREF(was);
    }

    /* error streak and failure marks */
    error = get_attr(call, &a_error_type);
    if (error == NULL)
        goto error;
    if (error != Py_None) {
        int c = 0;
        if (s->last_error != NULL) {
            c = PyObject_RichCompareBool(error, s->last_error, Py_EQ);
            if (c < 0)
                goto error;
        }
        s->error_run = c ? s->error_run + 1 : 1;
        Py_INCREF(error);
        Py_XSETREF(s->last_error, error);
    }
    else if (s->error_run) {
        s->error_run = 0;
        Py_CLEAR(s->last_error);
    }
    if (s->marks != NULL || error != Py_None) {
        int failed = error != Py_None;
        if (ensure_marks(s) < 0)
            goto error;
        unsigned char old_mark = s->marks[slot];
        if (old_mark) {
            s->failed_recent -= old_mark & 1;
            s->revisits_recent -= old_mark >> 1;
        }
        s->marks[slot] = (unsigned char)failed;
        s->failed_recent += failed;
    }

    /* same-result streak: only a recorded result can continue or start one */
    if (digest != Py_None) {
        int c = 0;
        if (s->last_result != NULL) {
            c = PyObject_RichCompareBool(digest, s->last_result, Py_EQ);
            if (c < 0)
                goto error;
            if (c) {
                c = s->last_tool != NULL ? PyObject_RichCompareBool(tool, s->last_tool, Py_EQ) : 0;
                if (c < 0)
                    goto error;
            }
        }
        s->outcome_run = c ? s->outcome_run + 1 : 1;
        Py_INCREF(tool);
        Py_XSETREF(s->last_tool, tool);
        Py_INCREF(digest);
        Py_XSETREF(s->last_result, digest);
    }
    else if (s->last_result != NULL || s->outcome_run) {
        s->outcome_run = 0;
        Py_CLEAR(s->last_result);
    }

    /* failures: the Python reference decides (and may end the evaluation) */
    retryable = get_attr(call, &a_retryable);
    if (retryable == NULL)
        goto error;
    int has_failures = 0;
    if (s->failures != NULL) {
        has_failures = PyObject_IsTrue(s->failures);
        if (has_failures < 0)
            goto error;
    }
    if (has_failures || error != Py_None || retryable == Py_False) {
        PyObject *pyindex = PyLong_FromSsize_t(index);
        if (pyindex == NULL)
            goto error;
        PyObject *fargs[7] = {(PyObject *)s, call, sig, args_key, pyindex, policy, normalizer};
        tmp = PyObject_Vectorcall(py_failure_step, fargs, 7, NULL);
        Py_DECREF(pyindex);
        if (tmp == NULL)
            goto error;
        if (!PyTuple_Check(tmp) || PyTuple_GET_SIZE(tmp) != 3) {
            PyErr_SetString(PyExc_TypeError, "_failure_step must return a 3-tuple");
            goto error;
        }
        prior = PyTuple_GET_ITEM(tmp, 0);
        Py_INCREF(prior);
        int decided = PyObject_IsTrue(PyTuple_GET_ITEM(tmp, 1));
        if (decided < 0)
            goto error;
        if (decided) {
            result = PyTuple_GET_ITEM(tmp, 2);
            Py_INCREF(result);
            goto done;
        }
        Py_CLEAR(tmp);
    }

    /* revisits */
    if (digest == Py_None) {
        s->revisit_run = 0;
    }
    else if (s->track_revisit) {
        int r = track_revisit(s, args_key, digest_hash);
        if (r < 0)
            goto error;
        if (r) {
            if (ensure_marks(s) < 0)
                goto error;
            s->marks[slot] |= 2;
            s->revisits_recent++;
        }
    }

    /* the rules: nothing tripped and the run is working is the common case */
    const long long *lim = s->limits;
    if (hits < lim[0] && s->nruns == 0 && s->error_run < lim[1] && s->outcome_run < lim[2] &&
        s->revisit_run < lim[3] && s->revisits_recent < lim[4] && s->failed_recent < lim[5]) {
        if (s->current_working) {
            s->confirm_streak = 0;
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        PyObject *pyindex = PyLong_FromSsize_t(index);
        if (pyindex == NULL)
            goto error;
        PyObject *qargs[5] = {(PyObject *)s, call, pyindex, policy, normalizer};
        result = PyObject_Vectorcall(py_quiet, qargs, 5, NULL);
        Py_DECREF(pyindex);
        goto done;
    }
    {
        PyObject *pyindex = PyLong_FromSsize_t(index);
        PyObject *pyhits = PyLong_FromSsize_t(hits);
        if (pyindex == NULL || pyhits == NULL) {
            Py_XDECREF(pyindex);
            Py_XDECREF(pyhits);
            goto error;
        }
        PyObject *jargs[10] = {(PyObject *)s, call, sig, key, pyhits, pyindex, policy, normalizer,
                               now_s, prior ? prior : Py_None};
        result = PyObject_Vectorcall(py_judge, jargs, 10, NULL);
        Py_DECREF(pyindex);
        Py_DECREF(pyhits);
    }

done:
    Py_XDECREF(tmp);
    Py_XDECREF(sig);
    Py_XDECREF(args_key);
    Py_XDECREF(key);
    Py_XDECREF(tool);
    Py_XDECREF(digest);
    Py_XDECREF(progress);
    Py_XDECREF(error);
    Py_XDECREF(retryable);
    Py_XDECREF(prior);
    return result;

error:
    Py_XDECREF(result);
    result = NULL;
    goto done;
}

/* ---- volatile_free --------------------------------------------------------------------------- */

/* volatile_free(obj, keys, budget) -> True / False / None
 *
 * Walks a value decoded from JSON (dicts, lists, scalars) without recursion: True when no dict
 * anywhere in it has a key in the set `keys`, False when one has, None when the walk would
 * visit more than `budget` entries (the caller then scans the text instead). */
typedef struct {
    PyObject **items;
    Py_ssize_t top, cap;
    PyObject *small[64];
} Stack;

/* Push a dict or list (borrowed: the caller's value keeps it alive); -1 when out of memory. */
static int
stack_push(Stack *st, PyObject *v)
{
    if (st->top == st->cap) {
        PyObject **bigger = PyMem_Malloc((size_t)st->cap * 2 * sizeof(PyObject *));
        if (bigger == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(bigger, st->items, (size_t)st->cap * sizeof(PyObject *));
        if (st->items != st->small)
            PyMem_Free(st->items);
        st->items = bigger;
        st->cap *= 2;
    }
    st->items[st->top++] = v;
    return 0;
}

/* The walk: Py_True, Py_False or Py_None (borrowed), NULL with an exception set. */
static PyObject *
volatile_walk(PyObject *obj, PyObject *keys, Py_ssize_t budget)
{
    Stack st;
    st.items = st.small;
    st.top = 0;
    st.cap = 64;
    PyObject *answer = Py_True;
    st.items[st.top++] = obj;
    while (st.top && answer == Py_True) {
        PyObject *o = st.items[--st.top], *k, *v;
        if (PyDict_CheckExact(o)) {
            budget -= PyDict_GET_SIZE(o);
            if (budget < 0) {
                answer = Py_None;
                break;
            }
            Py_ssize_t pos = 0;
            while (PyDict_Next(o, &pos, &k, &v)) {
                int hit = PySet_Contains(keys, k);
                if (hit != 0) {
                    answer = hit > 0 ? Py_False : NULL;
                    break;
                }
                if ((PyDict_CheckExact(v) || PyList_CheckExact(v)) && stack_push(&st, v) < 0) {
                    answer = NULL;
                    break;
                }
            }
        }
        else if (PyList_CheckExact(o)) {
            Py_ssize_t n = PyList_GET_SIZE(o);
            budget -= n;
            if (budget < 0) {
                answer = Py_None;
                break;
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                v = PyList_GET_ITEM(o, i);
                if ((PyDict_CheckExact(v) || PyList_CheckExact(v)) && stack_push(&st, v) < 0) {
                    answer = NULL;
                    break;
                }
            }
        }
    }
    if (st.items != st.small)
        PyMem_Free(st.items);
    return answer;
}

static PyObject *
volatile_free(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "volatile_free(obj, keys, budget) takes 3 arguments");
        return NULL;
    }
    PyObject *keys = args[1];
    if (!PyAnySet_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "volatile_free: keys must be a set or frozenset");
        return NULL;
    }
    Py_ssize_t budget = PyLong_AsSsize_t(args[2]);
    if (budget == -1 && PyErr_Occurred())
        return NULL;
    PyObject *answer = volatile_walk(args[0], keys, budget);
    Py_XINCREF(answer);
    return answer;
}

/* ---- json_signature ------------------------------------------------------------------------ */

/* Bound by tripwire.core.signature (bind_signature()). */
static PyObject *sig_decode = NULL;     /* the JSON decoder's decode */
static PyObject *sig_decode_errors = NULL; /* what Normalizer.signature catches from it */
static PyObject *sig_encode = NULL;     /* the sorted MessagePack encoder's encode */
static PyObject *sig_hash = NULL;       /* xxhash.xxh3_128_intdigest */
static PyObject *sig_seed = NULL;       /* _seed(tool, kind) */
static PyObject *sig_seeds = NULL;      /* _JSON_SEEDS */
static PyObject *sig_kind = NULL;       /* ArgsKind.JSON */
static PyObject *sig_type = NULL;       /* Signature */
static PyObject *sig_result_hash = NULL; /* xxhash.xxh3_128_hexdigest */
static PyObject *sig_result_seed = NULL; /* the result digests' seed */

/* json_signature(tool, text, keys, max_bytes) -> Signature | None
 *
 * Normalizer.signature's hot path for JSON text holding an object or an array with no volatile
 * key: decode, encode as sorted MessagePack, hash seeded by (tool, JSON). None for anything
 * else (the caller then takes the Python path, which answers every case): text that is not
 * ASCII, empty, over max_bytes, or not opening with "{", "[" or whitespace; text that does not
 * decode to a dict or a list; a value that holds a volatile key or whose walk is over budget;
 * a value MessagePack cannot hold. Exceptions the Python path would not catch propagate. */
static PyObject *json_signature_of(PyObject *tool, PyObject *text, PyObject *keys,
                                   Py_ssize_t max_bytes);

static PyObject *
json_signature(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "json_signature(tool, text, keys, max_bytes) takes 4 arguments");
        return NULL;
    }
    if (sig_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "json_signature: bind_signature() was not called");
        return NULL;
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[3]);
    if (max_bytes == -1 && PyErr_Occurred())
        return NULL;
    return json_signature_of(args[0], args[1], args[2], max_bytes);
}

static PyObject *
json_signature_of(PyObject *tool, PyObject *text, PyObject *keys, Py_ssize_t max_bytes)
{
    if (!PyUnicode_CheckExact(tool) || !PyUnicode_CheckExact(text) || !PyAnySet_Check(keys))
        Py_RETURN_NONE;
    if (!PyUnicode_IS_ASCII(text))
        Py_RETURN_NONE;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (n == 0 || n > max_bytes)
        Py_RETURN_NONE;
    Py_UCS1 first = PyUnicode_1BYTE_DATA(text)[0];
    if (first != '{' && first != '[' && first != ' ' && first != '\t' && first != '\n' &&
        first != '\r')
        Py_RETURN_NONE;
    PyObject *obj = PyObject_CallOneArg(sig_decode, text);
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(sig_decode_errors)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    if (!PyDict_CheckExact(obj) && !PyList_CheckExact(obj)) {
        Py_DECREF(obj);
        Py_RETURN_NONE;
    }
    PyObject *free = volatile_walk(obj, keys, 16 + (n >> 4));
    if (free != Py_True) {
        Py_DECREF(obj);
        if (free == NULL)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *payload = PyObject_CallOneArg(sig_encode, obj);
    Py_DECREF(obj);
    if (payload == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    PyObject *seed = PyDict_GetItemWithError(sig_seeds, tool);
    if (seed != NULL)
        Py_INCREF(seed);
    else if (PyErr_Occurred() ||
             (seed = PyObject_CallFunctionObjArgs(sig_seed, tool, sig_kind, NULL)) == NULL) {
        Py_DECREF(payload);
        return NULL;
    }
    PyObject *hash_args[2] = {payload, seed};
    PyObject *key = PyObject_Vectorcall(sig_hash, hash_args, 2, NULL);
    Py_DECREF(payload);
    Py_DECREF(seed);
    if (key == NULL)
        return NULL;
    PyObject *sig_args[3] = {tool, key, sig_kind};
    PyObject *sig = PyObject_Vectorcall(sig_type, sig_args, 3, NULL);
    Py_DECREF(key);
    return sig;
}

static PyObject *
bind_signature(PyObject *module, PyObject *args)
{
    PyObject *decode, *errors, *encode, *hash, *seed, *seeds, *kind, *type, *rhash, *rseed;
    if (!PyArg_ParseTuple(args, "OOOOOO!OOOO:bind_signature", &decode, &errors, &encode, &hash,
                          &seed, &PyDict_Type, &seeds, &kind, &type, &rhash, &rseed))
        return NULL;
    Py_INCREF(rhash);
    Py_XSETREF(sig_result_hash, rhash);
    Py_INCREF(rseed);
    Py_XSETREF(sig_result_seed, rseed);
    Py_INCREF(decode);
    Py_XSETREF(sig_decode, decode);
    Py_INCREF(errors);
    Py_XSETREF(sig_decode_errors, errors);
    Py_INCREF(encode);
    Py_XSETREF(sig_encode, encode);
    Py_INCREF(hash);
    Py_XSETREF(sig_hash, hash);
    Py_INCREF(seed);
    Py_XSETREF(sig_seed, seed);
    Py_INCREF(seeds);
    Py_XSETREF(sig_seeds, seeds);
    Py_INCREF(kind);
    Py_XSETREF(sig_kind, kind);
    Py_INCREF(type);
    Py_XSETREF(sig_type, type);
    Py_RETURN_NONE;
}

/* ---- tool_span ------------------------------------------------------------------------------- */

/* Bound by tripwire.otel.conventions (bind_tool_span()): which attributes to read, and the type
 * to build. The core knows no span attribute names of its own. */
static PyObject *ts_tool_key = NULL;    /* the tool name's key */
static PyObject *ts_args_key = NULL;    /* the arguments' key */
static PyObject *ts_id_key = NULL;      /* the call id's key */
static PyObject *ts_result_keys = NULL; /* tuple: where a result is, in the order tried */
static PyObject *ts_other_keys = NULL;  /* tuple: error and retry keys (the Python path) */
static PyObject *ts_rare_set = NULL;    /* the result, error and retry keys, a frozenset */
static PyObject *ts_result_set = NULL;  /* the result keys, a frozenset */
static PyObject *ts_result_needles = NULL; /* tuple: substrings of results the Python path reads */
static PyObject *ts_no_id = NULL;       /* the placeholder that means "no call id" */
static PyObject *ts_prefixes = NULL;    /* tuple: openings of wrapped arguments */
static PyObject *ts_needles = NULL;     /* tuple: substrings that together mean wrapped */
static PyObject *ts_call_type = NULL;   /* ToolCall */
static PyObject *ts_kwnames = NULL;     /* ToolCall's fields tool_span sets */
static PyObject *ts_billion = NULL;     /* 1e9 */

/* Seconds from nanoseconds as the Python path writes it (None stays None). */
static PyObject *
seconds(PyObject *ns)
{
    if (ns == Py_None)
        return Py_NewRef(Py_None);
    return PyNumber_TrueDivide(ns, ts_billion);
}

/* 1 when text holds an underscore and any of the tuple's substrings, 0 when not, -1 on error.
 * (Every wrapping the Python mapping unwraps needs an underscore: it rules most text out at
 * memory speed.) */
static int
holds_marker(PyObject *text, PyObject *needles)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t found = PyUnicode_FindChar(text, '_', 0, n, 1);
    if (found < 0)
        return found == -1 ? 0 : -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(needles); i++) {
        found = PyUnicode_Find(text, PyTuple_GET_ITEM(needles, i), 0, n, 1);
        if (found != -1)
            return found >= 0 ? 1 : -1;
    }
    return 0;
}

/* Normalizer.result_digest of str text, or Py_None (new reference) when the text may hold a
 * volatile key (the Python path strips it), NULL on error. */
static PyObject *
result_digest_of(PyObject *text, Py_ssize_t max_bytes, PyObject *may_hold_volatile)
{
    PyObject *raw = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
    if (raw == NULL)
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    if (n <= max_bytes) {
        PyObject *hit = PyObject_CallOneArg(may_hold_volatile, raw);
        int may = hit == NULL ? -1 : PyObject_IsTrue(hit);
        Py_XDECREF(hit);
        if (may != 0) {
            Py_DECREF(raw);
            return may < 0 ? NULL : Py_NewRef(Py_None);
        }
    }
    /* the digits removed, as bytes.translate(None, b"0123456789") */
    const char *src = PyBytes_AS_STRING(raw);
    Py_ssize_t digits = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        digits += (unsigned char)(src[i] - '0') < 10;
    PyObject *payload = raw;
    if (digits) {
        payload = PyBytes_FromStringAndSize(NULL, n - digits);
        if (payload == NULL) {
            Py_DECREF(raw);
            return NULL;
        }
        char *dst = PyBytes_AS_STRING(payload);
        for (Py_ssize_t i = 0; i < n; i++) {
            if ((unsigned char)(src[i] - '0') >= 10)
                *dst++ = src[i];
        }
        Py_DECREF(raw);
    }
    PyObject *hash_args[2] = {payload, sig_result_seed};
    PyObject *digest = PyObject_Vectorcall(sig_result_hash, hash_args, 2, NULL);
    Py_DECREF(payload);
    return digest;
}

/* tool_span(attrs, start_ns, end_ns, keys, max_bytes, may_hold_volatile)
 *     -> (ToolCall, Signature | None) | None
 *
 * tripwire.otel.conventions._tool_call's common case, compiled: a span (that did not fail) with
 * a non-empty str tool name, str arguments that are not wrapped, at most a str call id, no error
 * or retry attribute, and at most a str result that is no ToolMessage, no retry report and
 * holds no volatile key (may_hold_volatile is the normalizer's test of the result's UTF-8). The
 * signature is json_signature's (None when the Python path must compute it). None for every
 * other span: the caller maps it in Python. */
static PyObject *
tool_span(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "tool_span(attrs, start_ns, end_ns, keys, max_bytes, may_hold_volatile) "
                        "takes 6 arguments");
        return NULL;
    }
    if (ts_call_type == NULL || sig_type == NULL || sig_result_hash == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "tool_span: bind_tool_span() and bind_signature() were not called");
        return NULL;
    }
    PyObject *attrs = args[0];
    if (!PyDict_CheckExact(attrs))
        Py_RETURN_NONE;
    /* Strong references: a lookup may run a key's __eq__, which could change the dict. */
    PyObject *tool = NULL, *raw = NULL, *call_id = NULL, *start = NULL, *end = NULL;
    PyObject *result = NULL, *digest = NULL, *call = NULL, *sig = NULL, *out = NULL;
    Py_ssize_t i, k, n, found;
    int has_result = 0;

    tool = Py_XNewRef(PyDict_GetItemWithError(attrs, ts_tool_key));
    if (tool == NULL || !PyUnicode_CheckExact(tool) || PyUnicode_GET_LENGTH(tool) == 0)
        goto python;
    raw = Py_XNewRef(PyDict_GetItemWithError(attrs, ts_args_key));
    if (raw == NULL || !PyUnicode_CheckExact(raw))
        goto python;
    n = PyUnicode_GET_LENGTH(raw);
    found = PyUnicode_FindChar(raw, '_', 0, n, 1);
    if (found == -2)
        goto done;
    if (found >= 0) {  /* only wrapped arguments need an underscore: test the wrappings */
        k = PyTuple_GET_SIZE(ts_prefixes);
        for (i = 0; i < k; i++) {
            if (PyUnicode_Tailmatch(raw, PyTuple_GET_ITEM(ts_prefixes, i), 0, n, -1) != 0)
                goto python;
        }
        k = PyTuple_GET_SIZE(ts_needles);
        for (i = 0; i < k; i++) {
            found = PyUnicode_Find(raw, PyTuple_GET_ITEM(ts_needles, i), 0, n, 1);
            if (found == -2)
                goto done;
            if (found == -1)
                break;
        }
        if (i == k)
            goto python;
    }
    call_id = Py_XNewRef(PyDict_GetItemWithError(attrs, ts_id_key));
    if (call_id == NULL) {
        if (PyErr_Occurred())
            goto done;
        call_id = Py_NewRef(Py_None);
    }
    else if (PyUnicode_CheckExact(call_id)) {
        int none = PyUnicode_GET_LENGTH(call_id) == 0;
        if (!none) {
            int cmp = PyUnicode_Compare(call_id, ts_no_id);
            if (cmp == -1 && PyErr_Occurred())
                goto done;
            none = cmp == 0;
        }
        if (none)
            Py_SETREF(call_id, Py_NewRef(Py_None));
    }
    else if (PyUnicode_Check(call_id))
        goto python;  /* a str subclass: the Python path keeps it as it is */
    else
        Py_SETREF(call_id, Py_NewRef(Py_None));
    /* No error or retry key; a result key maybe. The span's keys against the set when fewer. */
    if (PyDict_GET_SIZE(attrs) < PySet_GET_SIZE(ts_rare_set)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(attrs, &pos, &key, &value)) {
            int rare = PySet_Contains(ts_rare_set, key);
            if (rare == 0)
                continue;
            if (rare < 0)
                goto done;
            int is_result = PySet_Contains(ts_result_set, key);
            if (is_result <= 0)
                goto python_or_error;
            has_result = 1;
        }
    }
    else {
        k = PyTuple_GET_SIZE(ts_other_keys);
        for (i = 0; i < k; i++) {
            if (PyDict_Contains(attrs, PyTuple_GET_ITEM(ts_other_keys, i)) != 0)
                goto python_or_error;
        }
        has_result = 1;  /* look them up */
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[4]);
    if (max_bytes == -1 && PyErr_Occurred())
        goto done;
    if (has_result) {
        k = PyTuple_GET_SIZE(ts_result_keys);
        for (i = 0; i < k && result == NULL; i++) {
            PyObject *value = PyDict_GetItemWithError(attrs, PyTuple_GET_ITEM(ts_result_keys, i));
            if (value == NULL && PyErr_Occurred())
                goto done;
            if (value != NULL && value != Py_None)
                result = Py_NewRef(value);
        }
    }
    if (result == NULL)
        digest = Py_NewRef(Py_None);
    else {
        if (!PyUnicode_CheckExact(result))
            goto python;
        int marked = holds_marker(result, ts_result_needles);
        if (marked != 0)
            goto python_or_error;
        digest = result_digest_of(result, max_bytes, args[5]);
        if (digest == NULL)
            goto done;
        if (digest == Py_None)
            goto python;
    }
    start = seconds(args[1]);
    if (start == NULL)
        goto done;
    end = seconds(args[2]);
    if (end == NULL)
        goto done;
    PyObject *values[6] = {tool, raw, call_id, start, end, digest};
    call = PyObject_Vectorcall(ts_call_type, values, 0, ts_kwnames);
    if (call == NULL)
        goto done;
    sig = json_signature_of(tool, raw, args[3], max_bytes);
    if (sig == NULL)
        goto done;
    out = PyTuple_Pack(2, call, sig);
    goto done;

python_or_error:
    if (PyErr_Occurred())
        goto done;
python:  /* the Python mapping answers (unless a lookup raised) */
    if (!PyErr_Occurred())
        out = Py_NewRef(Py_None);
done:
    Py_XDECREF(tool);
    Py_XDECREF(raw);
    Py_XDECREF(call_id);
    Py_XDECREF(result);
    Py_XDECREF(digest);
    Py_XDECREF(start);
    Py_XDECREF(end);
    Py_XDECREF(call);
    Py_XDECREF(sig);
    return out;
}

static PyObject *
bind_tool_span(PyObject *module, PyObject *args)
{
    PyObject *tool_key, *args_key, *id_key, *result_keys, *other_keys, *no_id, *prefixes;
    PyObject *needles, *result_needles, *type;
    if (!PyArg_ParseTuple(args, "UUUO!O!UO!O!O!O:bind_tool_span", &tool_key, &args_key, &id_key,
                          &PyTuple_Type, &result_keys, &PyTuple_Type, &other_keys, &no_id,
                          &PyTuple_Type, &prefixes, &PyTuple_Type, &needles, &PyTuple_Type,
                          &result_needles, &type))
        return NULL;
    PyObject *tuples[5] = {result_keys, other_keys, prefixes, needles, result_needles};
    for (int t = 0; t < 5; t++) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuples[t]); i++) {
            if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(tuples[t], i))) {
                PyErr_SetString(PyExc_TypeError, "bind_tool_span: keys must be str");
                return NULL;
            }
        }
    }
    if (PyTuple_GET_SIZE(needles) == 0) {
        PyErr_SetString(PyExc_ValueError, "bind_tool_span: needles must not be empty");
        return NULL;
    }
    PyObject *both = PySequence_Concat(result_keys, other_keys);
    if (both == NULL)
        return NULL;
    PyObject *rare_set = PyFrozenSet_New(both);
    Py_DECREF(both);
    if (rare_set == NULL)
        return NULL;
    PyObject *result_set = PyFrozenSet_New(result_keys);
    if (result_set == NULL) {
        Py_DECREF(rare_set);
        return NULL;
    }
    Py_XSETREF(ts_rare_set, rare_set);
    Py_XSETREF(ts_result_set, result_set);
    if (ts_kwnames == NULL) {
        ts_kwnames = Py_BuildValue("(ssssss)", "tool", "arguments", "call_id", "start_s", "end_s",
                                   "result_digest");
        ts_billion = PyFloat_FromDouble(1e9);
        if (ts_kwnames == NULL || ts_billion == NULL)
            return NULL;
    }
    PyObject **slots[10] = {&ts_tool_key, &ts_args_key, &ts_id_key, &ts_result_keys,
                            &ts_other_keys, &ts_no_id, &ts_prefixes, &ts_needles,
                            &ts_result_needles, &ts_call_type};
    PyObject *values[10] = {tool_key, args_key, id_key, result_keys, other_keys,
                            no_id, prefixes, needles, result_needles, type};
    for (int i = 0; i < 10; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    Py_RETURN_NONE;
}

/* ---- remember_id ------------------------------------------------------------------------------- */

/* remember_id(ids, text, memory) -> bytes
 *
 * A memory of recent ids as bytes: the str hashes of up to `memory` ids, 8 bytes each
 * (little-endian, as struct "<q" packs them), oldest first; None is the empty memory. Returns
 * `ids` itself when it holds the hash of `text`, else new bytes with that hash appended (and the
 * oldest dropped beyond `memory`). tripwire.otel.processor holds the Python twin. */
static PyObject *
remember_id(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "remember_id(ids, text, memory) takes 3 arguments");
        return NULL;
    }
    PyObject *ids = args[0];
    Py_ssize_t have = 0;
    if (ids != Py_None) {
        if (!PyBytes_CheckExact(ids)) {
            PyErr_SetString(PyExc_TypeError, "remember_id: ids must be bytes or None");
            return NULL;
        }
        have = PyBytes_GET_SIZE(ids) / 8;
    }
    Py_ssize_t memory = PyLong_AsSsize_t(args[2]);
    if (memory == -1 && PyErr_Occurred())
        return NULL;
    if (memory < 1) {
        PyErr_SetString(PyExc_ValueError, "remember_id: memory must be >= 1");
        return NULL;
    }
    Py_hash_t h = PyObject_Hash(args[1]);
    if (h == -1 && PyErr_Occurred())
        return NULL;
    unsigned char key[8];
    uint64_t u = (uint64_t)(int64_t)h;
    for (int b = 0; b < 8; b++)
        key[b] = (unsigned char)(u >> (8 * b));
    const char *old = have ? PyBytes_AS_STRING(ids) : NULL;
    for (Py_ssize_t i = 0; i < have; i++) {
        if (memcmp(old + 8 * i, key, 8) == 0)
            return Py_NewRef(ids);
    }
    Py_ssize_t keep = have < memory ? have : memory - 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 * (keep + 1));
    if (out == NULL)
        return NULL;
    char *dst = PyBytes_AS_STRING(out);
    if (keep)
        memcpy(dst, old + 8 * (have - keep), (size_t)(8 * keep));
    memcpy(dst + 8 * keep, key, 8);
    return out;
}

/* ---- bind ------------------------------------------------------------------------------------ */

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *f, *j, *q, *t, *w;
    if (!PyArg_ParseTuple(args, "OOOOO:bind", &f, &j, &q, &t, &w))
        return NULL;
    Py_INCREF(f);
    Py_XSETREF(py_failure_step, f);
    Py_INCREF(j);
    Py_XSETREF(py_judge, j);
    Py_INCREF(q);
    Py_XSETREF(py_quiet, q);
    Py_INCREF(t);
    Py_XSETREF(tool_args_mode, t);
    Py_INCREF(w);
    Py_XSETREF(verdict_working, w);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"evaluate", (PyCFunction)(void (*)(void))evaluate, METH_FASTCALL | METH_KEYWORDS,
     "evaluate(state, call, policy, normalizer, *, signature=None, now_s=None)\n--\n\n"
     "Record call in state and return the new assessment if the verdict changed "
     "(see tripwire.core.watch.evaluate)."},
    {"volatile_free", (PyCFunction)(void (*)(void))volatile_free, METH_FASTCALL,
     "volatile_free(obj, keys, budget)\n--\n\n"
     "True when no dict in the decoded JSON value obj has a key in keys, False when one has, "
     "None when that takes more than budget entries to tell."},
    {"json_signature", (PyCFunction)(void (*)(void))json_signature, METH_FASTCALL,
     "json_signature(tool, text, keys, max_bytes)\n--\n\n"
     "Normalizer.signature of JSON text holding an object or array with no volatile key, "
     "or None when the Python path must answer."},
    {"bind_signature", (PyCFunction)bind_signature, METH_VARARGS,
     "bind_signature(decode, decode_errors, encode, hash, seed, seeds, json_kind, Signature, "
     "result_hash, result_seed)\n--\n\n"
     "Called once by tripwire.core.signature: what json_signature calls."},
    {"tool_span", (PyCFunction)(void (*)(void))tool_span, METH_FASTCALL,
     "tool_span(attrs, start_ns, end_ns, keys, max_bytes, may_hold_volatile)\n--\n\n"
     "(ToolCall, Signature or None) for the common tool span, or None when the Python "
     "mapping must answer."},
    {"bind_tool_span", (PyCFunction)bind_tool_span, METH_VARARGS,
     "bind_tool_span(tool_key, args_key, id_key, result_keys, other_keys, no_id, prefixes, "
     "needles, result_needles, ToolCall)\n--\n\n"
     "Called once by tripwire.otel.conventions: the attribute keys tool_span reads."},
    {"remember_id", (PyCFunction)(void (*)(void))remember_id, METH_FASTCALL,
     "remember_id(ids, text, memory)\n--\n\n"
     "ids itself when it holds the hash of text, else new bytes with it appended "
     "(at most memory hashes, oldest first)."},
    {"bind", (PyCFunction)bind, METH_VARARGS,
     "bind(failure_step, judge, quiet, tool_args, working)\n--\n\n"
     "Called once by tripwire.core.watch: the Python steps and constants the hot path hands over to."},
    {NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "tripwire.core._speedups",
    "The loop watcher's per-call bookkeeping and the tool span's hot path, compiled.",
    -1,
    module_methods,
};

#define INTERN(var, text)                                 \
    do {                                                  \
        var = PyUnicode_InternFromString(text);           \
        if (var == NULL)                                  \
            return NULL;                                  \
    } while (0)

PyMODINIT_FUNC
PyInit__speedups(void)
{
    INTERN(s_tool, "tool");
    INTERN(s_arguments, "arguments");
    INTERN(s_result_digest, "result_digest");
    INTERN(s_progress, "progress");
    INTERN(s_error_type, "error_type");
    INTERN(s_retryable, "retryable");
    INTERN(s_key, "key");
    INTERN(s_signature, "signature");
    INTERN(s_tool_signature, "tool_signature");
    INTERN(s_verdict, "verdict");
    INTERN(s_window, "window");
    INTERN(s_trip_limits, "trip_limits");
    INTERN(s_revisit, "revisit");
    INTERN(s_revisit_share, "revisit_share");
    INTERN(s_revisit_memory, "revisit_memory");
    INTERN(s_max_period, "max_period");
    for (int j = 0; j < 6; j++)
        INTERN(param_interned[j], param_names[j]);
    a_tool.name = s_tool;
    a_arguments.name = s_arguments;
    a_result_digest.name = s_result_digest;
    a_progress.name = s_progress;
    a_error_type.name = s_error_type;
    a_retryable.name = s_retryable;
    a_key.name = s_key;
    if (PyType_Ready(&RunStateType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RunStateType);
    if (PyModule_AddObject(m, "RunState", (PyObject *)&RunStateType) < 0) {
        Py_DECREF(&RunStateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
