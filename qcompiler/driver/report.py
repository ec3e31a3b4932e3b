"""The build report of a compilation: OUT/report.json and OUT/report.html (and the DFQ files),
completed once the library exists (its size is part of the report)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..codegen.target import QUANTIZED_DTYPES
from ..plan import mixed, report, report_html, sparse_report
from ..plan.dfq import artifact_files
from ..plan.dfq import report as dfq_report
from .options import CompileOptions


def is_quantized(graph) -> bool:
    """Whether the graph holds integer ops (the quantize pass ran and quantized something)."""
    return any(op.kind.startswith("QLinear") or op.kind in ("QuantizeLinear", "Requantize", "DynamicQLinearGemm")
               for op in graph.ops)


@dataclass
class ReportFiles:
    rep: dict
    quantized: bool
    output: str
    extra: dict = field(default_factory=dict)    # file name -> fn(manifest) -> bytes
    done: dict | None = None

    @classmethod
    def of(cls, g, pm, opts: CompileOptions, *, name: str, ops_before, params_before, evaluation, given,
           output: str) -> "ReportFiles":
        spec, c = opts.target, opts.calib
        data = report_html.compile_data(g, pm, model=name, target=spec.family, dtype=spec.dtype,
                                        ops_before=ops_before, params_before=params_before,
                                        timings=opts.pipeline.time_passes)   # seconds only on request
        quantized = spec.dtype in QUANTIZED_DTYPES and is_quantized(g)
        if quantized:
            calib = getattr(pm.ctx.options.get("quantize"), "calib", None)
            calibration = {"source": c.source, "samples": calib.num_samples if calib is not None
                           else c.random_samples, "method": c.method}
            if c.dynamic:                        # quantize-dynamic: ranges at run time, nothing calibrated
                calibration = {"source": "none: activations quantized at run time", "samples": 0,
                               "method": f"run-time min/max per {c.dynamic_granularity}"}
            elif g.meta.get("prequantized"):       # fold-qdq: the model's own scales, nothing calibrated
                calibration = {"source": "the model's own QuantizeLinear/DequantizeLinear", "samples": 0,
                               "method": "given"}
            rep = report.build_report(
                pm.ctx.data.get("quantize.float_graph"), g, evaluation, percentile=c.percentile,
                model=name, target=spec.family, given=given, calibration=calibration)
            rep.update(data)
            if not c.dynamic:
                rep.update(mixed.report_parts(g, pm.ctx.data.get("mixed") or {}, pm.ctx.options["quantize"], rep))
            if pm.ctx.data.get("layer_costs") is not None:        # per-layer ms, boundaries, slower-than-float
                chosen = (pm.ctx.data.get("mixed") or {}).get("selection", {}).get("float_layers", [])
                rep["latency"] = pm.ctx.data["layer_costs"].to_json(frozenset(chosen))
        else:
            rep = {"format_version": report.FORMAT_VERSION, **data, "layers": report_html.float_layers(g),
                   "size": {"params_fp32_bytes": g.param_count()[1]}}
        if "sparsity" in g.meta:                 # the encode-sparse pass ran (int8, or pruned fp32)
            rep["sparsity"] = sparse_report.sparsity_section(     # a float build is its own pruned fp32 graph
                g, dense_fp32=pm.ctx.data.get("prune.dense_graph"),
                pruned_fp32=pm.ctx.data.get("quantize.float_graph", None if quantized else g), data=evaluation,
                budget=opts.budget)
        w = g.meta.get("weights")
        if w is not None and not quantized:      # quantize-weights (--weights int4): per layer, and the bytes
            stored = g.param_count()[1]
            rep["weights"] = w
            rep["size"] = {**rep["size"], "params_bytes": stored,
                           "params_fp32_bytes": stored - w["scheme"]["bytes"] + w["scheme"]["fp32_bytes"]}
        self = cls(rep, quantized, output)
        eq = g.meta.get("equalize")
        self.extra[report.REPORT] = lambda m: report.to_json(self.full(m))
        self.extra[report_html.HTML_NAME] = lambda m: report_html.render(
            self.full(m), equalization=dfq_report(eq) if eq and eq.get("layers") else None).encode()
        self.extra.update(artifact_files(eq))                   # equalization.svg/.json when equalize ran
        return self

    def full(self, manifest: dict) -> dict:
        """report.json's content, once the library (``manifest``) exists; computed once."""
        if self.done is None:
            rep = self.rep
            r = report.with_library_size(rep, manifest["library"]["bytes"]) if self.quantized else \
                {**rep, "size": {**rep["size"], "library_fp32_bytes": manifest["library"]["bytes"]}}
            if "sparsity" in r:
                r = {**r, "sparsity": sparse_report.with_library(
                    r["sparsity"], manifest["library"]["bytes"], sparse_report.building_library(self.output))}
            self.done = {**r, "warnings": report_html.warnings_of(r)}
        return self.done

    def final(self) -> dict:
        return self.done or {}


def format_text(rep: dict) -> str:
    """The report as the terminal tables ``qcompile`` prints after an int8 build."""
    from ..plan.layer_cost import format_text as latency_text
    text = report.format_table(rep) + mixed.format_text(rep) + latency_text(rep.get("latency"))
    sec = rep.get("sparsity")
    if sec:
        if sparse_report.worth_showing(sec["layers"]):
            text += "\n".join(sparse_report.format_lines(sec)) + "\n"
    return text
