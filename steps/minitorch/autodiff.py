"""Reverse-mode automatic differentiation over the graph tensors record (miniTorch's `autodiff.py`).

Each non-leaf tensor remembers the Function that made it, that Function's saved context and its
inputs (`Tensor.history`). `backpropagate` walks the graph once in reverse topological order, so
every node's gradient is complete (all its consumers have contributed) before it is pushed to its
inputs.
"""

from __future__ import annotations


def topological_sort(root) -> list:
    """Every tensor `root` depends on that needs a gradient, `root` first and each node before its
    inputs. Iterative depth-first search (a deep graph - a long training sequence - would overflow
    Python's recursion limit); shared sub-expressions appear once."""
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node.unique_id in visited or node.is_constant():
            continue
        visited.add(node.unique_id)
        stack.append((node, True))
        for parent in node.parents():
            if parent.unique_id not in visited:
                stack.append((parent, False))
    return order[::-1]  # post-order reversed: consumers before producers


def backpropagate(root, d_root) -> None:
    """Accumulate d root / d leaf into every leaf's `.grad` (d_root: TensorData of root's shape)."""
    pending = {root.unique_id: d_root}
    for node in topological_sort(root):
        grad = pending.pop(node.unique_id)
        if node.is_leaf():
            node.accumulate_grad(grad)
            continue
        for parent, parent_grad in node.chain_rule(grad):
            if parent.is_constant():
                continue
            previous = pending.get(parent.unique_id)
            pending[parent.unique_id] = parent_grad if previous is None else node.backend_add(previous, parent_grad)
