/* The L1 key map's two per-request loops (ragcache/tiers/lru_index.py), compiled.
 *
 * Why: a 32-key lookup through numpy's batch operations is some fifteen calls of about a microsecond each, most of
 * it numpy's dispatch, not the loads; on a served L1 hit that was about a sixth of the request's CPU
 * (benchmarks/notes/r8.md). Here one call walks the same arrays, in place, with the same rules: open addressing
 * with linear probing (a slot's row is >= 0 for a key, -1 empty: the probe ends, -2 a tombstone: the probe goes
 * on), and recency stamped in order with one log entry per use. Everything else (inserts, evictions, rebuilds, compaction) stays in
 * numpy, whose batch form suits them. Arrays come as buffers, made by the index with the dtypes named below; their
 * sizes and their alignment are checked here (a misaligned int64 load is undefined behaviour in C), every bound
 * written so that no sum of caller-given sizes can overflow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>

#define EMPTY (-1)

/* Whether a buffer's memory is aligned for items of `size` bytes. */
static int aligned(const Py_buffer *b, size_t size) { return ((uintptr_t)b->buf % size) == 0; }

typedef struct {
    Py_buffer keys, hi, lo, slot_row;
    Py_ssize_t num_keys, table_size;
} Table;

static void release_table(Table *t) {
    PyBuffer_Release(&t->keys);
    PyBuffer_Release(&t->hi);
    PyBuffer_Release(&t->lo);
    PyBuffer_Release(&t->slot_row);
}

/* The table's sizes checked against each other; the mask must be the table size less one (a power of two). */
static int check_table(Table *t, uint64_t mask) {
    t->num_keys = t->keys.len / 16;
    t->table_size = t->slot_row.len / 4;
    if (t->keys.len % 16 || t->hi.len != t->table_size * 8 || t->lo.len != t->table_size * 8
        || (uint64_t)t->table_size != mask + 1 || t->table_size & (t->table_size - 1)
        || !aligned(&t->keys, 8) || !aligned(&t->hi, 8) || !aligned(&t->lo, 8) || !aligned(&t->slot_row, 4)) {
        PyErr_SetString(PyExc_ValueError, "lru kernels: keys [n, 2] uint64, hi/lo uint64 and slot_row int32 of one "
                                          "power-of-two size, mask = size - 1, each aligned for its items");
        return -1;
    }
    return 0;
}

/* The row of key i, or EMPTY. Terminates: the table always has empty slots (live plus deleted stay below 3/4). */
static inline int64_t probe_one(const Table *t, Py_ssize_t i, uint64_t mask) {
    const uint64_t *keys = (const uint64_t *)t->keys.buf, *hi = (const uint64_t *)t->hi.buf, *lo = (const uint64_t *)t->lo.buf;
    const int32_t *slot_row = (const int32_t *)t->slot_row.buf;
    uint64_t k_hi = keys[2 * i], k_lo = keys[2 * i + 1], slot = k_lo & mask;
    for (Py_ssize_t step = 0; step < t->table_size; step++) {
        int32_t row = slot_row[slot];
        if (row == EMPTY)
            return EMPTY;
        if (row >= 0 && lo[slot] == k_lo && hi[slot] == k_hi)
            return row;
        slot = (slot + 1) & mask;
    }
    return EMPTY;
}

PyDoc_STRVAR(find_doc, "find(keys, hi, lo, slot_row, mask, rows_out)\n--\n\n"
                       "rows_out[i] = the row of keys[i], or -1 where it is not resident.");

static PyObject *find(PyObject *self, PyObject *args) {
    Table t = {0};
    Py_buffer rows_out = {0};
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*y*y*y*Kw*", &t.keys, &t.hi, &t.lo, &t.slot_row, &mask, &rows_out))
        return NULL;
    PyObject *result = NULL;
    if (check_table(&t, mask) < 0)
        goto done;
    if (rows_out.len / 8 < t.num_keys || !aligned(&rows_out, 8)) {
        PyErr_SetString(PyExc_ValueError, "lru kernels: rows_out holds fewer int64 than there are keys, or is misaligned");
        goto done;
    }
    int64_t *rows = (int64_t *)rows_out.buf;
    for (Py_ssize_t i = 0; i < t.num_keys; i++)
        rows[i] = probe_one(&t, i, mask);
    result = Py_NewRef(Py_None);
done:
    release_table(&t);
    PyBuffer_Release(&rows_out);
    return result;
}

