"""What a job imports before it starts its work: every one of the DAG's ~110 jobs is a new Python
process, so a heavy module imported where it is not used costs the default DAG once per job (about
1 s each for scipy.stats and torch.distributed.tensor on a 2-core machine). Checked in a fresh
interpreter, as a job starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules_after(code: str, watch: tuple[str, ...]) -> list[str]:
    prog = f"import sys\n{code}\nprint(sorted(m for m in {watch!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        # a single-device GPT: built, run forward and backward (the perf, gpt_train and parity jobs)
        "import torch\nfrom steps.models.gpt import GPTConfig, GPTLMHeadModel\n"
        "m = GPTLMHeadModel(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16))\n"
        "x = torch.zeros(2, 8, dtype=torch.long)\nm(x, labels=x).loss.backward()",
        # a side-by-side ratio with its interval (every timed cell)
        "from steps.paired import compare\n"
        "r = compare(lambda: sum(range(100)), lambda: sum(range(200)), pairs=3, warmup=0)\n"
        "assert r.low <= r.ratio <= r.high",
        # a job's markdown table
        "import steps.tables",
    ],
    ids=["gpt", "paired", "tables"],
)
def test_a_job_does_not_import_what_it_does_not_use(code):
    assert modules_after(code, ("scipy.stats", "torch.distributed.tensor", "pandas", "sympy")) == []


def test_a_dtensor_still_takes_the_attention_path_for_sharded_linears():
    """The attention's fast path is for plain linears only: once torch.distributed.tensor is loaded
    (TP/FSDP load it), a DTensor weight is seen as one without attention.py importing it."""
    code = (
        "import torch\nfrom torch import nn\nfrom steps.models.attention import _plain_linear\n"
        "lin = nn.Linear(4, 4)\nassert _plain_linear(lin)\n"
        "import torch.distributed as dist\n"
        "from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh\n"
        "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
        "dist.init_process_group('fake', rank=0, world_size=2, store=FakeStore())\n"
        "w = distribute_tensor(lin.weight.detach(), init_device_mesh('cpu', (2,)), [Shard(0)])\n"
        "lin.weight = nn.Parameter(w)\nassert not _plain_linear(lin)"
    )
    assert modules_after(code, ("torch.distributed.tensor",)) == ["torch.distributed.tensor"]
