/* The protobuf wire scanner of OTLP trace requests: the compiled twin of tripwire/spans/_wire.py.
 *
 * One stateless leaf function, scan(data, prefixes, keys, max_depth), that walks the bytes of an
 * ExportTraceServiceRequest and returns, per span, only what the span mapping reads. The rules
 * are the Python twin's (see its module docstring; tests/spans/test_otlpscan.py checks the two
 * against each other): nothing here knows what a span means, only where its fields are.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef const unsigned char *ptr;

enum { OK = 0, E_TRUNC, E_VARINT, E_FIELD0, E_WIRE, E_UTF8, E_PY };

static const char *WHY[] = {
    "", "truncated field", "varint longer than 10 bytes", "field number 0",
    "unsupported wire type", "invalid UTF-8", "",
};
static const char BAD_IDS[] = "invalid trace_id or span_id";

#define KEYS 32
#define IDS 128 /* a power of two */
typedef struct {
    PyObject *prefixes; /* tuple of bytes */
    PyObject *keys;     /* frozenset of bytes */
    int max_depth;
    Py_ssize_t deep;
    /* The spans of a request carry the same few attribute keys: each is tested against the
     * wanted ones, and a wanted one decoded (and hashed, by the first dict it goes into), once
     * per request, and every span's dict shares its str. Owned references, released by scan(). */
    int seen;
    ptr key_at[KEYS];
    Py_ssize_t key_len[KEYS];
    PyObject *key_name[KEYS]; /* the key's str, or NULL: not wanted */
    /* Likewise the hex of the trace ids and parent span ids met lately: one str per trace (and
     * per parent) and request, its hash computed once, wherever the receiver looks it up. One
     * table for trace ids, one for parent ids; a slot per id's last byte (ids are random), taken
     * over when another id needs it. */
    ptr id_at[2][IDS];
    PyObject *id_str[2][IDS];
} Ctx;

typedef struct {
    ptr lo, hi;
    int set;
} Slice;

static int varint(ptr *p, ptr end, uint64_t *out) {
    uint64_t x = 0;
    int shift = 0;
    ptr q = *p;
    for (;;) {
        if (q >= end) return E_TRUNC;
        unsigned c = *q++;
        if (shift < 64) x |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) break;
        shift += 7;
        if (shift >= 70) return E_VARINT;
    }
    *p = q;
    *out = x;
    return OK;
}

static int tag(ptr *p, ptr end, uint32_t *field, int *wt) {
    uint64_t t;
    int e = varint(p, end, &t);
    if (e) return e;
    if (t > 0xFFFFFFFFu || (t >> 3) == 0) return E_FIELD0;
    int w = (int)(t & 7);
    if (w == 3 || w == 4 || w == 6 || w == 7) return E_WIRE;
    *field = (uint32_t)(t >> 3);
    *wt = w;
    return OK;
}

static int length(ptr *p, ptr end, Slice *s) {
    uint64_t n;
    int e = varint(p, end, &n);
    if (e) return e;
    if (n > (uint64_t)(end - *p)) return E_TRUNC;
    s->lo = *p;
    s->hi = *p + n;
    s->set = 1;
    *p = s->hi;
    return OK;
}

static int skip(ptr *p, ptr end, int wt) {
    uint64_t v;
    Slice s;
    switch (wt) {
    case 0: return varint(p, end, &v);
    case 1:
        if (end - *p < 8) return E_TRUNC;
        *p += 8;
        return OK;
    case 5:
        if (end - *p < 4) return E_TRUNC;
        *p += 4;
        return OK;
    default: return length(p, end, &s);
    }
}

static PyObject *text(Slice s, int *err) {
    PyObject *r = PyUnicode_DecodeUTF8((const char *)s.lo, s.hi - s.lo, "strict");
    if (r == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            *err = E_UTF8;
        } else {
            *err = E_PY;
        }
    }
    return r;
}

