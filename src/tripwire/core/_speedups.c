/* The loop watcher's per-call bookkeeping, compiled: an optional accelerator for
 * tripwire.core.watch.
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
    Stack st;
    st.items = st.small;
    st.top = 0;
    st.cap = 64;
    PyObject *answer = Py_True;
    st.items[st.top++] = args[0];
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
    Py_XINCREF(answer);
    return answer;
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
    {"bind", (PyCFunction)bind, METH_VARARGS,
     "bind(failure_step, judge, quiet, tool_args, working)\n--\n\n"
     "Called once by tripwire.core.watch: the Python steps and constants the hot path hands over to."},
    {NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "tripwire.core._speedups",
    "The loop watcher's per-call bookkeeping, compiled (see tripwire.core.watch).",
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
