"""Compile every Triton kernel of avex.kernels for one GPU architecture, no GPU needed.

    python tests/triton_compile_cases.py 90        # prints one JSON line: case -> cubin bytes

Run by tests/test_triton_compile.py in a fresh interpreter without TRITON_INTERPRET (under the
interpreter the kernels are InterpretedFunctions, which the compiler does not take). Each case
is a kernel at the block sizes its launcher picks for the benchmark and training shapes
(through the launchers' own helpers, so a change of launch geometry changes what is compiled)
and in each dtype the launcher passes it.
"""
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

gt = importlib.import_module("avex.kernels.gumbel_topk")
ex = importlib.import_module("avex.kernels.exchange")
cp = importlib.import_module("avex.kernels.compact")
sa = importlib.import_module("avex.kernels.set_aware")
utils = importlib.import_module("avex.kernels._utils")
exref = importlib.import_module("avex.kernels.exchange_ref")

pow2, warps = utils.next_power_of_2, utils.row_launch_config
ranked_warps = utils.ranked_row_launch_config   # the launch helpers of the row kernels

# (width M, K): the Gumbel-Top-K / exchange benchmarks (M=320, K in 32..128) and the embedded
# benchmark's default training shape (M=80, K=16); for sm_90 (the GPU we run on) also the widest
# row the kernels accept, which takes ~30 s more to compile.
ROW_SHAPES = [(320, 32), (320, 128), (80, 16)]
WIDEST = (utils.ROW_KERNEL_MAX_WIDTH, 128)
SCORE_DTYPES = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}
# compact(): any floating dtype; D of the compaction benchmark (1024, 3584) and the embedded one
HIDDEN_DTYPES = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16", "fp64": "*fp64"}
FEATURES = [3584, 1024, 32]
COMPACT_WIDTH, COMPACT_SETS = 400, 5
EXCHANGE_G = 8


def gumbel_cases(shapes):
    row = {"k_ptr": "*i64", "lengths_ptr": "*i64", "indices_ptr": "*i64",
           "anchor_ptr": "*fp32", "offset_ptr": "*fp32"}
    for width, k in shapes:
        block_m, block_k = pow2(width), pow2(k)
        for name, dtype in SCORE_DTYPES.items():
            if (width, k) != ROW_SHAPES[1] and name != "fp32":
                continue  # every dtype at the paper's shape; fp32 at the others
            base = {**row, "scores_ptr": dtype}
            for sample in (True, False):
                yield (f"gumbel_topk_fwd M={width} {name} sample={sample}",
                       gt._gumbel_topk_fwd_kernel,
                       {**base, "logp_ptr": "*fp32", "width": "i32", "kmax": "i32",
                        "tau": "fp32", "seed": "i64", "SAMPLE": "constexpr",
                        "BLOCK_M": "constexpr"},
                       {"SAMPLE": sample, "BLOCK_M": block_m}, sa.launch_config(block_m))
            yield (f"pl_log_prob_fwd M={width} K={k} {name}", gt._pl_log_prob_fwd_kernel,
                   {**base, "logp_ptr": "*fp32", "width": "i32", "kmax": "i32", "tau": "fp32",
                    "BLOCK_M": "constexpr", "BLOCK_K": "constexpr", "CHUNK_K": "constexpr"},
                   {"BLOCK_M": block_m, "BLOCK_K": block_k, "CHUNK_K": min(block_k, 16)},
                   ranked_warps(block_m))
            yield (f"pl_log_prob_bwd M={width} K={k} {name}", gt._pl_log_prob_bwd_kernel,
                   {**base, "dlogp_ptr": "*fp32", "dscores_ptr": "*fp32", "width": "i32",
                    "kmax": "i32", "tau": "fp32", "BLOCK_M": "constexpr",
                    "BLOCK_K": "constexpr"},
                   {"BLOCK_M": block_m, "BLOCK_K": block_k}, ranked_warps(block_m))


def exchange_cases(shapes):
    for width, k in shapes:
        block_m, block_k = pow2(width), pow2(k)
        block_w = pow2(exref.group_width(EXCHANGE_G, width))
        for name, dtype in SCORE_DTYPES.items():
            # modality: any integer dtype; int64 (what the data pipeline makes) for every
            # scores dtype, the narrow ones with fp32
            for mod in ("*i64", "*i32", "*i8") if name == "fp32" else ("*i64",):
                if (width, k) != ROW_SHAPES[1] and (name != "fp32" or mod != "*i64"):
                    continue
                yield (f"exchange_fwd M={width} K={k} {name} modality={mod[1:]}",
                       ex._exchange_fwd_kernel,
                       {"scores_ptr": dtype, "indices_ptr": "*i64", "modality_ptr": mod,
                        "removed_ptr": "*i64", "inserted_ptr": "*i64", "size_ptr": "*i64",
                        "delta_ptr": "*fp32", "keep_ptr": "*i8", "anchor_ptr": "*i8",
                        "width": "i32", "k_width": "i32", "n_types": "i32",
                        "type_bits": "i32", "g": "i32", "out_width": "i32",
                        "BLOCK_M": "constexpr", "BLOCK_K": "constexpr",
                        "CHUNK_K": "constexpr"},
                       {"BLOCK_M": block_m, "BLOCK_K": block_k,
                        "CHUNK_K": min(block_k, ex.INDEX_CHUNK)},
                       ex._exchange_fwd_launch_config(block_m))
        yield (f"exchange_bwd M={width}", ex._exchange_bwd_kernel,
               {"removed_ptr": "*i64", "inserted_ptr": "*i64", "grad_delta_ptr": "*fp32",
                "grad_scores_ptr": "*fp32", "width": "i32", "out_width": "i32",
                "N_TYPES": "constexpr", "BLOCK_M": "constexpr", "BLOCK_W": "constexpr",
                "CHUNK_W": "constexpr"},
               {"N_TYPES": len(exref.EXCHANGE_TYPES), "BLOCK_M": block_m, "BLOCK_W": block_w,
                "CHUNK_W": min(block_w, ex.INDEX_CHUNK)}, ranked_warps(block_m))


