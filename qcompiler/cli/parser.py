"""``qcompile``'s argument parser: the commands and their flags, grouped, the main ones first."""
from __future__ import annotations

import argparse

from .. import __version__
from ..errors import UserError

COMMANDS = ("compile", "inspect", "convert", "run", "verify")

COMPILE_EXAMPLES = """examples:
  qcompile model.onnx --target x86 --dtype fp32 -o out                 # float artifact for this CPU
  qcompile model.onnx --dtype int8 --calib calib.npz -o out            # static int8, calibrated
  qcompile model.onnx --dtype int8 --calib images/ --preprocess imagenet --min-sqnr 30 -o out
  qcompile model.onnx --target arm --cpu cortex-a76 --dtype int8 --calib calib.npz -o out
  qcompile model.onnx --target cuda --arch sm_90 --dtype fp16 -o out
  qcompile model.onnx --input-shape x=1x3x224x224 --input-value sr=16000 -o out
  qcompile encoder.onnx --dynamic sequence=1..512 -o out              # one artifact, any length 1..512
"""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str):
        raise UserError(message, self.prog, f"see '{self.prog} --help'")


def _input_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inputs")
    g.add_argument("--input-shape", action="append", default=[], metavar="NAME=DxDxD",
                   help="static shape of an input with dynamic dimensions (repeatable; a dynamic batch "
                        "alone defaults to 1)")
    g.add_argument("--input-value", action="append", default=[], metavar="NAME=V[,V...]",
                   help="bind an input to a constant that folds into the model, e.g. sr=16000 (repeatable)")
    g.add_argument("--dynamic", action="append", default=[], metavar="DIM=LO..HI[:B,B,...]",
                   help="one artifact for every size of a dynamic dim (a dim the model names, or a symbol of "
                        "--input-shape such as input_ids=1xS): compiled per bucket size (default: powers of two "
                        "and their 1.5 multiples from 16, and HI), inputs zero-padded to the bucket at run time "
                        "(repeatable)")


def _pass_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("passes")
    g.add_argument("--passes", default=None, metavar="PIPELINE",
                   help="comma-separated passes, 'default' or 'none' (see qcompile --list-passes)")
    g.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help="load passes registered with @register_pass from a Python file (repeatable)")
    g.add_argument("--print-ir-after", default=None, metavar="PASS|all", help="print the IR after these passes")
    g.add_argument("--time-passes", action="store_true", help="print the time spent in each pass")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")


