/* The loop watcher's per-call bookkeeping, compiled: an optional accelerator.
 *
 * step(state, call, key, result, policy) does, for one signed tool call, exactly what
 * tripwire/core/watch.py's evaluate_hashed does up to the point where a rule could trip: the
 * call goes into the ring (counts, period runs), its result into the results ring, the
 * same-result streak and the revisit ring move on, and the per-call marks are written. It then
 * answers what evaluate_hashed does next:
 *
 *   None  nothing trips and the verdict in force is working: done (the common case);
 *   0     nothing trips: evaluate_hashed goes on with _quiet();
 *   n > 0 a rule may trip with the call's key seen n times in the window: _judge(..., hits=n);
 *   -1    not a call this handles; nothing was touched and evaluate_hashed's Python path runs.
 *
 * It handles calls that carry no error, no progress fingerprint and no retryable=False, in runs
 * with no progress ring, under a policy keyed on tool and arguments with no declared polls; a
 * call whose own signature failed within the window (a retry) is Python's too. Everything else,
 * and every rule's test and every verdict, stays in Python. It calls no Python function.
 * evaluate_hashed in watch.py stays the reference: the whole suite runs with and without this
 * module (TRIPWIRE_NO_EXTENSIONS=1), and tests/core/test_watchstep.py runs both on the same
 * random calls and compares every field of the state after each one.
 *
 * The RunState and ToolCall fields are read and written where their __slots__ keep them: the
 * offsets come from the classes' member descriptors, once, in configure(); a class whose
 * fields are not plain object slots is refused there, and the Python path is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

enum {
    S_CALLS,
    S_CONFIRM_STREAK,
    S_COUNTS,
    S_CURRENT,
    S_ERROR_RUN,
    S_FAILED_RECENT,
    S_FAILURES,
    S_KEYS,
    S_LAST_ERROR,
    S_LAST_RESULT,
    S_LAST_TOOL,
    S_MARKS,
    S_OUTCOME_RUN,
    S_PROGRESS,
    S_RECENT,
    S_REPLAY_AT,
    S_REPLAY_RUN,
    S_RESULTS,
    S_REVISIT_RUN,
    S_REVISITS_RECENT,
    S_RUNS,
    S_SEEN,
    S_SEEN_AT,
    S_SEEN_META,
    S_COUNT
};

static const char *const state_names[S_COUNT] = {
    "calls",      "confirm_streak", "counts",     "current",     "error_run",       "failed_recent",
    "failures",   "keys",           "last_error", "last_result", "last_tool",       "marks",
    "outcome_run", "progress",      "recent",     "replay_at",   "replay_run",      "results",
    "revisit_run", "revisits_recent", "runs",     "seen",        "seen_at",         "seen_meta",
};

enum { C_TOOL, C_ERROR_TYPE, C_RETRYABLE, C_PROGRESS, C_COUNT };

static const char *const call_names[C_COUNT] = {"tool", "error_type", "retryable", "progress"};

static Py_ssize_t state_off[S_COUNT];
static Py_ssize_t call_off[C_COUNT];
static PyTypeObject *state_type; /* strong references, set by configure() */
static PyTypeObject *call_type;
static PyObject *no_runs;    /* watch._NO_RUNS: the shared empty dict of a run with no period run */
static PyObject *working;    /* Verdict.WORKING */
static PyObject *array_type; /* array.array */
static PyObject *tool_args;  /* KeyMode.TOOL_ARGS */
static long long empty_hash; /* watch._EMPTY */
static long long replay_grace;
static PyObject *str_verdict;
static PyObject *minus_one;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
#define ST(name) SLOT(state, state_off[name])
#define CL(name) SLOT(call, call_off[name])

/* Store ``value`` (a new reference, stolen) in a slot, releasing what it held. */
static inline void
put(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject **at = (PyObject **)((char *)obj + off);
    PyObject *old = *at;
    *at = value;
    Py_XDECREF(old);
}

static inline int
get_ll(PyObject *state, int name, long long *out)
{
    PyObject *v = ST(name);
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "RunState.%s is not an int", state_names[name]);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static inline int
set_ll(PyObject *state, int name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    put(state, state_off[name], v);
    return 0;
}

/* -- the policy's figures, by policy object (policies are frozen) --------------------------- */

