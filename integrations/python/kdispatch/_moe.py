# SPDX-License-Identifier: Apache-2.0
"""The engines' fused-experts calls (kdispatch.sglang.fused_experts,
kdispatch.vllm.fused_experts) unpacked into torch.ops.kdispatch.fused_moe:
one place for the argument checks and conversions both shims share."""

_ACTIVATIONS = {"silu": 0, "gelu": 1}


def experts(who, hidden_states, w1, w2, topk_weights, topk_ids, *, activation="silu", routed_scaling_factor=None,
            inplace=False, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, block_shape=None, expert_map=None,
            per_channel_quant=False, a1_scale=None, a2_scale=None, unsupported=None):
    """The engine's fused-experts call on kdispatch's ops: torch.ops.kdispatch.
    fused_moe (bf16/fp16, block fp8 with ``block_shape=[128, 128]``), or
    fp8_w8a8 without a block shape, fused_moe_fp8_tensor (w1_scale/w2_scale
    [E]) or, with ``per_channel_quant``, fused_moe_fp8_channel
    (w1_scale/w2_scale [E, N] or SGLang's [E, N, 1]); a1_scale and a2_scale
    (static, one scale each) given together or not at all. `unsupported`:
    {argument name: given?}, the engine's arguments the ops do not compute
    (NotImplementedError naming the first one given). `expert_map`: [global
    E] int tensor of local ids (-1: not local), applied to topk_ids first
    (vLLM's expert parallelism). Returns the output, or hidden_states
    written in place when `inplace`."""
    import torch
    from . import torch_ops  # noqa: F401  registers torch.ops.kdispatch

    for name, given in (unsupported or {}).items():
        if given:
            raise NotImplementedError(f"{who}: {name} is not supported by kdispatch's fused_moe ops (bf16/fp16, "
                                      "block-fp8 128x128, per-tensor or per-channel fp8 experts)")
    scaled = use_fp8_w8a8 and block_shape is None  # SGLang's fp8_w8a8 without block_shape
    if use_fp8_w8a8 and not scaled and [int(b) for b in block_shape] != [128, 128]:
        raise NotImplementedError(f"{who}: use_fp8_w8a8 with a block_shape needs [128, 128] (block fp8), got "
                                  f"{block_shape!r}")
    if not use_fp8_w8a8 and (w1_scale is not None or w2_scale is not None or block_shape is not None or
                             a1_scale is not None or a2_scale is not None or per_channel_quant):
        raise ValueError(f"{who}: w1_scale, w2_scale, a1_scale, a2_scale, block_shape and per_channel_quant come "
                         f"with use_fp8_w8a8=True")
    if not scaled and (per_channel_quant or a1_scale is not None or a2_scale is not None):
        raise NotImplementedError(f"{who}: per_channel_quant, a1_scale and a2_scale go with fp8_w8a8 without a "
                                  f"block_shape (block fp8 quantises its activations per 1x128 group)")
    if (a1_scale is None) != (a2_scale is None):
        raise NotImplementedError(f"{who}: {'a2_scale' if a1_scale is not None else 'a1_scale'} is None while the "
                                  f"other is given: kdispatch's fp8 ops take static activation scales as a pair")
    if activation not in _ACTIVATIONS:
        raise NotImplementedError(f"{who}: activation {activation!r} (kdispatch's fused_moe computes "
                                  f"{', '.join(_ACTIVATIONS)})")
    ids = topk_ids
    if expert_map is not None:  # global ids -> this rank's (-1: another rank's expert, contributes nothing)
        ids = torch.where(ids >= 0, expert_map.to(ids.device)[ids.clamp(min=0).long()], -1)
    ids = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
    weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
    rsf = 1.0 if routed_scaling_factor is None else float(routed_scaling_factor)
    if scaled:
        def flat(s, rows, name):  # SGLang's [E, N, 1] per-channel scales as [E, N]; a 0-dim static scale as [1]
            if s is not None and rows == 1 and s.numel() != 1:
                raise NotImplementedError(f"{who}: {name}: one static scale (a tensor of 1 element), got shape "
                                          f"{tuple(s.shape)}: per-expert activation scales are not computed")
            return None if s is None else s.reshape(rows) if rows else s.reshape(s.shape[0], -1)

        op = torch.ops.kdispatch.fused_moe_fp8_channel if per_channel_quant else torch.ops.kdispatch.fused_moe_fp8_tensor
        out = op(hidden_states, w1, w2, weights.contiguous(), ids.contiguous(),
                 flat(w1_scale, None if per_channel_quant else -1, "w1_scale"),
                 flat(w2_scale, None if per_channel_quant else -1, "w2_scale"),
                 flat(a1_scale, 1, "a1_scale"), flat(a2_scale, 1, "a2_scale"), rsf, _ACTIVATIONS[activation])
    else:
        out = torch.ops.kdispatch.fused_moe(hidden_states, w1, w2, weights.contiguous(), ids.contiguous(), w1_scale,
                                            w2_scale, rsf, _ACTIVATIONS[activation])
    if inplace:
        hidden_states.copy_(out)
        return hidden_states
    return out