static int eq(Slice s, const char *lit, size_t n) {
    return (size_t)(s.hi - s.lo) == n && memcmp(s.lo, lit, n) == 0;
}

static int wanted(Ctx *c, ptr k, Py_ssize_t n) {
    Py_ssize_t np = PyTuple_GET_SIZE(c->prefixes);
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *pre = PyTuple_GET_ITEM(c->prefixes, i);
        Py_ssize_t pn = PyBytes_GET_SIZE(pre);
        if (pn <= n && memcmp(k, PyBytes_AS_STRING(pre), pn) == 0) return 1;
    }
    if (PySet_GET_SIZE(c->keys) == 0) return 0;
    PyObject *b = PyBytes_FromStringAndSize((const char *)k, n);
    if (b == NULL) return -1;
    int r = PySet_Contains(c->keys, b);
    Py_DECREF(b);
    return r;
}

/* The str of the attribute key k when it is wanted, else NULL in *name: OK or an error. */
static int wanted_name(Ctx *c, Slice k, PyObject **name) {
    Py_ssize_t n = k.set ? k.hi - k.lo : 0;
    *name = NULL;
    if (!k.set) {
        int w = wanted(c, (ptr) "", 0);
        if (w < 0) return E_PY;
        if (w && (*name = PyUnicode_FromStringAndSize("", 0)) == NULL) return E_PY;
        return OK;
    }
    for (int i = 0; i < c->seen; i++)
        if (c->key_len[i] == n && memcmp(c->key_at[i], k.lo, n) == 0) {
            *name = Py_XNewRef(c->key_name[i]);
            return OK;
        }
    int w = wanted(c, k.lo, n);
    if (w < 0) return E_PY;
    if (w) {
        int err = OK;
        if ((*name = text(k, &err)) == NULL) return err ? err : E_PY;
    }
    if (c->seen < KEYS) {
        int i = c->seen++;
        c->key_at[i] = k.lo;
        c->key_len[i] = n;
        c->key_name[i] = Py_XNewRef(*name);
    }
    return OK;
}

static PyObject *value(ptr p, ptr end, int depth, Ctx *c, int *err);

static int kv_into(ptr p, ptr end, int depth, Ctx *c, PyObject *out, int filtered) {
    Slice k = {0}, v = {0};
    uint32_t f;
    int wt, e;
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) return e;
        if (wt == 2 && (f == 1 || f == 2)) {
            if ((e = length(&p, end, f == 1 ? &k : &v))) return e;
        } else if ((e = skip(&p, end, wt))) {
            return e;
        }
    }
    int err = OK;
    PyObject *name;
    if (filtered) {
        if ((err = wanted_name(c, k, &name))) return err;
        if (name == NULL) return OK;
    } else {
        name = k.set ? text(k, &err) : PyUnicode_FromStringAndSize("", 0);
        if (name == NULL) return err ? err : E_PY;
    }
    PyObject *val;
    if (v.set) {
        val = value(v.lo, v.hi, depth, c, &err);
        if (val == NULL) {
            Py_DECREF(name);
            return err ? err : E_PY;
        }
    } else {
        val = Py_NewRef(Py_None);
    }
    int r = PyDict_SetItem(out, name, val);
    Py_DECREF(name);
    Py_DECREF(val);
    return r < 0 ? E_PY : OK;
}