typedef struct {
    PyObject *policy; /* strong reference; NULL: empty entry */
    long long window, revisit_memory;
    long long threshold, same_error, failure_share, revisit_share, same_result, revisit;
    int handled;   /* keyed on tool+args, no declared polls */
    int revisit_on; /* policy.revisit or policy.revisit_share is set */
} Limits;

#define CACHED_POLICIES 8
static Limits cache[CACHED_POLICIES];
static int cache_next;

static int
attr_ll(PyObject *obj, const char *name, long long *out)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v == NULL)
        return -1;
    if (!PyLong_Check(v)) {
        Py_DECREF(v);
        PyErr_Format(PyExc_TypeError, "policy field %s is not an int", name);
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (value == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? LLONG_MAX : (overflow < 0 ? LLONG_MIN : value);
    return 0;
}

static int
attr_set(PyObject *obj, const char *name)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v == NULL)
        return -1;
    int set = v != Py_None;
    Py_DECREF(v);
    return set;
}

static Limits *
limits_for(PyObject *policy)
{
    for (int i = 0; i < CACHED_POLICIES; i++)
        if (cache[i].policy == policy)
            return &cache[i];
    Limits fresh;
    memset(&fresh, 0, sizeof fresh);
    PyObject *key = PyObject_GetAttrString(policy, "key");
    if (key == NULL)
        return NULL;
    int keyed = key == tool_args;
    Py_DECREF(key);
    PyObject *polls = PyObject_GetAttrString(policy, "polls");
    if (polls == NULL)
        return NULL;
    int polling = PyObject_IsTrue(polls);
    Py_DECREF(polls);
    if (polling < 0)
        return NULL;
    fresh.handled = keyed && !polling;
    int revisit = attr_set(policy, "revisit");
    int revisit_share = attr_set(policy, "revisit_share");
    if (revisit < 0 || revisit_share < 0)
        return NULL;
    fresh.revisit_on = revisit || revisit_share;
    if (attr_ll(policy, "window", &fresh.window) < 0 ||
        attr_ll(policy, "revisit_memory", &fresh.revisit_memory) < 0)
        return NULL;
    if (fresh.window < 1 || fresh.revisit_memory < 1) {
        PyErr_SetString(PyExc_ValueError, "policy window and revisit_memory must be positive");
        return NULL;
    }
    PyObject *limits = PyObject_GetAttrString(policy, "trip_limits");
    if (limits == NULL)
        return NULL;
    int bad = attr_ll(limits, "threshold", &fresh.threshold) < 0 ||
              attr_ll(limits, "same_error", &fresh.same_error) < 0 ||
              attr_ll(limits, "failure_share", &fresh.failure_share) < 0 ||
              attr_ll(limits, "revisit_share", &fresh.revisit_share) < 0 ||
              attr_ll(limits, "same_result", &fresh.same_result) < 0 ||
              attr_ll(limits, "revisit", &fresh.revisit) < 0;
    Py_DECREF(limits);
    if (bad)
        return NULL;
    Limits *entry = &cache[cache_next];
    cache_next = (cache_next + 1) % CACHED_POLICIES;
    Py_XDECREF(entry->policy);
    Py_INCREF(policy);
    fresh.policy = policy;
    *entry = fresh;
    return entry;
}

/* -- pieces of the step ------------------------------------------------------------------- */

/* recent.insert(0, key); recent.pop() on a list of n >= 1 items. */
static inline void
shift_in(PyObject *recent, PyObject *key)
{
    PyObject **items = ((PyListObject *)recent)->ob_item;
    Py_ssize_t n = PyList_GET_SIZE(recent);
    PyObject *last = items[n - 1];
    memmove(items + 1, items, (size_t)(n - 1) * sizeof(PyObject *));
    Py_INCREF(key);
    items[0] = key;
    Py_DECREF(last);
}

