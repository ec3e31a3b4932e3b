"""ONNX LSTM and GRU -> IR, unrolled over the (static) sequence length at import.

The input projection of every time step is one Gemm per direction (``X W^T + b`` on the
``[seq*batch, input]`` matrix, both biases folded in where the formula allows), split into steps;
each step then adds the recurrent Gemm ``h R^T`` and applies the gates with the plain elementwise
ops the code generators already have. Per step and direction an LSTM is 11 ops, a GRU 12::

    LSTM  g = xw[t] + Gemm(h, R, transB=1)           (i, o, f, c gate order, as ONNX)
          s, cc = Split(g, [3H, H]);  i, o, f = Split(Sigmoid(s), [H, H, H])
          c = f*c + i*Tanh(cc);       h = o*Tanh(c)
    GRU   xzr, xh = Split(xw[t], [2H, H]);  z, r = Split(Sigmoid(xzr + h Rzr^T), [H, H])
          linear_before_reset=0: ht = Tanh(xh + (r*h) Rh^T)       (Rbh folded into xw)
          linear_before_reset=1: ht = Tanh(xh + r*(h Rh^T + Rbh))
          h = ht + z*(h - ht)

A missing initial state is zero, and the first step drops the terms it zeroes. ``Y`` is the steps
concatenated (reshaped, and transposed for ``layout=1``), ``Y_h``/``Y_c`` the last step of each
direction. Supported: forward, reverse and bidirectional; layout 0 and 1; optional ``B``,
``initial_h``, ``initial_c``; ``sequence_lens`` absent or a constant equal to the sequence length
for every batch entry; the default activations. Not supported (a UserError naming the node):
other activations, ``clip``, ``input_forget``, non-zero peepholes, shorter or run-time sequence
lengths, and non-constant weights.

ONNX Runtime's com.microsoft ``DynamicQuantizeLSTM`` (its dynamic-int8 LSTM) is the same LSTM with
integer weights, transposed against ONNX's -- W ``[nd, input, 4H]``, R ``[nd, H, 4H]`` (int8 or
uint8; one zero point per direction, scales per direction or per column, inputs 8-11) -- and its
two products quantized at run time as its CPU kernel does (``rnn_helpers.cc`` ComputeGemm, driven
by ``uni_directional_lstm.cc``): DynamicQuantizeLinear's uint8 quantization of the whole
``[seq*batch, input]`` X once, and of the whole ``[batch, H]`` h at every step::

    xw = Cast(MatMulInteger(q_x, W[d], z_x, z_W)) * (s_x * s_W[d])             (one Split into steps)
    g  = (xw[t] + Cast(MatMulInteger(q_h, R[d], z_h, z_R)) * (s_h * s_R[d])) + (Wb + Rb)

in that order (MLAS accumulates the recurrent product onto the input one; the fused bias comes
with the gates), then the LSTM cell above. Same attributes and limits as LSTM, and no ``layout``.
ONNX Runtime running a batch on several threads quantizes h per block of rows instead (its
``batch_parallel_``); this is what it computes on one thread, and for batch 1 on any.
"""
from __future__ import annotations

import numpy as np

from .onnx_qlinear import dynamic_quantize, integer_matmul
from .onnx_registry import converter, nonempty_const, opt_input

_DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}
_GATES = {"LSTM": 4, "GRU": 3}


class _Emitter:
    """Emits the ops of one recurrent node with fresh, readable names (``<node>/<tag>/<k>``)."""

    def __init__(self, b, n):
        self.b, self.n, self.base = b, n, b.node_name(n)
        self.shared: dict = {}

    def op(self, kind, operands, attrs, tag, n_out=1, out=None):
        names = [out] if out else [self.b.fresh(f"{self.base}/{tag}") for _ in range(n_out)]
        res = self.b.emit(self.n, kind, operands, attrs, outputs=names, op_name=names[0], check=out is not None)
        return res if n_out > 1 else res[0]

    def const(self, arr, tag, key=None):
        """A constant value; with ``key``, one shared by every step (the recurrent weights)."""
        if key is not None and key in self.shared:
            return self.shared[key]
        name = self.b.fresh(f"{self.base}/{tag}")
        self.b.set_const(name, np.asarray(arr, order="C"))   # (ascontiguousarray makes 0-d 1-d)
        v = self.b.val(name)
        if key is not None:
            self.shared[key] = v
        return v

    def chain(self, x, steps, out):
        """Apply ``steps`` ([(kind, attrs)]) to ``x`` in turn; the last result is named ``out``."""
        for i, (kind, attrs) in enumerate(steps):
            x = self.op(kind, x if isinstance(x, list) else [x], attrs, kind.lower(),
                        out=out if i == len(steps) - 1 else None)
        return x


