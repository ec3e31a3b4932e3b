"""The ``sparsity`` section of the build report (``OUT/report.json``), and what the library is made of.

    sec = sparsity_section(graph, dense_fp32=..., pruned_fp32=..., data=eval_data)
    sec = with_library(sec, OUT / "model.so")

Per layer (conv/gemm with a constant weight, final graph, in order): sparsity before/after pruning,
whether it was pruned or why not, 2:4 compliance, ``format`` (what the artifact stores and runs: the
cost model's choice for ``objective``, which the lowering reads from ``graph.meta["sparsity"]`` to emit
a sparse kernel), the formats best for time and for size, the dense, stored and smallest-encoding bytes.

Pruning's own effect (with ``--sparsity`` and evaluation data): the unpruned and the pruned fp32
graph (``ctx.data["prune.dense_graph"]`` and the graph the quantize pass started from) run on the
held-back data through :func:`qcompiler.plan.report.evaluate`: per layer the SQNR of its
output (the error pruning accumulated up to it; after the residual add for a fused residual conv),
output SQNR, top-1 agreement and, with labels, the top-1 accuracy of both
(the int8 accuracy is in the report's ``evaluation``).

Sizes, measured: the library's ELF sections (``.text`` = kernel code, ``.rodata`` holding TVM's
``__tvm_ffi__library_bin`` = Relax VM bytecode + the constant pool: packed weights, biases,
requantization multipliers). Measured on fashion_mobilenet int8 (x86, AVX-512 VNNI host, 2026-11-22,
before kernels lost their TIR asserts, the constants their int64/float32 widths and the default build
its verify functions: 182 KB on 2026-11-23, see README "Sparsity"): model.so 444,072 B = .text 176,584 (23 kernels, all of distinct shapes, so none is shared; ~6 KB per
tensorized conv) + .eh_frame 16,452 + library_bin 224,565 (constants 177,200: int8 weights 90,944,
int32 18,000, int64 36,000, float32 32,256; the ``debug``/``debug_alone`` functions of ``qcompile
verify`` 30,857; VM bytecode the rest). Conv/gemm weights are 97,616 B of it (22 %): no weight
encoding can bring that model.so to 0.6x; the code and the other constants must shrink too.
The estimate ``library - Σ stored + Σ smallest encoding`` says what the best encodings alone give.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

from ..ir.graph import Graph
from ..passes.prune import summarize
from .report import evaluate, json_round


def elf_sizes(path: str | Path) -> dict[str, int]:
    """Section sizes of an ELF64 little-endian shared library, plus ``library_bin``: the size of
    TVM's ``__tvm_ffi__library_bin`` symbol (the serialized modules: VM bytecode and constants),
    from the static or, in a stripped library, the dynamic symbol table.
    Empty for a file that is not such an ELF."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, link, _info, _al, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        secs.append((name, typ, off, size, link, entsize))
    stroff = secs[shstrndx][2]

    def cstr(base: int, at: int) -> str:
        end = data.index(b"\0", base + at)
        return data[base + at:end].decode(errors="replace")
    out = {cstr(stroff, s[0]): s[3] for s in secs if s[3]}
    for name, typ, off, size, link, entsize in secs:
        if typ not in (2, 11) or not entsize:            # SHT_SYMTAB, SHT_DYNSYM (a stripped library)
            continue
        strtab = secs[link][2]
        for j in range(size // entsize):
            st_name, _i, _o, _sh, _v, st_size = struct.unpack_from("<IBBHQQ", data, off + j * entsize)
            if st_size and cstr(strtab, st_name) == "__tvm_ffi__library_bin":
                out["library_bin"] = st_size
    return out


def sparsity_section(graph: Graph, *, dense_fp32: Graph | None = None, pruned_fp32: Graph | None = None,
                     data=None, budget=None) -> dict:
    """The report's ``sparsity`` dict for the final ``graph``: it reads (never makes) the decision the
    ``encode-sparse`` pass recorded in ``graph.meta["sparsity"]``, the one the lowering builds from."""
    rec = graph.meta.get("sparsity") or {"layers": {}}
    encoded = [r["encoding"] for r in rec["layers"].values() if "encoding" in r]
    objective = encoded[0]["objective"] if encoded else "time"
    rows, dense_total, enc_total, stored_total = [], 0, 0, 0
    for name, r in rec["layers"].items():
        e = r.get("encoding")
        if e is None:
            continue                                    # a float layer that vanished (not in the final graph)
        dense_b, best = e["size"]["dense"], e["format_size"]
        row = {"name": name, "kind": r["kind"], "matrix": r["matrix"], "groups": r["groups"],
               "params": r["params"], "sparsity": r["sparsity"], "sparsity_before": r.get("sparsity_before", 0.0),
               "nm_2_4": r["nm_2_4"], "pruned": bool(r.get("pruned", False)),
               "format": e["format"], "format_time": e["format_time"], "format_size": best, "bits": e["bits"],
               "dense_bytes": dense_b, "encoded_bytes": e["size"][best], "stored_bytes": e["size"][e["format"]],
               "kernel_code_bytes": e.get("code", {}).get(e["format"], 0),
               "time_ratio": json_round(e["time"][e["format_time"]] / e["time"]["dense"])}
        if "skipped" in r:
            row["skipped"] = r["skipped"]
        rows.append(row)
        dense_total += dense_b
        enc_total += e["size"][best]
        stored_total += e["size"][e["format"]]
    sec = {"target": rec.get("target"), "pattern": rec.get("pattern"), "method": rec.get("method"),
           "global": rec.get("global", False),
           "objective": objective, "layers": rows, "weights_dense_bytes": dense_total,
           "weights_encoded_bytes": enc_total, "weights_stored_bytes": stored_total,
           "weights_ratio": json_round(enc_total / max(dense_total, 1)),
           **{k: v for k, v in summarize(rec).items() if k in ("params", "zeros", "sparsity", "pruned_sparsity")}}
    if dense_fp32 is not None and pruned_fp32 is not None and data is not None and data.take > 0:
        pruned = {r["name"] for r in rows}            # every layer: the error accumulated up to it
        # the layer's result in the unpruned graph; the quantize pass splits a fused residual conv but
        # gives the value after the add that name again, so the same name exists in both graphs
        have = {v.name for op in pruned_fp32.ops for v in op.results}
        names = {op.result.name: op.name for op in dense_fp32.ops
                 if op.name in pruned and op.results and op.result.name in have}
        lrows = [{"value": v} for v in names]
        res = evaluate(dense_fp32, pruned_fp32, data, lrows)
        by_layer = {names[lr["value"]]: lr.get("sqnr_db") for lr in lrows}
        for r in rows:
            if r["name"] in by_layer:
                r["pruning_sqnr_db"] = by_layer[r["name"]]
        ev = {"samples": res["samples"], "outputs": res["outputs"]}
        if "accuracy" in res:
            ev["accuracy"] = {"fp32_dense": res["accuracy"]["fp32"], "fp32_pruned": res["accuracy"]["int8"]}
        if budget is not None and budget.budget is not None:
            ev["budget"] = pruning_budget(sec, ev, budget)
        sec["pruning_effect"] = ev
    return sec


def pruning_budget(sec: dict, effect: dict, budget) -> dict:
    """Whether pruning alone (dense vs pruned fp32 on the held-back data) stays within the user's
    budget (:class:`~qcompiler.plan.mixed.BudgetOptions`: ``--max-accuracy-drop`` in points of
    top-1 accuracy, of top-1 agreement with the dense model where the data has no labels, or
    ``--min-sqnr`` in dB of the worst output), with the one-line warning when it does not."""
    outs = [o for o in effect["outputs"] if o.get("sqnr_db") is not None]
    if budget.max_accuracy_drop is not None:
        acc = effect.get("accuracy")
        if acc is not None:
            what, drop = "top-1 accuracy", 100 * (acc["fp32_dense"] - acc["fp32_pruned"])
            detail = f"{100 * acc['fp32_dense']:.2f} % -> {100 * acc['fp32_pruned']:.2f} %"
        else:
            agree = min((o["top1_agreement"] for o in effect["outputs"] if "top1_agreement" in o), default=None)
            if agree is None:
                return {"kind": "max-accuracy-drop", "budget": budget.max_accuracy_drop, "met": None,
                        "note": "the outputs have no classes to compare"}
            what, drop, detail = "top-1 agreement with the dense model", 100 * (1 - agree), f"{100 * agree:.2f} %"
        row = {"kind": "max-accuracy-drop", "budget": budget.max_accuracy_drop, "measured": round(drop, 4),
               "met": drop <= budget.max_accuracy_drop}
        figure = (f"drops {what} by {drop:.2f} points ({detail})", f"the --max-accuracy-drop budget of "
                  f"{budget.max_accuracy_drop:g} points")
    else:
        worst = min(outs, key=lambda o: o["sqnr_db"]) if outs else None
        if worst is None:
            return {"kind": "min-sqnr", "budget": budget.min_sqnr, "met": None, "note": "no output SQNR"}
        row = {"kind": "min-sqnr", "budget": budget.min_sqnr, "measured": worst["sqnr_db"],
               "met": worst["sqnr_db"] >= budget.min_sqnr}
        figure = (f"leaves output {worst['name']} at {worst['sqnr_db']:.2f} dB SQNR against the dense model",
                  f"the --min-sqnr budget of {budget.min_sqnr:g} dB")
    if not row["met"]:
        how = "obc" if sec.get("method") == "obc" else "magnitude"
        target = sec["pattern"] if sec["pattern"] != "unstructured" else f"{100 * sec['target']:g} % unstructured"
        tries = ["a lower --sparsity" if sec["pattern"] != "2:4" else "--sparsity-pattern unstructured with a lower "
                 "--sparsity", "--no-prune NAME on the layers that lose most (report.json sparsity.layers[]."
                 "pruning_sqnr_db)"]
        if how == "magnitude":
            tries.insert(0, "--prune-method obc with --calib DATA (re-fits the kept weights)")
        else:
            tries.append("more --calib-samples")
        row["warning"] = (f"pruning alone ({how}, {target}) {figure[0]} on {effect['samples']} held-back samples, "
                          f"beyond {figure[1]}: try {', '.join(tries[:-1])} or {tries[-1]}")
    return row


def building_library(out_dir: str | Path) -> Path | None:
    """The model.so that :func:`qcompiler.codegen.artifact.write_artifact` (this process) is writing
    for ``out_dir``, in its temporary folder next to it (the report is written before the rename)."""
    out = Path(out_dir).absolute()
    found = sorted(out.parent.glob(f".{out.name}.tmp-{os.getpid()}-*/model.so"))
    return found[0] if found else None


def with_library(sec: dict, library_bytes: int, library: str | Path | None = None) -> dict:
    """Add the measured library breakdown (ELF sections of ``library`` when given) and the estimated
    size of the library with its conv/gemm weights sparse-encoded."""
    elf = elf_sizes(library) if library is not None and Path(library).is_file() else {}
    total = int(library_bytes)
    est = total - sec["weights_stored_bytes"] + sec["weights_encoded_bytes"]
    return {**sec, "library": {
        "bytes": total, "text_bytes": elf.get(".text"), "rodata_bytes": elf.get(".rodata"),
        "library_bin_bytes": elf.get("library_bin"), "eh_frame_bytes": elf.get(".eh_frame"),
        "sparse_layers": sum(r["format"] != "dense" for r in sec["layers"]),
        "sparse_encoded_bytes_estimated": est, "sparse_ratio_estimated": round(est / max(total, 1), 4),
        "note": "model.so stores each conv/gemm weight in its 'format' (sparse ones with a sparse kernel); "
                "the estimate swaps every weight's stored bytes for its size-optimal encoding, kernel code "
                "unchanged"}}


def worth_showing(layers, min_zeros: float | None = None) -> bool:
    """Whether the sparsity rows say anything: a layer pruned, or stored in a sparse format, or (with
    ``min_zeros``, the report's weight column) holding at least that share of zero weights."""
    return any(r["pruned"] or r["format"] != "dense" or (min_zeros is not None and r["sparsity"] >= min_zeros)
               for r in layers)


def format_lines(sec: dict) -> list[str]:
    """A few lines for the text report."""
    pruned = f", {100 * sec['pruned_sparsity']:.1f} % of the pruned layers'" if sec.get("pruned_sparsity") else ""
    s = [f"sparsity: {100 * sec['sparsity']:.1f} % of {sec['params']:,} conv/gemm weights are zero{pruned}"
         + (f" (pruned: {sec['pattern']}, target {sec['target']:g}{', global' if sec['global'] else ''}"
            f"{', ' + sec['method'] if sec.get('method') else ''})"
            if sec.get("target") is not None else " (detected, nothing pruned)")]
    n_sparse = sum(r["format_time"] != "dense" for r in sec["layers"])
    n_stored = sum(r["format"] != "dense" for r in sec["layers"])
    s.append(f"  weights dense {sec['weights_dense_bytes']:,} B, stored {sec['weights_stored_bytes']:,} B "
             f"({n_stored} layers sparse, objective {sec['objective']}), smallest encoding "
             f"{sec['weights_encoded_bytes']:,} B ({sec['weights_ratio']:.2f}x); "
             f"cost model: {n_sparse} of {len(sec['layers'])} layers faster sparse")
    pe = sec.get("pruning_effect")
    if pe:
        o = pe["outputs"][0] if pe["outputs"] else {}
        line = f"  pruning alone (fp32): output SQNR {o.get('sqnr_db')} dB"
        if "top1_agreement" in o:
            line += f", top-1 agreement {100 * o['top1_agreement']:.2f} %"
        if "accuracy" in pe:
            line += (f", accuracy {100 * pe['accuracy']['fp32_dense']:.2f} % -> "
                     f"{100 * pe['accuracy']['fp32_pruned']:.2f} %")
        s.append(line)
    lib = sec.get("library")
    if lib:
        s.append(f"  model.so {lib['bytes']:,} B (code .text {lib['text_bytes'] or 0:,} B, VM+constants "
                 f"{lib['library_bin_bytes'] or 0:,} B); with sparse weights ~{lib['sparse_encoded_bytes_estimated']:,} B "
                 f"({lib['sparse_ratio_estimated']:.2f}x, estimated)")
    return s
