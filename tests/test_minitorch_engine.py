"""miniTorch's engine: strided storage, every op forward and backward against torch autograd in
float64 (hypothesis draws shapes, broadcasting included) at <= 1e-10, finite differences of the
engine itself, modules and optimizers against torch."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import steps.minitorch as mt
from steps.minitorch import autodiff
from steps.minitorch.models import DecoderLM, shifted_targets
from steps.minitorch.parity import OPS, check_op, op_parity, sample
from steps.minitorch.tensor_data import (
    IndexingError,
    TensorData,
    broadcast_index,
    index_to_position,
    shape_broadcast,
    to_index,
)

TOL = 1e-10
UNARY = [name for name, op in OPS.items() if op.arity == 1]
BINARY = [name for name, op in OPS.items() if op.arity == 2 and name != "matmul"]


# ---- strided storage ------------------------------------------------------------------------------
@given(array_shapes(min_dims=1, max_dims=4, max_side=5), st.data())
def test_to_index_and_position_enumerate_storage(shape, data):
    td = TensorData(np.arange(int(np.prod(shape)), dtype=np.float64), shape)
    ordinal = data.draw(st.integers(0, td.size - 1))
    index = np.zeros(len(shape), dtype=np.int64)
    to_index(ordinal, td.shape_array, index)
    assert index_to_position(index, td.strides_array) == ordinal  # contiguous: position == ordinal
    order = data.draw(st.permutations(range(len(shape))))
    permuted = td.permute(*order)
    assert permuted.storage is td.storage  # a view: no copy
    np.testing.assert_array_equal(permuted.to_numpy(), td.to_numpy().transpose(order))


def test_broadcast_index_and_shape():
    assert shape_broadcast((2, 1, 4), (3, 1)) == (2, 3, 4)
    assert shape_broadcast((), (5,)) == (5,)
    with pytest.raises(IndexingError, match="do not broadcast"):
        shape_broadcast((2, 3), (4,))
    out = np.zeros(2, dtype=np.int64)
    broadcast_index(np.array([1, 2, 3]), np.array([2, 3, 4]), np.array([1, 4]), out)
    assert out.tolist() == [0, 3]


def test_views_share_storage_and_refuse_what_they_cannot():
    x = mt.tensor(np.arange(12.0).reshape(3, 4))
    t = x.permute(1, 0)
    assert t.data.storage is x.data.storage and not t.data.is_contiguous()
    with pytest.raises(IndexingError, match="non-contiguous"):
        t.view(12)
    np.testing.assert_array_equal(t.contiguous().view(12).to_numpy(), np.arange(12.0).reshape(3, 4).T.reshape(-1))
    with pytest.raises(IndexingError, match="has 5 elements"):
        x.view(5)
    with pytest.raises(IndexingError, match="inner sizes"):
        x @ x


# ---- every op against torch -----------------------------------------------------------------------
def _check(name, shapes, seed):
    rng = np.random.default_rng(seed)
    errors = check_op(name, [sample(rng, s, OPS[name].domain) for s in shapes], seed=seed)
    assert max(errors.values()) <= TOL, (name, shapes, errors)


@pytest.mark.parametrize("name", UNARY)
@settings(max_examples=12, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=4), seed=st.integers(0, 2**16))
def test_unary_op_matches_torch(name, shape, seed):
    _check(name, [shape], seed)


@pytest.mark.parametrize("name", BINARY)
@settings(max_examples=12, deadline=None)
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4), seed=st.integers(0, 2**16)
)
def test_binary_op_broadcasts_like_torch(name, shapes, seed):
    _check(name, list(shapes.input_shapes), seed)


@settings(max_examples=20, deadline=None)
@given(
    batch=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3),
    mkn=st.tuples(*[st.integers(1, 5)] * 3),
    seed=st.integers(0, 2**16),
)
def test_matmul_batch_broadcast_matches_torch(batch, mkn, seed):
    m, k, n = mkn
    a_batch, b_batch = batch.input_shapes
    _check("matmul", [(*a_batch, m, k), (*b_batch, k, n)], seed)


def test_op_parity_table_of_the_stage():
    errors = op_parity("reference", seed=3)
    assert set(errors) == set(OPS) and max(errors.values()) <= TOL


# ---- the engine itself ----------------------------------------------------------------------------
def test_topological_sort_visits_a_shared_subexpression_once():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    shared = x * 3.0
    y = (shared + shared * shared).sum()
    order = autodiff.topological_sort(y)
    ids = [n.unique_id for n in order]
    assert len(ids) == len(set(ids)) and order[0] is y and order[-1] is x
    assert ids.index(shared.unique_id) > max(
        ids.index(p.unique_id) for p in order if any(q is shared for q in p.parents())
    )
    y.backward()
    np.testing.assert_allclose(x.grad.to_numpy(), 3.0 + 2 * 9.0 * np.array([1.0, 2.0]))  # d/dx (3x + 9x^2)


def test_gradients_match_central_finite_differences():
    rng = np.random.default_rng(0)
    a0, b0 = rng.uniform(0.5, 1.5, (3, 4)), rng.uniform(0.5, 1.5, (4,))

    def f(a, b):
        return (mt.softmax((a * b).tanh() @ mt.tensor(np.ones((4, 2))), -1).log() / (b + 1.0).sum()).sum()

    a, b = mt.tensor(a0, requires_grad=True), mt.tensor(b0, requires_grad=True)
    f(a, b).backward()
    for x0, grad, which in ((a0, a.grad.to_numpy(), 0), (b0, b.grad.to_numpy(), 1)):
        numeric = np.zeros_like(x0)
        for i in np.ndindex(x0.shape):
            step = np.zeros_like(x0)
            step[i] = 1e-6
            args = [a0, b0]
            plus, minus = list(args), list(args)
            plus[which], minus[which] = x0 + step, x0 - step
            numeric[i] = (f(*map(mt.tensor, plus)).item() - f(*map(mt.tensor, minus)).item()) / 2e-6
        np.testing.assert_allclose(grad, numeric, atol=1e-8)


def test_gradients_accumulate_and_backward_needs_a_scalar():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad.to_numpy(), [4.0, 6.0])
    with pytest.raises(IndexingError, match="scalar"):
        (x * x).backward()


def test_softmax_loss_and_one_hot():
    rng = np.random.default_rng(1)
    logits, targets = rng.normal(size=(6, 5)), rng.integers(0, 5, 6)
    ours = mt.softmax_loss(mt.tensor(logits), targets).to_numpy()
    theirs = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(targets), reduction="none")
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        mt.one_hot([7], 5)


def test_ids_and_indices_take_the_labs_own_tensors():
    """Class ids, token ids and dimensions given as miniTorch tensors work as NumPy arrays do; what
    cannot be an id fails with one line naming the argument."""
    rng = np.random.default_rng(4)
    logits, targets = mt.tensor(rng.normal(size=(6, 5))), rng.integers(0, 5, 6)
    expected = mt.softmax_loss(logits, targets).to_numpy()
    np.testing.assert_array_equal(mt.softmax_loss(logits, mt.tensor(targets)).to_numpy(), expected)
    np.testing.assert_array_equal(mt.softmax_loss(logits, torch.tensor(targets)).to_numpy(), expected)
    np.testing.assert_array_equal(mt.one_hot(mt.tensor([2, 0]), 3).to_numpy(), np.eye(3)[[2, 0]])
    emb, ids = mt.Embedding(7, 3), rng.integers(0, 7, (2, 4))
    np.testing.assert_array_equal(emb(mt.tensor(ids)).to_numpy(), emb(ids).to_numpy())
    np.testing.assert_array_equal(logits.sum(mt.tensor(1)).to_numpy(), logits.sum(1).to_numpy())
    np.testing.assert_array_equal(logits.permute(mt.tensor(1), 0).to_numpy(), logits.permute(1, 0).to_numpy())
    lm, idx = DecoderLM(11, 8, 1, 2, 4), rng.integers(0, 11, (2, 5))
    as_tensors = lm.loss(mt.tensor(idx), shifted_targets(mt.tensor(idx))).item()
    assert as_tensors == lm.loss(idx, shifted_targets(idx)).item()
    for bad, why in ((mt.tensor([1.5, 2.0]), "whole numbers"), ("a", "integer"), ([mt.tensor(1)], "integer")):
        with pytest.raises((TypeError, ValueError), match=f"^softmax_loss: targets: .*{why}") as err:
            mt.softmax_loss(mt.tensor(rng.normal(size=(2, 5))), bad)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match=r"^sum: dim: one integer, got shape \(2,\)"):
        logits.sum(mt.tensor([0, 1]))


# ---- modules and optimizers -----------------------------------------------------------------------
def _torch_layers(ours: mt.Linear, norm: mt.LayerNorm1d):
    lin = torch.nn.Linear(*ours.weights.value.shape).double()
    lin.weight.data = torch.tensor(ours.weights.value.to_numpy().T.copy())
    lin.bias.data = torch.tensor(ours.bias.value.to_numpy())
    ln = torch.nn.LayerNorm(norm.weights.value.shape[0]).double()
    return lin, ln


def test_linear_layernorm_embedding_match_torch():
    rng = np.random.default_rng(2)
    lin, norm, emb = mt.Linear(5, 3, rng=rng), mt.LayerNorm1d(3), mt.Embedding(7, 3, rng=rng)
    t_lin, t_norm = _torch_layers(lin, norm)
    t_emb = torch.nn.Embedding(7, 3).double()
    t_emb.weight.data = torch.tensor(emb.weights.value.to_numpy())
    x, ids = rng.normal(size=(2, 4, 5)), rng.integers(0, 7, (2, 4))
    ours = norm(lin(mt.tensor(x))) + emb(ids)
    ours.sum().backward()
    theirs = t_norm(t_lin(torch.tensor(x))) + t_emb(torch.tensor(ids))
    theirs.sum().backward()
    np.testing.assert_allclose(ours.to_numpy(), theirs.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(lin.weights.value.grad.to_numpy(), t_lin.weight.grad.numpy().T, atol=1e-12)
    np.testing.assert_allclose(emb.weights.value.grad.to_numpy(), t_emb.weight.grad.numpy(), atol=1e-12)
    names = [n for n, _ in mt.ModuleList([lin, norm]).named_parameters()]
    assert names == ["0.weights", "0.bias", "1.weights", "1.bias"]


@pytest.mark.parametrize("which", ["sgd", "adamw", "adam"])
def test_optimizers_follow_torch_for_ten_steps(which):
    rng = np.random.default_rng(3)
    lin, norm = mt.Linear(4, 2, rng=rng), mt.LayerNorm1d(2)
    t_lin, t_norm = _torch_layers(lin, norm)
    ours_params, theirs_params = lin.parameters() + norm.parameters(), [*t_lin.parameters(), *t_norm.parameters()]
    make = {
        "sgd": (lambda p: mt.SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        "adamw": (
            lambda p: mt.AdamW(p, lr=0.05, weight_decay=0.1),
            lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1),
        ),
        "adam": (
            lambda p: mt.Adam(p, lr=0.05, weight_decay=0.1),
            lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1),
        ),
    }[which]
    ours_opt, theirs_opt = make[0](ours_params), make[1](theirs_params)
    x, y = rng.normal(size=(8, 4)), rng.integers(0, 2, 8)
    for _ in range(10):
        ours_opt.zero_grad()
        mt.softmax_loss(norm(lin(mt.tensor(x))), y).mean().backward()
        ours_opt.step()
        theirs_opt.zero_grad()
        torch.nn.functional.cross_entropy(t_norm(t_lin(torch.tensor(x))), torch.tensor(y)).backward()
        theirs_opt.step()
    np.testing.assert_allclose(lin.weights.value.to_numpy(), t_lin.weight.detach().numpy().T, atol=1e-12)
    np.testing.assert_allclose(norm.bias.value.to_numpy(), t_norm.bias.detach().numpy(), atol=1e-12)


def test_dropout_keeps_the_expectation_and_is_off_in_eval():
    mt.manual_seed(0)
    drop = mt.Dropout(0.25)
    x = mt.ones((200, 50))
    kept = drop(x).to_numpy()
    assert set(np.unique(kept)) <= {0.0, 1 / 0.75} and abs(kept.mean() - 1.0) < 0.03
    assert drop.eval()(x) is x
