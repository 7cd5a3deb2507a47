/* The volatile-value mask of a tool result, compiled: an optional accelerator.
 *
 * Two pure functions of Normalizer.result_digest, each with a Python twin in
 * tripwire/core/signature.py that stays the reference (the whole test suite runs against both:
 * TRIPWIRE_NO_EXTENSIONS=1 selects the twins):
 *
 * - mask(payload) -> bytes | None: exactly _VOLATILE_TEXT_RE.sub(b"\x00v", payload), where the
 *   pattern is "\d(?:" VOLATILE_TEXT ")" | "(?<![0-9A-Za-z])(?=[A-Za-z])(?:" VOLATILE_WORDS ")".
 *   None for a payload longer than MAX_PAYLOAD bytes (the twin answers; result digests only mask
 *   results of at most 200 bytes).
 * - strip_digits(payload) -> bytes: exactly payload.translate(None, b"0123456789"), the digits a
 *   long result loses, in one branch-free pass (translate tests a deletion table per byte).
 * - prepare(text, max_bytes) -> bytes | None: the bytes Normalizer.result_digest hashes for a
 *   result text, on its common path (text that holds no JSON document it would parse and is no
 *   candidate for a "found nothing" message): the first two, chosen as result_digest chooses,
 *   without the Python steps around them. None hands the text to result_digest's own path.
 *
 * Each alternative of the two lists is written out below, in the pattern's order, as the
 * regex engine tries it: leftmost-first alternation, greedy quantifiers that give back one
 * character at a time, lookarounds that test without consuming. Where a quantifier's
 * backtracking can never lead to a match, the comment says why and only the greedy path is
 * tried. The pattern is a bytes pattern: \d is [0-9], \w is [A-Za-z0-9_], \s is
 * [ \t\n\r\f\v], and (?i:...) folds ASCII letters only. A match never starts inside an
 * earlier one (re.sub scans on from the end of each), but lookbehinds read the text as it was.
 *
 * No state, no Python callbacks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_PAYLOAD 4096 /* per-position runs make the scan quadratic at worst: bound it */

/* Character classes, one bit each; END (past the last byte) is in none of them. */
#define DG 0x001    /* [0-9] */
#define UP 0x002    /* [A-Z] */
#define LO 0x004    /* [a-z] */
#define US 0x008    /* _ */
#define HL 0x010    /* [a-fA-F] */
#define SP 0x020    /* [ \t\n\r\f\v] */
#define DOT 0x040   /* . */
#define SLASH 0x080 /* / */
#define COLON 0x100 /* : */
#define DASH 0x200  /* - */
#define AL (UP | LO)
#define AN (DG | UP | LO)
#define WD (AN | US)
#define HX (DG | HL)
#define END 256

static unsigned short cls[END + 1];

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
} Text;

/* The byte at i, or END outside the text. */
static inline int
ch(const Text *t, Py_ssize_t i)
{
    return i >= 0 && i < t->n ? t->s[i] : END;
}

static inline int
is(const Text *t, Py_ssize_t i, int mask)
{
    return (cls[ch(t, i)] & mask) != 0;
}

#define D(i) is(t, (i), DG)

/* The length of the run of bytes in ``mask`` that starts at i. */
static Py_ssize_t
run(const Text *t, Py_ssize_t i, int mask)
{
    Py_ssize_t j = i;
    while (j < t->n && (cls[t->s[j]] & mask))
        j++;
    return j - i;
}

/* True when the count bytes from i are all hex digits. */
static int
hexes(const Text *t, Py_ssize_t i, Py_ssize_t count)
{
    return run(t, i, HX) >= count;
}

/* How many bytes of s[i:i+len] have a class in mask. */
static Py_ssize_t
count(const Text *t, Py_ssize_t i, Py_ssize_t len, int mask)
{
    Py_ssize_t c = 0;
    for (Py_ssize_t j = i; j < i + len; j++)
        c += (cls[t->s[j]] & mask) != 0;
    return c;
}

/* (?<![X]\d) tested right after the digit at p: true unless the byte before p is in X. */
static inline int
free_before(const Text *t, Py_ssize_t p, int mask)
{
    return !(p >= 1 && is(t, p - 1, mask));
}