static inline int
same(PyObject *a, PyObject *b)
{
    return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* item == key, for a place of the ring or of ``recent`` (an int, or None while empty) and the
 * call's key (an exact int) whose low 64 bits are ``low``: what ``same`` answers, without the
 * generic comparison when the answer shows sooner: an empty place, or an int whose low bits
 * differ (the common case). */
static inline int
same_key(PyObject *item, PyObject *key, uint64_t low)
{
    if (item == key)
        return 1;
    if (item == Py_None)
        return 0;
    if (PyLong_CheckExact(item) && (uint64_t)PyLong_AsUnsignedLongLongMask(item) != low)
        return 0;
    return PyObject_RichCompareBool(item, key, Py_EQ);
}

/* counts[k] + delta, deleting the entry at 0; returns the new count or -1 on error. */
static long long
bump(PyObject *counts, PyObject *k, long long delta)
{
    PyObject *v = PyDict_GetItemWithError(counts, k);
    long long now = delta;
    if (v != NULL) {
        now = PyLong_AsLongLong(v) + delta;
        if (now == -1 + delta && PyErr_Occurred())
            return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    } else if (delta < 0) {
        PyErr_SetObject(PyExc_KeyError, k);
        return -1;
    }
    if (now == 0)
        return PyDict_DelItem(counts, k) < 0 ? -1 : 0;
    PyObject *n = PyLong_FromLongLong(now);
    if (n == NULL)
        return -1;
    int rc = PyDict_SetItem(counts, k, n);
    Py_DECREF(n);
    return rc < 0 ? -1 : now;
}

/* The verdict in force is working (state.current.verdict is WORKING). */
static int
working_now(PyObject *state)
{
    PyObject *current = ST(S_CURRENT);
    if (current == Py_None)
        return 0;
    PyObject *verdict = PyObject_GetAttr(current, str_verdict);
    if (verdict == NULL)
        return -1;
    int is = verdict == working;
    Py_DECREF(verdict);
    return is;
}

/* What step returns once the bookkeeping is done and nothing can trip. */
static PyObject *
nothing_trips(PyObject *state)
{
    int is = working_now(state);
    if (is < 0)
        return NULL;
    if (is) {
        PyObject *streak = ST(S_CONFIRM_STREAK);
        if (!(PyLong_CheckExact(streak) && PyLong_AsLong(streak) == 0)) {
            if (set_ll(state, S_CONFIRM_STREAK, 0) < 0)
                return NULL;
        }
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(0);
}

/* watch._track_revisit: 1 when this (signature, result) pair was seen before in the run. */
static int
track_revisit(PyObject *state, const Limits *lim, PyObject *key, long long result, long long index)
{
    Py_ssize_t memory = (Py_ssize_t)lim->revisit_memory;
    PyObject *seen = ST(S_SEEN);
    if (seen == Py_None) {
        seen = PyByteArray_FromStringAndSize(NULL, memory * 8);
        if (seen == NULL)
            return -1;
        memset(PyByteArray_AS_STRING(seen), 0, (size_t)memory * 8);
        put(state, state_off[S_SEEN], seen);
    }
    uint64_t low = (uint64_t)PyLong_AsUnsignedLongLongMask(key);
    if (low == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    uint64_t pair = low ^ (uint64_t)result;
    if (pair == 0)
        pair = 1;
    unsigned char packed[8];
    for (int i = 0; i < 8; i++)
        packed[i] = (unsigned char)(pair >> (8 * i));
    PyObject *meta = ST(S_SEEN_META);
    if (meta == Py_None) {
        meta = PyList_New(memory);
        if (meta == NULL)
            return -1;
        PyObject *zero = PyLong_FromLong(0);
        for (Py_ssize_t i = 0; i < memory; i++) {
            Py_INCREF(zero);
            PyList_SET_ITEM(meta, i, zero);
        }
        Py_DECREF(zero);
        put(state, state_off[S_SEEN_META], meta);
    }
    const char *ring = PyByteArray_AS_STRING(seen);
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; i < memory; i++) {
        if (memcmp(ring + 8 * i, packed, 8) == 0) {
            at = i;
            break;
        }
    }
    long long replay_at, replay_run, revisit_run;
    if (get_ll(state, S_REPLAY_AT, &replay_at) < 0 || get_ll(state, S_REPLAY_RUN, &replay_run) < 0 ||
        get_ll(state, S_REVISIT_RUN, &revisit_run) < 0)
        return -1;
    if (at >= 0) {
        PyObject *held = PyList_GET_ITEM(meta, at);
        long long entry = PyLong_AsLongLong(held);
        if (entry == -1 && PyErr_Occurred())
            return -1;
        long long first = entry >> 8, times = entry & 255;
        if (times < 255) {
            times += 1;
            PyObject *v = PyLong_FromLongLong(entry + 1);
            if (v == NULL)
                return -1;
            PyList_SET_ITEM(meta, at, v);
            Py_DECREF(held);
        }
        if (first == replay_at + 1) {
            if (set_ll(state, S_REPLAY_AT, first) < 0 || set_ll(state, S_REPLAY_RUN, replay_run + 1) < 0)
                return -1;
            if (replay_run + 1 >= replay_grace && times < 3)
                return 0; /* a stretch done again in order: counts from the third time through */
        } else {
            if (set_ll(state, S_REPLAY_AT, first) < 0)
                return -1;
            if (replay_run && set_ll(state, S_REPLAY_RUN, 0) < 0)
                return -1;
        }
        return set_ll(state, S_REVISIT_RUN, revisit_run + 1) < 0 ? -1 : 1;
    }
    if (set_ll(state, S_REVISIT_RUN, 0) < 0 || set_ll(state, S_REPLAY_RUN, 0) < 0 ||
        set_ll(state, S_REPLAY_AT, -2) < 0)
        return -1;
    long long slot;
    if (get_ll(state, S_SEEN_AT, &slot) < 0)
        return -1;
    if (slot < 0 || slot >= memory) {
        PyErr_SetString(PyExc_ValueError, "RunState.seen_at is outside the revisit ring");
        return -1;
    }
    memcpy(PyByteArray_AS_STRING(seen) + 8 * slot, packed, 8);
    PyObject *v = PyLong_FromLongLong(index * 256 + 1);
    if (v == NULL)
        return -1;
    PyObject *held = PyList_GET_ITEM(meta, slot);
    PyList_SET_ITEM(meta, slot, v);
    Py_DECREF(held);
    return set_ll(state, S_SEEN_AT, (slot + 1) % memory) < 0 ? -1 : 0;
}

/* -- step ------------------------------------------------------------------------------------ */

static PyObject *
fallback(void)
{
    Py_INCREF(minus_one);
    return minus_one;
}

static PyObject *
step(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "step(state, call, key, result, policy) takes 5 arguments");
        return NULL;
    }
    PyObject *state = args[0], *call = args[1], *key = args[2], *result_obj = args[3];
    if (state_type == NULL || Py_TYPE(state) != state_type || Py_TYPE(call) != call_type ||
        !PyLong_CheckExact(result_obj) || !PyLong_CheckExact(key))
        return fallback();
    Limits *lim = limits_for(args[4]);
    if (lim == NULL)
        return NULL;
    if (!lim->handled)
        return fallback();
    for (int i = 0; i < C_COUNT; i++)
        if (CL(i) == NULL)
            return fallback();
    if (CL(C_ERROR_TYPE) != Py_None || CL(C_PROGRESS) != Py_None || CL(C_RETRYABLE) == Py_False)
        return fallback();
    for (int i = 0; i < S_COUNT; i++)
        if (ST(i) == NULL)
            return fallback();
    const Py_ssize_t window = (Py_ssize_t)lim->window;
    PyObject *keys = ST(S_KEYS), *counts = ST(S_COUNTS), *recent = ST(S_RECENT);
    PyObject *failures = ST(S_FAILURES), *results = ST(S_RESULTS), *marks = ST(S_MARKS);
    PyObject *seen = ST(S_SEEN), *meta = ST(S_SEEN_META);
    if (ST(S_PROGRESS) != Py_None || !(failures == Py_None || PyDict_CheckExact(failures)) ||
        !PyList_CheckExact(keys) || PyList_GET_SIZE(keys) != window || !PyDict_CheckExact(counts) ||
        !PyList_CheckExact(recent) || PyList_GET_SIZE(recent) < 1 || !PyDict_CheckExact(ST(S_RUNS)) ||
        !(results == Py_None || Py_TYPE(results) == (PyTypeObject *)array_type) ||
        !(marks == Py_None || (PyByteArray_CheckExact(marks) && PyByteArray_GET_SIZE(marks) == window)) ||
        !(seen == Py_None || (PyByteArray_CheckExact(seen) && PyByteArray_GET_SIZE(seen) == 8 * lim->revisit_memory)) ||
        !(meta == Py_None || (PyList_CheckExact(meta) && PyList_GET_SIZE(meta) == lim->revisit_memory)))
        return fallback();
    long long result = PyLong_AsLongLong(result_obj);
    if (result == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return fallback();
    }
    long long calls;
    if (get_ll(state, S_CALLS, &calls) < 0)
        return NULL;
    const long long index = calls + 1;
    /* A failure still in the window: a call of another signature goes on here (as in
     * _failure_step, which then does nothing); a retry of that signature is Python's, unless the
     * failure has left the window, when it is forgotten. */
    const int had_failures = failures != Py_None && PyDict_GET_SIZE(failures) > 0;
    int expired = 0;
    if (had_failures) {
        PyObject *prior = PyDict_GetItemWithError(failures, key);
        if (prior == NULL && PyErr_Occurred())
            return NULL;
        if (prior != NULL) {
            if (!PyTuple_Check(prior) || PyTuple_GET_SIZE(prior) < 5)
                return fallback();
            long long failed_at = PyLong_AsLongLong(PyTuple_GET_ITEM(prior, 4)); /* Failure.call_index */
            if (failed_at == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return fallback();
            }
            if (index - failed_at < window)
                return fallback();
            expired = 1;
        }
    }
    Py_buffer ring;
    int have_ring = 0;
    if (results != Py_None || result) {
        if (results == Py_None) { /* the first result of the run: array("q", bytes(8 * window)) */
            PyObject *zeros = PyBytes_FromStringAndSize(NULL, window * 8);
            if (zeros == NULL)
                return NULL;
            memset(PyBytes_AS_STRING(zeros), 0, (size_t)window * 8);
            results = PyObject_CallFunction(array_type, "sO", "q", zeros);
            Py_DECREF(zeros);
            if (results == NULL)
                return NULL;
            put(state, state_off[S_RESULTS], results);
        }
        if (PyObject_GetBuffer(results, &ring, PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
            return NULL;
        have_ring = 1;
        if (ring.itemsize != 8 || ring.len != window * 8) {
            PyBuffer_Release(&ring);
            PyErr_SetString(PyExc_ValueError, "RunState.results is not the window's ring of int64");
            return NULL;
        }
    }

    /* --- the call goes into the ring: counts, period runs -------------------------------- */
    if (set_ll(state, S_CALLS, index) < 0)
        goto error;
    const Py_ssize_t slot = (Py_ssize_t)((index - 1) % window);
    const uint64_t low = (uint64_t)PyLong_AsUnsignedLongLongMask(key); /* an exact int: no error */
    PyObject *old = PyList_GET_ITEM(keys, slot);
    long long hits;
    int eq = same_key(old, key, low);
    if (eq < 0)
        goto error;
    if (eq) {
        PyObject *v = PyDict_GetItemWithError(counts, key);
        if (v == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, key);
            goto error;
        }
        hits = PyLong_AsLongLong(v);
        if (hits == -1 && PyErr_Occurred())
            goto error;
    } else {
        if (old != Py_None && bump(counts, old, -1) < 0)
            goto error;
        Py_INCREF(key);
        PyList_SET_ITEM(keys, slot, key);
        Py_DECREF(old);
        hits = bump(counts, key, 1);
        if (hits < 0)
            goto error;
    }

    const Py_ssize_t periods = PyList_GET_SIZE(recent);
    int found = 0;
    for (Py_ssize_t i = 0; i < periods && !found; i++) {
        found = same_key(PyList_GET_ITEM(recent, i), key, low);
        if (found < 0)
            goto error;
    }
    if (found) {
        PyObject *runs = ST(S_RUNS);
        int first = same_key(PyList_GET_ITEM(recent, 0), key, low);
        if (first < 0)
            goto error;
        if (PyDict_GET_SIZE(runs) != periods || !first) {
            PyObject *fresh = PyDict_New();
            if (fresh == NULL)
                goto error;
            PyObject *begin = NULL;
            for (Py_ssize_t p = 1; p <= periods; p++) {
                int is = same_key(PyList_GET_ITEM(recent, p - 1), key, low);
                if (is < 0)
                    goto error_fresh;
                if (!is)
                    continue;
                PyObject *at = PyLong_FromSsize_t(p);
                if (at == NULL)
                    goto error_fresh;
                PyObject *start = PyDict_GetItemWithError(runs, at);
                if (start == NULL) {
                    if (PyErr_Occurred() || (begin == NULL && (begin = PyLong_FromLongLong(index - 1)) == NULL)) {
                        Py_DECREF(at);
                        goto error_fresh;
                    }
                    start = begin;
                }
                int rc = PyDict_SetItem(fresh, at, start);
                Py_DECREF(at);
                if (rc < 0)
                    goto error_fresh;
            }
            Py_XDECREF(begin);
            put(state, state_off[S_RUNS], fresh);
            shift_in(recent, key);
            goto ringed;
        error_fresh:
            Py_XDECREF(begin);
            Py_DECREF(fresh);
            goto error;
        }
        /* else every run goes on and recent is unchanged (see evaluate_hashed) */
    } else {
        if (PyDict_GET_SIZE(ST(S_RUNS))) {
            Py_INCREF(no_runs);
            put(state, state_off[S_RUNS], no_runs);
        }
        shift_in(recent, key);
    }
ringed:;
    const int no_runs_now = PyDict_GET_SIZE(ST(S_RUNS)) == 0;

    if (!have_ring && marks == Py_None && !had_failures) {
        /* A call with no evidence in a run that never had any: nothing to record. */
        if (hits < lim->threshold && no_runs_now)
            return nothing_trips(state);
        return PyLong_FromLongLong(hits);
    }

    if (have_ring) {
        ((int64_t *)ring.buf)[slot] = (int64_t)result;
        PyBuffer_Release(&ring);
        have_ring = 0;
    }
    long long error_run;
    if (get_ll(state, S_ERROR_RUN, &error_run) < 0)
        return NULL;
    if (error_run) {
        if (set_ll(state, S_ERROR_RUN, 0) < 0)
            return NULL;
        Py_INCREF(Py_None);
        put(state, state_off[S_LAST_ERROR], Py_None);
        error_run = 0;
    }

    /* Same-result streak: consecutive calls of one tool that found nothing. */
    long long last_result, outcome_run;
    if (get_ll(state, S_LAST_RESULT, &last_result) < 0 || get_ll(state, S_OUTCOME_RUN, &outcome_run) < 0)
        return NULL;
    if (result == empty_hash) {
        PyObject *tool = CL(C_TOOL);
        int again = 0;
        if (last_result == empty_hash) {
            again = same(tool, ST(S_LAST_TOOL));
            if (again < 0)
                return NULL;
        }
        outcome_run = again ? outcome_run + 1 : 1;
        if (set_ll(state, S_OUTCOME_RUN, outcome_run) < 0)
            return NULL;
        Py_INCREF(tool);
        put(state, state_off[S_LAST_TOOL], tool);
        if (set_ll(state, S_LAST_RESULT, result) < 0)
            return NULL;
    } else if (last_result || outcome_run) {
        outcome_run = 0;
        if (set_ll(state, S_OUTCOME_RUN, 0) < 0 || set_ll(state, S_LAST_RESULT, 0) < 0)
            return NULL;
    }

    if (expired && PyDict_DelItem(failures, key) < 0)
        return NULL;

    /* This call's mark (bit 1: a revisit; a call handled here never failed). */
    int mark = 0;
    if (!result) {
        if (set_ll(state, S_REVISIT_RUN, 0) < 0)
            return NULL;
    } else if (lim->revisit_on) {
        int revisit = track_revisit(state, lim, key, result, index);
        if (revisit < 0)
            return NULL;
        mark = revisit ? 2 : 0;
    }
    long long failed_recent, revisits_recent;
    if (get_ll(state, S_FAILED_RECENT, &failed_recent) < 0 ||
        get_ll(state, S_REVISITS_RECENT, &revisits_recent) < 0)
        return NULL;
    marks = ST(S_MARKS);
    if (marks == Py_None && mark) {
        marks = PyByteArray_FromStringAndSize(NULL, window);
        if (marks == NULL)
            return NULL;
        memset(PyByteArray_AS_STRING(marks), 0, (size_t)window);
        put(state, state_off[S_MARKS], marks);
    }
    if (marks != Py_None) {
        unsigned char *cell = (unsigned char *)PyByteArray_AS_STRING(marks) + slot;
        int old_mark = *cell;
        if (old_mark != mark) {
            *cell = (unsigned char)mark;
            long long failed = failed_recent + (mark & 1) - (old_mark & 1);
            long long revisits = revisits_recent + (mark >> 1) - (old_mark >> 1);
            if (failed != failed_recent && set_ll(state, S_FAILED_RECENT, failed) < 0)
                return NULL;
            if (revisits != revisits_recent && set_ll(state, S_REVISITS_RECENT, revisits) < 0)
                return NULL;
            failed_recent = failed;
            revisits_recent = revisits;
        }
    }

    /* --- can any rule trip at this call? (evaluate_hashed's test, field for field) -------- */
    long long revisit_run;
    if (get_ll(state, S_REVISIT_RUN, &revisit_run) < 0)
        return NULL;
    results = ST(S_RESULTS);
    if (hits < lim->threshold && no_runs_now &&
        (marks == Py_None || (error_run < lim->same_error && failed_recent < lim->failure_share &&
                              revisits_recent < lim->revisit_share)) &&
        (results == Py_None || (outcome_run < lim->same_result && revisit_run < lim->revisit)))
        return nothing_trips(state);
    return PyLong_FromLongLong(hits);

error:
    if (have_ring)
        PyBuffer_Release(&ring);
    return NULL;
}

/* -- configure ------------------------------------------------------------------------------- */

static int
offsets(PyTypeObject *type, const char *const *names, int count, Py_ssize_t *out)
{
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (descr == NULL)
            PyErr_Clear();
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)descr)->d_common.d_type != type) {
            Py_XDECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, names[i]);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        Py_DECREF(descr); /* the class holds it */
        if (member->type != Py_T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, names[i]);
            return -1;
        }
        out[i] = member->offset;
    }
    return 0;
}

