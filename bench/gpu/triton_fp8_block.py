# SPDX-License-Identifier: Apache-2.0
"""A Triton peer of SGLang's w8a8 block-fp8 GEMM (DeepSeek-V3 style scaling),
written for kdispatch's benchmarks; it follows the public description of
SGLang's `w8a8_block_fp8_matmul` (python/sglang/srt/layers/quantization/
fp8_kernel.py) and looks its tile configuration up in SGLang's committed
per-(N, K, device) JSON files by the same nearest-batch rule.

  C[M, N] (bf16) = sum over K groups g of  As[:, g] * Bs[n // 128, g]
                                          * (A[:, g*128:(g+1)*128] . B[:, g*128:(g+1)*128]^T)

  A  [M, K]  fp8 e4m3fn, row-major (activations)
  B  [N, K]  fp8 e4m3fn, row-major (nn.Linear weight layout)
  As [M, ceil(K/128)] fp32, any strides (kdispatch keeps it M-major: pass
     sa_kd.t() of a contiguous [ceil(K/128), M] tensor)
  Bs [ceil(N/128), ceil(K/128)] fp32, one scale per 128 x 128 block of B

fp32 accumulation: each BLOCK_SIZE_K step (one 128-wide K group, or a part of
one) is a tl.dot into an fp32 partial that is scaled by a_s[:, None] *
b_s[None, :] before it is added. Tails: rows and columns past M / N wrap
(modulo) on the loads, so every lane reads a valid address, and the store is
masked in M and N; the last K block is masked (zeros) when K is not a multiple
of BLOCK_SIZE_K and uses its own group's scale.

  python3 bench/gpu/triton_fp8_block.py [CONFIGS_DIR]
runs the self-check (exits 0 with a message where CUDA or Triton is missing).
"""
import json
import os
import sys

try:
    import triton
    import triton.language as tl
    TRITON_ERROR = None
except Exception as _e:  # noqa: BLE001  (ImportError, or a broken install)
    triton = None
    tl = None
    TRITON_ERROR = f"{type(_e).__name__}: {_e}"

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIGS_DIR = os.path.join(HERE, "..", "..", "..", "shared", "data", "sglang-configs", "quantization")

GROUP = 128  # the quantisation group: 1 x 128 for A, 128 x 128 for B
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# SGLang's fallback when no file exists for (N, K, device)
DEFAULT_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": GROUP, "BLOCK_SIZE_K": GROUP, "GROUP_SIZE_M": 32,
                  "num_warps": 4, "num_stages": 3}


