/* The inference fast path's tie check (gumbel_topk.py, _keys_fall_strictly) as one C pass.
 *
 * On a CPU, gumbel_topk(sample=False) with no gradient wanted is torch.topk of K + 1 plus this
 * check: the reference's ranking keys (s - row max) / tau, over each row's first K + 1 sorted
 * values, must fall strictly. At B=64, K=32 the check is 2k floats; NumPy spends about 5 us of
 * per-op dispatch on it, this pass well under 1 us. keys_fall_strictly_numpy in gumbel_topk.py
 * is the reference it must equal, and the fallback where this module isn't built.
 *
 * The keys must round as the reference's do (IEEE single or double, to nearest), so no
 * value-changing float optimisation may be on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#ifdef __FAST_MATH__
#error "gumbel_topk_host.c must round as IEEE does: build it without -ffast-math"
#endif

/* values: [rows, width] contiguous, each row sorted descending (torch.topk's order).
 * A row's check covers its keys 0..k (k = k_rows[r], or kmax). k == width only when K = M
 * (topk of min(K + 1, M)): then the row's last key must still be above -inf. A NaN anywhere
 * fails a comparison. */
#define DEFINE_KEYS_FALL(T, NAME)                                                            \
    static int NAME(const T *values, Py_ssize_t rows, Py_ssize_t width, Py_ssize_t kmax,     \
                    double tau, const int64_t *k_rows)                                       \
    {                                                                                        \
        const T tau_t = (T)tau; /* tau rounded to the key dtype, as the reference divides */ \
        const int divide = tau != 1.0;                                                       \
        for (Py_ssize_t r = 0; r < rows; ++r) {                                              \
            const T *row = values + r * width;                                               \
            const Py_ssize_t k = k_rows ? (Py_ssize_t)k_rows[r] : kmax;                      \
            const Py_ssize_t last = k < width - 1 ? k : width - 1;                           \
            const T first = row[0];                                                          \
            T previous = first - first; /* NaN when the row max is +-inf or NaN */           \
            if (divide)                                                                      \
                previous = previous / tau_t;                                                 \
            for (Py_ssize_t i = 1; i <= last; ++i) {                                         \
                T key = row[i] - first;                                                      \
                if (divide)                                                                  \
                    key = key / tau_t;                                                       \
                if (!(key < previous))                                                       \
                    return 0;                                                                \
                previous = key;                                                              \
            }                                                                                \
            if (k == width && !(previous > -INFINITY))                                  \
                return 0;                                                                    \
        }                                                                                    \
        return 1;                                                                            \
    }

DEFINE_KEYS_FALL(float, keys_fall_f32)
DEFINE_KEYS_FALL(double, keys_fall_f64)

/* keys_fall_strictly(values_address, rows, width, kmax, tau, is_float64,
 *                    k_rows_address or None) -> bool
 * Addresses of CPU tensors the caller keeps alive: values [rows, width] float32 or float64,
 * k_rows [rows] int64, both contiguous. No checks beyond the argument types: private to
 * gumbel_topk.py, which calls it only on tensors it made. */
static PyObject *keys_fall_strictly(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "keys_fall_strictly takes 7 arguments, got %zd", nargs);
        return NULL;
    }
    const void *values = PyLong_AsVoidPtr(args[0]);
    const Py_ssize_t rows = PyLong_AsSsize_t(args[1]);
    const Py_ssize_t width = PyLong_AsSsize_t(args[2]);
    const Py_ssize_t kmax = PyLong_AsSsize_t(args[3]);
    const double tau = PyFloat_AsDouble(args[4]);
    const int is_float64 = PyObject_IsTrue(args[5]);
    const void *k_rows = args[6] == Py_None ? NULL : PyLong_AsVoidPtr(args[6]);
    if (PyErr_Occurred())
        return NULL;
    const int falls = is_float64
        ? keys_fall_f64(values, rows, width, kmax, tau, k_rows)
        : keys_fall_f32(values, rows, width, kmax, tau, k_rows);
    return PyBool_FromLong(falls);
}

static PyMethodDef methods[] = {
    {"keys_fall_strictly", (PyCFunction)(void (*)(void))keys_fall_strictly, METH_FASTCALL,
     "Whether the ranking keys of topk's sorted values fall strictly (see gumbel_topk.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gumbel_topk_host",
    "C pass of gumbel_topk's inference tie check.", -1, methods,
};

PyMODINIT_FUNC PyInit__gumbel_topk_host(void) { return PyModule_Create(&module); }