def compact_cases():
    block_l = min(pow2(COMPACT_WIDTH), cp.PLAN_CHUNK)
    for padded in (True, False):
        for left in ((True, False) if padded else (False,)):
            for original in (True, False):
                yield (f"compact_plan padded={padded} left={left} original={original}",
                       cp._compact_plan_kernel,
                       {"keep_ptr": "*i8", "lengths_ptr": "*i64", "cu_ptr": "*i32",
                        "index_ptr": "*i64", "positions_ptr": "*i64", "mask_ptr": "*i64",
                        "dest_ptr": "*i64", "width": "i32", "num_sets": "i32",
                        "padded_width": "i32", "ORIGINAL": "constexpr",
                        "PADDED": "constexpr", "LEFT": "constexpr", "BLOCK_L": "constexpr",
                        "L_CHUNKS": "constexpr", "PAD_CHUNKS": "constexpr"},
                       {"ORIGINAL": original, "PADDED": padded, "LEFT": left,
                        "BLOCK_L": block_l, "L_CHUNKS": triton.cdiv(COMPACT_WIDTH, block_l),
                        "PAD_CHUNKS": triton.cdiv(COMPACT_WIDTH, block_l) if padded else 0},
                       warps(block_l))
    for features in FEATURES:
        tile = cp._copy_tile(features)
        launch = {"num_warps": tile.pop("num_warps")}
        for name, dtype in HIDDEN_DTYPES.items():
            yield (f"gather_rows D={features} {name}", cp._gather_rows_kernel,
                   {"src_ptr": dtype, "index_ptr": "*i64", "out_ptr": dtype, "n_slots": "i32",
                    "features": "i32", "BLOCK_T": "constexpr", "BLOCK_D": "constexpr",
                    "D_CHUNKS": "constexpr"}, dict(tile), launch)
            acc = tl.float64 if name == "fp64" else tl.float32
            yield (f"sum_set_grads D={features} {name}", cp._sum_set_grads_kernel,
                   {"grad_out_ptr": dtype, "dest_ptr": "*i64", "grad_src_ptr": dtype,
                    "n_rows": "i32", "width": "i32", "features": "i32",
                    "NUM_SETS": "constexpr", "ACC_DTYPE": "constexpr", "BLOCK_T": "constexpr",
                    "BLOCK_D": "constexpr", "D_CHUNKS": "constexpr"},
                   {"NUM_SETS": COMPACT_SETS, "ACC_DTYPE": acc, **tile}, launch)


def set_aware_cases(shapes):
    # the cosine matrix: float32 (serving, training) or float64 (float64 hidden states)
    widths = dict.fromkeys(width for width, _ in (*shapes, (2000, 0)))  # + a clip's 2000 tokens
    for width in widths:
        block_m = pow2(width)
        for gram in ("*fp32", "*fp64"):
            if gram == "*fp64" and width != 80:
                continue
            for sample in (True, False) if width <= sa.MAX_SAMPLE_WIDTH else (False,):
                yield (f"set_aware M={width} gram={gram[1:]} sample={sample}",
                       sa._set_aware_kernel,
                       {"key_ptr": "*fp64", "gram_ptr": gram, "budget_ptr": "*i64",
                        "coef_ptr": "*fp64", "picks_ptr": "*i64", "width": "i32",
                        "kmax": "i32", "SAMPLE": "constexpr", "BLOCK_M": "constexpr"},
                       {"SAMPLE": sample, "BLOCK_M": block_m},
                       sa.launch_config(block_m))


def resource_usage(cubin: bytes) -> dict:
    """Registers, stack and local memory per thread, shared memory per block, as the
    cuobjdump that ships with Triton reads them from the cubin ({} if it is missing)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        Path(path).write_bytes(cubin)
        report = subprocess.run([str(tool), "--dump-resource-usage", path],
                                capture_output=True, text=True).stdout
    return {key.lower(): int(value) for key, value in
            re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", report)}


def main(arch: int) -> None:
    results = {}
    shapes = ROW_SHAPES + [WIDEST] if arch == 90 else ROW_SHAPES
    for name, fn, signature, constants, options in (*gumbel_cases(shapes),
                                                    *exchange_cases(shapes), *compact_cases(),
                                                    *set_aware_cases(shapes)):
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                                  target=GPUTarget("cuda", arch, 32), options=options)
        results[name] = {"cubin_bytes": len(compiled.asm["cubin"]),
                         "seconds": round(time.perf_counter() - start, 2),
                         "div_rn": "div.rn.f32" in compiled.asm["ptx"],
                         **resource_usage(compiled.asm["cubin"])}
    print(json.dumps(results))


if __name__ == "__main__":
    main(int(sys.argv[1]))
