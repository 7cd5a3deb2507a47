/* Stateless leaf helpers of tripwire.core.signature, compiled: an optional accelerator.
 *
 * Three pure functions, each with a Python twin in tripwire/core/signature.py that stays the
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
 * - canonical_text(text, keys) -> bytes | None: canonical(msgspec.json.decode(text), keys) for
 *   ASCII JSON text (a str or bytes) whose top level is an object or an array, read straight
 *   from the text: no Python object per value. None whenever it is not certain to give those
 *   bytes (the caller then decodes): text that is not ASCII or not valid JSON, a lone surrogate,
 *   a key twice in one object, an integer outside 64 bits, a float that overflows, nesting as
 *   deep as MAX_DEPTH, more than MAX_KEYS volatile keys.
 *
 * No state, no Python callbacks, no knowledge of spans or rules: the loop watcher and every
 * rule are Python (tripwire/core/watch.py, tripwire/core/rules.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
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

/* ---- canonical_text ------------------------------------------------------------------------ */

/* What canonical_text reads is what msgspec's JSON decoder accepts (RFC 8259: whitespace is
 * space, tab, CR and LF; no leading zeros; no control character in a string; only the escapes
 * \" \\ \/ \b \f \n \r \t \uXXXX), and it writes what canonical writes for the decoded value. It
 * reads the text's terminating NUL (str and bytes objects both have one) as the stop of every
 * scan: no scan needs a bounds check, and a NUL inside the text is refused like any stray byte. */

#define MAX_KEYS 64 /* more volatile keys than this: the caller decodes */

/* Bytes of a JSON string: plain, the closing quote, an escape, or refused (a control character,
 * a non-ASCII byte of bytes text, the terminating NUL). */
enum { S_PLAIN = 0, S_QUOTE, S_ESCAPE, S_BAD };
static unsigned char string_class[256];

static void
init_text_classes(void)
{
    for (int c = 0; c < 256; c++)
        string_class[c] = c < 0x20 || c >= 0x80 ? S_BAD : c == '"' ? S_QUOTE : c == '\\' ? S_ESCAPE : S_PLAIN;
}

typedef struct {
    Py_ssize_t key_at;  /* where the key's bytes are: in the text, or in tmp when escaped */
    Py_ssize_t key_len;
    Py_ssize_t at, len; /* the entry's bytes in out: the key's MessagePack, then the value's */
    const char *key;    /* set when the object closes (tmp may move until then) */
    int escaped;
} TextEntry;

typedef struct {
    const char *s;
    Py_ssize_t len;
} Key;

typedef struct {
    const unsigned char *text, *p, *end;
    Buffer out;     /* the canonical bytes */
    Buffer tmp;     /* unescaped keys of the open objects, then one unescaped string value */
    Buffer scratch; /* the entries of an object while they are written back in key order */
    TextEntry *entries;
    Py_ssize_t top, cap;
    const Key *keys;
    Py_ssize_t n_keys;
    uint64_t key_bits; /* the key_bit of every volatile key: most other keys miss them all */
    TextEntry small[64];
} Parser;

static void
buf_init(Buffer *b)
{
    b->data = b->small;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->small);
}

static void
buf_free(Buffer *b)
{
    if (b->data != b->small)
        PyMem_Free(b->data);
}

