"""Every Triton kernel compiles for Hopper (sm_90) and Ampere (sm_80) through Triton's own
ptxas, no GPU needed.

The interpreter runs the kernels' logic but skips the compiler; this catches what only the
compiler rejects (types, layouts, scan and sort lowering), in every dtype the launchers pass
and at the block sizes they pick for the benchmark and training shapes
(``tests/triton_compile_cases.py`` lists the cases). It also reads the compiled code: no
register spills (local memory) at any of those sizes, and the Gumbel-Top-K ranking key divides
with IEEE rounding, as the reference does.

Cost: the two architectures compile side by side, one process each. With an empty Triton cache
the sm_90 list took 91 s of compiling on the 2-core development machine (2026-11-25, shared
with other jobs), the widest rows (4096) a third of it, which is why only sm_90 compiles them;
a warm cache (~/.triton/cache) skips the compiler.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import importlib

import pytest

pytest.importorskip("triton")
kernel_utils = importlib.import_module("avex.kernels._utils")

CASES = Path(__file__).with_name("triton_compile_cases.py")
ARCHS = (90, 80)


@pytest.fixture(scope="module")
def compiled():
    # A fresh interpreter without TRITON_INTERPRET (set for the rest of the suite).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    runs = {arch: subprocess.Popen([sys.executable, str(CASES), str(arch)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for arch in ARCHS}
    out = {}
    for arch, run in runs.items():
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, f"sm_{arch}:\n{stderr[-3000:]}"
        out[arch] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles(compiled, arch):
    cases = compiled[arch]
    kernels = {name.split()[0] for name in cases}
    assert kernels == {"gumbel_topk_fwd", "pl_log_prob_fwd", "pl_log_prob_bwd", "exchange_fwd",
                       "exchange_bwd", "compact_plan", "gather_rows", "sum_set_grads",
                       "set_aware"}
    assert all(case["cubin_bytes"] > 0 for case in cases.values())
    for dtype in ("fp32", "bf16", "fp16"):
        assert any(name.startswith("gumbel_topk_fwd") and dtype in name for name in cases)
        assert any(name.startswith("exchange_fwd") and dtype in name for name in cases)
    for dtype in ("fp32", "bf16", "fp16", "fp64"):
        assert any(name.startswith("gather_rows") and dtype in name for name in cases)
    widest = f"M={kernel_utils.ROW_KERNEL_MAX_WIDTH}"
    assert any(widest in name for name in cases) == (arch == 90)


@pytest.mark.parametrize("arch", ARCHS)
def test_no_register_spills(compiled, arch):
    cases = compiled[arch]
    if "local" not in next(iter(cases.values())):
        pytest.skip("Triton's cuobjdump is missing: no resource report to read")
    spilled = {name: case for name, case in cases.items() if case["local"] or case["stack"]}
    assert not spilled


@pytest.mark.parametrize("arch", ARCHS)
def test_ranking_key_divides_with_ieee_rounding(compiled, arch):
    forward = {name: case for name, case in compiled[arch].items()
               if name.startswith("gumbel_topk_fwd")}
    assert forward and all(case["div_rn"] for case in forward.values())
