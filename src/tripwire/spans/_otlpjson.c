/* The OTLP/JSON fast path of tripwire/spans/otlp.py's decode_json: one stateless leaf.
 *
 * scan(data, prefixes, keys, max_depth) reads an OTLP/JSON ExportTraceServiceRequest in one pass
 * and returns, per span, the entry tuple the protobuf scanner gives (see tripwire/spans/_wire.py):
 * (trace_id, span_id, parent_span_id, name, start_s, end_s, status_error, status_message,
 * exception_type, attributes, resource_attributes, scope_name), converting only the wanted
 * attributes. It answers only requests whose every field it can read exactly as the msgspec
 * decoder of otlp.py reads them, and returns None for anything else: a syntax error anywhere,
 * a known field of another type, a field written twice, an id that is not hex (base64 ids), a
 * time that is not a plain count of nanoseconds, a bytes, NaN or quoted double value, values cut
 * at max_depth, an escaped key, a span without a trace id... The Python decoder answers those
 * (errors, recovery, counters), so it is the twin: tests/spans/test_otlpjson.py holds the two to
 * the same views on random valid requests, and to "the same, or None" on broken ones.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef const unsigned char *ptr;

enum { OK = 0, NO = 1, PYERR = 2 }; /* NO: decline, the Python decoder answers */

#define SKIP_DEPTH 64
#define NAMES 64
#define IDS 128 /* a power of two */

typedef struct {
    ptr p, end;
    PyObject *prefixes; /* tuple of bytes */
    PyObject *keys;     /* frozenset of bytes */
    int max_depth;
    /* Attribute keys and ids repeat from span to span: the str of each is made (and hashed)
     * once per request. Owned references, released by scan(). */
    int names;
    ptr name_at[NAMES];
    Py_ssize_t name_len[NAMES];
    PyObject *name[NAMES];
    /* And whether each attribute key is wanted: asked of the wanted prefixes and keys once per
     * request (keys as written, unescaped; they point into the body). */
    int wants;
    ptr want_at[NAMES];
    Py_ssize_t want_len[NAMES];
    unsigned char want[NAMES];
    /* And the str of each trace id and parent span id met lately, as written: one per trace
     * (and per parent) and request. One table for each; a slot per id's last two characters,
     * taken over when another id needs it. */
    ptr id_at[2][IDS];
    PyObject *id_str[2][IDS];
} P;

typedef struct {
    ptr lo, hi;  /* the string's bytes between the quotes, escapes as written */
    int escaped; /* holds a backslash */
    int set;
} Str;

/* -- lexing ----------------------------------------------------------------------------- */