/* (?:-[0-9a-fA-F]{4,})* from i, greedy: where it ends. Each group takes its whole run of hex
 * digits, so the byte after it is no hex digit: the next group can only start there. */
static Py_ssize_t
hex_groups(const Text *t, Py_ssize_t i)
{
    while (ch(t, i) == '-') {
        Py_ssize_t r = run(t, i + 1, HX);
        if (r < 4)
            break;
        i += 1 + r;
    }
    return i;
}

/* _UNIT at i: (?:ns|us|\xc2\xb5s|ms|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)(?![A-Za-z0-9_]);
 * the end of the match, or -1. The lookahead follows the group, so a unit that matches but is
 * followed by a word byte sends the engine on to the next one ("s" then "secs" on "secs"). */
static Py_ssize_t
unit(const Text *t, Py_ssize_t i)
{
    static const char *const units[] = {
        "ns", "us", "\xc2\xb5s", "ms", "s", "secs", "sec", "seconds", "second", "mins", "min",
        "minutes", "minute", "h", "hrs", "hr", "hours", "hour", NULL,
    };
    int c = ch(t, i);
    if (c != 'n' && c != 'u' && c != 0xc2 && c != 'm' && c != 's' && c != 'h')
        return -1; /* no unit starts with it */
    for (const char *const *u = units; *u != NULL; u++) {
        if ((unsigned char)**u != c)
            continue;
        Py_ssize_t len = (Py_ssize_t)strlen(*u);
        if (len <= t->n - i && memcmp(t->s + i, *u, (size_t)len) == 0 && !is(t, i + len, WD))
            return i + len;
    }
    return -1;
}

/* \s?_UNIT at i: the space taken first, then not. */
static Py_ssize_t
spaced_unit(const Text *t, Py_ssize_t i)
{
    if (is(t, i, SP)) {
        Py_ssize_t e = unit(t, i + 1);
        if (e >= 0)
            return e;
    }
    return unit(t, i);
}

/* (?:\.\d+)? then s, at g (inside the 1m23s alternative): the end after the s, or -1. With the
 * fraction taken, fewer of its digits leave a digit where the s must be; without it, the dot
 * is there. */
static Py_ssize_t
fraction_then_s(const Text *t, Py_ssize_t g)
{
    if (ch(t, g) == '.' && D(g + 1)) {
        Py_ssize_t f = g + 1 + run(t, g + 1, DG);
        if (ch(t, f) == 's')
            return f + 1;
    }
    return ch(t, g) == 's' ? g + 1 : -1;
}

