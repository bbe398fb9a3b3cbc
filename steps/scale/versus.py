"""One plan, simulated beside its analytic numbers: what the fake-world step runs for it and which
formula each measured quantity is set against.

  FSDP2 / HSDP / DP / TP  as the plan says (DP: HSDP with a shard axis of one)
  ZeRO-2 (zero: 2, a dp axis)  FSDP2 over that axis with reshard_after_forward=False: each layer's
          bf16 parameters stay gathered from forward to backward, so one all-gather a step (ZeRO-2's
          communication). Its state is the fp32 shards plus those held bf16 copies (2Ψ), against the
          Playbook's 2Ψ + 14Ψ/N: FSDP2 keeps fp32 gradient shards (4Ψ/N) where the Playbook counts
          bf16 (2Ψ/N), so the simulated state is 2Ψ/N higher (the ratio says by how much); the
          predicted state (analytic.held_state, what `fits` uses) is 2Ψ + 16Ψ/N, equal to it
  SP (our GPT)  the sharding stage's SequenceParallel plan; saved bytes against Megatron's formula
          (every activation ÷ t) and against it plus the gathered copies torch keeps
          (analytic.sp_gathered_bytes_per_token): the latter exactly
  full AC (our GPT)  GPTConfig.checkpoint_activations: each block recomputed in backward; the
          forward keeps the blocks' inputs, against the analytic `kept` (the peak adds one layer
          rebuilt in backward, which the forward-side meter does not see)
  Llama AC (selective, full), ZeRO-1, PP  analytic only; a Llama plan is simulated without AC
  MoE (a named shape with experts)  our GPT with its MoE, balanced routing (steps/scale/balanced_moe.py); EP
          over the ep axis as the sharding stage's native fsdp_ep; simulated without a dp axis and
          without AC; its saved bytes against an estimate (analytic.moe_bytes_per_token), not an op count
"""

from __future__ import annotations

import math

from steps.analytic import activations, memory
from steps.analytic.comm import by_collective
from steps.models.shapes import Shape
from steps.scale.scale_plan import ScalePlan

DIRECT_MAX_WORLD = 256  # largest world whose full-depth model is built just to read its parameter bytes

GiB = 2**30


def simulable(shape: Shape, plan: ScalePlan) -> bool:
    moe_ok = not shape.experts or (plan.axis("dp") == 1 and plan.ac == "none")  # MoE: fsdp × ep, no AC
    return moe_ok and plan.axis("pp") == 1 and plan.zero_stage in (0, 2, 3) and (not plan.sp or shape.family == "gpt2")


def playbook_gap_terms(shape: Shape) -> dict[str, float]:
    """Where one simulated layer (no TP, no AC) parts from the Playbook's 34·d bytes per token
    (Korthikanti et al.: LayerNorm inputs 4d, the matmul inputs after them 4d, attention's q, k, v
    6d and output 2d, GeLU input 8d and output 8d, two dropout masks 2d; scores not stored with
    SDPA), term by term in bytes per token and layer: 34·d + their sum is the simulated layer."""
    d, kv, f, H = shape.d, shape.kv_dim, shape.ffn, shape.heads
    terms = {"no dropout masks": -2.0 * d, "SDPA logsumexp, fp32 per head": 4.0 * H}
    if shape.family == "gpt2":
        return terms | {"LayerNorm mean and rstd": 8.0}
    return terms | {
        "RMSNorm inputs in fp32 (HF upcasts)": 4.0 * d,
        "RMSNorm normalized bf16 copies (for the weight's grad)": 4.0 * d,
        "RMSNorm rstd, fp32": 8.0,
        "GQA: k and v of kv_heads": -4.0 * (d - kv),
        "SwiGLU: gate, SiLU, up, product of ffn vs GeLU's 2 × 4d": 8.0 * f - 16.0 * d,
    }


def setup(shape: Shape, plan: ScalePlan):
    """(mesh sizes, Recipe, the AC the simulation runs) for a simulable plan."""
    from steps.scale.recipe import Recipe

    sizes = {a: plan.axis(a) for a in ("dp", "fsdp", "ep", "tp")}
    if plan.zero_stage == 2:
        sizes = {"dp": 1, "fsdp": plan.axis("dp"), "tp": plan.axis("tp")}
    ac = "full" if plan.ac == "full" and shape.family == "gpt2" else "none"
    gpt = {"checkpoint_activations": True} if ac == "full" else {}
    return sizes, Recipe(reshard=plan.zero_stage != 2, sp=plan.sp, gpt=gpt), ac


def compare(shape: Shape, plan: ScalePlan) -> tuple[dict, str, str, str]:
    """(metrics, the memory and comm texts of the report, the simulated comm by axis) of one plan.
    Both sides of every ratio are the plan as simulated: with the AC it ran (`setup`), which for a
    Llama plan with AC is none, so the comm compared leaves out the recomputed TP collectives."""
    from steps.scale import fakeworld as fw  # torch: only where a cell simulates

    sizes, recipe, ac = setup(shape, plan)
    step = fw.simulate(shape, sizes, plan.micro_batch, plan.seq, recipe)
    # the full-depth model read directly checks the depth extrapolation; FSDP2 chunks every parameter
    # `world` ways on fake tensors, ~28 s at 1,024 on 2 cores, and the check does not depend on the world
    direct = fw.full_depth_params(shape, fw.mesh_for(sizes)) if plan.world <= DIRECT_MAX_WORLD else math.nan
    an_state = memory.state(shape, plan)["state"]
    held = memory.held_state(shape, plan)["state"]
    act = activations.activations(shape, plan, ac=ac)
    an_comm = sum(by_collective(shape, plan, ac=ac).values())
    state = step.state + (step.gathered if plan.zero_stage == 2 else 0.0)  # ZeRO-2: the held bf16 copies
    comm = sum(step.comm.values())
    m = {
        "state_gib_sim": state / GiB,
        "state_ratio": state / an_state,
        "state_ratio_held": state / held,
        "params_direct_ratio": direct / step.params,
        "saved_gib_sim": step.saved / GiB,
        "saved_ratio": step.saved / act["kept"],
        "saved_layer_ratio_playbook": step.saved_per_layer / act["korthikanti_per_layer"],
        "comm_gib_sim": comm / GiB,
        "comm_ratio": comm / an_comm if an_comm else math.nan,
    }
    label = "AC full, kept by the forward" if ac == "full" else "no AC"
    text = f"state {state / GiB:.2f} sim / {an_state / GiB:.2f} Playbook / {held / GiB:.2f} predicted GiB; "
    text += f"saved ({label}) {step.saved / GiB:.2f} / "
    text += f"{act['kept'] / GiB:.2f}"
    if act["sp_gathered"]:
        with_gathered = act["kept"] + act["sp_gathered"]
        m["saved_ratio_torch_sp"] = step.saved / with_gathered
        text += f" Megatron-SP, {with_gathered / GiB:.2f} with torch's gathered norm outputs"
    comm_text = f"{comm / GiB:.2f} sim / {an_comm / GiB:.2f} analytic ({label})"
    comm_sim = ", ".join(f"{k} {v / GiB:.2f}" for k, v in sorted(step.comm.items()) if v)
    return m, text, comm_text, comm_sim
