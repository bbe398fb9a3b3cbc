"""The `fast` backend's matmul kernel body (fast_ops.py compiles it serial and parallel, as its other
kernels): `prange` over (batch, block of BLOCK_I rows); per block the rows of a and panels of b
(BLOCK_K x BLOCK_J) are copied into contiguous buffers so the innermost loop (over j) is contiguous
and vectorised, and accumulates in a local (rows x N) tile written out once.

Self-contained (it calls no other kernel helper): Numba's disk cache checks this file's timestamp,
so editing it recompiles the kernel.
"""

from __future__ import annotations

import numpy as np
from numba import prange

BLOCK_I, BLOCK_K, BLOCK_J = 32, 64, 256  # matmul tile: rows of a, depth, columns of b


def blocked_matmul(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    """out[batch] = a[batch] @ b[batch] (a batch of 1 broadcast), added in k order as the reference does."""
    batches, rows, cols, depth = out_shape[0], out_shape[1], out_shape[2], a_shape[2]
    a_batch = a_strides[0] * (a_shape[0] > 1)  # a batch of 1 is shared by every output batch
    b_batch = b_strides[0] * (b_shape[0] > 1)
    row_blocks = (rows + BLOCK_I - 1) // BLOCK_I
    for task in prange(batches * row_blocks):
        batch, i0 = task // row_blocks, (task % row_blocks) * BLOCK_I
        ni = min(BLOCK_I, rows - i0)
        # a's rows i0 .. i0 + ni, contiguous: (ni, depth)
        a_rows = np.empty((ni, depth))
        for i in range(ni):
            p = batch * a_batch + (i0 + i) * a_strides[1]
            for k in range(depth):
                a_rows[i, k] = a[p + k * a_strides[2]]
        acc = np.zeros((ni, cols))  # out[batch, i0 .. i0 + ni, :]
        panel = np.empty((BLOCK_K, BLOCK_J))  # b[batch, k0 .. k0 + nk, j0 .. j0 + nj], contiguous
        for j0 in range(0, cols, BLOCK_J):
            nj = min(BLOCK_J, cols - j0)
            for k0 in range(0, depth, BLOCK_K):
                nk = min(BLOCK_K, depth - k0)
                for k in range(nk):
                    p = batch * b_batch + (k0 + k) * b_strides[1] + j0 * b_strides[2]
                    for j in range(nj):
                        panel[k, j] = b[p + j * b_strides[2]]
                for i in range(ni):
                    row, a_row = acc[i, j0 : j0 + nj], a_rows[i, k0 : k0 + nk]  # 1-D views: the j loop vectorises
                    for k in range(0, nk - nk % 4, 4):  # four rows of the panel per pass: one store per 4 products
                        a0, a1, a2, a3 = a_row[k], a_row[k + 1], a_row[k + 2], a_row[k + 3]
                        p0, p1, p2, p3 = panel[k], panel[k + 1], panel[k + 2], panel[k + 3]
                        for j in range(nj):  # added in k order, as the reference does: the same rounding
                            row[j] = row[j] + a0 * p0[j] + a1 * p1[j] + a2 * p2[j] + a3 * p3[j]
                    for k in range(nk - nk % 4, nk):
                        ak, pk = a_row[k], panel[k]
                        for j in range(nj):
                            row[j] += ak * pk[j]
        for i in range(ni):
            p = batch * out_strides[0] + (i0 + i) * out_strides[1]
            for j in range(cols):
                out[p + j * out_strides[2]] = acc[i, j]
