"""Planners that compile, time or evaluate the model to decide how to build it, and the reports.

    mixed.py          which layers stay float: --keep-float, --sensitivity, --accuracy-budget
    sensitivity.py    per-layer sensitivity (only this layer int8 / only this layer float)
    select.py         the greedy selection under an accuracy budget, with its bootstrap bound
    layer_cost.py     per-layer int8 and float kernel times on the target (compiled and timed)
    dfq.py            the data-free quantization recipe (--equalize, --bias-correction) and its report
    report.py         the build report: the int8 model against fp32 on held-back data
    sparse_report.py  the sparsity section of the report
    report_html.py    report.html, the self-contained page of the build report

This package sits above :mod:`qcompiler.codegen` and :mod:`qcompiler.passes` (it runs both); the
quantization maths it uses live below them in :mod:`qcompiler.quant`.
"""