/* The VOLATILE_TEXT alternatives after the digit at p (q = p + 1): the end of the match, or -1. */
static Py_ssize_t
digit_match(const Text *t, Py_ssize_t p)
{
    const Py_ssize_t q = p + 1;
    Py_ssize_t i, j, k, e, r;
    int c;

    /* (?<=sh: line \d)\d*(?=:) -- fewer digits leave a digit where the colon must be. */
    if (p >= 9 && memcmp(t->s + p - 9, "sh: line ", 9) == 0) {
        e = q + run(t, q, DG);
        if (ch(t, e) == ':')
            return e;
    }

    /* (?<![0-9A-Za-z.]\d)\d{3}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?
     *  |[T_]\d\d-\d\d-\d\d)? -- nothing follows, so each optional part is taken when it matches. */
    if (free_before(t, p, AN | DOT) && D(q) && D(q + 1) && D(q + 2) && ch(t, q + 3) == '-' && D(q + 4)
        && D(q + 5) && ch(t, q + 6) == '-' && D(q + 7) && D(q + 8)) {
        i = q + 9;
        c = ch(t, i);
        if ((c == 'T' || c == ' ') && D(i + 1) && D(i + 2) && ch(t, i + 3) == ':' && D(i + 4) && D(i + 5)) {
            j = i + 6;
            if (ch(t, j) == ':' && D(j + 1) && D(j + 2)) {
                j += 3;
                c = ch(t, j);
                if ((c == '.' || c == ',') && D(j + 1))
                    j += 1 + run(t, j + 1, DG);
            }
            c = ch(t, j);
            if (c == 'Z') {
                j++;
            }
            else if ((c == '+' || c == '-') && D(j + 1) && D(j + 2)) {
                k = j + 3;
                if (ch(t, k) == ':' && D(k + 1) && D(k + 2))
                    j = k + 3;
                else if (D(k) && D(k + 1)) /* without the colon (a colon at k fails here) */
                    j = k + 2;
            }
            return j;
        }
        if ((c == 'T' || c == '_') && D(i + 1) && D(i + 2) && ch(t, i + 3) == '-' && D(i + 4) && D(i + 5)
            && ch(t, i + 6) == '-' && D(i + 7) && D(i + 8))
            return i + 9;
        return i;
    }

    /* (?<![\w./]\d)(?:\d?/\d\d?/\d\d(?:\d\d)?|\d{3}/\d\d?/\d\d?)(?![\w/]) */
    if (free_before(t, p, WD | DOT | SLASH)) {
        for (int a = 1; a >= 0; a--) {
            if (a && !D(q))
                continue;
            i = q + a;
            if (ch(t, i) != '/')
                continue;
            i++;
            for (int b = 2; b >= 1; b--) {
                if (!D(i) || (b == 2 && !D(i + 1)))
                    continue;
                j = i + b;
                if (ch(t, j) != '/' || !D(j + 1) || !D(j + 2))
                    continue;
                k = j + 3;
                if (D(k) && D(k + 1) && !is(t, k + 2, WD | SLASH))
                    return k + 2;
                if (!is(t, k, WD | SLASH))
                    return k;
            }
        }
        if (D(q) && D(q + 1) && D(q + 2) && ch(t, q + 3) == '/') {
            i = q + 4;
            for (int b = 2; b >= 1; b--) {
                if (!D(i) || (b == 2 && !D(i + 1)))
                    continue;
                j = i + b;
                if (ch(t, j) != '/')
                    continue;
                j++;
                for (int d = 2; d >= 1; d--) {
                    if (!D(j) || (d == 2 && !D(j + 1)))
                        continue;
                    if (!is(t, j + d, WD | SLASH))
                        return j + d;
                }
            }
        }
    }

    /* (?<![\w.:]\d)\d?:\d\d(?::\d\d(?:[.,]\d+)?)?(?![\w:]) */
    if (free_before(t, p, WD | DOT | COLON)) {
        for (int a = 1; a >= 0; a--) {
            if (a && !D(q))
                continue;
            i = q + a;
            if (ch(t, i) != ':' || !D(i + 1) || !D(i + 2))
                continue;
            j = i + 3;
            if (ch(t, j) == ':' && D(j + 1) && D(j + 2)) {
                k = j + 3;
                c = ch(t, k);
                if ((c == '.' || c == ',') && D(k + 1)) {
                    for (r = run(t, k + 1, DG); r >= 1; r--)
                        if (!is(t, k + 1 + r, WD | COLON))
                            return k + 1 + r;
                }
                if (!is(t, k, WD | COLON))
                    return k;
            }
            if (!is(t, j, WD | COLON))
                return j;
        }
    }

    /* (?<![\w.-]\d)[0-9a-fA-F]{7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-]) */
    if (free_before(t, p, WD | DOT | DASH) && hexes(t, q, 7) && ch(t, q + 7) == '-' && hexes(t, q + 8, 4)
        && ch(t, q + 12) == '-' && hexes(t, q + 13, 4) && ch(t, q + 17) == '-' && hexes(t, q + 18, 4)
        && ch(t, q + 22) == '-' && hexes(t, q + 23, 12) && !is(t, q + 35, WD | DASH))
        return q + 35;

    const int free_word_dot = free_before(t, p, WD | DOT);

    /* (?<![\w.]\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,}(?:-[0-9a-fA-F]{4,})*(?![\w-]) -- giving
     * back a hex digit leaves one (a word byte) next, giving back a group leaves its dash. */
    if (free_word_dot) {
        r = run(t, q, HX);
        if (r >= 7 && count(t, q, r, HL) > 0) {
            e = hex_groups(t, q + r);
            if (!is(t, e, WD | DASH))
                return e;
        }
    }

    /* (?<![\w.]0)(?<=0)x[0-9a-fA-F]{6,}(?!\w) -- fewer hex digits leave a word byte next. */
    if (t->s[p] == '0' && free_word_dot && ch(t, q) == 'x') {
        r = run(t, q + 1, HX);
        if (r >= 6 && !is(t, q + 1 + r, WD))
            return q + 1 + r;
    }

    /* (?<![\w.]\d)\d{3,}(?:\.\d+)?(?![\w.]) -- fewer digits leave a digit next, no fraction a dot. */
    if (free_word_dot) {
        r = run(t, q, DG);
        if (r >= 3) {
            e = q + r;
            if (ch(t, e) == '.' && D(e + 1)) {
                Py_ssize_t f = e + 1 + run(t, e + 1, DG);
                if (!is(t, f, WD | DOT))
                    return f;
            }
            if (!is(t, e, WD | DOT))
                return e;
        }
    }

    /* (?<![\w.]\d)\d*(?:\.\d+)?\s?_UNIT -- fewer leading digits leave a digit where the fraction's
     * dot, the space or the unit must start. */
    if (free_word_dot) {
        i = q + run(t, q, DG);
        if (ch(t, i) == '.' && D(i + 1)) {
            for (r = run(t, i + 1, DG); r >= 1; r--) {
                e = spaced_unit(t, i + 1 + r);
                if (e >= 0)
                    return e;
            }
        }
        e = spaced_unit(t, i);
        if (e >= 0)
            return e;
    }

    /* (?<![\w.]\d)\d*(?:h\d+m(?:\d+(?:\.\d+)?s)?|m\d+(?:\.\d+)?s)(?![A-Za-z0-9_]) -- fewer digits
     * anywhere leave a digit where an h, m, dot or s must be. */
    if (free_word_dot) {
        i = q + run(t, q, DG);
        c = ch(t, i);
        if (c == 'h') {
            r = run(t, i + 1, DG);
            if (r >= 1 && ch(t, i + 1 + r) == 'm') {
                j = i + 2 + r;
                r = run(t, j, DG);
                if (r >= 1) {
                    e = fraction_then_s(t, j + r);
                    if (e >= 0 && !is(t, e, WD))
                        return e;
                }
                if (!is(t, j, WD))
                    return j;
            }
        }
        else if (c == 'm') {
            r = run(t, i + 1, DG);
            if (r >= 1) {
                e = fraction_then_s(t, i + 1 + r);
                if (e >= 0 && !is(t, e, WD))
                    return e;
            }
        }
    }

    /* (?=(?:[A-Za-z]*\d){3})(?=\d*[A-Za-z])[A-Za-z0-9]{15,}(?![A-Za-z0-9]) -- the lookaheads read
     * the run of letters and digits at q; fewer bytes of it leave one next. */
    r = run(t, q, AN);
    if (r >= 15 && count(t, q, r, DG) >= 3 && is(t, q + run(t, q, DG), AL))
        return q + r;

    /* (?<![A-Za-z0-9]\d)(?=(?:[A-Za-z]*\d){2})(?=(?:[0-9a-z]*[A-Z]){2})(?=[0-9A-Z]*[a-z])
     * [A-Za-z0-9]{9,}(?![A-Za-z0-9]) */
    if (r >= 9 && free_before(t, p, AN) && count(t, q, r, DG) >= 2 && count(t, q, r, UP) >= 2
        && count(t, q, r, LO) >= 1)
        return q + r;

    return -1;
}