static PyObject *value(ptr p, ptr end, int depth, Ctx *c, int *err) {
    int kind = 0, wt, e;
    uint32_t f;
    Slice s = {0};
    uint64_t num = 0;
    ptr dbl = NULL;
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) goto fail;
        if (wt == 2 && (f == 1 || f == 5 || f == 6 || f == 7)) {
            kind = (int)f;
            if ((e = length(&p, end, &s))) goto fail;
        } else if (wt == 0 && (f == 2 || f == 3)) {
            kind = (int)f;
            if ((e = varint(&p, end, &num))) goto fail;
        } else if (wt == 1 && f == 4) {
            if (end - p < 8) { e = E_TRUNC; goto fail; }
            kind = 4;
            dbl = p;
            p += 8;
        } else if ((e = skip(&p, end, wt))) {
            goto fail;
        }
    }
    switch (kind) {
    case 1: return text(s, err);
    case 3: return PyLong_FromLongLong((long long)(int64_t)num);
    case 2: return PyBool_FromLong(num != 0);
    case 4: {
        double d;
        uint64_t bits = 0;
        for (int i = 7; i >= 0; i--) bits = (bits << 8) | dbl[i];
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case 7: return PyBytes_FromStringAndSize((const char *)s.lo, s.hi - s.lo);
    case 5:
    case 6: {
        if (depth >= c->max_depth) {
            c->deep++;
            Py_RETURN_NONE;
        }
        ptr q = s.lo, qend = s.hi;
        if (kind == 5) {
            PyObject *items = PyList_New(0);
            if (items == NULL) { *err = E_PY; return NULL; }
            while (q < qend) {
                Slice item = {0};
                if ((e = tag(&q, qend, &f, &wt))) { Py_DECREF(items); goto fail; }
                if (f == 1 && wt == 2) {
                    if ((e = length(&q, qend, &item))) { Py_DECREF(items); goto fail; }
                    PyObject *x = value(item.lo, item.hi, depth + 1, c, err);
                    if (x == NULL) { Py_DECREF(items); return NULL; }
                    int r = PyList_Append(items, x);
                    Py_DECREF(x);
                    if (r < 0) { Py_DECREF(items); *err = E_PY; return NULL; }
                } else if ((e = skip(&q, qend, wt))) {
                    Py_DECREF(items);
                    goto fail;
                }
            }
            PyObject *t = PyList_AsTuple(items);
            Py_DECREF(items);
            if (t == NULL) *err = E_PY;
            return t;
        }
        PyObject *d = PyDict_New();
        if (d == NULL) { *err = E_PY; return NULL; }
        while (q < qend) {
            Slice item = {0};
            if ((e = tag(&q, qend, &f, &wt))) { Py_DECREF(d); goto fail; }
            if (f == 1 && wt == 2) {
                if ((e = length(&q, qend, &item))) { Py_DECREF(d); goto fail; }
                if ((e = kv_into(item.lo, item.hi, depth + 1, c, d, 0))) { Py_DECREF(d); goto fail; }
            } else if ((e = skip(&q, qend, wt))) {
                Py_DECREF(d);
                goto fail;
            }
        }
        return d;
    }
    default: Py_RETURN_NONE;
    }
fail:
    *err = e;
    return NULL;
}

/* Where an AnyValue's string is, when a string is its (last) value. */
static int string_value(ptr p, ptr end, Slice *out) {
    uint32_t f;
    int wt, e;
    out->set = 0;
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) return e;
        if (wt == 2 && (f == 1 || f == 5 || f == 6 || f == 7)) {
            Slice s;
            if ((e = length(&p, end, &s))) return e;
            if (f == 1) *out = s;
            else out->set = 0;
        } else if ((wt == 0 && (f == 2 || f == 3)) || (wt == 1 && f == 4)) {
            out->set = 0;
            if ((e = skip(&p, end, wt))) return e;
        } else if ((e = skip(&p, end, wt))) {
            return e;
        }
    }
    return OK;
}

static int exception_type(ptr p, ptr end, int *is_exc, Slice *found) {
    uint32_t f;
    int wt, e, seen = 0;
    *is_exc = 0;
    found->set = 0;
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) return e;
        if (f == 2 && wt == 2) {
            Slice s;
            if ((e = length(&p, end, &s))) return e;
            *is_exc = eq(s, "exception", 9);
        } else if (f == 3 && wt == 2) {
            Slice kv;
            if ((e = length(&p, end, &kv))) return e;
            if (seen) continue;
            Slice k = {0}, v = {0};
            ptr q = kv.lo;
            while (q < kv.hi) {
                uint32_t kf;
                int kwt;
                if ((e = tag(&q, kv.hi, &kf, &kwt))) return e;
                if (kwt == 2 && (kf == 1 || kf == 2)) {
                    if ((e = length(&q, kv.hi, kf == 1 ? &k : &v))) return e;
                } else if ((e = skip(&q, kv.hi, kwt))) {
                    return e;
                }
            }
            if (k.set && eq(k, "exception.type", 14)) {
                seen = 1;
                if (v.set && (e = string_value(v.lo, v.hi, found))) return e;
            }
        } else if ((e = skip(&p, end, wt))) {
            return e;
        }
    }
    return OK;
}

