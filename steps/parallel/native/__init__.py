"""The production torch APIs on our GPT, applied imperatively from the plan (torchtitan's layout):

parallelize.py  parallelize_gpt(model, mesh, plan): apply_tp, then apply_fsdp (FSDP2, HSDP when
                the data axis replicates) or apply_ddp — torchtitan's parallelize_llama order
pipeline.py     pipeline_gpt(model, plan, rank, stages): one torch.distributed.pipelining stage
                and its GPipe / 1F1B schedule
engine.py       NativeEngine / PipelineEngine: the rank loop's interface (engines.py) around them
"""