static inline void
skip_space(Parser *P)
{
    const unsigned char *p = P->p;
    while (*p <= ' ' && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    P->p = p;
}

/* One of 64 bits for a key, from its length and its first and last bytes. */
static inline int
key_bit(const char *s, Py_ssize_t len)
{
    if (len == 0)
        return 0;
    return (int)(((size_t)len * 13 + (unsigned char)s[0] + 3 * (size_t)(unsigned char)s[len - 1]) & 63);
}

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int parse_value(Parser *P, int depth);

/* P->p at a string's opening quote: its raw content (*s, *n), whether it holds an escape, and
 * P->p past its closing quote. */
static int
scan_string(Parser *P, const unsigned char **s, Py_ssize_t *n, int *escaped)
{
    const unsigned char *q = P->p + 1, *start = q;
    int esc = 0;
    for (;;) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* Eight bytes at a time to the first one that is not plain (a quote, a backslash, a
         * byte below 0x20 or above 0x7f): the lowest flagged byte is always a true one. */
        while (P->end - q >= 8) {
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t w, quote, slash;
            memcpy(&w, q, 8);
            quote = w ^ (ones * '"');
            slash = w ^ (ones * '\\');
            uint64_t special =
                (((w - ones * 0x20) & ~w) | ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | w) & highs;
            if (special) {
                q += __builtin_ctzll(special) >> 3;
                break;
            }
            q += 8;
        }
#endif
        unsigned char k = string_class[*q];
        if (k == S_PLAIN) {
            q++;
            continue;
        }
        if (k == S_QUOTE)
            break;
        if (k == S_ESCAPE && P->end - q >= 2) {
            esc = 1;
            q += 2;
            continue;
        }
        return DECLINE;
    }
    *s = start;
    *n = q - start;
    *escaped = esc;
    P->p = q + 1;
    return OK;
}

static int
hex4(const unsigned char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The UTF-8 of the raw string content s[0:n] (escapes resolved) appended to b. A bad escape or
 * a surrogate that is not half of a pair: DECLINE (msgspec refuses both). */
static int
unescape(Buffer *b, const unsigned char *s, Py_ssize_t n)
{
    const unsigned char *end = s + n;
    while (s < end) {
        const unsigned char *run = s;
        while (s < end && *s != '\\')
            s++;
        if (s > run && buf_put(b, run, s - run) < 0)
            return FAIL;
        if (s == end)
            break;
        unsigned char c = s[1]; /* scan_string saw it: a backslash never ends the content */
        s += 2;
        unsigned char one;
        switch (c) {
        case '"': case '\\': case '/': one = c; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            if (end - s < 4)
                return DECLINE;
            long cp = hex4(s);
            if (cp < 0)
                return DECLINE;
            s += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return DECLINE;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - s < 6 || s[0] != '\\' || s[1] != 'u')
                    return DECLINE;
                long low = hex4(s + 2);
                if (low < 0xDC00 || low > 0xDFFF)
                    return DECLINE;
                s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            unsigned char u[4];
            Py_ssize_t k;
            if (cp < 0x80) {
                u[0] = (unsigned char)cp;
                k = 1;
            }
            else if (cp < 0x800) {
                u[0] = (unsigned char)(0xC0 | (cp >> 6));
                u[1] = (unsigned char)(0x80 | (cp & 0x3F));
                k = 2;
            }
            else if (cp < 0x10000) {
                u[0] = (unsigned char)(0xE0 | (cp >> 12));
                u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                u[2] = (unsigned char)(0x80 | (cp & 0x3F));
                k = 3;
            }
            else {
                u[0] = (unsigned char)(0xF0 | (cp >> 18));
                u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                u[3] = (unsigned char)(0x80 | (cp & 0x3F));
                k = 4;
            }
            if (buf_put(b, u, k) < 0)
                return FAIL;
            continue;
        }
        default:
            return DECLINE;
        }
        if (buf_byte(b, one) < 0)
            return FAIL;
    }
    return OK;
}

static int
parse_string(Parser *P)
{
    const unsigned char *s;
    Py_ssize_t n;
    int escaped;
    int rc = scan_string(P, &s, &n, &escaped);
    if (rc != OK)
        return rc;
    if (!escaped)
        return put_text(&P->out, (const char *)s, n) < 0 ? FAIL : OK;
    Py_ssize_t mark = P->tmp.len;
    rc = unescape(&P->tmp, s, n);
    if (rc == OK && put_text(&P->out, P->tmp.data + mark, P->tmp.len - mark) < 0)
        rc = FAIL;
    P->tmp.len = mark;
    return rc;
}