/* Case-insensitive (ASCII) match of the lower-case word w at i. */
static int
folded(const Text *t, Py_ssize_t i, const char *w)
{
    for (; *w; w++, i++) {
        int c = ch(t, i);
        if (c == END || (c | 0x20) != *w || !(cls[c] & AL))
            return 0;
    }
    return 1;
}

/* The tail of the request-id alternative, from i (after "id"):
 * [\"']? ?[:=]\s*[\"']?[\w.-]+ -- the end of the match, or -1. */
static Py_ssize_t
id_value(const Text *t, Py_ssize_t i)
{
    for (int quote = 1; quote >= 0; quote--) {
        Py_ssize_t a = i;
        if (quote) {
            if (ch(t, a) != '"' && ch(t, a) != '\'')
                continue;
            a++;
        }
        for (int space = 1; space >= 0; space--) {
            Py_ssize_t b = a;
            if (space) {
                if (ch(t, b) != ' ')
                    continue;
                b++;
            }
            if (ch(t, b) != ':' && ch(t, b) != '=')
                continue;
            b++;
            for (Py_ssize_t w = run(t, b, SP); w >= 0; w--) {
                for (int open = 1; open >= 0; open--) {
                    Py_ssize_t e = b + w;
                    if (open) {
                        if (ch(t, e) != '"' && ch(t, e) != '\'')
                            continue;
                        e++;
                    }
                    Py_ssize_t v = run(t, e, WD | DOT | DASH);
                    if (v >= 1)
                        return e + v;
                }
            }
        }
    }
    return -1;
}