class _Rnn:
    """What LSTM and GRU share: attributes, weights, the input projection, the outputs."""

    def __init__(self, b, n, a):
        self.b, self.n = b, n
        self.e = _Emitter(b, n)
        direction = a.get("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise b.fail(n, f"unknown direction '{direction}'", "use forward, reverse or bidirectional")
        self.dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        nd = len(self.dirs)
        acts = a.get("activations")
        if acts is not None and [s.lower() for s in acts] != _DEFAULT_ACTS[self.kind] * nd:
            raise b.fail(n, f"activations {list(acts)} are not supported",
                         f"qcompiler imports {self.kind} with the default activations only")
        if a.get("clip") is not None:
            raise b.fail(n, "the clip attribute is not supported", f"export the {self.kind} without cell clipping")
        if a.get("input_forget", 0):
            raise b.fail(n, "input_forget=1 is not supported", "export the LSTM without coupled input/forget gates")
        self.layout = int(a.get("layout", 0))
        self.x = b.val(n.input[0])
        if self.x.type.rank != 3:
            raise b.fail(n, f"X has shape {list(self.x.shape)}, expected rank 3", "fix the model")
        if self.layout:
            self.batch, self.seq, self.inp = self.x.shape
        else:
            self.seq, self.batch, self.inp = self.x.shape
        G = _GATES[self.kind]
        self.H = H = self.weights(a, nd, G)
        bias = nonempty_const(b, n, 3)
        self.bias = (np.zeros((nd, 2 * G * H), self.x.dtype) if bias is None else bias.astype(self.x.dtype))
        if self.bias.shape != (nd, 2 * G * H):
            raise b.fail(n, f"B has shape {list(self.bias.shape)}, expected {[nd, 2 * G * H]}", "fix the model")
        if opt_input(n, 4) and b.const(n.input[4]) is None:
            raise b.fail(n, "sequence_lens is computed at run time",
                         "qcompiler unrolls full sequences only: drop sequence_lens or make it a constant")
        lens = nonempty_const(b, n, 4)
        if lens is not None and not (lens.reshape(-1) == self.seq).all():
            raise b.fail(n, f"sequence_lens {lens.reshape(-1).tolist()} differ from the sequence length {self.seq}",
                         "qcompiler unrolls full sequences only: pad the inputs to one length and drop sequence_lens")

    def weights(self, a, nd: int, G: int) -> int:
        """Load W and R (ONNX's ``[nd, G*H, input]`` / ``[nd, G*H, H]``); returns hidden_size."""
        b, n = self.b, self.n
        self.w = b.need_const(n, 1, "W").astype(self.x.dtype)
        self.r = b.need_const(n, 2, "R").astype(self.x.dtype)
        H = int(a.get("hidden_size", self.r.shape[-1]))
        if self.w.shape != (nd, G * H, self.inp) or self.r.shape != (nd, G * H, H):
            raise b.fail(n, f"W {list(self.w.shape)} / R {list(self.r.shape)} do not fit {nd} direction(s), "
                         f"hidden_size {H} and input size {self.inp}", "fix the model")
        return H

    # -- inputs ------------------------------------------------------------------------------------
    def steps(self, d: int, bias: np.ndarray) -> list:
        """``X W[d]^T + bias`` for every time step: a list of ``[batch, G*H]`` values."""
        e = self.e
        xw = e.op("Gemm", [self.flat_x(), e.const(self.w[d], "W"), e.const(bias, "B")],
                  {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}, "xw")
        return self.per_step(xw)

    def flat_x(self):
        """X as one ``[seq*batch, input]`` matrix, time-major (made once, shared by the directions)."""
        if "x_flat" not in self.e.shared:
            e, x = self.e, self.x
            if self.layout and self.batch > 1:
                x = e.op("Transpose", [x], {"perm": [1, 0, 2]}, "x_seq_major")
            self.e.shared["x_flat"] = e.op("Reshape", [x], {"shape": [self.seq * self.batch, self.inp]}, "x_flat")
        return self.e.shared["x_flat"]

    def per_step(self, xw) -> list:
        """A ``[seq*batch, N]`` value split into its ``seq`` steps of ``[batch, N]``."""
        if self.seq == 1:
            return [xw]
        return self.e.op("Split", [xw], {"axis": 0, "split": [self.batch] * self.seq}, "xw_t", n_out=self.seq)

    def initial(self, i: int, d: int):
        """Direction ``d`` of the optional initial state input ``i`` as ``[batch, H]``, or None."""
        name = opt_input(self.n, i)
        if name is None:
            return None
        c = self.b.const(name)
        if c is not None and c.size and not c.any():
            return None                                    # a zero constant: same as absent
        v, e, nd = self.b.val(name), self.e, len(self.dirs)
        want = (self.batch, nd, self.H) if self.layout else (nd, self.batch, self.H)
        if v.shape != want:
            raise self.b.fail(self.n, f"input {i} has shape {list(v.shape)}, expected {list(want)}", "fix the model")
        if nd > 1:
            ax = 1 if self.layout else 0
            v = e.op("Slice", [v], {"starts": [d], "ends": [d + 1], "axes": [ax], "steps": [1]}, "state")
        return e.op("Reshape", [v], {"shape": [self.batch, self.H]}, "state")

    def run(self, cell, state_inputs: list[int]) -> None:
        """Unroll ``cell(d, xw_t, state) -> state`` (state[0] is h) and emit the outputs."""
        self.b.g.meta["fixed_batch"] = True       # the Reshapes fix the batch: no batched evaluation
        hs_all, finals = [], []
        for d, direction in enumerate(self.dirs):
            xw = self.steps(d, self.input_bias(d))
            state = [self.initial(i, d) for i in state_inputs]
            order = range(self.seq) if direction == "forward" else reversed(range(self.seq))
            hs = [None] * self.seq
            for t in order:
                state = cell(d, xw[t], state)
                hs[t] = state[0]
            hs_all.append(hs)
            finals.append(state)
        self.outputs(hs_all, finals)

    def outputs(self, hs_all, finals) -> None:
        n, e, b = self.n, self.e, self.b
        nd, S, B, H = len(self.dirs), self.seq, self.batch, self.H
        outs = list(n.output) + [""] * 3
        if outs[0] and b.used(outs[0]):
            per_dir = []
            for hs in hs_all:
                y = hs[0] if S == 1 else e.op("Concat", hs, {"axis": 0}, "y")
                shape = [S, B, 1, H] if self.layout else [S, 1, B, H]
                per_dir.append((y, shape))
            steps = [("Concat", {"axis": 2 if self.layout else 1})] if nd > 1 else []
            if self.layout:
                steps.append(("Transpose", {"perm": [1, 0, 2, 3]}))
            if steps:
                parts = [e.op("Reshape", [y], {"shape": s}, "y") for y, s in per_dir]
                e.chain(parts, steps, outs[0])
            else:
                e.chain(per_dir[0][0], [("Reshape", {"shape": per_dir[0][1]})], outs[0])
        for k in range(len(finals[0])):
            out = outs[1 + k]
            if not (out and b.used(out)):
                continue
            shape = [B, 1, H] if self.layout else [1, B, H]
            lasts = [self.zero_if_none(f[k]) for f in finals]
            if nd == 1:
                e.chain(lasts[0], [("Reshape", {"shape": shape})], out)
            else:
                parts = [e.op("Reshape", [v], {"shape": shape}, "last") for v in lasts]
                e.chain(parts, [("Concat", {"axis": 1 if self.layout else 0})], out)

    def zero_if_none(self, v):
        return v if v is not None else self.e.const(np.zeros((self.batch, self.H), self.x.dtype), "zero")

    def gemm(self, h, w, tag, d, bias=None):
        """``h w^T (+ bias)``; ``w`` and ``bias`` are stored once per direction and ``tag``."""
        ops = [h, self.e.const(w, "R", (tag, d))] + ([self.e.const(bias, "Rb", (tag, d, "b"))] if bias is not None else [])
        return self.e.op("Gemm", ops, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}, tag)