if triton is not None:

    @triton.jit
    def _block_fp8_gemm(
        a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr,
        M, N, K,
        group_n, group_k,
        stride_am, stride_ak,
        stride_bn, stride_bk,
        stride_cm, stride_cn,
        stride_as_m, stride_as_k,
        stride_bs_n, stride_bs_k,
        BLOCK_SIZE_M: tl.constexpr,
        BLOCK_SIZE_N: tl.constexpr,
        BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        EVEN_K: tl.constexpr,
    ):
        # program id -> (tile row, tile column), GROUP_SIZE_M tile rows at a
        # time so that neighbouring programs share columns of B in L2
        pid = tl.program_id(axis=0)
        tiles_m = tl.cdiv(M, BLOCK_SIZE_M)
        tiles_n = tl.cdiv(N, BLOCK_SIZE_N)
        tiles_per_group = GROUP_SIZE_M * tiles_n
        group = pid // tiles_per_group
        first_m = group * GROUP_SIZE_M
        rows_in_group = min(tiles_m - first_m, GROUP_SIZE_M)
        in_group = pid % tiles_per_group
        tile_m = first_m + in_group % rows_in_group
        tile_n = in_group // rows_in_group

        rows = tile_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        cols = tile_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        rows_ld = rows % M  # M / N tails: wrap for the loads, mask the store
        cols_ld = cols % N
        ks = tl.arange(0, BLOCK_SIZE_K)

        a_tile = a_ptr + rows_ld[:, None] * stride_am + ks[None, :] * stride_ak  # [BM, BK]
        b_tile = b_ptr + ks[:, None] * stride_bk + cols_ld[None, :] * stride_bn  # [BK, BN]: B^T
        a_scale = as_ptr + rows_ld * stride_as_m  # [BM]
        b_scale = bs_ptr + (cols_ld // group_n) * stride_bs_n  # [BN]

        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            k0 = kb * BLOCK_SIZE_K
            if EVEN_K:
                a = tl.load(a_tile)
                b = tl.load(b_tile)
            else:
                k_left = K - k0
                a = tl.load(a_tile, mask=ks[None, :] < k_left, other=0.0)
                b = tl.load(b_tile, mask=ks[:, None] < k_left, other=0.0)
            g = k0 // group_k
            s_a = tl.load(a_scale + g * stride_as_k)
            s_b = tl.load(b_scale + g * stride_bs_k)
            part = tl.dot(a, b)  # fp8 x fp8 -> fp32
            acc += part * s_a[:, None] * s_b[None, :]
            a_tile += BLOCK_SIZE_K * stride_ak
            b_tile += BLOCK_SIZE_K * stride_bk

        c = acc.to(c_ptr.dtype.element_ty)
        c_tile = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
        tl.store(c_tile, c, mask=(rows[:, None] < M) & (cols[None, :] < N))


def sglang_device_name(torch=None):
    """torch.cuda.get_device_name() with spaces as '_', as SGLang names its files."""
    if torch is None:
        import torch
    return torch.cuda.get_device_name().replace(" ", "_")


def config_file_name(N, K, device_name, block_n=GROUP, block_k=GROUP):
    return f"N={N},K={K},device_name={device_name},dtype=fp8_w8a8,block_shape=[{block_n}, {block_k}].json"


def nearest_batch_key(keys, M):
    """SGLang's rule: the batch size nearest to M, the smaller on a tie."""
    return min(sorted(int(k) for k in keys), key=lambda x: abs(x - M))


def _lookup(configs_dir, N, K, M, device_name):
    """(config, path, key) or (None, reason, None)."""
    name = config_file_name(N, K, device_name)
    path = os.path.join(configs_dir, name)
    if not os.path.isdir(configs_dir):
        return None, f"no SGLang configs folder {configs_dir}", None
    if not os.path.isfile(path):
        return None, f"no SGLang config file {name} in {configs_dir}", None
    with open(path) as f:
        table = {int(k): v for k, v in json.load(f).items()}
    if not table:
        return None, f"SGLang config file {path} is empty", None
    key = nearest_batch_key(table, M)
    return dict(table[key]), path, key


def load_sglang_config(configs_dir, N, K, M, device_name="NVIDIA_H200"):
    """SGLang's tuned config for (N, K) on device_name at batch M: reads
    {configs_dir}/N={N},K={K},device_name={device_name},dtype=fp8_w8a8,block_shape=[128, 128].json
    and picks the entry whose batch key is nearest to M (ties: the smaller key).
    device_name None: this machine's, as SGLang names it. Returns
    (config_dict, path), or (None, reason) where there is no file."""
    if device_name is None:
        device_name = sglang_device_name()
    cfg, path_or_reason, _ = _lookup(configs_dir, N, K, M, device_name)
    return cfg, path_or_reason


def make_block_fp8_peer(configs_dir, N, K, M, out, device_name=None):
    """(fn, description): fn(a8 [M, K], b8 [N, K], sa_mk [M, K/128] any strides,
    sb [N/128, K/128]) launches the kernel with SGLang's config for (N, K) at
    batch M (its default config where no file exists) into out (bf16 [M, N])
    and returns out. device_name None: this machine's name as SGLang spells it.
    Raises where Triton is missing or the config cannot run here."""
    if triton is None:
        raise RuntimeError(f"triton unavailable ({TRITON_ERROR})")
    if device_name is None:
        device_name = sglang_device_name()
    cfg, path_or_reason, key = _lookup(configs_dir, N, K, M, device_name)
    if cfg is None:
        cfg = dict(DEFAULT_CONFIG)
        if os.path.isdir(configs_dir):
            source = f"default config (no SGLang file for N={N},K={K},{device_name})"
        else:
            source = f"default config ({path_or_reason})"
    else:
        source = f"{os.path.basename(path_or_reason)} key {key}"
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config from {source} lacks {missing}")
    meta = {k: int(cfg[k]) for k in CONFIG_KEYS}
    if GROUP % meta["BLOCK_SIZE_K"] != 0:
        raise ValueError(f"BLOCK_SIZE_K {meta['BLOCK_SIZE_K']} does not divide the group {GROUP} ({source})")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"out is {tuple(out.shape)}, not ({M}, {N})")
    kb, nb = (K + GROUP - 1) // GROUP, (N + GROUP - 1) // GROUP
    even_k = K % meta["BLOCK_SIZE_K"] == 0
    grid = (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)
    kernel = _block_fp8_gemm[grid]
    desc = ("BM{BLOCK_SIZE_M} BN{BLOCK_SIZE_N} BK{BLOCK_SIZE_K} G{GROUP_SIZE_M} w{num_warps} s{num_stages}"
            .format(**meta) + f", {source}")

    def fn(a8, b8, sa_mk, sb):
        if (tuple(a8.shape) != (M, K) or tuple(b8.shape) != (N, K) or tuple(sa_mk.shape) != (M, kb)
                or tuple(sb.shape) != (nb, kb)):
            raise ValueError(f"shapes a {tuple(a8.shape)} b {tuple(b8.shape)} sa {tuple(sa_mk.shape)} "
                             f"sb {tuple(sb.shape)} for M {M} N {N} K {K}")
        kernel(a8, b8, out, sa_mk, sb,
               M, N, K, GROUP, GROUP,
               a8.stride(0), a8.stride(1),
               b8.stride(0), b8.stride(1),
               out.stride(0), out.stride(1),
               sa_mk.stride(0), sa_mk.stride(1),
               sb.stride(0), sb.stride(1),
               EVEN_K=even_k, **meta)
        return out

    return fn, desc