/* The VOLATILE_WORDS alternatives at the letter at p, which starts a word: the end, or -1. */
static Py_ssize_t
word_match(const Text *t, Py_ssize_t p)
{
    Py_ssize_t r, e;

    /* [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-]) */
    if (hexes(t, p, 8) && ch(t, p + 8) == '-' && hexes(t, p + 9, 4) && ch(t, p + 13) == '-'
        && hexes(t, p + 14, 4) && ch(t, p + 18) == '-' && hexes(t, p + 19, 4) && ch(t, p + 23) == '-'
        && hexes(t, p + 24, 12) && !is(t, p + 36, WD | DASH))
        return p + 36;

    /* (?=[a-fA-F])(?:(?=[0-9a-fA-F-]*\d)[0-9a-fA-F]{8,}(?:-[0-9a-fA-F]{4,})*|[a-fA-F]{12,})(?![\w-])
     * -- in either branch, giving anything back leaves a hex digit or a dash next. */
    if (is(t, p, HL)) {
        Py_ssize_t span = run(t, p, HX | DASH);
        r = run(t, p, HX);
        if (r >= 8 && count(t, p, span, DG) > 0) {
            e = hex_groups(t, p + r);
            if (!is(t, e, WD | DASH))
                return e;
        }
        r = run(t, p, HL);
        if (r >= 12 && !is(t, p + r, WD | DASH))
            return p + r;
    }

    /* (?=(?:[A-Za-z]*\d){3})(?:(?=\d*[A-Za-z])[A-Za-z0-9]{16,}|(?=(?:[0-9a-z]*[A-Z]){2})
     * (?=[0-9A-Z]*[a-z])[A-Za-z0-9]{10,})(?![A-Za-z0-9]) -- (?=\d*[A-Za-z]) holds at a letter. */
    r = run(t, p, AN);
    if (r >= 10 && count(t, p, r, DG) >= 3) {
        if (r >= 16)
            return p + r;
        if (count(t, p, r, UP) >= 2 && count(t, p, r, LO) >= 1)
            return p + r;
    }

    /* (?i:(?:x-)?(?:request|req|trace|span|correlation)[ _-]?id)[\"']? ?[:=]\s*[\"']?[\w.-]+ */
    if (strchr("xrtsc", t->s[p] | 0x20) != NULL) { /* a letter: never the terminating NUL */
        static const char *const names[] = {"request", "req", "trace", "span", "correlation", NULL};
        for (int x = 1; x >= 0; x--) {
            Py_ssize_t i = p;
            if (x) {
                if (!folded(t, i, "x") || ch(t, i + 1) != '-')
                    continue;
                i += 2;
            }
            for (const char *const *name = names; *name != NULL; name++) {
                if (!folded(t, i, *name))
                    continue;
                Py_ssize_t j = i + (Py_ssize_t)strlen(*name);
                for (int sep = 1; sep >= 0; sep--) {
                    Py_ssize_t k = j;
                    if (sep) {
                        int c = ch(t, k);
                        if (c != ' ' && c != '_' && c != '-')
                            continue;
                        k++;
                    }
                    if (!folded(t, k, "id"))
                        continue;
                    e = id_value(t, k + 2);
                    if (e >= 0)
                        return e;
                }
            }
        }
    }

    /* tmp[a-z0-9_]{8}(?![A-Za-z0-9_]) */
    if (ch(t, p) == 't' && ch(t, p + 1) == 'm' && ch(t, p + 2) == 'p' && run(t, p + 3, LO | DG | US) >= 8
        && !is(t, p + 11, WD))
        return p + 11;

    return -1;
}

