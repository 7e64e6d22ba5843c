/* OpenAI's base64 answer assembled in one pass (ragcache_server/embedding/wire.py, ``openai_base64_answer``; its
 * Python twin: _base64_answer_py.py).
 *
 * Why: the answer is 32 rows of 2,048 base64 characters framed by a few bytes each; joined in Python (a slice, a
 * framing string and a list entry a row) that framing cost several times the copy itself, about a sixth of an L1
 * hit's CPU (benchmarks/notes/r8.md). Here the exact size is counted first and every byte written once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const char OPENING[] = "{\"object\":\"embedding\",\"embedding\":\"";
static const char CLOSING[] = "\",\"index\":";

static Py_ssize_t num_digits(Py_ssize_t value) {
    Py_ssize_t digits = 1;
    while (value >= 10) {
        value /= 10;
        digits++;
    }
    return digits;
}

static char *write_decimal(char *at, Py_ssize_t value) {
    Py_ssize_t digits = num_digits(value);
    for (Py_ssize_t i = digits - 1; i >= 0; i--) {
        at[i] = (char)('0' + value % 10);
        value /= 10;
    }
    return at + digits;
}

PyDoc_STRVAR(join_rows_doc, "join_rows(encoded, width, head, tail) -> bytes\n--\n\n"
                            "head, then each width-byte row of encoded as {\"object\":\"embedding\",\"embedding\":"
                            "\"<row>\",\"index\":i}, comma-separated, then tail.");

static PyObject *join_rows(PyObject *self, PyObject *args) {
    Py_buffer encoded = {0}, head = {0}, tail = {0};
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*ny*y*", &encoded, &width, &head, &tail))
        return NULL;
    PyObject *answer = NULL;
    if (width <= 0 || encoded.len % width) {
        PyErr_SetString(PyExc_ValueError, "join_rows: encoded must be whole rows of width > 0 bytes");
        goto done;
    }
    Py_ssize_t num_rows = encoded.len / width, size = head.len + tail.len;
    const Py_ssize_t framing = (Py_ssize_t)(sizeof(OPENING) - 1 + sizeof(CLOSING) - 1) + 1;  /* and the closing brace */
    for (Py_ssize_t i = 0; i < num_rows; i++)
        size += framing + width + num_digits(i) + (i > 0);  /* a comma before every row but the first */
    answer = PyBytes_FromStringAndSize(NULL, size);
    if (answer == NULL)
        goto done;
    char *at = PyBytes_AS_STRING(answer);
    const char *rows = (const char *)encoded.buf;
    memcpy(at, head.buf, head.len);
    at += head.len;
    for (Py_ssize_t i = 0; i < num_rows; i++) {
        if (i > 0)
            *at++ = ',';
        memcpy(at, OPENING, sizeof(OPENING) - 1);
        at += sizeof(OPENING) - 1;
        memcpy(at, rows + i * width, width);
        at += width;
        memcpy(at, CLOSING, sizeof(CLOSING) - 1);
        at = write_decimal(at + sizeof(CLOSING) - 1, i);
        *at++ = '}';
    }
    memcpy(at, tail.buf, tail.len);
done:
    PyBuffer_Release(&encoded);
    PyBuffer_Release(&head);
    PyBuffer_Release(&tail);
    return answer;
}

static PyMethodDef methods[] = {
    {"join_rows", join_rows, METH_VARARGS, join_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_base64_answer", "OpenAI's base64 answer, assembled.", -1, methods};

PyMODINIT_FUNC PyInit__base64_answer(void) { return PyModule_Create(&module); }