class _Lstm(_Rnn):
    kind = "LSTM"

    def input_bias(self, d):
        H4 = 4 * self.H
        return self.bias[d, :H4] + self.bias[d, H4:]

    def cell(self, d, xw, state):
        e, H = self.e, self.H
        h, c = state
        g = self.gates(d, xw, h)
        s, cc = e.op("Split", [g], {"axis": 1, "split": [3 * H, H]}, "split", n_out=2)
        i, o, f = e.op("Split", [e.op("Sigmoid", [s], {}, "ifo")], {"axis": 1, "split": [H, H, H]}, "gate", n_out=3)
        ic = e.op("Mul", [i, e.op("Tanh", [cc], {}, "cand")], {}, "ic")
        c = ic if c is None else e.op("Add", [e.op("Mul", [f, c], {}, "fc"), ic], {}, "c")
        h = e.op("Mul", [o, e.op("Tanh", [c], {}, "tanh_c")], {}, "h")
        return [h, c]

    def gates(self, d, xw, h):
        """The gates' input ``xw[t] + h R^T`` (the biases are in ``xw``)."""
        return xw if h is None else self.e.op("Add", [xw, self.gemm(h, self.r[d], "hr", d)], {}, "gates")


class _Gru(_Rnn):
    kind = "GRU"

    def __init__(self, b, n, a):
        super().__init__(b, n, a)
        self.lbr = int(a.get("linear_before_reset", 0))

    def input_bias(self, d):
        H, wb, rb = self.H, self.bias[d, :3 * self.H], self.bias[d, 3 * self.H:].copy()
        if self.lbr:
            rb[2 * H:] = 0                    # Rbh stays inside r * (h Rh^T + Rbh)
        return wb + rb

    def cell(self, d, xw, state):
        e, H, (h,) = self.e, self.H, state
        r_w, rbh = self.r[d], self.bias[d, 5 * H:]
        xzr, xh = e.op("Split", [xw], {"axis": 1, "split": [2 * H, H]}, "split", n_out=2)
        if h is None:
            zr = xzr
        elif self.lbr:
            hzr, hh = e.op("Split", [self.gemm(h, r_w, "hr", d, np.concatenate([np.zeros(2 * H, rbh.dtype), rbh]))],
                           {"axis": 1, "split": [2 * H, H]}, "hsplit", n_out=2)
            zr = e.op("Add", [xzr, hzr], {}, "zr")
        else:
            zr = e.op("Add", [xzr, self.gemm(h, r_w[:2 * H], "hzr", d)], {}, "zr")
        z, r = e.op("Split", [e.op("Sigmoid", [zr], {}, "zr_act")], {"axis": 1, "split": [H, H]}, "gate", n_out=2)
        if h is None:
            rec = e.op("Mul", [r, e.const(rbh, "Rbh", ("rbh", d))], {}, "rh") if self.lbr and rbh.any() else None
        elif self.lbr:
            rec = e.op("Mul", [r, hh], {}, "rh")
        else:
            rec = self.gemm(e.op("Mul", [r, h], {}, "rh"), r_w[2 * H:], "hh", d)
        pre = xh if rec is None else e.op("Add", [xh, rec], {}, "cand_pre")
        ht = e.op("Tanh", [pre], {}, "cand")
        if h is None:                          # h = (1 - z) * ht
            return [e.op("Sub", [ht, e.op("Mul", [z, ht], {}, "zh")], {}, "h")]
        return [e.op("Add", [ht, e.op("Mul", [z, e.op("Sub", [h, ht], {}, "dh")], {}, "zdh")], {}, "h")]