PyDoc_STRVAR(find_hits_doc, "find_hits(keys, hi, lo, slot_row, mask, positions_out, rows_out) -> int\n--\n\n"
                            "The resident keys only: their positions in keys and their rows, in order, first in "
                            "the outputs; returns how many.");

static PyObject *find_hits(PyObject *self, PyObject *args) {
    Table t = {0};
    Py_buffer positions_out = {0}, rows_out = {0};
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*y*y*y*Kw*w*", &t.keys, &t.hi, &t.lo, &t.slot_row, &mask, &positions_out, &rows_out))
        return NULL;
    PyObject *result = NULL;
    if (check_table(&t, mask) < 0)
        goto done;
    if (positions_out.len / 8 < t.num_keys || rows_out.len / 8 < t.num_keys || !aligned(&positions_out, 8)
        || !aligned(&rows_out, 8)) {
        PyErr_SetString(PyExc_ValueError, "lru kernels: an output holds fewer int64 than there are keys, or is misaligned");
        goto done;
    }
    int64_t *positions = (int64_t *)positions_out.buf, *rows = (int64_t *)rows_out.buf;
    Py_ssize_t num_hits = 0;
    for (Py_ssize_t i = 0; i < t.num_keys; i++) {
        int64_t row = probe_one(&t, i, mask);
        if (row >= 0) {
            positions[num_hits] = i;
            rows[num_hits++] = row;
        }
    }
    result = PyLong_FromSsize_t(num_hits);
done:
    release_table(&t);
    PyBuffer_Release(&positions_out);
    PyBuffer_Release(&rows_out);
    return result;
}

PyDoc_STRVAR(touch_doc, "touch(rows, stamp, log_rows, log_ticks, tail, tick)\n--\n\n"
                        "Rows used in order: each stamped with the next tick and logged at tail onwards (a row used "
                        "twice keeps its later tick; its earlier entry is stale). The caller moves tail and tick on "
                        "by len(rows) and makes room in the log first.");

static PyObject *touch(PyObject *self, PyObject *args) {
    Py_buffer rows_in = {0}, stamp_buf = {0}, log_rows_buf = {0}, log_ticks_buf = {0};
    Py_ssize_t tail;
    long long tick;
    if (!PyArg_ParseTuple(args, "y*w*w*w*nL", &rows_in, &stamp_buf, &log_rows_buf, &log_ticks_buf, &tail, &tick))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = rows_in.len / 8, num_rows = stamp_buf.len / 8, capacity = log_rows_buf.len / 4;
    /* tail comes from the caller: `tail + count > capacity` could overflow (undefined, and a wrapped sum passes),
     * so the room left is computed instead, once tail is known to lie within the log; likewise the ticks handed out. */
    if (rows_in.len % 8 || log_ticks_buf.len % 8 || log_ticks_buf.len / 8 != capacity || tail < 0 || tail > capacity
        || count > capacity - tail || tick < 0 || (long long)count > LLONG_MAX - 1 - tick
        || !aligned(&rows_in, 8) || !aligned(&stamp_buf, 8) || !aligned(&log_rows_buf, 4) || !aligned(&log_ticks_buf, 8)) {
        PyErr_SetString(PyExc_ValueError, "lru kernels: rows int64, a log of int32 rows and int64 ticks with room "
                                          "for them at tail, each aligned for its items");
        goto done;
    }
    const int64_t *rows = (const int64_t *)rows_in.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (rows[i] < 0 || rows[i] >= num_rows) {
            PyErr_Format(PyExc_ValueError, "lru kernels: row %lld is not a row of this index", (long long)rows[i]);
            goto done;
        }
    }
    int64_t *stamp = (int64_t *)stamp_buf.buf, *log_ticks = (int64_t *)log_ticks_buf.buf;
    int32_t *log_rows = (int32_t *)log_rows_buf.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t now = tick + 1 + i;
        stamp[rows[i]] = now;
        log_rows[tail + i] = (int32_t)rows[i];
        log_ticks[tail + i] = now;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&rows_in);
    PyBuffer_Release(&stamp_buf);
    PyBuffer_Release(&log_rows_buf);
    PyBuffer_Release(&log_ticks_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, find_doc},
    {"find_hits", find_hits, METH_VARARGS, find_hits_doc},
    {"touch", touch, METH_VARARGS, touch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lru_kernels", "The L1 key map's lookup and recency loops.", -1, methods};

PyMODINIT_FUNC PyInit__lru_kernels(void) { return PyModule_Create(&module); }