# ---- self-check ------------------------------------------------------------

def _group_quant(torch, x):
    """x [R, K] -> (q e4m3fn [R, K], s fp32 [R, ceil(K/128)]), one scale per 1 x 128 group."""
    R, K = x.shape
    kb = (K + GROUP - 1) // GROUP
    pad = torch.zeros(R, kb * GROUP, device=x.device)
    pad[:, :K] = x.float()
    g = pad.view(R, kb, GROUP)
    s = g.abs().amax(dim=2).clamp(min=1e-10) / 448.0
    q = (g / s[:, :, None]).clamp(-448, 448).view(R, kb * GROUP)[:, :K].to(torch.float8_e4m3fn)
    return q.contiguous(), s


def _block_quant(torch, w):
    """w [N, K] -> (q e4m3fn [N, K], s fp32 [ceil(N/128), ceil(K/128)]), one scale per 128 x 128 block."""
    N, K = w.shape
    nb, kb = (N + GROUP - 1) // GROUP, (K + GROUP - 1) // GROUP
    pad = torch.zeros(nb * GROUP, kb * GROUP, device=w.device)
    pad[:N, :K] = w.float()
    g = pad.view(nb, GROUP, kb, GROUP)
    s = g.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448.0
    q = (g / s[:, None, :, None]).clamp(-448, 448).view(nb * GROUP, kb * GROUP)[:N, :K].to(torch.float8_e4m3fn)
    return q.contiguous(), s.contiguous()


def _self_check(configs_dir):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"triton_fp8_block self-check skipped: torch unavailable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("triton_fp8_block self-check skipped: torch.cuda is unavailable")
        return 0
    if triton is None:
        print(f"triton_fp8_block self-check skipped: triton unavailable ({TRITON_ERROR})")
        return 0
    print(f"device {torch.cuda.get_device_name()} (SGLang name {sglang_device_name(torch)}), "
          f"torch {torch.__version__}, triton {triton.__version__}, configs {os.path.abspath(configs_dir)}")
    torch.manual_seed(0)
    failures = 0
    for M, N, K in [(1, 2112, 7168), (16, 4096, 4096), (64, 7168, 16384), (5, 264, 400)]:
        x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") * 0.02
        a8, sa = _group_quant(torch, x)
        b8, sb = _block_quant(torch, w)
        sa_kd = sa.t().contiguous()  # kdispatch's M-major [K/128, M]
        out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        try:
            fn, desc = make_block_fp8_peer(configs_dir, N, K, M, out)
            out.fill_(float("nan"))
            got = fn(a8, b8, sa_kd.t(), sb)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"M {M} N {N} K {K}: FAILED to run: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            failures += 1
            continue
        da = a8.double() * sa.double().repeat_interleave(GROUP, 1)[:, :K]
        dw = b8.double() * sb.double().repeat_interleave(GROUP, 0)[:N].repeat_interleave(GROUP, 1)[:, :K]
        ref = da @ dw.t()
        err = float((got.double() - ref).norm() / ref.norm().clamp(min=1e-30))
        ok = err < 1e-2  # NaN (an unwritten output) fails too
        failures += not ok
        print(f"M {M} N {N} K {K}: rel. L2 error {err:.2e} {'ok' if ok else 'FAILED'}; {desc}")
    print("all ok" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_self_check(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CONFIGS_DIR))
