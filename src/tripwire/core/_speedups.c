/* Stateless leaf helpers of tripwire.core.signature, compiled: an optional accelerator.
 *
 * Two pure functions, each with a Python twin in tripwire/core/signature.py that stays the
 * reference (the whole test suite runs against both: TRIPWIRE_NO_EXTENSIONS=1 selects the
 * Python twins):
 *
 * - canonical(obj, keys) -> bytes | None: the canonical MessagePack of a tool call's arguments,
 *   exactly the bytes of msgspec's sorted MessagePack encoder applied to Normalizer._normalize
 *   (volatile keys dropped at every depth, integral floats as integers, NaN and infinities as
 *   their tokens), in one pass and without building the normalized copy. None for any value it
 *   does not handle itself (a type other than dict, list, tuple, str, int, float, bool and None,
 *   a non-str key, an integer wider than 64 bits, a lone surrogate, nesting as deep as
 *   MAX_DEPTH): the caller then takes the Python path.
 * - volatile_free(obj, keys, budget) -> True / False / None: whether a value decoded from JSON
 *   holds a volatile key anywhere (None when the walk is over budget).
 *
 * No state, no Python callbacks, no knowledge of spans or rules: the loop watcher and every
 * rule are Python (tripwire/core/watch.py, tripwire/core/rules.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64 /* tripwire.core.signature.MAX_DEPTH */

/* ---- canonical ------------------------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char small[512];
} Buffer;

static int
buf_reserve(Buffer *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *bigger = b->data == b->small ? PyMem_Malloc((size_t)cap) : PyMem_Realloc(b->data, (size_t)cap);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->data == b->small)
        memcpy(bigger, b->small, (size_t)b->len);
    b->data = bigger;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buffer *b, const void *p, Py_ssize_t n)
{
    if (b->len + n > b->cap && buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
    return 0;
}

/* One byte: the type byte of most values and headers. */
static inline int
buf_byte(Buffer *b, unsigned char c)
{
    if (b->len == b->cap && buf_reserve(b, 1) < 0)
        return -1;
    b->data[b->len++] = (char)c;
    return 0;
}

/* A type byte followed by an n-byte big-endian unsigned value. */
static int
buf_tagged(Buffer *b, unsigned char tag, uint64_t v, int n)
{
    unsigned char out[9];
    out[0] = tag;
    for (int i = 0; i < n; i++)
        out[1 + i] = (unsigned char)(v >> (8 * (n - 1 - i)));
    return buf_put(b, out, 1 + n);
}

static int
put_uint(Buffer *b, uint64_t v)
{
    if (v < 128)
        return buf_byte(b, (unsigned char)v);
    if (v <= 0xff)
        return buf_tagged(b, 0xcc, v, 1);
    if (v <= 0xffff)
        return buf_tagged(b, 0xcd, v, 2);
    if (v <= 0xffffffffULL)
        return buf_tagged(b, 0xce, v, 4);
    return buf_tagged(b, 0xcf, v, 8);
}

static int
put_int(Buffer *b, int64_t v)
{
    if (v >= 0)
        return put_uint(b, (uint64_t)v);
    if (v >= -32)
        return buf_byte(b, (unsigned char)(int8_t)v);
    if (v >= -128)
        return buf_tagged(b, 0xd0, (uint64_t)(uint8_t)(int8_t)v, 1);
    if (v >= -32768)
        return buf_tagged(b, 0xd1, (uint64_t)(uint16_t)(int16_t)v, 2);
    if (v >= -2147483648LL)
        return buf_tagged(b, 0xd2, (uint64_t)(uint32_t)(int32_t)v, 4);
    return buf_tagged(b, 0xd3, (uint64_t)v, 8);
}

