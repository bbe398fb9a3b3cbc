"""GPT written from scratch, one concept per file (read in this order):

softmax -> linear -> norms -> positional -> masking -> attention -> mlp -> gpt -> hf_convert -> generate

Each custom `torch.autograd.Function` has a NumPy twin; the default training path uses the
fused torch ops (nn.Linear, nn.LayerNorm, scaled_dot_product_attention) for speed, and
`gpt.use_custom_functions(model)` swaps the hand-written Functions in for the lesson/parity runs.
"""