def _quant_args(p: argparse.ArgumentParser) -> None:
    q = p.add_argument_group("quantization (--dtype int8, or the quantize pass)")
    q.add_argument("--calib", default=None, metavar="PATH|random",
                   help="calibration data: image folder, .npy/.npz with a leading sample axis, or 'random'")
    q.add_argument("--calib-samples", type=int, default=256, metavar="N", help="samples to calibrate on (256)")
    q.add_argument("--calib-method", default="minmax", choices=("minmax", "percentile", "entropy", "mse"),
                   help="activation range method (minmax)")
    q.add_argument("--percentile", type=float, default=99.99, help="for --calib-method percentile (99.99)")
    q.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default per channel)")
    q.add_argument("--preprocess", default=None, metavar="ITEMS",
                   help="image folders: e.g. 'imagenet,bgr' or 'resize=256,mean=0.5,std=0.5,scale=1/255,nhwc'")
    q.add_argument("--eval-samples", type=int, default=64, metavar="N",
                   help="report: SQNR and top-1 agreement on N samples held back from calibration (64; 0: off)")
    q.add_argument("--eval", default=None, metavar="PATH", help="report: evaluate on this data instead")
    q.add_argument("--equalize", action=argparse.BooleanOptionalAction, default=None,
                   help="cross-layer range equalization (default: on with --per-tensor)")
    q.add_argument("--bias-correction", default=None, choices=("none", "analytic", "empirical"),
                   help="correct the int8 weights' mean output shift (default empirical)")
    q.add_argument("--weight-rounding", default="nearest", choices=("nearest", "gptq"),
                   help="round the quantized weights each to its nearest value (default), or gptq: each layer's "
                        "rounding errors compensated on the calibration data (Frantar et al. 2022)")
    q.add_argument("--smooth-quant", nargs="?", const="auto", default=None, metavar="ALPHA",
                   help="SmoothQuant: move activation outliers into the weights of linear layers, strength ALPHA "
                        "in [0, 1] (no value: chosen per layer from the calibration data)")
    q.add_argument("--activations", default="static", choices=("static", "dynamic"),
                   help="static: activation ranges calibrated on --calib (default); dynamic: the linear layers' "
                        "inputs quantized at run time from their own range (no calibration data needed)")
    q.add_argument("--dynamic-granularity", default="token", choices=("token", "tensor"),
                   help="--activations dynamic: one activation scale per row/token (default) or per tensor")
    q.add_argument("--requantize", action="store_true",
                   help="a pre-quantized (QDQ) model: drop its own quantization and calibrate it afresh on --calib")
    w = p.add_argument_group("weight-only quantization (a float --dtype)")
    w.add_argument("--weights", default=None, choices=("int4",),
                   help="store the MatMul/Gemm weights and embedding tables 4-bit in blocks along K, activations "
                        "float (with --weight-rounding gptq and --calib: GPTQ's error-compensating rounding)")
    w.add_argument("--weight-block", type=int, default=None, metavar="B",
                   help="--weights int4: inputs per block, 32, 64 or 128 (128, as ONNX Runtime's MatMulNBits quantizer)")
    w.add_argument("--weight-symmetric", action=argparse.BooleanOptionalAction, default=None,
                   help="--weights int4: int4 without zero points (default: asymmetric uint4, as ONNX Runtime)")
    w.add_argument("--weight-scale-dtype", default=None, choices=("fp32", "fp16"),
                   help="--weights int4: the blocks' scales in fp32 (default) or fp16")
    m = p.add_argument_group("mixed precision (which layers stay float)")
    m.add_argument("--keep-float", action="append", default=[], metavar="NAME|op:TYPE",
                   help="keep this op, or every op of a type, in float (repeatable)")
    m.add_argument("--force-int8", action="append", default=[], metavar="NAME",
                   help="make this op integer whatever --keep-float or the budget say (repeatable)")
    m.add_argument("--min-sqnr", type=float, default=None, metavar="DB",
                   help="budget: the fewest float layers for output SQNR >= DB vs fp32 (bootstrap lower bound)")
    m.add_argument("--max-accuracy-drop", type=float, default=None, metavar="POINTS",
                   help="budget: the fewest float layers for a top-1 drop <= POINTS on labelled --eval data")
    m.add_argument("--sensitivity", action="store_true", help="report the per-layer sensitivity table")
    m.add_argument("--sensitivity-samples", type=int, default=64, metavar="N",
                   help="samples the sensitivity and the SQNR budget are measured on (64)")
    m.add_argument("--budget-confidence", type=float, default=0.95, metavar="C",
                   help="confidence of the budget's bootstrap bound (0.95; 0: the point estimate)")
    s = p.add_argument_group("sparsity")
    s.add_argument("--sparsity", type=float, default=None, metavar="F",
                   help="prune conv/gemm weights to this fraction of zeros (0 < F < 1)")
    s.add_argument("--sparsity-pattern", default=None, choices=("unstructured", "2:4", "block4"),
                   help="pattern of the zeros (unstructured)")
    s.add_argument("--sparsity-global", action="store_true", help="one magnitude ranking over all layers")
    s.add_argument("--prune-method", default=None, choices=("magnitude", "obc"),
                   help="magnitude: zero the smallest |w|; obc: also re-fit the kept weights on --calib, layer by "
                        "layer (SparseGPT; the default when --calib gives data)")
    s.add_argument("--no-prune", action="append", default=[], metavar="NAME|KIND",
                   help="leave this layer or kind (Conv, Gemm, MatMul) dense (repeatable)")
    s.add_argument("--sparse-objective", default="time", choices=("time", "size"),
                   help="weight encoding: the fastest by the cost model (time) or the fewest bytes (size)")