static PyObject *hex(Slice s) {
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = s.hi - s.lo;
    PyObject *r = PyUnicode_New(2 * n, 127);
    if (r == NULL) return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(r);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[2 * i] = (Py_UCS1)digits[s.lo[i] >> 4];
        out[2 * i + 1] = (Py_UCS1)digits[s.lo[i] & 15];
    }
    return r;
}

/* hex(s) of a trace id (table 0, 16 bytes) or a parent span id (table 1, 8 bytes), shared
 * with the id met last in its slot when it is the same id. */
static PyObject *hex_of(Ctx *c, int table, Slice s) {
    Py_ssize_t n = s.hi - s.lo; /* 16 or 8: checked by the caller */
    int i = s.lo[n - 1] & (IDS - 1);
    PyObject **slot = &c->id_str[table][i];
    if (*slot != NULL && memcmp(c->id_at[table][i], s.lo, n) == 0) return Py_NewRef(*slot);
    PyObject *r = hex(s);
    if (r != NULL) {
        Py_XSETREF(*slot, Py_NewRef(r)); /* the old one is a str: its release runs no Python */
        c->id_at[table][i] = s.lo;
    }
    return r;
}

static int zeros(Slice s) {
    for (ptr q = s.lo; q < s.hi; q++)
        if (*q) return 0;
    return 1;
}

static uint64_t fixed64(ptr p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static PyObject *seconds(uint64_t ns) {
    if (!ns) Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ns / 1e9);
}

/* One span: a new tuple, or a new str (why it is rejected), or NULL with *err = E_PY. */
static PyObject *span(ptr p, ptr end, Ctx *c, PyObject *resource, PyObject *scope, int *err) {
    Slice tid = {0}, sid = {0}, parent = {0}, name = {0}, msg = {0}, exc = {0};
    uint64_t start = 0, stop = 0, code = 0;
    int exc_seen = 0, e = OK, wt;
    uint32_t f;
    PyObject *attrs = PyDict_New();
    if (attrs == NULL) { *err = E_PY; return NULL; }
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) goto bad;
        if (wt == 2) {
            Slice s;
            if ((e = length(&p, end, &s))) goto bad;
            switch (f) {
            case 9:
                if ((e = kv_into(s.lo, s.hi, 0, c, attrs, 1))) goto bad;
                break;
            case 1: tid = s; break;
            case 2: sid = s; break;
            case 4: parent = s; break;
            case 5: name = s; break;
            case 11:
                if (!exc_seen) {
                    int is_exc;
                    Slice found;
                    if ((e = exception_type(s.lo, s.hi, &is_exc, &found))) goto bad;
                    if (is_exc) {
                        exc_seen = 1;
                        exc = found;
                    }
                }
                break;
            case 15: {
                ptr q = s.lo;
                while (q < s.hi) {
                    uint32_t sf;
                    int swt;
                    if ((e = tag(&q, s.hi, &sf, &swt))) goto bad;
                    if (sf == 2 && swt == 2) {
                        if ((e = length(&q, s.hi, &msg))) goto bad;
                    } else if (sf == 3 && swt == 0) {
                        if ((e = varint(&q, s.hi, &code))) goto bad;
                    } else if ((e = skip(&q, s.hi, swt))) {
                        goto bad;
                    }
                }
                break;
            }
            default: break;
            }
        } else if (wt == 1 && (f == 7 || f == 8)) {
            if (end - p < 8) { e = E_TRUNC; goto bad; }
            if (f == 7) start = fixed64(p);
            else stop = fixed64(p);
            p += 8;
        } else if ((e = skip(&p, end, wt))) {
            goto bad;
        }
    }
    Py_ssize_t sn = sid.hi - sid.lo;
    if (!tid.set || tid.hi - tid.lo != 16 || zeros(tid) || (sn != 0 && sn != 8) || (sn == 8 && zeros(sid))) {
        Py_DECREF(attrs);
        return PyUnicode_FromString(BAD_IDS);
    }
    int failed = (code & 0xFFFFFFFFu) == 2;
    PyObject *t = PyTuple_New(12);
    if (t == NULL) { Py_DECREF(attrs); *err = E_PY; return NULL; }
    PyObject *x;
    /* From here, t owns what is set; a failure drops t (and what it holds). */
