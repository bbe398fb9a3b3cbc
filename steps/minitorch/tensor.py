"""The Tensor: TensorData + the backend whose kernels compute it + how it was made (miniTorch's
`tensor.py`). Every method is one Function of tensor_functions.py, or a few of them.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from . import autodiff
from . import tensor_functions as F
from .tensor_data import IndexingError, TensorData
from .tensor_ops import TensorBackend, get_backend

_ids = itertools.count()


class Tensor:
    __hash__ = object.__hash__  # __eq__ below is elementwise

    def __init__(self, data: TensorData, backend: TensorBackend, history=None, requires_grad: bool = False):
        self.data = data
        self.backend = backend
        self.history = history  # (Function, Context, inputs) or None for a leaf / constant
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        self.unique_id = next(_ids)

    # ---- shape and values ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def dims(self) -> int:
        return self.data.dims

    def to_numpy(self) -> np.ndarray:
        return self.data.to_numpy()

    def item(self) -> float:
        if self.size != 1:
            raise IndexingError(f"item() of a tensor of {self.size} elements (shape {self.shape})")
        return float(self.to_numpy().reshape(-1)[0])

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({self.to_numpy()!r}, backend={self.backend.name!r}{grad})"

    def _like(self, value) -> Tensor:
        """A constant on this tensor's backend: a Python number becomes a 0-d tensor."""
        if isinstance(value, Tensor):
            return value
        return Tensor(TensorData.from_numpy(np.asarray(value, dtype=np.float64)), self.backend)

    def detach(self) -> Tensor:
        return Tensor(self.data, self.backend)

    # ---- autodiff hooks (autodiff.py) ----------------------------------------------------------
    def is_leaf(self) -> bool:
        return self.history is None

    def is_constant(self) -> bool:
        return not self.requires_grad

    def parents(self) -> Sequence[Tensor]:
        return () if self.history is None else self.history[2]

    def chain_rule(self, grad: TensorData):
        fn, ctx, inputs = self.history
        grads = fn.backward(ctx, grad)
        for t, g in zip(inputs, grads):
            if g is not None:
                yield t, F.sum_to(self.backend, g, t.shape)

    def backend_add(self, a: TensorData, b: TensorData) -> TensorData:
        return self.backend.zip(F.S.add, a, b)

    def accumulate_grad(self, grad: TensorData) -> None:
        grad = self.backend.contiguous(grad)
        if self.grad is None:
            self.grad = Tensor(grad, self.backend)
        else:
            self.grad = Tensor(self.backend_add(self.grad.data, grad), self.backend)

    def backward(self, grad: Tensor | None = None) -> None:
        if grad is None:
            if self.size != 1:
                raise IndexingError(f"backward() without a gradient needs a scalar, got shape {self.shape}")
            grad = self._like(np.ones(self.shape))
        autodiff.backpropagate(self, grad.data)

    def zero_grad_(self) -> None:
        self.grad = None

    # ---- arithmetic ----------------------------------------------------------------------------
    def __add__(self, other):
        return F.Add.apply(self, self._like(other))

    def __radd__(self, other):
        return F.Add.apply(self._like(other), self)

    def __sub__(self, other):
        return F.Sub.apply(self, self._like(other))

    def __rsub__(self, other):
        return F.Sub.apply(self._like(other), self)

    def __mul__(self, other):
        return F.Mul.apply(self, self._like(other))

    def __rmul__(self, other):
        return F.Mul.apply(self._like(other), self)

    def __truediv__(self, other):
        return F.Div.apply(self, self._like(other))

    def __rtruediv__(self, other):
        return F.Div.apply(self._like(other), self)

    def __neg__(self):
        return F.Neg.apply(self)

    def __pow__(self, exponent: float):
        if isinstance(exponent, Tensor):
            raise TypeError("tensor ** tensor is not supported: the exponent must be a number")
        return F.Pow.apply(self, self._like(float(exponent)))

    def __matmul__(self, other):
        return F.MatMul.apply(self, other)

    def __lt__(self, other):
        return F.LT.apply(self, self._like(other))

    def __gt__(self, other):
        return F.LT.apply(self._like(other), self)

    def __eq__(self, other):
        return F.EQ.apply(self, self._like(other))

    # ---- elementwise functions -----------------------------------------------------------------
    def exp(self):
        return F.Exp.apply(self)

    def log(self):
        return F.Log.apply(self)

    def relu(self):
        return F.ReLU.apply(self)

    def sigmoid(self):
        return F.Sigmoid.apply(self)

    def tanh(self):
        return F.Tanh.apply(self)

    def erf(self):
        return F.Erf.apply(self)

    def inv(self):
        return F.Inv.apply(self)

    # ---- reductions (dim=None: over every element, a 0-d result) -------------------------------
    def _dim(self, dim: int, op: str) -> int:
        dim = as_index(dim, f"{op}: dim")
        if not -self.dims <= dim < self.dims:
            raise IndexingError(f"dimension {dim} out of range for a {self.dims}-dimensional tensor")
        return dim % self.dims

    def sum(self, dim: int | None = None, keepdim: bool = False):
        if dim is None:
            return F.Sum.apply(self.contiguous().view(self.size), dim=0).view()
        dim = self._dim(dim, "sum")
        out = F.Sum.apply(self, dim=dim)
        return out if keepdim else out._squeeze(dim)

    def mean(self, dim: int | None = None, keepdim: bool = False):
        count = self.size if dim is None else self.shape[self._dim(dim, "mean")]
        return self.sum(dim, keepdim) * (1.0 / count)

    def max(self, dim: int, keepdim: bool = False):
        dim = self._dim(dim, "max")
        out = F.Max.apply(self, dim=dim)
        return out if keepdim else out._squeeze(dim)

    def _squeeze(self, dim: int):
        return self.view(*(s for k, s in enumerate(self.shape) if k != dim))

    # ---- views ---------------------------------------------------------------------------------
    def view(self, *shape: int):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(as_index(s, "view: shape") for s in shape)
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            shape = tuple(self.size // max(known, 1) if s == -1 else s for s in shape)
        return F.View.apply(self, shape=tuple(shape))

    def permute(self, *order: int):
        return F.Permute.apply(self, order=tuple(as_index(o, "permute: order") % self.dims for o in order))

    def transpose(self, d0: int = -2, d1: int = -1):
        order = list(range(self.dims))
        d0, d1 = as_index(d0, "transpose: d0"), as_index(d1, "transpose: d1")
        order[d0], order[d1] = order[d1], order[d0]
        return self.permute(*order)

    def contiguous(self):
        return self if self.data.is_contiguous() else F.Copy.apply(self)


IDS = "integer ids (a miniTorch Tensor, a NumPy array or torch tensor, a list or a number)"


def as_ids(value, what: str) -> np.ndarray:
    """Whole-number ids (class ids, token ids, positions) as an int64 array, taken from a miniTorch
    Tensor as from a NumPy array, a torch tensor, nested lists or a number. `what` names the argument
    ("softmax_loss: targets"): anything else fails with one line that starts with it."""
    if isinstance(value, Tensor):
        value = value.to_numpy()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists, an object NumPy cannot hold
        raise TypeError(f"{what}: expected {IDS}, got {type(value).__name__} ({exc})") from None
    if array.dtype.kind not in "biuf":
        held = f" of {type(array.flat[0]).__name__}" if array.dtype == object and array.size else ""
        raise TypeError(f"{what}: expected {IDS}, got {type(value).__name__}{held}")
    if array.dtype.kind == "f":
        bad = array[~(np.isfinite(array) & (array == np.round(array)))]
        if bad.size:
            raise ValueError(f"{what}: ids must be whole numbers, got {bad.flat[0]!r}")
    return array.astype(np.int64)


def as_index(value, what: str) -> int:
    """One integer (a dimension, a size, a position): an int as it is, else as_ids of one element."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    ids = as_ids(value, what)
    if ids.size != 1:
        raise TypeError(f"{what}: one integer, got shape {ids.shape}")
    return int(ids.reshape(-1)[0])


def _backend(backend) -> TensorBackend:
    return backend if isinstance(backend, TensorBackend) else get_backend(backend)


def tensor(data, requires_grad: bool = False, backend="reference") -> Tensor:
    """A leaf tensor from nested lists, a number or a NumPy array (copied, as float64)."""
    array = np.asarray(data.to_numpy() if isinstance(data, Tensor) else data, dtype=np.float64)
    return Tensor(TensorData.from_numpy(array), _backend(backend), requires_grad=requires_grad)


def zeros(shape, backend="reference", requires_grad: bool = False) -> Tensor:
    return tensor(np.zeros(shape), requires_grad, backend)


def ones(shape, backend="reference", requires_grad: bool = False) -> Tensor:
    return tensor(np.ones(shape), requires_grad, backend)
