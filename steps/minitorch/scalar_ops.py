"""The scalar functions every tensor op is built from (miniTorch's `operators.py`).

Plain `math` on Python floats: the same function is applied per element by the reference kernels
(Python), compiled by `numba.njit` for the `fast` kernels and by `numba.cuda.jit(device=True)` for
the `cuda` kernels, so each one stays a single expression with no Python objects.
"""

import math

EPS = 1e-300  # log's floor: log(0) would be -inf; float64's smallest normal is ~2.2e-308


def id_(x):
    return x


def neg(x):
    return -x


def add(x, y):
    return x + y


def mul(x, y):
    return x * y


def div(x, y):
    return x / y


def pow_(x, y):
    return x**y


def lt(x, y):
    return 1.0 if x < y else 0.0


def eq(x, y):
    return 1.0 if x == y else 0.0


def max_(x, y):
    return x if x > y else y


def exp(x):
    return math.exp(x)


def log(x):
    return math.log(x if x > EPS else EPS)


def inv(x):
    return 1.0 / x


def relu(x):
    return x if x > 0.0 else 0.0


def sigmoid(x):  # the numerically stable pair of forms
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def tanh(x):
    return math.tanh(x)


def erf(x):
    return math.erf(x)


# backward forms: d/dx f(x) * g, as one zip so the gradient costs one kernel
def log_back(x, g):
    return g / (x if x > EPS else EPS)


def inv_back(x, g):
    return -g / (x * x)


def relu_back(x, g):
    return g if x > 0.0 else 0.0


def erf_back(x, g):  # d erf(x)/dx = 2/sqrt(pi) exp(-x^2)
    return g * 1.1283791670955126 * math.exp(-x * x)


def sub(x, y):
    return x - y


def dec(x):
    return x - 1.0