static int
put_str_header(Buffer *b, Py_ssize_t n)
{
    if (n < 32)
        return buf_byte(b, (unsigned char)(0xa0 | n));
    if (n <= 0xff)
        return buf_tagged(b, 0xd9, (uint64_t)n, 1);
    if (n <= 0xffff)
        return buf_tagged(b, 0xda, (uint64_t)n, 2);
    return buf_tagged(b, 0xdb, (uint64_t)n, 4);
}

static int
put_text(Buffer *b, const char *s, Py_ssize_t n)
{
    if (put_str_header(b, n) < 0)
        return -1;
    return buf_put(b, s, n);
}

static int
put_container_header(Buffer *b, Py_ssize_t n, unsigned char fix, unsigned char t16, unsigned char t32)
{
    if (n < 16)
        return buf_byte(b, (unsigned char)(fix | n));
    if (n <= 0xffff)
        return buf_tagged(b, t16, (uint64_t)n, 2);
    return buf_tagged(b, t32, (uint64_t)n, 4);
}

/* Results of the walk: written, "the Python path must answer", or an exception is set. */
enum { OK = 0, DECLINE = 1, FAIL = -1 };

typedef struct {
    const char *key;
    Py_ssize_t len;
    PyObject *value;
} Entry;

static int
entry_order(const void *pa, const void *pb)
{
    const Entry *a = pa, *b = pb;
    Py_ssize_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->key, b->key, (size_t)n);
    if (c != 0)
        return c;
    return (a->len > b->len) - (a->len < b->len);
}

static int walk(Buffer *b, PyObject *v, PyObject *keys, int depth);

static int
walk_float(Buffer *b, double x)
{
    if (isnan(x))
        return put_text(b, "\0NaN", 4) < 0 ? FAIL : OK;
    if (isinf(x))
        return (x > 0 ? put_text(b, "\0Infinity", 9) : put_text(b, "\0-Infinity", 10)) < 0 ? FAIL : OK;
    if (floor(x) == x) {
        /* An integral float is the integer (1.0 == 1); beyond 64 bits the Python path writes it. */
        if (x >= 0 && x < 18446744073709551616.0)
            return put_uint(b, (uint64_t)x) < 0 ? FAIL : OK;
        if (x < 0 && x >= -9223372036854775808.0)
            return put_int(b, (int64_t)x) < 0 ? FAIL : OK;
        return DECLINE;
    }
    unsigned char out[9];
    uint64_t bits;
    memcpy(&bits, &x, 8);
    out[0] = 0xcb;
    for (int i = 0; i < 8; i++)
        out[1 + i] = (unsigned char)(bits >> (8 * (7 - i)));
    return buf_put(b, out, 9) < 0 ? FAIL : OK;
}

static int
walk_dict(Buffer *b, PyObject *d, PyObject *keys, int depth)
{
    Py_ssize_t n = PyDict_GET_SIZE(d);
    Entry small[16];
    Entry *entries = n <= 16 ? small : PyMem_Malloc((size_t)n * sizeof(Entry));
    if (entries == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    Py_ssize_t pos = 0, kept = 0;
    PyObject *k, *v;
    int rc = OK;
    while (PyDict_Next(d, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            rc = DECLINE;
            break;
        }
        int hit = PySet_Contains(keys, k);
        if (hit < 0) {
            rc = FAIL;
            break;
        }
        if (hit)
            continue;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(k, &len);
        if (s == NULL) { /* a lone surrogate: the Python path writes it */
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                rc = FAIL;
                break;
            }
            PyErr_Clear();
            rc = DECLINE;
            break;
        }
        entries[kept].key = s;
        entries[kept].len = len;
        entries[kept].value = v;
        kept++;
    }
    if (rc == OK) {
        if (kept > 16)
            qsort(entries, (size_t)kept, sizeof(Entry), entry_order);
        else /* a few keys (the common case): an insertion sort, no calls */
            for (Py_ssize_t i = 1; i < kept; i++) {
                Entry e = entries[i];
                Py_ssize_t j = i;
                while (j > 0 && entry_order(&entries[j - 1], &e) > 0) {
                    entries[j] = entries[j - 1];
                    j--;
                }
                entries[j] = e;
            }
        if (put_container_header(b, kept, 0x80, 0xde, 0xdf) < 0)
            rc = FAIL;
        for (Py_ssize_t i = 0; rc == OK && i < kept; i++) {
            if (put_text(b, entries[i].key, entries[i].len) < 0)
                rc = FAIL;
            else
                rc = walk(b, entries[i].value, keys, depth + 1);
        }
    }
    if (entries != small)
        PyMem_Free(entries);
    return rc;
}