static const double exact_powers[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

static int
parse_number(Parser *P)
{
    const unsigned char *start = P->p, *q = start;
    int negative = *q == '-';
    if (negative)
        q++;
    const unsigned char *int_start = q;
    if (*q == '0')
        q++;
    else if (is_digit(*q))
        while (is_digit(*q))
            q++;
    else
        return DECLINE;
    const unsigned char *int_end = q, *frac_start = q, *frac_end = q;
    int is_float = 0;
    if (*q == '.') {
        q++;
        if (!is_digit(*q))
            return DECLINE;
        frac_start = q;
        while (is_digit(*q))
            q++;
        frac_end = q;
        is_float = 1;
    }
    Py_ssize_t exponent = 0;
    if (*q == 'e' || *q == 'E') {
        q++;
        int exp_negative = *q == '-';
        if (*q == '-' || *q == '+')
            q++;
        if (!is_digit(*q))
            return DECLINE;
        const unsigned char *exp_start = q;
        while (is_digit(*q))
            exponent = exponent * 10 + (*q++ - '0');
        if (q - exp_start > 6) /* absurd: leave it to the decoder (and no overflow here) */
            return DECLINE;
        if (exp_negative)
            exponent = -exponent;
        is_float = 1;
    }
    P->p = q;
    if (!is_float) {
        /* An integer: exact up to 64 bits; msgspec makes a wider one a Python int, and
         * canonical declines it. */
        if (int_end - int_start > 20)
            return DECLINE;
        uint64_t m = 0;
        for (const unsigned char *d = int_start; d < int_end; d++) {
            unsigned digit = (unsigned)(*d - '0');
            if (m > (UINT64_MAX - digit) / 10)
                return DECLINE;
            m = m * 10 + digit;
        }
        if (!negative)
            return put_uint(&P->out, m) < 0 ? FAIL : OK;
        if (m > 9223372036854775808ULL)
            return DECLINE;
        int64_t v = m == 9223372036854775808ULL ? INT64_MIN : -(int64_t)m;
        return put_int(&P->out, v) < 0 ? FAIL : OK;
    }
    double x;
    /* The significant digits, up to 19 of them (then m is exact). */
    uint64_t m = 0;
    int digits = 0;
    for (const unsigned char *d = int_start; d < frac_end && digits <= 19; d++) {
        if (d == int_end)
            d = frac_start;
        if (d == frac_end)
            break;
        if (m == 0 && *d == '0')
            continue;
        m = m * 10 + (uint64_t)(*d - '0');
        digits++;
    }
    Py_ssize_t e10 = exponent - (frac_end - frac_start);
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    const int fast = 1;
#else
    const int fast = 0; /* excess precision would round twice */
#endif
    if (m == 0 && digits == 0)
        x = negative ? -0.0 : 0.0; /* every digit is a zero: 0.0 or -0.0, whatever the exponent */
    else if (fast && digits <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        /* Both operands exact: one correctly rounded operation (Clinger's fast path). */
        x = (double)m;
        x = e10 < 0 ? x / exact_powers[-e10] : x * exact_powers[e10];
        if (negative)
            x = -x;
    }
    else {
        /* Correctly rounded and locale-independent (Python's own float parser). */
        char number[128];
        Py_ssize_t n = q - start;
        if (n >= (Py_ssize_t)sizeof(number))
            return DECLINE;
        memcpy(number, start, (size_t)n);
        number[n] = '\0';
        x = PyOS_string_to_double(number, NULL, NULL);
        if (x == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                return FAIL;
            PyErr_Clear();
            return DECLINE;
        }
    }
    if (isinf(x))
        return DECLINE; /* msgspec refuses a number out of range */
    return walk_float(&P->out, x);
}

static int
text_entry_order(const void *pa, const void *pb)
{
    const TextEntry *a = pa, *b = pb;
    Py_ssize_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    if (n > 0 && a->key[0] != b->key[0]) /* the common case, without a call */
        return (unsigned char)a->key[0] - (unsigned char)b->key[0];
    int c = memcmp(a->key, b->key, (size_t)n);
    if (c != 0)
        return c;
    return (a->key_len > b->key_len) - (a->key_len < b->key_len);
}

static int
is_volatile(const Parser *P, const char *key, Py_ssize_t len)
{
    if (!((P->key_bits >> key_bit(key, len)) & 1))
        return 0;
    for (Py_ssize_t i = 0; i < P->n_keys; i++)
        if (P->keys[i].len == len && memcmp(P->keys[i].s, key, (size_t)len) == 0)
            return 1;
    return 0;
}

/* The object whose header byte is out[start] and whose entries are entries[base:top], written
 * in text order: sort them as canonical does and, unless they were in order already, write them
 * again in that order. */
static int
close_object(Parser *P, Py_ssize_t start, Py_ssize_t base)
{
    TextEntry *e = P->entries + base;
    Py_ssize_t n = P->top - base;
    for (Py_ssize_t i = 0; i < n; i++)
        e[i].key = e[i].escaped ? P->tmp.data + e[i].key_at : (const char *)P->text + e[i].key_at;
    int moved = 0;
    if (n > 16) {
        moved = 1;
        qsort(e, (size_t)n, sizeof(TextEntry), text_entry_order);
    }
    else
        for (Py_ssize_t i = 1; i < n; i++) {
            TextEntry t = e[i];
            Py_ssize_t j = i;
            while (j > 0 && text_entry_order(&e[j - 1], &t) > 0) {
                e[j] = e[j - 1];
                j--;
            }
            if (j != i) {
                e[j] = t;
                moved = 1;
            }
        }
    for (Py_ssize_t i = 1; i < n; i++)
        if (text_entry_order(&e[i - 1], &e[i]) == 0)
            return DECLINE; /* a key twice: the decoder keeps the last value */
    if (!moved && n < 16) {
        P->out.data[start] = (char)(0x80 | n);
        return OK;
    }
    Py_ssize_t body = P->out.len - (start + 1);
    P->scratch.len = 0;
    if (buf_put(&P->scratch, P->out.data + start + 1, body) < 0)
        return FAIL;
    P->out.len = start;
    if (put_container_header(&P->out, n, 0x80, 0xde, 0xdf) < 0)
        return FAIL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (buf_put(&P->out, P->scratch.data + (e[i].at - (start + 1)), e[i].len) < 0)
            return FAIL;
    return OK;
}

static int
push_entry(Parser *P, const TextEntry *entry)
{
    if (P->top == P->cap) {
        if (P->cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(TextEntry)) {
            PyErr_NoMemory();
            return FAIL;
        }
        TextEntry *bigger = PyMem_Malloc((size_t)P->cap * 2 * sizeof(TextEntry));
        if (bigger == NULL) {
            PyErr_NoMemory();
            return FAIL;
        }
        memcpy(bigger, P->entries, (size_t)P->top * sizeof(TextEntry));
        if (P->entries != P->small)
            PyMem_Free(P->entries);
        P->entries = bigger;
        P->cap *= 2;
    }
    P->entries[P->top++] = *entry;
    return OK;
}

static int
parse_object(Parser *P, int depth)
{
    if (depth >= MAX_DEPTH)
        return DECLINE;
    Py_ssize_t start = P->out.len, base = P->top, mark = P->tmp.len;
    if (buf_byte(&P->out, 0x80) < 0)
        return FAIL;
    P->p++;
    skip_space(P);
    if (*P->p == '}') {
        P->p++;
        return OK;
    }
    int rc;
    for (;;) {
        if (*P->p != '"') {
            rc = DECLINE;
            break;
        }
        const unsigned char *s;
        TextEntry entry;
        rc = scan_string(P, &s, &entry.key_len, &entry.escaped);
        if (rc != OK)
            break;
        const char *key = (const char *)s;
        if (entry.escaped) {
            entry.key_at = P->tmp.len;
            rc = unescape(&P->tmp, s, entry.key_len);
            if (rc != OK)
                break;
            entry.key_len = P->tmp.len - entry.key_at;
            key = P->tmp.data + entry.key_at;
        }
        else
            entry.key_at = s - P->text;
        skip_space(P);
        if (*P->p != ':') {
            rc = DECLINE;
            break;
        }
        P->p++;
        skip_space(P);
        int dropped = is_volatile(P, key, entry.key_len);
        entry.at = P->out.len;
        if (!dropped && put_text(&P->out, key, entry.key_len) < 0) {
            rc = FAIL;
            break;
        }
        rc = parse_value(P, depth + 1);
        if (rc != OK)
            break;
        if (dropped) { /* read (it must be valid JSON), not written */
            P->out.len = entry.at;
            if (entry.escaped)
                P->tmp.len = entry.key_at;
        }
        else {
            entry.len = P->out.len - entry.at;
            if (push_entry(P, &entry) < 0) {
                rc = FAIL;
                break;
            }
        }
        skip_space(P);
        if (*P->p == ',') {
            P->p++;
            skip_space(P);
            continue;
        }
        if (*P->p == '}') {
            P->p++;
            rc = close_object(P, start, base);
        }
        else
            rc = DECLINE;
        break;
    }
    P->top = base;
    P->tmp.len = mark;
    return rc;
}

static int
parse_array(Parser *P, int depth)
{
    if (depth >= MAX_DEPTH)
        return DECLINE;
    Py_ssize_t start = P->out.len, n = 0;
    if (buf_byte(&P->out, 0x90) < 0)
        return FAIL;
    P->p++;
    skip_space(P);
    if (*P->p == ']') {
        P->p++;
        return OK;
    }
    for (;;) {
        int rc = parse_value(P, depth + 1);
        if (rc != OK)
            return rc;
        n++;
        skip_space(P);
        if (*P->p == ',') {
            P->p++;
            skip_space(P);
            continue;
        }
        if (*P->p != ']')
            return DECLINE;
        P->p++;
        break;
    }
    if (n < 16) {
        P->out.data[start] = (char)(0x90 | n);
        return OK;
    }
    /* A wider header: move the items up behind it. */
    int width = n <= 0xffff ? 2 : 4;
    Py_ssize_t body = P->out.len - (start + 1);
    if (buf_reserve(&P->out, width) < 0)
        return FAIL;
    char *h = P->out.data + start;
    memmove(h + 1 + width, h + 1, (size_t)body);
    h[0] = (char)(width == 2 ? 0xdc : 0xdd);
    for (int i = 0; i < width; i++)
        h[1 + i] = (char)((uint64_t)n >> (8 * (width - 1 - i)));
    P->out.len += width;
    return OK;
}

static int
parse_literal(Parser *P, const char *word, Py_ssize_t n, unsigned char byte)
{
    if (P->end - P->p < n || memcmp(P->p, word, (size_t)n) != 0)
        return DECLINE;
    P->p += n;
    return buf_byte(&P->out, byte) < 0 ? FAIL : OK;
}

static int
parse_value(Parser *P, int depth)
{
    switch (*P->p) {
    case '{':
        return parse_object(P, depth);
    case '[':
        return parse_array(P, depth);
    case '"':
        return parse_string(P);
    case 't':
        return parse_literal(P, "true", 4, 0xc3);
    case 'f':
        return parse_literal(P, "false", 5, 0xc2);
    case 'n':
        return parse_literal(P, "null", 4, 0xc0);
    case '-': case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
        return parse_number(P);
    default:
        return DECLINE;
    }
}

/* One volatile key's UTF-8 into keys[]; DECLINE for a key that is not an exact str (it could
 * equal a str it does not spell) or for more than MAX_KEYS of them. */
static int
add_key(PyObject *k, Key *keys, Py_ssize_t *n, uint64_t *bits)
{
    if (!PyUnicode_CheckExact(k) || *n == MAX_KEYS)
        return DECLINE;
    Py_ssize_t len;
    const char *s;
    if (PyUnicode_IS_COMPACT_ASCII(k)) {
        s = (const char *)PyUnicode_DATA(k);
        len = PyUnicode_GET_LENGTH(k);
    }
    else if ((s = PyUnicode_AsUTF8AndSize(k, &len)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return FAIL;
        PyErr_Clear(); /* a lone surrogate: no key read from the text can equal it */
        return OK;
    }
    keys[*n].s = s;
    keys[*n].len = len;
    (*n)++;
    *bits |= 1ULL << key_bit(s, len);
    return OK;
}

/* The volatile keys (a tuple, a set or a frozenset: the collection keeps them alive, and no
 * Python code runs before the parse ends). */
static int
collect_keys(PyObject *keys, Key *out, Py_ssize_t *n, uint64_t *bits)
{
    if (PyTuple_CheckExact(keys)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); i++) {
            int rc = add_key(PyTuple_GET_ITEM(keys, i), out, n, bits);
            if (rc != OK)
                return rc;
        }
        return OK;
    }
    PyObject *it = PyObject_GetIter(keys), *k;
    if (it == NULL)
        return FAIL;
    int rc = OK;
    while (rc == OK && (k = PyIter_Next(it)) != NULL) {
        rc = add_key(k, out, n, bits);
        Py_DECREF(k);
    }
    Py_DECREF(it);
    if (rc == OK && PyErr_Occurred())
        rc = FAIL;
    return rc;
}

