"""all-MiniLM-L6-v2 with int4 weight-only quantization (``--weights int4``): artifact size against
fp32, sentence-embedding cosine against ONNX Runtime fp32 with round-to-nearest beside GPTQ, and
batch-1 latency against ONNX Runtime's own 4-bit model (issue #38 part 4: weights <= 0.16x fp32,
cosine >= 0.98 with GPTQ, latency <= 1.0x ORT's MatMulNBits).

    python bench/int4_weights.py                                   # blocks of 32 (fp16 scales), 32, 64, 128
    python bench/int4_weights.py --configs 32:fp16 --sentences 64 --calib 32 --rounds 5
    python bench/int4_weights.py --configs 32:fp16 --conv-models fashion_mobilenet,resnet18 --rounds 0

Per configuration (``B[:fp16][:sym]``: block size, float16 scales, symmetric int4; default uint4
with zero points and float32 scales, ONNX Runtime's defaults) two builds (what ``qcompile M.onnx
--dtype fp32 --weights int4 --weight-block B [--weight-scale-dtype fp16] [--weight-symmetric]
[--weight-rounding gptq --calib C]`` runs: every MatMul weight and the word/token-type embedding
tables 4-bit) and ONNX Runtime's ``MatMulNBitsQuantizer`` on the same ONNX file with the same block
size and symmetry, MatMul and Gather quantized (MatMulNBits, GatherBlockQuantized; accuracy level
unset: float32 compute). Embeddings as sentence-transformers makes them (the last hidden state
averaged over the real tokens, L2-normalized: :mod:`minilm_embeddings`), of ``--sentences``
generated sentences padded to 128 tokens; GPTQ calibrates on ``--calib`` other sentences.
Sizes: model.so bytes over our fp32 build's model.so, and the constants (params) as stored over
their fp32 bytes. Latency: one call on the first sentence, batch 1, both engines on ``--threads``
threads, medians of ``--iters`` calls per round, interleaved for ``--rounds`` rounds (the median
of the rounds); on a shared machine these are indicative only.

``--conv-models``: the first configuration on conv models (their convs with >= 16 input channels a
group, and their Gemms, 4-bit; depthwise and first convs float), output SQNR against ONNX Runtime
fp32 and top-1 agreement with it on ``--conv-eval`` feeds of seed 1, GPTQ on ``--conv-calib`` of seed
0 (fashion_mobilenet: its own test images, bench/weight_rounding.py's ProjectModel).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")      # GPTQ's factorizations: BLAS threads fight on 2 cores
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np  # noqa: E402

import zoo  # noqa: E402
from minilm_embeddings import _call, embed, feeds, sentences  # noqa: E402
from zoo.harness import Build, options, save_calib  # noqa: E402

from _timing import median_ms  # noqa: E402


def parse_config(text: str) -> dict:
    parts = text.split(":")
    return {"block": int(parts[0]), "fp16": "fp16" in parts[1:], "sym": "sym" in parts[1:], "name": text}


def build_ours(m, out: Path, cfg: dict, rounding: str, calib_npz: Path | None) -> Build:
    from qcompiler.driver import CalibOptions, WeightOptions, compile
    from qcompiler.driver.options import WeightRounding
    src, opts = options(m, "fp32")
    calib = CalibOptions(source=str(calib_npz), eval_samples=0, weight_rounding=WeightRounding(rounding)) \
        if rounding == "gptq" else opts.calib
    opts = dataclasses.replace(opts, calib=calib, weights=WeightOptions(
        "int4", cfg["block"], cfg["sym"], "fp16" if cfg["fp16"] else "fp32"))
    t = time.perf_counter()
    art = compile(src, out, opts)
    b = Build(out, time.perf_counter() - t)
    b.params = art.report["size"]
    return b


def ort_nbits(m, path: Path, cfg: dict) -> Path:
    """ONNX Runtime's own 4-bit model of ``m``: MatMulNBits and GatherBlockQuantized."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    ops = ("MatMul", "Gather")
    q = MatMulNBitsQuantizer(onnx.load(str(m.path())), block_size=cfg["block"], is_symmetric=cfg["sym"],
                             op_types_to_quantize=ops, algo_config=DefaultWeightOnlyQuantConfig(
                                 block_size=cfg["block"], is_symmetric=cfg["sym"], op_types_to_quantize=ops))
    q.process()
    q.model.save_model_to_file(str(path), use_external_data_format=False)
    return path


def conv_rows(models: list[str], cfg: dict, n_calib: int, n_eval: int, tmp: Path) -> list[tuple]:
    """(model, rounding, SQNR dB, top-1 agreement, so/fp32, params/fp32) per conv model and rounding."""
    from weight_rounding import get
    from zoo.harness import build
    from zoo.loader import sqnr_db
    rows = []
    for name in models:
        m = get(name)
        cal, ev = m.feeds(n_calib, seed=0), m.feeds(n_eval, seed=1)
        ort = zoo.ort_session(m.path(), 2)
        ref = [ort.run(None, m.ort_feeds(f))[0] for f in ev]
        fp32 = build(m, "fp32", tmp / f"{name}_fp32")
        so32 = (fp32.out / "model.so").stat().st_size
        npz = save_calib(cal, tmp / f"{name}_calib.npz")
        for rounding in ("nearest", "gptq"):
            b = build_ours(m, tmp / f"{name}_{rounding}", cfg, rounding, npz)
            got = [b(f)[0] for f in ev]
            agree = float(np.mean([np.argmax(r) == np.argmax(g) for r, g in zip(ref, got)]))
            rows.append((name, rounding, sqnr_db(ref, got), agree,
                         (b.out / "model.so").stat().st_size / so32, b.params["params_bytes"] / b.params["params_fp32_bytes"]))
            print(f"# built {name} {rounding} in {b.seconds:.0f} s", file=sys.stderr, flush=True)
    return rows


