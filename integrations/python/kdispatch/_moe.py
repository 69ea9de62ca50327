# SPDX-License-Identifier: Apache-2.0
"""The engines' fused-experts calls (kdispatch.sglang.fused_experts,
kdispatch.vllm.fused_experts) unpacked into torch.ops.kdispatch.fused_moe:
one place for the argument checks and conversions both shims share."""

_ACTIVATIONS = {"silu": 0, "gelu": 1}


def experts(who, hidden_states, w1, w2, topk_weights, topk_ids, *, activation="silu", routed_scaling_factor=None,
            inplace=False, use_fp8_w8a8=False, w1_scale=None, w2_scale=None, block_shape=None, expert_map=None,
            unsupported=None):
    """torch.ops.kdispatch.fused_moe of an engine's call. `unsupported`:
    {argument name: given?}, the engine's arguments the op does not compute
    (NotImplementedError naming the first one given). `expert_map`: [global
    E] int tensor of local ids (-1: not local), applied to topk_ids first
    (vLLM's expert parallelism). Returns the output, or hidden_states
    written in place when `inplace`."""
    import torch
    from . import torch_ops  # noqa: F401  registers torch.ops.kdispatch

    for name, given in (unsupported or {}).items():
        if given:
            raise NotImplementedError(f"{who}: {name} is not supported by kdispatch's fused_moe (bf16/fp16 or "
                                      "block-fp8 128x128 experts)")
    if use_fp8_w8a8 and [int(b) for b in (block_shape or [])] != [128, 128]:
        raise NotImplementedError(f"{who}: use_fp8_w8a8 needs block_shape=[128, 128] (block fp8), got "
                                  f"{block_shape!r}")
    if not use_fp8_w8a8 and (w1_scale is not None or w2_scale is not None or block_shape is not None):
        raise ValueError(f"{who}: w1_scale, w2_scale and block_shape come with use_fp8_w8a8=True")
    if activation not in _ACTIVATIONS:
        raise NotImplementedError(f"{who}: activation {activation!r} (kdispatch's fused_moe computes "
                                  f"{', '.join(_ACTIVATIONS)})")
    ids = topk_ids
    if expert_map is not None:  # global ids -> this rank's (-1: another rank's expert, contributes nothing)
        ids = torch.where(ids >= 0, expert_map.to(ids.device)[ids.clamp(min=0).long()], -1)
    ids = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
    weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
    rsf = 1.0 if routed_scaling_factor is None else float(routed_scaling_factor)
    out = torch.ops.kdispatch.fused_moe(hidden_states, w1, w2, weights.contiguous(), ids.contiguous(), w1_scale,
                                        w2_scale, rsf, _ACTIVATIONS[activation])
    if inplace:
        hidden_states.copy_(out)
        return hidden_states
    return out