static inline void ws(P *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static inline int peek(P *s) {
    ws(s);
    return s->p < s->end ? *s->p : -1;
}

static inline int take(P *s, int ch) {
    if (peek(s) != ch) return NO;
    s->p++;
    return OK;
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int u4(ptr q, ptr end, unsigned *out) {
    if (end - q < 4) return NO;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(q[i]);
        if (h < 0) return NO;
        v = (v << 4) | (unsigned)h;
    }
    *out = v;
    return OK;
}

/* A string at the cursor: checks its escapes (a lone surrogate declines) and its UTF-8
 * (strictly, as Python decodes it), and gives its raw bytes. */
static int string(P *s, Str *out) {
    if (peek(s) != '"') return NO;
    ptr q = ++s->p, end = s->end;
    out->lo = q;
    out->escaped = 0;
    for (;;) {
        /* eight bytes at a time while none is a quote, a backslash, a control or non-ASCII */
        while (end - q >= 8) {
            uint64_t w;
            memcpy(&w, q, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
            uint64_t hit = ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | (w - ones * 0x20) | w;
            if (hit & highs) break;
            q += 8;
        }
        while (q < end && *q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\') q++;
        if (q >= end) return NO;
        unsigned c = *q;
        if (c == '"') break;
        if (c < 0x20) return NO;
        if (c == '\\') {
            out->escaped = 1;
            if (++q >= end) return NO;
            switch (*q) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                q++;
                continue;
            case 'u': {
                unsigned u;
                if (u4(q + 1, end, &u)) return NO;
                q += 5;
                if (u >= 0xDC00 && u <= 0xDFFF) return NO;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    unsigned lo;
                    if (end - q < 6 || q[0] != '\\' || q[1] != 'u' || u4(q + 2, end, &lo)) return NO;
                    if (lo < 0xDC00 || lo > 0xDFFF) return NO;
                    q += 6;
                }
                continue;
            }
            default:
                return NO;
            }
        }
        /* a multi-byte UTF-8 sequence */
        int n;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; }
        else return NO;
        if (end - q <= n) return NO;
        for (int i = 1; i <= n; i++) {
            if ((q[i] & 0xC0) != 0x80) return NO;
            cp = (cp << 6) | (q[i] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return NO;
        q += n + 1;
    }
    out->hi = q;
    out->set = 1;
    s->p = q + 1;
    return OK;
}

static void put_utf8(unsigned char **w, unsigned cp) {
    unsigned char *o = *w;
    if (cp < 0x80) *o++ = (unsigned char)cp;
    else if (cp < 0x800) { *o++ = 0xC0 | (cp >> 6); *o++ = 0x80 | (cp & 0x3F); }
    else if (cp < 0x10000) {
        *o++ = 0xE0 | (cp >> 12); *o++ = 0x80 | ((cp >> 6) & 0x3F); *o++ = 0x80 | (cp & 0x3F);
    } else {
        *o++ = 0xF0 | (cp >> 18); *o++ = 0x80 | ((cp >> 12) & 0x3F);
        *o++ = 0x80 | ((cp >> 6) & 0x3F); *o++ = 0x80 | (cp & 0x3F);
    }
    *w = o;
}

/* The str of a string checked by string(). */
static PyObject *text(Str t) {
    if (!t.escaped) return PyUnicode_DecodeUTF8((const char *)t.lo, t.hi - t.lo, "strict");
    unsigned char *buf = (unsigned char *)PyMem_Malloc((size_t)(t.hi - t.lo) + 1);
    if (buf == NULL) return PyErr_NoMemory();
    unsigned char *w = buf;
    for (ptr q = t.lo; q < t.hi;) {
        if (*q != '\\') { *w++ = *q++; continue; }
        q++;
        switch (*q++) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        default: { /* 'u', checked by string() */
            unsigned u = 0, lo = 0;
            u4(q, t.hi, &u);
            q += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {
                u4(q + 2, t.hi, &lo);
                q += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(&w, u);
        }
        }
    }
    PyObject *r = PyUnicode_DecodeUTF8((const char *)buf, w - buf, "strict");
    PyMem_Free(buf);
    return r;
}

/* The str of an unescaped string that repeats (a key, an id): made once per request. */
static PyObject *name_of(P *s, ptr lo, Py_ssize_t n) {
    for (int i = 0; i < s->names; i++)
        if (s->name_len[i] == n && memcmp(s->name_at[i], lo, n) == 0) return Py_NewRef(s->name[i]);
    PyObject *r = PyUnicode_DecodeUTF8((const char *)lo, n, "strict");
    if (r != NULL && s->names < NAMES) {
        int i = s->names++;
        s->name_at[i] = lo;
        s->name_len[i] = n;
        s->name[i] = Py_NewRef(r);
    }
    return r;
}

static inline int is(Str k, const char *lit, size_t n) {
    return (size_t)(k.hi - k.lo) == n && memcmp(k.lo, lit, n) == 0;
}
#define IS(k, lit) is((k), (lit), sizeof(lit) - 1)

typedef struct {
    ptr lo, hi;
    int integral; /* no fraction, no exponent */
    int negative;
} Num;

static int number(P *s, Num *out) {
    ws(s);
    ptr q = s->p, end = s->end;
    out->lo = q;
    out->negative = 0;
    out->integral = 1;
    if (q < end && *q == '-') { out->negative = 1; q++; }
    if (q >= end) return NO;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') while (q < end && *q >= '0' && *q <= '9') q++;
    else return NO;
    if (q < end && *q == '.') {
        out->integral = 0;
        q++;
        ptr d = q;
        while (q < end && *q >= '0' && *q <= '9') q++;
        if (q == d) return NO;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        out->integral = 0;
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        ptr d = q;
        while (q < end && *q >= '0' && *q <= '9') q++;
        if (q == d) return NO;
    }
    out->hi = q;
    s->p = q;
    return OK;
}

static int literal(P *s, const char *lit, size_t n) {
    ws(s);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return NO;
    s->p += n;
    return OK;
}

/* Any JSON value, checked and passed over. */
static int skip(P *s, int depth) {
    if (depth > SKIP_DEPTH) return NO;
    int c = peek(s), e;
    Str t;
    Num n;
    switch (c) {
    case '"': return string(s, &t);
    case '{':
        s->p++;
        if (peek(s) == '}') { s->p++; return OK; }
        for (;;) {
            if ((e = string(s, &t)) || (e = take(s, ':')) || (e = skip(s, depth + 1))) return e;
            c = peek(s);
            s->p++;
            if (c == '}') return OK;
            if (c != ',') return NO;
        }
    case '[':
        s->p++;
        if (peek(s) == ']') { s->p++; return OK; }
        for (;;) {
            if ((e = skip(s, depth + 1))) return e;
            c = peek(s);
            s->p++;
            if (c == ']') return OK;
            if (c != ',') return NO;
        }
    case 't': return literal(s, "true", 4);
    case 'f': return literal(s, "false", 5);
    case 'n': return literal(s, "null", 4);
    default: return number(s, &n);
    }
}

static int is_null(P *s) {
    if (peek(s) == 'n') return literal(s, "null", 4) == OK ? 1 : -1;
    return 0;
}

/* Walk an object: for each member, `member` reads its value at the cursor (a known key
 * written twice declines: see MEMBER). */
typedef int (*member_fn)(P *s, Str key, void *ctx);

static int object(P *s, member_fn member, void *ctx) {
    int e;
    if ((e = take(s, '{'))) return e;
    if (peek(s) == '}') { s->p++; return OK; }
    for (;;) {
        Str k;
        if ((e = string(s, &k)) || (e = take(s, ':'))) return e;
        if ((e = member(s, k, ctx))) return e;
        int c = peek(s);
        s->p++;
        if (c == '}') return OK;
        if (c != ',') return NO;
    }
}

/* An object, or null (then *present stays 0). */
static int nullable(P *s, member_fn member, void *ctx, int *present) {
    int null = is_null(s);
    if (null < 0) return NO;
    if (null) return OK;
    *present = 1;
    return object(s, member, ctx);
}

typedef int (*item_fn)(P *s, void *ctx);

static int array(P *s, item_fn item, void *ctx) {
    int e;
    if ((e = take(s, '['))) return e;
    if (peek(s) == ']') { s->p++; return OK; }
    for (;;) {
        if ((e = item(s, ctx))) return e;
        int c = peek(s);
        s->p++;
        if (c == ']') return OK;
        if (c != ',') return NO;
    }
}

static inline int once(unsigned *seen, unsigned bit) {
    if (*seen & bit) return NO;
    *seen |= bit;
    return OK;
}

/* A known member: read once (the bit of `seen` says it was), by `read`. */
#define MEMBER(seen, lit, bit, read)           \
    if (IS(k, lit)) {                          \
        if (once((seen), (bit))) return NO;    \
        return (read);                         \
    }

static int wanted(P *s, Str k) {
    Py_ssize_t n = k.hi - k.lo, np = PyTuple_GET_SIZE(s->prefixes);
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *pre = PyTuple_GET_ITEM(s->prefixes, i);
        Py_ssize_t pn = PyBytes_GET_SIZE(pre);
        if (pn <= n && memcmp(k.lo, PyBytes_AS_STRING(pre), pn) == 0) return 1;
    }
    if (PySet_GET_SIZE(s->keys) == 0) return 0;
    PyObject *b = PyBytes_FromStringAndSize((const char *)k.lo, n);
    if (b == NULL) return -1;
    int r = PySet_Contains(s->keys, b);
    Py_DECREF(b);
    return r;
}

/* -- AnyValue and KeyValue ------------------------------------------------------------- */

static int any_value(P *s, int depth, int build, PyObject **out);

typedef struct {
    int depth, build;
    PyObject *out; /* the tuple's items (a list) or the kvlist's dict, when building */
} Items;

static int kv_item(P *s, void *ctx);

static int array_item(P *s, void *ctx) {
    Items *it = (Items *)ctx;
    PyObject *v = NULL;
    if (peek(s) != '{') return NO; /* an array's values are AnyValue objects, never null */
    int e = any_value(s, it->depth, it->build, &v);
    if (e || !it->build) return e;
    e = PyList_Append(it->out, v) < 0 ? PYERR : OK;
    Py_DECREF(v);
    return e;
}

/* {"values": [...]} of an arrayValue (kv = 0) or a kvlistValue (kv = 1). */
typedef struct {
    Items items;
    int kv;
    unsigned seen;
} ValuesCtx;

static int values_member(P *s, Str k, void *ctx) {
    ValuesCtx *v = (ValuesCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&v->seen, "values", 1, array(s, v->kv ? kv_item : array_item, &v->items))
    return skip(s, 0);
}

typedef struct {
    unsigned seen;
    int depth, build, fields;
    PyObject *value;
} AnyCtx;

static int any_member(P *s, Str k, void *ctx) {
    AnyCtx *a = (AnyCtx *)ctx;
    int e, null;
    if (k.escaped) return NO;
    unsigned bit;
    int kind; /* 1 string, 2 int, 3 double, 4 bool, 5 array, 6 kvlist */
    if (IS(k, "stringValue")) { bit = 1; kind = 1; }
    else if (IS(k, "intValue")) { bit = 2; kind = 2; }
    else if (IS(k, "doubleValue")) { bit = 4; kind = 3; }
    else if (IS(k, "boolValue")) { bit = 8; kind = 4; }
    else if (IS(k, "arrayValue")) { bit = 16; kind = 5; }
    else if (IS(k, "kvlistValue")) { bit = 32; kind = 6; }
    else if (IS(k, "bytesValue")) return NO; /* base64: the Python decoder converts it */
    else return skip(s, 0);
    if (once(&a->seen, bit)) return NO;
    if ((null = is_null(s)) < 0) return NO;
    if (null) return OK; /* None: as if absent */
    if (++a->fields > 1) return NO; /* which one wins is the Python decoder's to say */
    PyObject *v = NULL;
    switch (kind) {
    case 1: {
        Str t;
        if ((e = string(s, &t))) return e;
        if (a->build && (v = text(t)) == NULL) return PYERR;
        break;
    }
    case 2: {
        char buf[24];
        ptr lo, hi;
        if (peek(s) == '"') {
            Str t;
            if ((e = string(s, &t))) return e;
            lo = t.lo;
            hi = t.hi;
            ptr q = lo;
            if (q < hi && *q == '-') q++;
            if (q == hi) return NO;
            for (; q < hi; q++)
                if (*q < '0' || *q > '9') return NO;
        } else {
            Num n;
            if ((e = number(s, &n))) return e;
            if (!n.integral) return NO;
            lo = n.lo;
            hi = n.hi;
        }
        if (hi - lo > 19 || (hi - lo == 19 && *lo != '-')) return NO; /* within int64 */
        if (a->build) {
            memcpy(buf, lo, hi - lo);
            buf[hi - lo] = 0;
            if ((v = PyLong_FromLongLong(strtoll(buf, NULL, 10))) == NULL) return PYERR;
        }
        break;
    }
    case 3: {
        char buf[40];
        Num n;
        if (peek(s) == '"') return NO; /* "NaN", "Infinity": the Python decoder's */
        if ((e = number(s, &n))) return e;
        if (n.hi - n.lo >= (Py_ssize_t)sizeof(buf)) return NO;
        if (n.integral && n.hi - n.lo - n.negative > 15) return NO; /* an int above 2**53 */
        memcpy(buf, n.lo, n.hi - n.lo);
        buf[n.hi - n.lo] = 0;
        double d = PyOS_string_to_double(buf, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred()) return PYERR;
        if (d > 1.7976931348623157e308 || d < -1.7976931348623157e308) return NO;
        if (a->build && (v = PyFloat_FromDouble(d)) == NULL) return PYERR;
        break;
    }
    case 4:
        if (literal(s, "true", 4) == OK) v = Py_True;
        else if (literal(s, "false", 5) == OK) v = Py_False;
        else return NO;
        if (a->build) Py_INCREF(v);
        else v = NULL;
        break;
    default: {
        if (a->depth >= s->max_depth) return NO; /* cut and counted by the Python decoder */
        ValuesCtx vc = {{a->depth + 1, a->build, NULL}, kind == 6, 0};
        if (a->build) {
            vc.items.out = kind == 6 ? PyDict_New() : PyList_New(0);
            if (vc.items.out == NULL) return PYERR;
        }
        e = object(s, values_member, &vc);
        if (e) {
            Py_XDECREF(vc.items.out);
            return e;
        }
        if (a->build) {
            if (kind == 5) {
                v = PyList_AsTuple(vc.items.out);
                Py_DECREF(vc.items.out);
                if (v == NULL) return PYERR;
            } else {
                v = vc.items.out;
            }
        }
    }
    }
    a->value = v;
    return OK;
}

/* An AnyValue (an object, or null for None). Builds *out (a new reference) when build is set. */
static int any_value(P *s, int depth, int build, PyObject **out) {
    int null = is_null(s), e;
    if (null < 0) return NO;
    if (!null) {
        AnyCtx a = {0, depth, build, 0, NULL};
        if ((e = object(s, any_member, &a))) {
            Py_XDECREF(a.value);
            return e;
        }
        if (build) *out = a.value != NULL ? a.value : Py_NewRef(Py_None);
    } else if (build) {
        *out = Py_NewRef(Py_None);
    }
    return OK;
}

/* A KeyValue. mode 0: check only; 1: into `out` if its key is wanted; 2: into `out` (kvlist).
 * With `exc`, the first value of key "exception.type" is reported (an event's attributes). */
typedef struct {
    unsigned seen;
    Str key;
    ptr value_at; /* where the value began, when it came before the key */
    int depth, mode, build;
    int want; /* mode 1: the key is wanted (-1: not known yet) */
    PyObject *value;
} KvCtx;

static int kv_wanted(P *s, KvCtx *kv) {
    if (kv->want >= 0) return kv->want;
    if (!kv->key.set) return kv->want = 0; /* "" is not wanted */
    if (!kv->key.escaped) {
        ptr lo = kv->key.lo;
        Py_ssize_t n = kv->key.hi - lo;
        for (int i = 0; i < s->wants; i++)
            if (s->want_len[i] == n && memcmp(s->want_at[i], lo, n) == 0) return kv->want = s->want[i];
        kv->want = wanted(s, kv->key);
        if (kv->want >= 0 && s->wants < NAMES) {
            int i = s->wants++;
            s->want_at[i] = lo;
            s->want_len[i] = n;
            s->want[i] = (unsigned char)kv->want;
        }
        return kv->want;
    }
    PyObject *name = text(kv->key); /* the key as the decoder reads it */
    if (name == NULL) return -1;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(name, &n);
    Str raw = {(ptr)utf8, (ptr)utf8 + n, 0, 1};
    kv->want = utf8 != NULL ? wanted(s, raw) : -1;
    Py_DECREF(name);
    return kv->want;
}

static int kv_member(P *s, Str k, void *ctx) {
    KvCtx *kv = (KvCtx *)ctx;
    if (k.escaped) return NO;
    if (IS(k, "key")) {
        if (once(&kv->seen, 1)) return NO;
        return string(s, &kv->key);
    }
    if (IS(k, "value")) {
        if (once(&kv->seen, 2)) return NO;
        int build = 0;
        if (kv->mode == 2) build = 1;
        else if (kv->mode == 1) {
            if (kv->key.set) {
                if ((build = kv_wanted(s, kv)) < 0) return PYERR;
            } else {
                ws(s);
                kv->value_at = s->p; /* decided at the end, read again then if wanted */
            }
        }
        kv->build = build;
        return any_value(s, kv->depth, build, build ? &kv->value : NULL);
    }
    return skip(s, 0);
}

static int kv_read(P *s, KvCtx *kv) {
    int e = object(s, kv_member, kv);
    if (e) {
        Py_CLEAR(kv->value);
        return e;
    }
    if (kv->mode == 1 && kv->value_at != NULL && !kv->build) {
        int w = kv_wanted(s, kv);
        if (w < 0) return PYERR;
        if (w) {
            /* Read it again in place: on a copy of the state, the names a key-value list in
             * the value added to the copy's table would never be released. */
            ptr resume = s->p;
            s->p = kv->value_at;
            e = any_value(s, kv->depth, 1, &kv->value);
            s->p = resume;
            if (e) return e;
            kv->build = 1;
        }
    }
    return OK;
}

static int kv_into(P *s, int depth, int mode, PyObject *out) {
    KvCtx kv = {0, {0}, NULL, depth, mode, 0, -1, NULL};
    int e = kv_read(s, &kv);
    if (e) return e;
    if (mode == 0) return OK;
    if (mode == 1) { /* a wanted key without a value is None, as in the Python decoder */
        int w = kv_wanted(s, &kv);
        if (w < 0) {
            Py_XDECREF(kv.value);
            return PYERR;
        }
        if (!w) return OK;
    }
    PyObject *name;
    if (kv.key.escaped) name = text(kv.key);
    else if (kv.key.set) name = name_of(s, kv.key.lo, kv.key.hi - kv.key.lo);
    else name = PyUnicode_FromStringAndSize("", 0);
    if (name == NULL) {
        Py_XDECREF(kv.value);
        return PYERR;
    }
    PyObject *value = kv.value != NULL ? kv.value : Py_NewRef(Py_None);
    int r = PyDict_SetItem(out, name, value);
    Py_DECREF(name);
    Py_DECREF(value);
    return r < 0 ? PYERR : OK;
}

static int kv_item(P *s, void *ctx) {
    Items *it = (Items *)ctx;
    return kv_into(s, it->depth, it->build ? 2 : 0, it->out);
}

typedef struct {
    PyObject *attrs; /* NULL: check only */
} AttrsCtx;

static int attr_item(P *s, void *ctx) {
    AttrsCtx *a = (AttrsCtx *)ctx;
    return kv_into(s, 0, a->attrs != NULL ? 1 : 0, a->attrs);
}

/* A list of KeyValue: the wanted ones into a new dict (*out), or only checked (out NULL). */
static int attributes(P *s, PyObject **out) {
    AttrsCtx a = {NULL};
    if (out != NULL && (a.attrs = PyDict_New()) == NULL) return PYERR;
    int e = array(s, attr_item, &a);
    if (e) {
        Py_XDECREF(a.attrs);
        return e;
    }
    if (out != NULL) *out = a.attrs;
    return OK;
}

/* -- events: the first "exception" event's exception.type ------------------------------ */

typedef struct {
    Str exc_type; /* the first exception.type attribute's stringValue, if it had one */
    int exc_seen; /* an exception.type attribute was met */
} EventAttrs;

typedef struct {
    unsigned seen;
    Str value;
} StrValueCtx;

static int str_value_member(P *s, Str k, void *ctx) {
    /* only called on an AnyValue already checked: reads its stringValue */
    StrValueCtx *c = (StrValueCtx *)ctx;
    if (!k.escaped && IS(k, "stringValue") && peek(s) == '"') return string(s, &c->value);
    return skip(s, 0);
}

/* The stringValue of the value of a KeyValue read from just past its '{' into ea->exc_type. */
static int exc_value(P *s, EventAttrs *ea) {
    int e;
    for (;;) {
        Str key;
        if ((e = string(s, &key)) || (e = take(s, ':'))) return e;
        if (IS(key, "value")) {
            if (is_null(s)) return OK;
            StrValueCtx sv = {0, {0}};
            if ((e = object(s, str_value_member, &sv))) return e;
            ea->exc_type = sv.value;
            return OK;
        }
        if ((e = skip(s, 0)) || (e = take(s, ','))) return e;
    }
}

static int event_attr(P *s, void *ctx) {
    EventAttrs *ea = (EventAttrs *)ctx;
    KvCtx kv = {0, {0}, NULL, 0, 0, 0, -1, NULL};
    ws(s);
    ptr at = s->p;
    int e = kv_read(s, &kv);
    if (e) return e;
    if (kv.key.escaped && !ea->exc_seen) return NO; /* it might say "exception.type" */
    if (ea->exc_seen || !kv.key.set || !IS(kv.key, "exception.type")) return OK;
    ea->exc_seen = 1;
    if (!(kv.seen & 2)) return OK; /* no value: no type */
    /* The KeyValue is known good: read it again, in place, for its value's stringValue. */
    ptr resume = s->p;
    s->p = at + 1; /* past its '{' */
    e = exc_value(s, ea);
    s->p = resume;
    return e;
}

typedef struct {
    unsigned seen;
    Str name;
    EventAttrs attrs;
} EventCtx;

static int event_member(P *s, Str k, void *ctx) {
    EventCtx *ev = (EventCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&ev->seen, "name", 1, string(s, &ev->name))
    MEMBER(&ev->seen, "attributes", 2, array(s, event_attr, &ev->attrs))
    return skip(s, 0);
}

typedef struct {
    int found; /* the first "exception" event was met */
    Str type;
} Events;

static int event_item(P *s, void *ctx) {
    Events *evs = (Events *)ctx;
    EventCtx ev = {0, {0}, {{0}, 0}};
    int e = object(s, event_member, &ev);
    if (e) return e;
    if (!evs->found && ev.name.set && !ev.name.escaped && IS(ev.name, "exception")) {
        evs->found = 1;
        evs->type = ev.attrs.exc_type;
    } else if (!evs->found && ev.name.set && ev.name.escaped) {
        return NO; /* an escaped name might say "exception" */
    }
    return OK;
}

/* -- spans ------------------------------------------------------------------------------ */

typedef struct {
    unsigned seen;
    Str trace_id, span_id, parent, name, message;
    PyObject *start, *end, *attrs;
    int error;
    Events events;
} SpanCtx;

static int peek_int64_over(ptr digits) {
    return memcmp(digits, "9223372036854775807", 19) > 0;
}

/* A time: nanoseconds as an integer or a string of digits; 0 is "unset" (None). */
static int nanos(P *s, PyObject **out) {
    int null = is_null(s), e;
    if (null < 0) return NO;
    if (null) {
        *out = Py_NewRef(Py_None);
        return OK;
    }
    ptr lo, hi;
    if (peek(s) == '"') {
        Str t;
        if ((e = string(s, &t))) return e;
        lo = t.lo;
        hi = t.hi;
        if (lo == hi) return NO;
        for (ptr q = lo; q < hi; q++)
            if (*q < '0' || *q > '9') return NO;
    } else {
        Num n;
        if ((e = number(s, &n))) return e;
        if (!n.integral || n.negative) return NO;
        lo = n.lo;
        hi = n.hi;
    }
    if (hi - lo > 19) return NO; /* below 2**64 */
    if (hi - lo == 19 && peek_int64_over(lo)) return NO; /* a JSON number: within int64 */
    uint64_t v = 0;
    for (ptr q = lo; q < hi; q++) v = v * 10 + (uint64_t)(*q - '0');
    *out = v ? PyFloat_FromDouble((double)v / 1e9) : Py_NewRef(Py_None);
    return *out == NULL ? PYERR : OK;
}

typedef struct {
    unsigned seen;
    int error;
    Str message;
} StatusCtx;

static int status_member(P *s, Str k, void *ctx) {
    StatusCtx *st = (StatusCtx *)ctx;
    int e, null;
    if (k.escaped) return NO;
    if (IS(k, "code")) {
        if (once(&st->seen, 1)) return NO;
        if ((null = is_null(s)) < 0) return NO;
        if (null) return OK;
        if (peek(s) == '"') {
            Str t;
            if ((e = string(s, &t))) return e;
            if (t.escaped) return NO;
            st->error = IS(t, "2") || IS(t, "STATUS_CODE_ERROR");
            return OK;
        }
        Num n;
        if ((e = number(s, &n))) return e;
        if (!n.integral || n.hi - n.lo > 18) return NO;
        st->error = n.hi - n.lo == 1 && *n.lo == '2';
        return OK;
    }
    if (IS(k, "message")) {
        if (once(&st->seen, 2)) return NO;
        if ((null = is_null(s)) < 0) return NO;
        if (null) return OK;
        return string(s, &st->message);
    }
    return skip(s, 0);
}

static int status(P *s, SpanCtx *sp) {
    StatusCtx st = {0, 0, {0}};
    int present = 0, e = nullable(s, status_member, &st, &present);
    sp->error = st.error;
    sp->message = st.message;
    return e;
}

static int span_member(P *s, Str k, void *ctx) {
    SpanCtx *sp = (SpanCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&sp->seen, "traceId", 1, string(s, &sp->trace_id))
    MEMBER(&sp->seen, "spanId", 2, string(s, &sp->span_id))
    MEMBER(&sp->seen, "parentSpanId", 4, string(s, &sp->parent))
    MEMBER(&sp->seen, "name", 8, string(s, &sp->name))
    MEMBER(&sp->seen, "startTimeUnixNano", 16, nanos(s, &sp->start))
    MEMBER(&sp->seen, "endTimeUnixNano", 32, nanos(s, &sp->end))
    MEMBER(&sp->seen, "attributes", 64, attributes(s, &sp->attrs))
    MEMBER(&sp->seen, "events", 128, array(s, event_item, &sp->events))
    MEMBER(&sp->seen, "status", 256, status(s, sp))
    return skip(s, 0);
}

/* A hex id of n bytes, lower-cased; NULL without an exception when it is not one. */
static PyObject *hex_id(Str t, Py_ssize_t n, int *zero) {
    if (t.escaped || t.hi - t.lo != 2 * n) return NULL;
    PyObject *r = PyUnicode_New(2 * n, 127);
    if (r == NULL) return NULL;
    Py_UCS1 *o = PyUnicode_1BYTE_DATA(r);
    int nonzero = 0;
    for (Py_ssize_t i = 0; i < 2 * n; i++) {
        int c = t.lo[i];
        if (hexval(c) < 0) {
            Py_DECREF(r);
            return NULL;
        }
        if (c >= 'A' && c <= 'F') c += 'a' - 'A';
        if (c != '0') nonzero = 1;
        o[i] = (Py_UCS1)c;
    }
    if (zero != NULL) *zero = !nonzero;
    return r;
}

/* hex_id() of a trace id (table 0) or a parent span id (table 1) that is not all zeros,
 * shared with the id met last in its slot when it is written the same. */
static PyObject *hex_id_of(P *s, int table, Str t, Py_ssize_t n, int *zero) {
    if (t.escaped || t.hi - t.lo != 2 * n) return NULL;
    int i = (t.lo[2 * n - 1] + 16 * t.lo[2 * n - 2]) & (IDS - 1);
    PyObject **slot = &s->id_str[table][i];
    if (*slot != NULL && memcmp(s->id_at[table][i], t.lo, 2 * n) == 0) {
        *zero = 0;
        return Py_NewRef(*slot);
    }
    PyObject *r = hex_id(t, n, zero);
    if (r != NULL && !*zero) {
        Py_XSETREF(*slot, Py_NewRef(r)); /* the old one is a str: its release runs no Python */
        s->id_at[table][i] = t.lo;
    }
    return r;
}

/* One span into `out` (a tuple whose last two items, resource and scope, are set later). */
static int span_item(P *s, void *ctx) {
    PyObject *out = (PyObject *)ctx;
    SpanCtx sp;
    memset(&sp, 0, sizeof sp);
    int e = object(s, span_member, &sp);
    PyObject *tid = NULL, *sid = NULL, *parent = NULL, *name = NULL, *msg = NULL, *exc = NULL;
    PyObject *entry = NULL;
    int zero = 0;
    if (e) goto done;
    e = NO;
    if (!sp.trace_id.set || sp.trace_id.lo == sp.trace_id.hi) goto done; /* missing: counted */
    if ((tid = hex_id_of(s, 0, sp.trace_id, 16, &zero)) == NULL || zero) goto fail;
    if (sp.span_id.set && sp.span_id.lo != sp.span_id.hi) {
        if ((sid = hex_id(sp.span_id, 8, &zero)) == NULL || zero) goto fail;
    } else if ((sid = PyUnicode_FromStringAndSize("", 0)) == NULL) {
        goto pyerr;
    }
    if (sp.parent.set && sp.parent.lo != sp.parent.hi) {
        if ((parent = hex_id_of(s, 1, sp.parent, 8, &zero)) == NULL) goto fail;
        if (zero) { /* all zeros: no parent (a root), as in protobuf */
            Py_DECREF(parent);
            parent = Py_NewRef(Py_None);
        }
    } else {
        parent = Py_NewRef(Py_None);
    }
    name = sp.name.set ? text(sp.name) : PyUnicode_FromStringAndSize("", 0);
    if (name == NULL) goto pyerr;
    if (sp.message.set && sp.message.lo != sp.message.hi) {
        if ((msg = text(sp.message)) == NULL) goto pyerr;
    } else {
        msg = Py_NewRef(Py_None);
    }
    if (sp.error && sp.events.found && sp.events.type.set && sp.events.type.lo != sp.events.type.hi) {
        if ((exc = text(sp.events.type)) == NULL) goto pyerr;
    } else {
        exc = Py_NewRef(Py_None);
    }
    if (sp.attrs == NULL && (sp.attrs = PyDict_New()) == NULL) goto pyerr;
    entry = PyTuple_Pack(12, tid, sid, parent, name, sp.start ? sp.start : Py_None,
                         sp.end ? sp.end : Py_None, sp.error ? Py_True : Py_False, msg, exc,
                         sp.attrs, Py_None, Py_None);
    if (entry == NULL) goto pyerr;
    e = PyList_Append(out, entry) < 0 ? PYERR : OK;
    goto done;
fail:
    if (PyErr_Occurred()) goto pyerr;
    e = NO;
    goto done;
pyerr:
    e = PYERR;
done:
    Py_XDECREF(entry);
    Py_XDECREF(tid);
    Py_XDECREF(sid);
    Py_XDECREF(parent);
    Py_XDECREF(name);
    Py_XDECREF(msg);
    Py_XDECREF(exc);
    Py_XDECREF(sp.start);
    Py_XDECREF(sp.end);
    Py_XDECREF(sp.attrs);
    return e;
}

/* -- the envelope ------------------------------------------------------------------------ */

static void set_item(PyObject *tuple, Py_ssize_t i, PyObject *v) {
    PyObject *old = PyTuple_GET_ITEM(tuple, i);
    Py_INCREF(v);
    PyTuple_SET_ITEM(tuple, i, v);
    Py_DECREF(old);
}

typedef struct {
    unsigned seen;
    Str name;
} ScopeCtx;

static int scope_member(P *s, Str k, void *ctx) {
    ScopeCtx *sc = (ScopeCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&sc->seen, "name", 1, string(s, &sc->name))
    return skip(s, 0);
}

typedef struct {
    unsigned seen;
    Str scope;
    PyObject *spans; /* a list of entries */
} SsCtx;

static int scope(P *s, SsCtx *ss) {
    ScopeCtx sc = {0, {0}};
    int present = 0, e = nullable(s, scope_member, &sc, &present);
    ss->scope = sc.name;
    return e;
}

static int ss_member(P *s, Str k, void *ctx) {
    SsCtx *ss = (SsCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&ss->seen, "scope", 1, scope(s, ss))
    MEMBER(&ss->seen, "spans", 2, array(s, span_item, ss->spans))
    return skip(s, 0);
}

typedef struct {
    PyObject *entries; /* the resource's entries from this list of ScopeSpans */
    Py_ssize_t count;  /* ScopeSpans objects read */
} SsList;

static int ss_item(P *s, void *ctx) {
    SsList *list = (SsList *)ctx;
    SsCtx ss = {0, {0}, PyList_New(0)};
    if (ss.spans == NULL) return PYERR;
    int e = object(s, ss_member, &ss);
    PyObject *scope = NULL;
    if (!e) {
        if (ss.scope.set && ss.scope.lo != ss.scope.hi) scope = text(ss.scope);
        else scope = Py_NewRef(Py_None);
        if (scope == NULL) e = PYERR;
    }
    for (Py_ssize_t i = 0; !e && i < PyList_GET_SIZE(ss.spans); i++) {
        PyObject *entry = PyList_GET_ITEM(ss.spans, i);
        set_item(entry, 11, scope);
        if (PyList_Append(list->entries, entry) < 0) e = PYERR;
    }
    Py_XDECREF(scope);
    Py_DECREF(ss.spans);
    list->count++;
    return e;
}

typedef struct {
    unsigned seen;
    PyObject *resource; /* NULL: none */
    SsList scope_spans, library_spans;
} RsCtx;

typedef struct {
    unsigned seen;
    PyObject *attrs;
} ResourceCtx;

static int resource_member(P *s, Str k, void *ctx) {
    ResourceCtx *r = (ResourceCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&r->seen, "attributes", 1, attributes(s, &r->attrs))
    return skip(s, 0);
}

static int resource(P *s, RsCtx *rs) {
    ResourceCtx r = {0, NULL};
    int present = 0, e = nullable(s, resource_member, &r, &present);
    if (e || !present) {
        Py_XDECREF(r.attrs);
        return e; /* null: no resource (None) */
    }
    rs->resource = r.attrs != NULL ? r.attrs : PyDict_New(); /* {} without attributes */
    return rs->resource == NULL ? PYERR : OK;
}

static int rs_member(P *s, Str k, void *ctx) {
    RsCtx *rs = (RsCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&rs->seen, "resource", 1, resource(s, rs))
    MEMBER(&rs->seen, "scopeSpans", 2, array(s, ss_item, &rs->scope_spans))
    MEMBER(&rs->seen, "instrumentationLibrarySpans", 4, array(s, ss_item, &rs->library_spans))
    return skip(s, 0);
}

static int rs_item(P *s, void *ctx) {
    PyObject *out = (PyObject *)ctx;
    RsCtx rs = {0, NULL, {PyList_New(0), 0}, {PyList_New(0), 0}};
    int e = (rs.scope_spans.entries == NULL || rs.library_spans.entries == NULL)
                ? PYERR
                : object(s, rs_member, &rs);
    if (!e) {
        /* scopeSpans, or the pre-1.0 name when scopeSpans is empty or absent */
        PyObject *chosen = rs.scope_spans.count ? rs.scope_spans.entries : rs.library_spans.entries;
        PyObject *resource = rs.resource != NULL ? rs.resource : Py_None;
        for (Py_ssize_t i = 0; !e && i < PyList_GET_SIZE(chosen); i++) {
            PyObject *entry = PyList_GET_ITEM(chosen, i);
            set_item(entry, 10, resource);
            if (PyList_Append(out, entry) < 0) e = PYERR;
        }
    }
    Py_XDECREF(rs.scope_spans.entries);
    Py_XDECREF(rs.library_spans.entries);
    Py_XDECREF(rs.resource);
    return e;
}

typedef struct {
    unsigned seen;
    PyObject *out;
} RequestCtx;

static int request_member(P *s, Str k, void *ctx) {
    RequestCtx *r = (RequestCtx *)ctx;
    if (k.escaped) return NO;
    MEMBER(&r->seen, "resourceSpans", 1, array(s, rs_item, r->out))
    return skip(s, 0);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    P s;
    if (!PyArg_ParseTuple(args, "y*O!O!i", &buf, &PyTuple_Type, &s.prefixes, &PyFrozenSet_Type,
                          &s.keys, &s.max_depth))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s.prefixes); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(s.prefixes, i))) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            return NULL;
        }
    }
    RequestCtx r = {0, PyList_New(0)};
    if (r.out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    s.p = (ptr)buf.buf;
    s.end = s.p + buf.len;
    s.names = 0;
    s.wants = 0;
    memset(s.id_str, 0, sizeof s.id_str);
    int e = object(&s, request_member, &r);
    for (int i = 0; i < s.names; i++) Py_DECREF(s.name[i]);
    for (int i = 0; i < IDS; i++) {
        Py_XDECREF(s.id_str[0][i]);
        Py_XDECREF(s.id_str[1][i]);
    }
    if (!e && (!(r.seen & 1) || peek(&s) != -1)) e = NO; /* no resourceSpans, or trailing data */
    PyBuffer_Release(&buf);
    if (e) {
        Py_DECREF(r.out);
        if (e == PYERR) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "scan failed");
            return NULL;
        }
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return r.out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, prefixes, keys, max_depth) -> entries or None: the spans of an OTLP/JSON "
     "ExportTraceServiceRequest that the fast path reads exactly (see tripwire.spans.otlp)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpjson", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlpjson(void) { return PyModule_Create(&module); }
