# SPDX-License-Identifier: Apache-2.0
"""vLLM's fused-experts call served by kdispatch (needs torch).

``fused_experts`` takes vLLM's ``fused_experts`` arguments
(``vllm.model_executor.layers.fused_moe.fused_moe``) as they are and runs
``torch.ops.kdispatch.fused_moe`` in SGLang's and vLLM's shared tensor
layout: ``w1`` [E, 2I, H] (gate rows first), ``w2`` [E, H, I], the router's
``topk_weights``/``topk_ids`` [M, top_k]. Expert parallelism as vLLM does
it: ``expert_map`` [global_num_experts] maps a global id to this rank's
local one (-1: another rank's expert, which contributes nothing here).
Block fp8: ``use_fp8_w8a8=True`` with ``block_shape=[128, 128]`` and the
block scales ``w1_scale``/``w2_scale``; the activations are quantised
inside the op per 1x128 group. fp8_w8a8 without a block shape (per tensor,
or ``per_channel_quant=True``; ``a1_scale``/``a2_scale`` both or neither):
``fused_moe_fp8_tensor`` / ``fused_moe_fp8_channel``. What the
ops do not compute raises NotImplementedError naming the argument.
"""


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation="silu",
                  apply_router_weight_on_input=False, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                  use_int4_w4a16=False, use_mxfp4_w4a4=False, per_channel_quant=False, global_num_experts=-1,
                  expert_map=None, w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None, a1_scale=None,
                  a2_scale=None, block_shape=None, allow_deep_gemm=False, allow_cutlass_block_scaled_grouped_gemm=False,
                  w1_bias=None, w2_bias=None):
    """vLLM's fused_experts through torch.ops.kdispatch.fused_moe (see the module's doc)."""
    from ._moe import experts

    del global_num_experts, allow_deep_gemm, allow_cutlass_block_scaled_grouped_gemm  # no effect on the result
    return experts("kdispatch.vllm.fused_experts", hidden_states, w1, w2, topk_weights, topk_ids,
                   activation=activation, inplace=inplace, use_fp8_w8a8=use_fp8_w8a8, w1_scale=w1_scale,
                   w2_scale=w2_scale, block_shape=block_shape, expert_map=expert_map,
                   per_channel_quant=per_channel_quant, a1_scale=a1_scale, a2_scale=a2_scale,
                   unsupported={"apply_router_weight_on_input": apply_router_weight_on_input,
                                "use_int8_w8a8": use_int8_w8a8, "use_int8_w8a16": use_int8_w8a16,
                                "use_int4_w4a16": use_int4_w4a16, "use_mxfp4_w4a4": use_mxfp4_w4a4,
                                "w1_zp": w1_zp is not None, "w2_zp": w2_zp is not None, "w1_bias": w1_bias is not None,
                                "w2_bias": w2_bias is not None})
