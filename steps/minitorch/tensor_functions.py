"""Every differentiable op: forward and backward as calls of the four primitives (miniTorch's
`tensor_functions.py`). Forward and backward receive and return TensorData; `Function.apply` wraps
the result in a Tensor that remembers how it was made.

Backward returns one gradient per input in the shape of the op's output (broadcast inputs are
summed back to their own shape by `sum_to` in the chain rule) or None where the input has none.
"""

from __future__ import annotations

from . import scalar_ops as S
from .tensor_data import TensorData


class Context:
    def __init__(self, backend):
        self.backend = backend
        self.saved: tuple = ()

    def save(self, *values) -> None:
        self.saved = values


class Function:
    @classmethod
    def apply(cls, *inputs, **kwargs):
        """The op on Tensors: its output is made by the inputs' own class (tensor.py's Tensor, whose
        methods call `apply`), so this module never imports tensor.py, which imports it."""
        backend = inputs[0].backend
        ctx = Context(backend)
        data = cls.forward(ctx, *(t.data for t in inputs), **kwargs)
        needs_grad = any(t.requires_grad for t in inputs)
        make = type(inputs[0])
        return make(data, backend, history=(cls, ctx, inputs) if needs_grad else None, requires_grad=needs_grad)


def sum_to(backend, grad: TensorData, shape) -> TensorData:
    """Sum a gradient of a broadcast shape back to `shape` (the adjoint of broadcasting)."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.dims - len(shape)
    for dim in range(grad.dims):
        if dim < extra or (shape[dim - extra] == 1 and grad.shape[dim] != 1):
            grad = backend.reduce(S.add, 0.0, grad, dim)
    return backend.contiguous(grad).view(*shape)


# ---- unary: map forward, zip (or map) backward -------------------------------------------------
class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return ctx.backend.map(S.neg, a)

    @staticmethod
    def backward(ctx, g):
        return (ctx.backend.map(S.neg, g),)


class Exp(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.backend.map(S.exp, a)
        ctx.save(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return (ctx.backend.zip(S.mul, g, ctx.saved[0]),)


def _unary(name: str, forward_fn, backward_fn) -> type:
    """A unary op whose derivative is one zip of (input, grad): d = backward_fn(a, g)."""

    def forward(ctx, a):
        ctx.save(a)
        return ctx.backend.map(forward_fn, a)

    def backward(ctx, g):
        return (ctx.backend.zip(backward_fn, ctx.saved[0], g),)

    return type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


Log = _unary("Log", S.log, S.log_back)
Inv = _unary("Inv", S.inv, S.inv_back)
ReLU = _unary("ReLU", S.relu, S.relu_back)
Erf = _unary("Erf", S.erf, S.erf_back)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.backend.map(S.sigmoid, a)
        ctx.save(out)
        return out

    @staticmethod
    def backward(ctx, g):  # g * s * (1 - s) = g * (s - s*s)
        b, s = ctx.backend, ctx.saved[0]
        return (b.zip(S.mul, g, b.zip(S.sub, s, b.zip(S.mul, s, s))),)


class Tanh(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.backend.map(S.tanh, a)
        ctx.save(out)
        return out

    @staticmethod
    def backward(ctx, g):  # g * (1 - t*t) = g - g*t*t
        b, t = ctx.backend, ctx.saved[0]
        return (b.zip(S.sub, g, b.zip(S.mul, g, b.zip(S.mul, t, t))),)


class Copy(Function):  # a contiguous copy (also what `.contiguous()` records)
    @staticmethod
    def forward(ctx, a):
        return ctx.backend.map(S.id_, a)

    @staticmethod
    def backward(ctx, g):
        return (g,)


# ---- binary: zip forward and backward ----------------------------------------------------------
class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        return ctx.backend.zip(S.add, a, b)

    @staticmethod
    def backward(ctx, g):
        return g, g


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        return ctx.backend.zip(S.sub, a, b)

    @staticmethod
    def backward(ctx, g):
        return g, ctx.backend.map(S.neg, g)


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a, b)
        return ctx.backend.zip(S.mul, a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        return ctx.backend.zip(S.mul, g, b), ctx.backend.zip(S.mul, g, a)


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        out = ctx.backend.zip(S.div, a, b)
        ctx.save(b, out)
        return out

    @staticmethod
    def backward(ctx, g):  # d(a/b) = g/b, -g * (a/b) / b
        be, (b, out) = ctx.backend, ctx.saved
        g_over_b = be.zip(S.div, g, b)
        return g_over_b, be.map(S.neg, be.zip(S.mul, g_over_b, out))


class Pow(Function):  # a ** c, c a constant (a 0-d tensor); no gradient for c
    @staticmethod
    def forward(ctx, a, c):
        ctx.save(a, c)
        return ctx.backend.zip(S.pow_, a, c)

    @staticmethod
    def backward(ctx, g):  # g * c * a ** (c - 1)
        be, (a, c) = ctx.backend, ctx.saved
        c_minus_1 = be.map(S.dec, c)
        return be.zip(S.mul, g, be.zip(S.mul, c, be.zip(S.pow_, a, c_minus_1))), None


def _comparison(name: str, fn) -> type:
    """a < b, a == b: 1.0 or 0.0 per element, no gradient for either input."""

    def forward(ctx, a, b):
        return ctx.backend.zip(fn, a, b)

    def backward(ctx, g):
        return None, None

    return type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


LT = _comparison("LT", S.lt)
EQ = _comparison("EQ", S.eq)


# ---- reductions ---------------------------------------------------------------------------------
class Sum(Function):
    @staticmethod
    def forward(ctx, a, dim: int):
        ctx.save(a.shape)
        return ctx.backend.reduce(S.add, 0.0, a, dim)

    @staticmethod
    def backward(ctx, g):  # every element of the row gets the row's gradient
        return (ctx.backend.map(S.id_, g, ctx.saved[0]),)


class Max(Function):
    @staticmethod
    def forward(ctx, a, dim: int):
        out = ctx.backend.reduce(S.max_, float("-inf"), a, dim)
        ctx.save(a, out)
        return out

    @staticmethod
    def backward(ctx, g):  # to the arg max (to every tied maximum: torch picks one of them)
        be, (a, out) = ctx.backend, ctx.saved
        return (be.zip(S.mul, be.zip(S.eq, a, out), g),)


# ---- views: the same storage, other shape/strides -----------------------------------------------
class Permute(Function):
    @staticmethod
    def forward(ctx, a, order: tuple):
        ctx.save(order)
        return a.permute(*order)

    @staticmethod
    def backward(ctx, g):
        order = ctx.saved[0]
        inverse = sorted(range(len(order)), key=order.__getitem__)
        return (g.permute(*inverse),)


class View(Function):
    @staticmethod
    def forward(ctx, a, shape: tuple):
        ctx.save(a.shape)
        return a.view(*shape)

    @staticmethod
    def backward(ctx, g):
        return (ctx.backend.contiguous(g).view(*ctx.saved[0]),)


# ---- matmul -------------------------------------------------------------------------------------
def _transpose(x: TensorData) -> TensorData:
    order = list(range(x.dims))
    order[-2], order[-1] = order[-1], order[-2]
    return x.permute(*order)


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a, b)
        return ctx.backend.matmul(a, b)

    @staticmethod
    def backward(ctx, g):  # dA = g @ B^T, dB = A^T @ g (batch broadcast summed back by sum_to)
        be, (a, b) = ctx.backend, ctx.saved
        return be.matmul(g, _transpose(b)), be.matmul(_transpose(a), g)