def _rpc_args(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_argument_group("remote boards (TVM RPC tracker)")
    g.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT", help=f"{what} on a board of this tracker")
    g.add_argument("--rpc-key", default=None, metavar="KEY", help="the boards' device key")
    g.add_argument("--rpc-timeout", type=float, default=60.0, metavar="S", help="seconds to wait for a board (60)")


def _qdq_weights_arg(p) -> None:
    p.add_argument("--qdq-weights", choices=("int8", "uint8"), default="int8",
                   help="weights of a written QDQ model: int8 (default; TensorRT) or uint8+128 (ONNX Runtime "
                        "on AVX2-only CPUs, whose int8-weight kernels saturate)")


def _compile_parser(sub) -> None:
    c = sub.add_parser("compile", help="compile a model to an artifact (the default command)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=COMPILE_EXAMPLES,
                       usage="qcompile [compile] MODEL.onnx [--target x86|arm|cuda] "
                             "[--dtype fp32|fp16|bf16|int8|fp8] -o OUT [options]",
                       description="Compile an ONNX model to an artifact folder (model.so, manifest.json, "
                       "report.json) that runs with the TVM runtime alone.")
    c.add_argument("model", help="the ONNX model file")
    c.add_argument("--target", default="x86", choices=("x86", "arm", "cuda"), help="target family (x86)")
    c.add_argument("--dtype", default=None, choices=("fp32", "fp16", "bf16", "int8", "fp8"),
                   help="precision (fp32; int8 for a pre-quantized QDQ model, fp8 for a float8 one); int8 and "
                        "fp8 need --calib unless the model is pre-quantized; bf16: cuda only; fp8: x86, arm, cuda sm_89+")
    c.add_argument("-o", "--output", required=True, metavar="OUT", help="artifact folder to write")
    t = c.add_argument_group("target details")
    t.add_argument("--cpu", default=None, help="LLVM CPU name (x86: the host's; arm: e.g. cortex-a76)")
    t.add_argument("--arch", default="sm_90", help="CUDA architectures, comma-separated (sm_90)")
    t.add_argument("--features", default="", help="extra LLVM features, e.g. +dotprod,+fullfp16")
    t.add_argument("--float-dtype", default="fp32", choices=("fp32", "fp16"),
                   help="int8 builds: storage of the layers kept float (fp32)")
    t.add_argument("--fp8-format", default=None, choices=("e4m3", "e5m2"),
                   help="fp8 builds: float8 E4M3 (default: 3 mantissa bits, max 448) or E5M2 (2 bits, max 57344)")
    _input_args(c)
    _quant_args(c)
    m = [a for a in c._action_groups if a.title.startswith("mixed")][0]
    m.add_argument("--layer-costs", default="measure", choices=("measure", "model", "off"),
                   help="budgets: per-layer latency measured here, modelled, or ignored (measure)")
    o = c.add_argument_group("outputs")
    o.add_argument("--json", action="store_true", help="print the build report as JSON")
    o.add_argument("--debug-layers", action="store_true",
                   help="int8 x86/arm: add the per-layer functions and model.qir that `qcompile verify` needs")
    o.add_argument("--export-qdq", default=None, metavar="FILE.onnx",
                   help="int8: also write the quantized model as QDQ ONNX (ONNX Runtime, TensorRT)")
    _qdq_weights_arg(o)
    tu = c.add_argument_group("tuning (x86)")
    tu.add_argument("--tune", type=int, default=None, metavar="TRIALS",
                    help="tune the float kernels with MetaSchedule: TRIALS measured schedules in all")
    tu.add_argument("--tune-db", default=None, metavar="DIR", help="tuning records (a per-target cache folder)")
    _rpc_args(c, "time a budget's layer costs")
    _pass_args(c)


def build_parser() -> argparse.ArgumentParser:
    top = Parser(prog="qcompile", formatter_class=argparse.RawDescriptionHelpFormatter,
                 description="qcompiler: a quantizing graph compiler for neural networks.\n\n"
                 "  qcompile MODEL.onnx --target x86 --dtype fp32 -o OUT   compile (the default command)\n"
                 "  qcompile inspect MODEL.onnx [--passes P]              IR text, op histogram, parameters\n"
                 "  qcompile convert MODEL.onnx -o OUT.onnx [--passes P]  the IR after passes, as ONNX\n"
                 "  qcompile run OUT --input X.npz [--output Y.npy]       run a compiled artifact\n"
                 "  qcompile verify OUT --data X.npz [--qdq F.onnx]       int8 artifact (--debug-layers) vs ORT\n",
                 epilog="Run 'qcompile COMMAND --help' for a command's options.")
    top.add_argument("--version", action="version", version=f"qcompiler {__version__}")
    top.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    sub = top.add_subparsers(dest="command", parser_class=Parser)
    _compile_parser(sub)
    i = sub.add_parser("inspect", help="print the IR, op histogram and parameter count of a model",
                       description="Import a model (optionally run passes) and print its IR, an op "
                       "histogram (before/after the passes) and the parameter count and bytes.")
    i.add_argument("model", help="the ONNX model file")
    _input_args(i)
    _pass_args(i)
    _quant_args(i)
    i.add_argument("--no-ir", action="store_true", help="do not print the IR text")
    i.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    v = sub.add_parser("convert", help="write the IR after passes back as ONNX",
                       description="Import a model, run passes (--passes none: import and export only) "
                       "and write the result as ONNX that ONNX Runtime can run.")
    v.add_argument("model", help="the ONNX model file")
    _input_args(v)
    v.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="ONNX file to write")
    _pass_args(v)
    _quant_args(v)
    _qdq_weights_arg(v)
    r = sub.add_parser("run", help="run a compiled artifact on inputs from .npy/.npz",
                       description="Run every sample of an input with a leading sample dimension through "
                       "a compiled artifact and print a short summary.")
    r.add_argument("artifact", help="artifact folder written by 'qcompile'")
    r.add_argument("--input", required=True, metavar="X.npy|X.npz",
                   help=".npy (the single input) or .npz (arrays named like the inputs, or 'x')")
    r.add_argument("--output", default=None, metavar="Y.npy|Y.npz", help="write the outputs here")
    r.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    _rpc_args(r, "run and time the artifact")
    f = sub.add_parser("verify", help="compare an int8 artifact with its QDQ model in ONNX Runtime",
                       description="Run an int8 artifact (ARM ones under qemu-aarch64) and the QDQ export of "
                       "the same quantized model in ONNX Runtime on the same inputs; print, layer by layer, "
                       "the largest difference in quantization steps (LSB) alone and chained. Exit code 0: "
                       "PASS (every layer alone within 1 LSB and >= 99 %% exact, >= 99.9 %% of output "
                       "elements within 1 LSB), 1: FAIL, 2: bad input.")
    f.add_argument("artifact", help="int8 artifact folder written with --debug-layers")
    f.add_argument("--data", required=True, metavar="X.npy|X.npz", help="inputs with a leading sample axis")
    f.add_argument("--qdq", default=None, metavar="FILE.onnx",
                   help="the QDQ model to compare with (default: exported from the artifact's model.qir)")
    f.add_argument("--samples", type=int, default=None, metavar="N", help="use the first N samples (all)")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    return top