#define SET(i, expr)                                                                               \
    do {                                                                                           \
        x = (expr);                                                                                \
        if (x == NULL) goto fail_t;                                                                \
        PyTuple_SET_ITEM(t, i, x);                                                                 \
    } while (0)
    PyTuple_SET_ITEM(t, 9, attrs);
    attrs = NULL;
    SET(0, hex_of(c, 0, tid));
    SET(1, hex(sid));
    SET(2, parent.set && parent.hi - parent.lo == 8 && !zeros(parent) ? hex_of(c, 1, parent) : Py_NewRef(Py_None));
    {
        int te = OK;
        x = name.set ? text(name, &te) : PyUnicode_FromStringAndSize("", 0);
        if (x == NULL) { e = te; goto fail_t; }
        PyTuple_SET_ITEM(t, 3, x);
    }
    SET(4, seconds(start));
    SET(5, seconds(stop));
    SET(6, PyBool_FromLong(failed));
    {
        int te = OK;
        if (msg.set && msg.hi > msg.lo) {
            x = text(msg, &te);
            if (x == NULL) { e = te; goto fail_t; }
        } else {
            x = Py_NewRef(Py_None);
        }
        PyTuple_SET_ITEM(t, 7, x);
        if (failed && exc.set && exc.hi > exc.lo) {
            x = text(exc, &te);
            if (x == NULL) { e = te; goto fail_t; }
        } else {
            x = Py_NewRef(Py_None);
        }
        PyTuple_SET_ITEM(t, 8, x);
    }
    SET(10, Py_NewRef(resource));
    SET(11, Py_NewRef(scope));
#undef SET
    return t;
fail_t:
    Py_DECREF(t);
    if (e == E_UTF8) return PyUnicode_FromString(WHY[e]);
    *err = E_PY;
    return NULL;
bad:
    Py_XDECREF(attrs);
    if (e == E_PY) { *err = E_PY; return NULL; }
    return PyUnicode_FromString(WHY[e]);
}

static int scope_spans(ptr p, ptr end, Ctx *c, PyObject *resource, PyObject *out) {
    uint32_t f;
    int wt, e;
    Slice where = {0};
    ptr j = p;
    while (j < end) {
        if ((e = tag(&j, end, &f, &wt))) return e;
        if (f == 1 && wt == 2) {
            Slice s;
            if ((e = length(&j, end, &s))) return e;
            ptr q = s.lo;
            while (q < s.hi) {
                uint32_t sf;
                int swt;
                if ((e = tag(&q, s.hi, &sf, &swt))) return e;
                if (sf == 1 && swt == 2) {
                    if ((e = length(&q, s.hi, &where))) return e;
                } else if ((e = skip(&q, s.hi, swt))) {
                    return e;
                }
            }
        } else if ((e = skip(&j, end, wt))) {
            return e;
        }
    }
    PyObject *scope;
    if (where.set && where.hi > where.lo) {
        int te = OK;
        scope = text(where, &te);
        if (scope == NULL) return te;
    } else {
        scope = Py_NewRef(Py_None);
    }
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) goto out;
        if (f == 2 && wt == 2) {
            Slice s;
            if ((e = length(&p, end, &s))) goto out;
            int se = OK;
            PyObject *x = span(s.lo, s.hi, c, resource, scope, &se);
            if (x == NULL) { e = E_PY; goto out; }
            int r = PyList_Append(out, x);
            Py_DECREF(x);
            if (r < 0) { e = E_PY; goto out; }
        } else if ((e = skip(&p, end, wt))) {
            goto out;
        }
    }
    e = OK;
