"""The production torch APIs on our GPT, applied imperatively from the plan (torchtitan's layout):

parallelize.py  the one parallelize path, torchtitan's order: apply_tp (our GPT, HF Llama), apply_ep,
                apply_fsdp (FSDP2, HSDP when the data axis replicates; mixed precision and
                reshard_after_forward parameters) or apply_ddp; parallelize_gpt(model, mesh, plan)
                composes them for a cell. The scale simulator (steps/scale/fakeworld.py) calls them too
pipeline.py     pipeline_gpt(model, plan, rank, stages): one torch.distributed.pipelining stage
                and its GPipe / 1F1B schedule
engine.py       NativeEngine / PipelineEngine: the rank loop's interface (engines.py) around them
ep.py           NativeEPEngine: strategies ep and fsdp_ep (apply_ep, then FSDP2 or DDP)
"""