static int
walk(Buffer *b, PyObject *v, PyObject *keys, int depth)
{
    if (v == Py_None)
        return buf_byte(b, 0xc0) < 0 ? FAIL : OK;
    if (v == Py_True || v == Py_False)
        return buf_byte(b, v == Py_True ? 0xc3 : 0xc2) < 0 ? FAIL : OK;
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(v, &len);
        if (s == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
                return FAIL;
            PyErr_Clear();
            return DECLINE;
        }
        return put_text(b, s, len) < 0 ? FAIL : OK;
    }
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow == 0) {
            if (x == -1 && PyErr_Occurred())
                return FAIL;
            return put_int(b, (int64_t)x) < 0 ? FAIL : OK;
        }
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                    return FAIL;
                PyErr_Clear();
                return DECLINE;
            }
            return put_uint(b, (uint64_t)u) < 0 ? FAIL : OK;
        }
        return DECLINE;
    }
    if (PyFloat_CheckExact(v))
        return walk_float(b, PyFloat_AS_DOUBLE(v));
    if (PyDict_CheckExact(v) || PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        if (depth >= MAX_DEPTH)
            return DECLINE; /* the Python path writes the depth (or cycle) token */
        if (PyDict_CheckExact(v))
            return walk_dict(b, v, keys, depth);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (put_container_header(b, n, 0x90, 0xdc, 0xdd) < 0)
            return FAIL;
        for (Py_ssize_t i = 0; i < n; i++) {
            /* The list may change size while walked only through another thread: re-check. */
            if (i >= PySequence_Fast_GET_SIZE(v))
                return DECLINE;
            int rc = walk(b, PySequence_Fast_GET_ITEM(v, i), keys, depth + 1);
            if (rc != OK)
                return rc;
        }
        return OK;
    }
    return DECLINE;
}

static PyObject *
canonical(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "canonical(obj, keys) takes 2 arguments");
        return NULL;
    }
    PyObject *keys = args[1];
    if (!PyAnySet_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "canonical: keys must be a set or frozenset");
        return NULL;
    }
    Buffer b;
    b.data = b.small;
    b.len = 0;
    b.cap = (Py_ssize_t)sizeof(b.small);
    PyObject *out = NULL;
    int rc = walk(&b, args[0], keys, 0);
    if (rc == OK)
        out = PyBytes_FromStringAndSize(b.data, b.len);
    else if (rc == DECLINE) {
        out = Py_None;
        Py_INCREF(out);
    }
    if (b.data != b.small)
        PyMem_Free(b.data);
    return out;
}

/* ---- volatile_free --------------------------------------------------------------------------- */

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

/* Py_True, Py_False or Py_None (borrowed), NULL with an exception set. */
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

/* ---- module ---------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"canonical", (PyCFunction)(void (*)(void))canonical, METH_FASTCALL,
     "canonical(obj, keys) -> bytes | None: the canonical MessagePack of normalized arguments "
     "(None: the Python path answers)."},
    {"volatile_free", (PyCFunction)(void (*)(void))volatile_free, METH_FASTCALL,
     "volatile_free(obj, keys, budget) -> True / False / None (over budget)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tripwire.core._speedups",
    "Stateless leaf helpers of tripwire.core.signature (see _speedups.c).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module_def);
}
