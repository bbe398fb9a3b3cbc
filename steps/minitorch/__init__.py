"""miniTorch: an autograd engine and its tensor kernels written from scratch (CMU 11-868, assignments 1-3).

scalar_ops.py         the scalar functions every op applies per element
tensor_data.py        strided storage: shape, strides, views without copies, broadcasting
reference_ops.py      the four kernel primitives (map, zip, reduce, matmul) defined: the reference backend
fast_ops.py           the same four with Numba njit(parallel=True)            (backend "fast")
fast_matmul.py        the fast backend's blocked matmul kernel
cuda_ops.py           the same four as CUDA kernels through numba.cuda         (backend "cuda")
tensor_ops.py         a backend: allocation and broadcasting around one kernel module
tensor_functions.py   every differentiable op, forward and backward, as calls of the four primitives
autodiff.py           topological_sort and backpropagate
tensor.py             the Tensor
nn.py, module.py, optim.py   losses and activations, modules, SGD/Adam
models.py             assignment 1's classifier and assignment 2's GPT-2 on the engine
stage.py              the stage's cells (ops, gpt); classify.py and translate.py its classifier and translate cells
"""

from . import backends
from .module import Dropout, Embedding, LayerNorm1d, Linear, Module, ModuleList, Parameter
from .nn import dropout, gelu, logsumexp, manual_seed, one_hot, softmax, softmax_loss
from .optim import SGD, Adam, AdamW
from .tensor import Tensor, ones, tensor, zeros
from .tensor_data import IndexingError

BACKENDS = backends.available()  # the backends this machine can run

__all__ = [
    "BACKENDS",
    "Adam",
    "AdamW",
    "Dropout",
    "Embedding",
    "IndexingError",
    "LayerNorm1d",
    "Linear",
    "Module",
    "ModuleList",
    "Parameter",
    "SGD",
    "Tensor",
    "dropout",
    "gelu",
    "logsumexp",
    "manual_seed",
    "one_hot",
    "ones",
    "softmax",
    "softmax_loss",
    "tensor",
    "zeros",
]


def __getattr__(name):  # `STAGE` imports the stage (torch, transformers) only when asked for
    if name == "STAGE":
        from .stage import STAGE

        return STAGE
    raise AttributeError(f"module 'steps.minitorch' has no attribute {name!r}")