/* The mask of the n bytes at s, as new bytes; `self` (a bytes object holding them) is returned
 * as it is when nothing matched, or NULL there: then new bytes are made. n <= MAX_PAYLOAD. */
static PyObject *
mask_bytes(const unsigned char *s, Py_ssize_t n, PyObject *self)
{
    Text text = {s, n};
    const Text *t = &text;
    /* A match is at least one byte and becomes two: the output is at most twice the input. */
    char out[2 * MAX_PAYLOAD];
    Py_ssize_t o = 0, p = 0, copied = 0;
    int matched = 0;
    while (p < t->n) {
        int c = t->s[p];
        Py_ssize_t e = -1;
        if (cls[c] & DG)
            e = digit_match(t, p);
        else if ((cls[c] & AL) && !(p >= 1 && is(t, p - 1, AN)))
            e = word_match(t, p);
        if (e < 0) {
            p++;
            continue;
        }
        memcpy(out + o, t->s + copied, (size_t)(p - copied));
        o += p - copied;
        out[o++] = '\0';
        out[o++] = 'v';
        p = copied = e;
        matched = 1;
    }
    if (!matched) {
        if (self != NULL) {
            Py_INCREF(self);
            return self;
        }
        return PyBytes_FromStringAndSize((const char *)s, n);
    }
    memcpy(out + o, t->s + copied, (size_t)(t->n - copied));
    o += t->n - copied;
    return PyBytes_FromStringAndSize(out, o);
}

static PyObject *
mask(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "mask(payload): payload must be bytes");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n > MAX_PAYLOAD)
        Py_RETURN_NONE;
    return mask_bytes((const unsigned char *)PyBytes_AS_STRING(arg), n, arg);
}

/* ---- strip_digits ---------------------------------------------------------------------------- */

/* The n bytes at s without their ASCII digits, as new bytes. */
static PyObject *
strip_bytes(const unsigned char *s, Py_ssize_t n)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t i = 0, k = 0;
    /* Eight bytes at a time: most words of text hold no digit and are copied whole. */
    const uint64_t ones = UINT64_C(0x0101010101010101), highs = UINT64_C(0x8080808080808080);
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        /* a high bit for each byte b with 0x2f < b < 0x3a: a digit ("hasbetween" of the
         * bit-twiddling hacks; bytes >= 0x80 never count) */
        uint64_t low7 = x & (ones * 127);
        uint64_t digits = (ones * (127 + 0x3a) - low7) & ~x & (low7 + ones * (127 - 0x2f)) & highs;
        if (digits == 0) {
            memcpy(o + k, &x, 8);
            k += 8;
            continue;
        }
        for (int j = 0; j < 8; j++) {
            unsigned char c = s[i + j];
            o[k] = c; /* always written, kept only when it is no digit */
            k += (unsigned char)(c - '0') > 9;
        }
    }
    for (; i < n; i++) {
        unsigned char c = s[i];
        o[k] = c;
        k += (unsigned char)(c - '0') > 9;
    }
    if (k < n && _PyBytes_Resize(&out, k) < 0)
        return NULL;
    return out;
}

static PyObject *
strip_digits(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "strip_digits(payload): payload must be bytes");
        return NULL;
    }
    return strip_bytes((const unsigned char *)PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
}

/* ---- prepare --------------------------------------------------------------------------------- */

#define SHORT 200     /* signature._SHORT: longer results lose every digit */
#define EMPTY_MAX 160 /* signature._EMPTY_MAX: only results this short can say "found nothing" */

static inline int
lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* What Normalizer.result_digest hashes for the result text `text`, when the text takes the
 * common path: no JSON document it might parse (an object, an array or a string within
 * max_bytes), and no candidate for a "found nothing" message (which its regex decides). None
 * otherwise, and for text that is not valid UTF-8 (lone surrogates): the Python path answers. */
