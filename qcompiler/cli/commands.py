"""The ``qcompile`` commands: each takes the parsed flags and a log function, returns the exit code."""
from __future__ import annotations

import json
import os
import sys

from .. import driver
from ..errors import UserError
from .options import compile_options, model_source, remote_options


def _runs_passes(args) -> bool:
    """inspect/convert run passes when given --passes, or a DFQ or pruning flag (then after the default ones)."""
    return args.passes not in (None, "none") or bool(args.equalize) or args.bias_correction is not None \
        or args.sparsity is not None or args.sparsity_pattern is not None or getattr(args, "weights", None) is not None


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def cmd_inspect(args, log) -> int:
    from ..ir.printer import print_graph
    g = driver.load_model(model_source(args))
    n0, b0 = g.param_count()
    before = g.op_histogram()
    pm = driver.run_pipeline(g, compile_options(args), log) if _runs_passes(args) else None
    after = g.op_histogram()
    n1, b1 = g.param_count()
    if args.json:
        print(json.dumps({
            "model": args.model, "graph": g.name,
            "inputs": [{"name": v.name, "type": str(v.type)} for v in g.inputs],
            "outputs": [{"name": v.name, "type": str(v.type)} for v in g.outputs],
            "ops_before": before, "ops_after": after if pm else before,
            "num_ops": sum(after.values()), "params": n1, "param_bytes": b1,
            "passes": [t.name for t in pm.timings] if pm else [],
        }, indent=2))
        return 0
    if not args.no_ir:
        print(print_graph(g, elide=True))
    print(f"model:   {args.model}  (graph '{g.name}', opset {g.meta.get('opset', '?')})")
    for v in g.inputs:
        print(f"input:   %{v.name}: {v.type}")
    for v in g.outputs:
        print(f"output:  %{v.name}: {v.type}")
    print(f"params:  {n1:,} elements, {_fmt_bytes(b1)}" + (f"  (before passes: {n0:,}, {_fmt_bytes(b0)})" if pm else ""))
    rows = before
    if pm:
        print(f"passes:  {', '.join(t.name for t in pm.timings) or '(none)'}")
        kinds = sorted(set(before) | set(after), key=lambda k: (-before.get(k, 0), k))
        print(f"{'op':<24}{'before':>8}{'after':>8}")
        for k in kinds:
            print(f"  {k:<22}{before.get(k, 0):>8}{after.get(k, 0):>8}")
        print(f"  {'total':<22}{sum(before.values()):>8}{sum(after.values()):>8}")
        return 0
    print(f"{'op':<24}{'count':>8}")
    for k, n in rows.items():
        print(f"  {k:<22}{n:>8}")
    print(f"  {'total':<22}{sum(before.values()):>8}")
    return 0


def cmd_convert(args, log) -> int:
    from ..frontend.onnx_export import save_onnx
    driver.check_model_path(args.model)
    driver.check_output_path(args.output, is_dir=False)
    if os.path.exists(args.output) and os.path.samefile(args.output, args.model):
        raise UserError("output would overwrite the input model", args.output, "choose another -o")
    g = driver.load_model(model_source(args))
    pm = driver.run_pipeline(g, compile_options(args), log) if _runs_passes(args) else None
    if driver.is_quantized(g):
        from ..frontend.qdq_export import save_qdq
        save_qdq(g, args.output, uint8_weights=args.qdq_weights == "uint8")   # ONNX Runtime, TensorRT
    else:
        save_onnx(g, args.output)
    log(f"wrote {args.output}: {len(g)} ops" + (f" after {', '.join(t.name for t in pm.timings)}" if pm else ""))
    return 0


def cmd_compile(args, log) -> int:
    """compile, with one progress line on a terminal (passes, lower N kernels, tvm.compile, link)."""
    from ..progress import StageLine, listening
    driver.check_model_path(args.model)
    opts = compile_options(args)
    with StageLine("compile", quiet=args.quiet) as line, listening(line):
        art = driver.compile(model_source(args), args.output, opts, log=log)
    if args.json:
        print(json.dumps({"artifact": str(art.path), "files": sorted(os.listdir(art.path)), "report": art.report},
                         indent=2, sort_keys=True))
    elif opts.quantizing and driver.is_quantized(art.graph) and not args.quiet:
        print(driver.format_text(art.report), end="")
    log(f"wrote {art.path} ({opts.target.family}, {opts.target.dtype}) in {art.seconds:.1f} s")
    return 0


def cmd_run(args, log) -> int:
    from ..runtime import load, run_batches
    if args.output:
        driver.check_output_path(args.output, is_dir=False)
    if args.rpc_tracker is not None:          # a bad OUT fails before waiting for a board
        from ..runtime import read_manifest
        read_manifest(args.artifact, verify_hash=False)
    remote = remote_options(args)
    if remote is None:
        outs = run_batches(load(args.artifact), args.input)
    else:
        from ..runtime import remote as rpc
        board = rpc.connect(remote.tracker, remote.key, remote.timeout)
        log(f"connected to {board}")
        outs, ms = rpc.run_remote(board, args.artifact, args.input)
    import numpy as np
    for name, y in outs.items():
        log(f"{name}: shape {list(y.shape)} {y.dtype}, mean {float(np.mean(y)):.6g}, "
            f"min {float(np.min(y)):.6g}, max {float(np.max(y)):.6g}")
    if remote is not None:
        log(f"ran on {board}: {ms:.4f} ms per run (median on the board)")
    if args.output:
        from ..runtime import save_outputs
        save_outputs(outs, args.output)
        log(f"wrote {args.output}")
    return 0


def cmd_verify(args, log) -> int:
    from ..verify import main as verify_main
    return verify_main(args, log)


COMMANDS = {"compile": cmd_compile, "inspect": cmd_inspect, "convert": cmd_convert, "run": cmd_run,
            "verify": cmd_verify}