static PyObject *
configure(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *st, *ct, *runs, *verdict, *arr, *mode;
    long long empty, grace;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOLL:configure", &PyType_Type, &st, &PyType_Type, &ct,
                          &PyDict_Type, &runs, &verdict, &arr, &mode, &empty, &grace))
        return NULL;
    if (!PyType_Check(arr)) {
        PyErr_SetString(PyExc_TypeError, "configure: array_type must be a type");
        return NULL;
    }
    Py_ssize_t s_off[S_COUNT], c_off[C_COUNT];
    if (offsets((PyTypeObject *)st, state_names, S_COUNT, s_off) < 0 ||
        offsets((PyTypeObject *)ct, call_names, C_COUNT, c_off) < 0)
        return NULL;
    memcpy(state_off, s_off, sizeof s_off);
    memcpy(call_off, c_off, sizeof c_off);
    Py_INCREF(st);
    Py_XSETREF(state_type, (PyTypeObject *)st);
    Py_INCREF(ct);
    Py_XSETREF(call_type, (PyTypeObject *)ct);
    Py_INCREF(runs);
    Py_XSETREF(no_runs, runs);
    Py_INCREF(verdict);
    Py_XSETREF(working, verdict);
    Py_INCREF(arr);
    Py_XSETREF(array_type, arr);
    Py_INCREF(mode);
    Py_XSETREF(tool_args, mode);
    empty_hash = empty;
    replay_grace = grace;
    for (int i = 0; i < CACHED_POLICIES; i++)
        Py_CLEAR(cache[i].policy);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
     "step(state, call, key, result, policy) -> int | None: evaluate_hashed's bookkeeping for one "
     "call (None: done; 0: _quiet; n > 0: _judge with n hits; -1: the Python path runs)."},
    {"configure", (PyCFunction)configure, METH_VARARGS,
     "configure(RunState, ToolCall, no_runs, working, array_type, tool_args, empty, replay_grace): "
     "the classes and constants step works with (TypeError: a layout it cannot read)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tripwire.core._watchstep",
    "The loop watcher's per-call bookkeeping (see _watchstep.c).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__watchstep(void)
{
    str_verdict = PyUnicode_InternFromString("verdict");
    minus_one = PyLong_FromLong(-1);
    if (str_verdict == NULL || minus_one == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
