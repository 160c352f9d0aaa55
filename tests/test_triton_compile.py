"""The Gumbel-Top-K kernels compile for Hopper (sm_90) through Triton's own ptxas, no GPU needed.

The interpreter runs the kernels' logic but skips the compiler; this catches what only the
compiler rejects (types, layouts, scan and sort lowering)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# Runs in a fresh interpreter: under TRITON_INTERPRET=1 (set for the rest of the suite) the
# kernels are InterpretedFunctions, which the compiler does not take.
COMPILE = textwrap.dedent("""
    import importlib, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    gt = importlib.import_module("avex.kernels.gumbel_topk")
    ROW = {"scores_ptr": "*fp32", "k_ptr": "*i64", "lengths_ptr": "*i64", "indices_ptr": "*i64",
           "anchor_ptr": "*fp32", "offset_ptr": "*fp32"}
    CASES = {
        "gumbel_topk_fwd": (gt._gumbel_topk_fwd_kernel,
            {**ROW, "logp_ptr": "*fp32", "width": "i32", "kmax": "i32", "tau": "fp32",
             "seed": "i64", "SAMPLE": "constexpr", "BLOCK_M": "constexpr"},
            {"SAMPLE": True, "BLOCK_M": 512}),
        "pl_log_prob_fwd_bf16": (gt._pl_log_prob_fwd_kernel,
            {**ROW, "scores_ptr": "*bf16", "logp_ptr": "*fp32", "width": "i32", "kmax": "i32",
             "tau": "fp32", "BLOCK_M": "constexpr", "BLOCK_K": "constexpr",
             "CHUNK_K": "constexpr"},
            {"BLOCK_M": 512, "BLOCK_K": 128, "CHUNK_K": 16}),
        "pl_log_prob_bwd": (gt._pl_log_prob_bwd_kernel,
            {**ROW, "dlogp_ptr": "*fp32", "dscores_ptr": "*fp32", "width": "i32",
             "kmax": "i32", "tau": "fp32", "BLOCK_M": "constexpr", "BLOCK_K": "constexpr"},
            {"BLOCK_M": 512, "BLOCK_K": 128}),
    }
    sizes = {}
    for name, (fn, signature, constants) in CASES.items():
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        sizes[name] = len(compiled.asm["cubin"])
    print(json.dumps(sizes))
""")


def test_kernels_compile_to_sm90_cubin():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(sizes) == {"gumbel_topk_fwd", "pl_log_prob_fwd_bf16", "pl_log_prob_bwd"}
    assert all(size > 0 for size in sizes.values())