static PyObject *
prepare(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "prepare(text: str, max_bytes: int)");
        return NULL;
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[1]);
    if (max_bytes == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(args[0], &n);
    if (utf8 == NULL) {
        PyErr_Clear(); /* a lone surrogate: encoded with surrogatepass by the Python path */
        Py_RETURN_NONE;
    }
    const unsigned char *s = (const unsigned char *)utf8;
    /* The opener: the first byte, or the first after ASCII whitespace (bytes.lstrip()). */
    Py_ssize_t i = 0;
    while (i < n && (cls[s[i]] & SP))
        i++;
    if (i < n && (s[i] == '{' || s[i] == '[' || s[i] == '"') && n <= max_bytes)
        Py_RETURN_NONE;
    if (n > SHORT)
        return strip_bytes(s, n);
    if (n <= EMPTY_MAX) {
        /* bare = payload.strip(); the cheap test of result_digest before its regex */
        Py_ssize_t lo = i, hi = n;
        while (hi > lo && (cls[s[hi - 1]] & SP))
            hi--;
        Py_ssize_t m = hi - lo;
        const unsigned char *b = s + lo;
        int maybe = m <= 4;
        if (!maybe && m >= 2) {
            int c0 = lower(b[0]), c1 = lower(b[1]);
            maybe = (c0 == 'n' && c1 == 'o') || (b[0] == '0' && b[1] == ' ') || (c0 == 'z' && c1 == 'e');
        }
        if (!maybe) {
            int zero = m >= 1 && b[0] == '0';
            int found = 0;
            if (!zero) {
                /* bare[-6:].lower().rstrip(b".!").endswith(b"found") */
                Py_ssize_t t0 = m > 6 ? m - 6 : 0, t1 = m;
                while (t1 > t0 && (b[t1 - 1] == '.' || b[t1 - 1] == '!'))
                    t1--;
                static const char word[] = "found";
                if (t1 - t0 >= 5) {
                    found = 1;
                    for (int k = 0; k < 5; k++)
                        if (lower(b[t1 - 5 + k]) != word[k])
                            found = 0;
                }
            }
            if (zero || found) {
                /* and b"ound" in bare */
                for (Py_ssize_t k = 0; k + 4 <= m; k++)
                    if (b[k] == 'o' && b[k + 1] == 'u' && b[k + 2] == 'n' && b[k + 3] == 'd') {
                        maybe = 1;
                        break;
                    }
            }
        }
        if (maybe)
            Py_RETURN_NONE;
    }
    return mask_bytes(s, n, NULL);
}

/* ---- module ---------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"mask", (PyCFunction)mask, METH_O,
     "mask(payload) -> bytes | None: every volatile value of a short result replaced by b'\\x00v' "
     "(None: the Python twin answers)."},
    {"strip_digits", (PyCFunction)strip_digits, METH_O,
     "strip_digits(payload) -> bytes: payload without its ASCII digits "
     "(payload.translate(None, b'0123456789'))."},
    {"prepare", (PyCFunction)(void (*)(void))prepare, METH_FASTCALL,
     "prepare(text, max_bytes) -> bytes | None: what a result digest hashes for the result text, "
     "on its common path (None: the Python path answers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tripwire.core._resultmask",
    "The volatile-value mask of a short tool result (see _resultmask.c).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__resultmask(void)
{
    for (int c = '0'; c <= '9'; c++)
        cls[c] |= DG;
    for (int c = 'A'; c <= 'Z'; c++)
        cls[c] |= UP;
    for (int c = 'a'; c <= 'z'; c++)
        cls[c] |= LO;
    for (int c = 'a'; c <= 'f'; c++)
        cls[c] |= HL, cls[c - 'a' + 'A'] |= HL;
    for (const char *c = " \t\n\r\f\v"; *c; c++)
        cls[(unsigned char)*c] |= SP;
    cls['_'] |= US;
    cls['.'] |= DOT;
    cls['/'] |= SLASH;
    cls[':'] |= COLON;
    cls['-'] |= DASH;
    return PyModule_Create(&module_def);
}