static PyObject *
canonical_text(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "canonical_text(text, keys) takes 2 arguments");
        return NULL;
    }
    PyObject *text = args[0], *keys = args[1];
    if (!PyAnySet_Check(keys) && !PyTuple_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "canonical_text: keys must be a tuple, set or frozenset");
        return NULL;
    }
    const unsigned char *data;
    Py_ssize_t size;
    if (PyUnicode_CheckExact(text)) {
        if (!PyUnicode_IS_COMPACT_ASCII(text))
            Py_RETURN_NONE;
        data = PyUnicode_DATA(text);
        size = PyUnicode_GET_LENGTH(text);
    }
    else if (PyBytes_CheckExact(text)) {
        data = (const unsigned char *)PyBytes_AS_STRING(text);
        size = PyBytes_GET_SIZE(text);
    }
    else {
        PyErr_SetString(PyExc_TypeError, "canonical_text: text must be a str or bytes");
        return NULL;
    }
    Key volatile_keys[MAX_KEYS];
    Parser P;
    P.keys = volatile_keys;
    P.n_keys = 0;
    P.key_bits = 0;
    int rc = collect_keys(keys, volatile_keys, &P.n_keys, &P.key_bits);
    if (rc == FAIL)
        return NULL;
    if (rc == DECLINE)
        Py_RETURN_NONE;
    P.text = P.p = data;
    P.end = data + size;
    buf_init(&P.out);
    buf_init(&P.tmp);
    buf_init(&P.scratch);
    P.entries = P.small;
    P.top = 0;
    P.cap = (Py_ssize_t)(sizeof(P.small) / sizeof(P.small[0]));
    skip_space(&P);
    if (*P.p == '{' || *P.p == '[') { /* a top-level scalar is left to the decoder */
        rc = parse_value(&P, 0);
        if (rc == OK) {
            skip_space(&P);
            if (P.p != P.end)
                rc = DECLINE; /* trailing data (or a NUL in the text) */
        }
    }
    else
        rc = DECLINE;
    PyObject *out = NULL;
    if (rc == OK)
        out = PyBytes_FromStringAndSize(P.out.data, P.out.len);
    else if (rc == DECLINE) {
        out = Py_None;
        Py_INCREF(out);
    }
    buf_free(&P.out);
    buf_free(&P.tmp);
    buf_free(&P.scratch);
    if (P.entries != P.small)
        PyMem_Free(P.entries);
    return out;
}

/* ---- module ---------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"canonical", (PyCFunction)(void (*)(void))canonical, METH_FASTCALL,
     "canonical(obj, keys) -> bytes | None: the canonical MessagePack of normalized arguments "
     "(None: the Python path answers)."},
    {"volatile_free", (PyCFunction)(void (*)(void))volatile_free, METH_FASTCALL,
     "volatile_free(obj, keys, budget) -> True / False / None (over budget)."},
    {"canonical_text", (PyCFunction)(void (*)(void))canonical_text, METH_FASTCALL,
     "canonical_text(text, keys) -> bytes | None: canonical(json.decode(text), keys) for ASCII JSON "
     "text whose top level is an object or an array (None: decode it and ask canonical)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tripwire.core._speedups",
    "Stateless leaf helpers of tripwire.core.signature (see _speedups.c).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    init_text_classes();
    return PyModule_Create(&module_def);
}