out:
    Py_DECREF(scope);
    return e;
}

static int resource_spans(ptr p, ptr end, Ctx *c, PyObject *out) {
    uint32_t f;
    int wt, e;
    PyObject *resource = NULL;
    ptr j = p;
    while (j < end) {
        if ((e = tag(&j, end, &f, &wt))) goto out;
        if (f == 1 && wt == 2) {
            Slice s;
            if ((e = length(&j, end, &s))) goto out;
            if (resource == NULL && (resource = PyDict_New()) == NULL) { e = E_PY; goto out; }
            ptr q = s.lo;
            while (q < s.hi) {
                uint32_t rf;
                int rwt;
                if ((e = tag(&q, s.hi, &rf, &rwt))) goto out;
                if (rf == 1 && rwt == 2) {
                    Slice a;
                    if ((e = length(&q, s.hi, &a))) goto out;
                    if ((e = kv_into(a.lo, a.hi, 0, c, resource, 1))) goto out;
                } else if ((e = skip(&q, s.hi, rwt))) {
                    goto out;
                }
            }
        } else if ((e = skip(&j, end, wt))) {
            goto out;
        }
    }
    if (resource == NULL) resource = Py_NewRef(Py_None);
    while (p < end) {
        if ((e = tag(&p, end, &f, &wt))) goto out;
        if (f == 2 && wt == 2) {
            Slice s;
            if ((e = length(&p, end, &s))) goto out;
            if ((e = scope_spans(s.lo, s.hi, c, resource, out))) goto out;
        } else if ((e = skip(&p, end, wt))) {
            goto out;
        }
    }
    e = OK;
out:
    Py_XDECREF(resource);
    return e;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Ctx c;
    if (!PyArg_ParseTuple(args, "y*O!O!i", &buf, &PyTuple_Type, &c.prefixes, &PyFrozenSet_Type,
                          &c.keys, &c.max_depth))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c.prefixes); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(c.prefixes, i))) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            return NULL;
        }
    }
    c.deep = 0;
    c.seen = 0;
    memset(c.id_str, 0, sizeof c.id_str);
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    ptr p = (ptr)buf.buf, end = p + buf.len;
    int e = OK;
    while (p < end) {
        uint32_t f;
        int wt;
        if ((e = tag(&p, end, &f, &wt))) break;
        if (f == 1 && wt == 2) {
            Slice s;
            if ((e = length(&p, end, &s))) break;
            if ((e = resource_spans(s.lo, s.hi, &c, out))) break;
        } else if ((e = skip(&p, end, wt))) {
            break;
        }
    }
    for (int i = 0; i < c.seen; i++) Py_XDECREF(c.key_name[i]);
    for (int i = 0; i < IDS; i++) {
        Py_XDECREF(c.id_str[0][i]);
        Py_XDECREF(c.id_str[1][i]);
    }
    PyBuffer_Release(&buf);
    if (e) {
        Py_DECREF(out);
        if (e != E_PY) PyErr_SetString(PyExc_ValueError, WHY[e]);
        else if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "scan failed");
        return NULL;
    }
    PyObject *r = Py_BuildValue("(Nn)", out, c.deep);
    return r;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, prefixes, keys, max_depth) -> (entries, cut): the spans of an OTLP "
     "ExportTraceServiceRequest (see tripwire.spans._wire)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlpscan(void) { return PyModule_Create(&module); }