def minilm(a, tmp: Path) -> None:
    """The MiniLM tables: embeddings and sizes per configuration, then the interleaved latencies."""
    from zoo.harness import build
    m = zoo.get("all-minilm-l6-v2")
    texts = sentences(a.sentences + a.calib, seed=0)
    ev, cal = feeds(texts[:a.sentences]), feeds(texts[a.sentences:])
    mask = np.concatenate([f["attention_mask"] for f in ev])
    ort32 = zoo.ort_session(m.path(), a.threads)
    ref = embed(np.concatenate([ort32.run(None, f)[0] for f in ev]), mask)
    rows, times = [], {}
    npz = save_calib(cal, tmp / "calib.npz")
    fp32 = build(m, "fp32", tmp / "fp32")
    so32 = (fp32.out / "model.so").stat().st_size
    calls = {"ORT fp32": lambda: ort32.run(None, ev[0]), "ours fp32": _call(fp32, ev[0])}
    configs = [parse_config(c) for c in a.configs.split(",") if c]
    for cfg in configs:
        ort4 = zoo.ort_session(ort_nbits(m, tmp / f"ort_{cfg['name'].replace(':', '_')}.onnx", cfg), a.threads)
        e = embed(np.concatenate([ort4.run(None, f)[0] for f in ev]), mask)
        rows.append((cfg["name"], "ORT MatMulNBits", e, None, None, None))
        calls[f"{cfg['name']} ORT"] = lambda s=ort4: s.run(None, ev[0])
        for rounding in ("nearest", "gptq"):
            b = build_ours(m, tmp / f"{cfg['name'].replace(':', '_')}_{rounding}", cfg, rounding, npz)
            e = embed(np.concatenate([b(f)[0] for f in ev]), mask)
            so = (b.out / "model.so").stat().st_size
            rows.append((cfg["name"], f"ours {rounding}", e, so / so32,
                         b.params["params_bytes"] / b.params["params_fp32_bytes"], b.seconds))
            print(f"# built {cfg['name']} {rounding} in {b.seconds:.0f} s", file=sys.stderr, flush=True)
            if rounding == "gptq":
                calls[f"{cfg['name']} ours"] = _call(b, ev[0])
    for _ in range(a.rounds):                           # interleaved: every engine once per round
        for name, fn in calls.items():
            for _ in range(3):
                fn()
            times.setdefault(name, []).append(median_ms(fn, a.iters))
    ms = {k: float(np.median(v)) for k, v in times.items()}
    lat = f"ORT fp32 {ms['ORT fp32']:.2f} ms, ours fp32 {ms['ours fp32']:.2f} ms; " if ms else ""
    print(f"# all-MiniLM-L6-v2, {len(ev)} sentences (GPTQ calibrated on {len(cal)} others), batch 1 x 128 tokens, "
          f"{a.threads} threads; {lat}our fp32 model.so {so32 / 2**20:.1f} MiB")
    print(f"{'config':<8} {'build':<16} {'cos min':>8} {'cos mean':>9} {'so/fp32':>8} {'params/fp32':>11} {'build s':>8}")
    for cfg, name, e, so, par, secs in rows:
        cos = np.sum(e * ref, axis=1)
        tail = f"{so:8.3f} {par:11.3f} {secs:8.0f}" if so is not None else f"{'':>8} {'':>11} {'':>8}"
        print(f"{cfg:<8} {name:<16} {cos.min():8.4f} {cos.mean():9.4f} {tail}")
    if ms:
        print(f"{'config':<8} {'ours (gptq) ms':>15} {'ORT MatMulNBits ms':>19} {'ratio':>6}")
        for cfg in configs:
            o, r = ms[f"{cfg['name']} ours"], ms[f"{cfg['name']} ORT"]
            print(f"{cfg['name']:<8} {o:15.2f} {r:19.2f} {o / r:6.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="32:fp16,32,64,128")
    ap.add_argument("--sentences", type=int, default=64, help="MiniLM evaluation sentences (0: no MiniLM)")
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--conv-models", default="")
    ap.add_argument("--conv-calib", type=int, default=16)
    ap.add_argument("--conv-eval", type=int, default=64)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="int4_") as tmp:
        tmp = Path(tmp)
        if a.sentences:
            minilm(a, tmp)
        convs = conv_rows([c for c in a.conv_models.split(",") if c], parse_config(a.configs.split(",")[0]),
                          a.conv_calib, a.conv_eval, tmp) if a.conv_models else []
    if convs:
        print(f"# conv models, {a.configs.split(',')[0]}: output SQNR vs ORT fp32 and top-1 agreement on {a.conv_eval} "
              f"feeds (GPTQ calibrated on {a.conv_calib} others)")
        print(f"{'model':<18} {'rounding':<8} {'SQNR dB':>8} {'top-1 agree':>11} {'so/fp32':>8} {'params/fp32':>11}")
        for name, rnd, sq, agree, so, par in convs:
            print(f"{name:<18} {rnd:<8} {sq:8.2f} {agree:11.3f} {so:8.3f} {par:11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