class _QLstm(_Lstm):
    """com.microsoft DynamicQuantizeLSTM: integer W, R with their scales and zero points (inputs
    8-11), every product computed as ONNX Runtime's kernel computes it (see the module docstring)."""

    def weights(self, a, nd: int, G: int) -> int:
        b, n = self.b, self.n
        if "layout" in a:
            raise b.fail(n, "has a layout attribute", "DynamicQuantizeLSTM takes time-major X only: drop layout")
        for i, what in ((8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point")):
            if not opt_input(n, i):
                raise b.fail(n, f"input {i} ({what}) is missing", "DynamicQuantizeLSTM needs W_scale, "
                             "W_zero_point, R_scale and R_zero_point: fix the model")
        w, r = b.need_const(n, 1, "W"), b.need_const(n, 2, "R")
        H = int(a.get("hidden_size", r.shape[1] if r.ndim == 3 else 0))
        if w.shape != (nd, self.inp, G * H) or r.shape != (nd, H, G * H):
            raise b.fail(n, f"W {list(w.shape)} / R {list(r.shape)} do not fit {nd} direction(s), hidden_size {H} "
                         f"and input size {self.inp} (DynamicQuantizeLSTM's W is [nd, input, 4H], R [nd, H, 4H])",
                         "fix the model")
        self.qw = [self._quantized(w, 8, "W", nd, G * H, d) for d in range(nd)]
        self.qr = [self._quantized(r, 10, "R", nd, G * H, d) for d in range(nd)]
        return H

    def _quantized(self, w: np.ndarray, i: int, what: str, nd: int, cols: int, d: int) -> tuple[str, str, str]:
        """Direction ``d`` of integer weight ``w`` with its scale (input ``i``) and zero point (input
        ``i + 1``) as the constant names (w, scale, zero point) ``integer_matmul`` takes. ONNX Runtime
        subtracts one zero point per direction (its first), so the others must equal it."""
        b, n, e = self.b, self.n, self.e
        s, z = b.need_const(n, i, f"{what}_scale"), b.need_const(n, i + 1, f"{what}_zero_point")
        if w.dtype not in (np.int8, np.uint8) or z.dtype != w.dtype or s.dtype != np.float32:
            raise b.fail(n, f"{what} is {w.dtype} with a {s.dtype} scale and a {z.dtype} zero point",
                         f"DynamicQuantizeLSTM takes an int8 or uint8 {what}, a zero point of that type "
                         "and a float32 scale")
        for v, part in ((s, "scale"), (z, "zero_point")):
            if v.shape not in ((nd,), (nd, cols)):
                raise b.fail(n, f"{what}_{part} has shape {list(v.shape)}, expected {[nd]} (per tensor) or "
                             f"{[nd, cols]} (per column)", "fix the model")
        if nd > 1 and s.ndim == 2 and z.ndim == 1:
            raise b.fail(n, f"{what}_scale is per column but {what}_zero_point per tensor",
                         "give both per tensor or both per column: ONNX Runtime misreads the mix")
        zd = z.reshape(nd, -1)[d]
        if (zd != zd[0]).any():
            raise b.fail(n, f"the zero points of {what} differ along its columns",
                         "ONNX Runtime's DynamicQuantizeLSTM takes one zero point per direction")
        sd = s.reshape(nd, -1)[d]
        return (e.const(w[d], what).name, e.const(sd if sd.size > 1 else sd.reshape(()), f"{what}_scale").name,
                e.const(zd[0].reshape(()), f"{what}_zero_point").name)

    def steps(self, d: int, bias) -> list:
        """``X W[d]`` for every time step, X quantized once, as one matrix (the biases come later)."""
        if "x_q" not in self.e.shared:
            self.e.shared["x_q"] = dynamic_quantize(self.b, self.n, self.flat_x().name, "x")
        return self.per_step(integer_matmul(self.b, self.n, self.e.shared["x_q"], *self.qw[d], f"xw{d}"))

    def gates(self, d, xw, h):
        """``(xw[t] + h R) + (Wb + Rb)``, in ONNX Runtime's order: the recurrent product accumulates
        onto the input one, the fused bias is added last (absent or zero: no add)."""
        b, n, e = self.b, self.n, self.e
        g = xw
        if h is not None:
            hr = integer_matmul(b, n, dynamic_quantize(b, n, h.name, f"h{d}"), *self.qr[d], f"hr{d}")
            g = e.op("Add", [xw, hr], {}, "gates")
        bias = self.input_bias(d)
        return e.op("Add", [g, e.const(bias, "B", ("bias", d))], {}, "biased") if bias.any() else g


def _no_peepholes(b, n) -> None:
    p = b.const(n.input[7]) if opt_input(n, 7) else None
    if opt_input(n, 7) and (p is None or p.any()):
        raise b.fail(n, "peephole weights P are not supported", "export the LSTM without peepholes (or with P = 0)")


@converter("LSTM")
def _lstm(b, n, a):
    rnn = _Lstm(b, n, a)
    _no_peepholes(b, n)
    rnn.run(rnn.cell, [5, 6])


@converter("DynamicQuantizeLSTM")
def _dynamic_quantize_lstm(b, n, a):
    rnn = _QLstm(b, n, a)
    _no_peepholes(b, n)
    rnn.run(rnn.cell, [5, 6])


@converter("GRU")
def _gru(b, n, a):
    rnn = _Gru(b, n, a)
    rnn.run(rnn.cell, [5])
