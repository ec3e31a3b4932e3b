"""The calibration source of a compilation, opened once: it hands out the calibration samples,
the held-back evaluation samples of the build report and the selection samples a budget is
measured on, as consecutive windows of one stream.

    src = CalibSource.open(opts.calib, graph.inputs, sensitivity_samples=64)
    src.calibration()     # the quantize pass's Dataset (None: random, drawn by the pass)
    src.reconstruction()  # the samples prune-reconstruct re-fits on (the same; random drawn here)
    src.evaluation()      # EvalData: the next eval_samples samples, or --eval's data
    src.selection()       # EvalData: the samples after those (None: measured on calibration)

    |<- calibration: samples ->|<- evaluation: eval_samples ->|<- selection: sensitivity_samples ->|

With ``source`` RANDOM the stream is the seeded random normal one the quantize pass draws
(``random_samples`` of it), and the evaluation continues it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

from ..errors import UserError
from ..quant.data import Dataset, Preprocess, as_specs, model_batch, open_dataset, random_dataset
from ..plan.report import EvalData
from .options import CalibOptions


@dataclass
class CalibSource:
    opts: CalibOptions
    inputs: list
    batch: int
    preprocess: Preprocess | None
    stream: Dataset | None            # the whole file's stream (None: random)
    sensitivity_samples: int = 0

    @classmethod
    def open(cls, opts: CalibOptions, inputs, *, sensitivity_samples: int = 0) -> "CalibSource":
        """Validate and open ``opts.source`` (once): the calibration, evaluation and selection
        windows are read from this one stream. A missing source is a UserError."""
        if opts.source is None:
            raise UserError("quantization needs calibration data", "--calib",
                            "give --calib DATA.npz|IMAGE_FOLDER, or --calib random to calibrate on noise")
        if opts.samples <= 0:
            raise UserError(f"--calib-samples must be positive, got {opts.samples}", "--calib-samples")
        pre = Preprocess.parse(opts.preprocess) if opts.preprocess else None
        batch = model_batch(as_specs(inputs))
        stream = None
        if not opts.is_random:          # opened once, whole: each window is a prefix of this stream
            stream = open_dataset(opts.source, inputs, preprocess=pre, batch=batch)
            if opts.samples > stream.num_samples:
                warnings.warn(f"{stream.where}: asked for {opts.samples} samples but the data holds "
                              f"{stream.num_samples}; using {stream.num_samples}", stacklevel=2)
        return cls(opts, list(inputs), batch, pre, stream, sensitivity_samples)

    # ---- the three windows --------------------------------------------------------------------
    def calibration(self) -> Dataset | None:
        """The first ``samples`` samples (None: random; the quantize pass draws ``random_samples``)."""
        if self.stream is None:
            return None
        return replace(self.stream, num_samples=min(self.stream.num_samples, self.opts.samples))

    def reconstruction(self) -> Dataset:
        """The samples ``prune-reconstruct`` re-fits the weights on: the calibration window (random:
        the ``random_samples`` the quantize pass draws)."""
        ds = self.calibration()
        return ds if ds is not None else random_dataset(self.inputs, self.opts.random_samples, batch=self.batch)

    def evaluation(self) -> EvalData | None:
        """The build report's data: ``eval_path`` (at most ``eval_samples``), or the ``eval_samples``
        samples of the stream after calibration's; None with ``eval_samples == 0`` (a negative
        count is refused by :meth:`CompileOptions.check`)."""
        o = self.opts
        if o.eval_samples == 0:
            return None
        if o.eval_path is not None:
            ds = open_dataset(o.eval_path, self.inputs, samples=o.eval_samples, preprocess=self.preprocess,
                              batch=self.batch)
            return EvalData(ds, 0, ds.num_samples, o.eval_path)
        if self.stream is None:
            r = o.random_samples
            with warnings.catch_warnings():            # the calibration already warned about random data
                warnings.simplefilter("ignore")
                ds = random_dataset(self.inputs, r + o.eval_samples)     # as the quantize pass draws it
            return EvalData(ds, r, o.eval_samples,
                            f"random normal inputs (seed 0), samples {r}..{r + o.eval_samples - 1} of the "
                            "calibration stream", random=True)
        ds = self._window_stream(o.samples + o.eval_samples)
        used = min(ds.num_samples, o.samples)
        left = ds.num_samples - used
        if left == 0:
            warnings.warn(f"report: {o.source} holds {ds.num_samples} samples, all used for calibration; "
                          "the report evaluates on calibration samples (give --eval DATA or fewer "
                          "--calib-samples for held-back data)", stacklevel=2)
            return EvalData(ds, 0, min(o.eval_samples, ds.num_samples), o.source, held_back=False)
        if left < o.eval_samples:
            warnings.warn(f"report: only {left} samples of {o.source} are left after the {used} used for "
                          f"calibration; evaluating on those {left}", stacklevel=2)
        return EvalData(ds, used, left, o.source)

    def selection(self, evaluation: EvalData | None) -> EvalData | None:
        """Where ``--min-sqnr`` is measured: the ``sensitivity_samples`` samples after the
        calibration and evaluation windows, so that neither the ranges nor the held-back check saw
        them; None (measure on the calibration samples, optimistic) when the source is random, an
        ``--eval`` file is given, or the stream holds no samples past those."""
        if self.stream is None or evaluation is None or not evaluation.held_back \
                or evaluation.source != self.opts.source:
            return None
        skip = evaluation.skip + evaluation.take
        ds = self._window_stream(skip + self.sensitivity_samples)
        left = ds.num_samples - skip
        if left <= 0:
            return None
        take = min(left, self.sensitivity_samples)
        return EvalData(ds, skip, take, f"{self.opts.source} samples {skip}..{skip + take - 1}")

    def _window_stream(self, n: int) -> Dataset:
        """The stream's first ``n`` samples (fewer where it holds fewer)."""
        return replace(self.stream, num_samples=min(self.stream.num_samples, n))
