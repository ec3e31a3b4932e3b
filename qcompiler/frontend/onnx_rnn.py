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
"""
from __future__ import annotations

import numpy as np

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
        self.b.set_const(name, np.ascontiguousarray(arr))
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
        self.b, self.n, self.kind = b, n, n.op_type
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
        self.w = b.need_const(n, 1, "W").astype(self.x.dtype)
        self.r = b.need_const(n, 2, "R").astype(self.x.dtype)
        H = int(a.get("hidden_size", self.r.shape[-1]))
        self.H = H
        if self.w.shape != (nd, G * H, self.inp) or self.r.shape != (nd, G * H, H):
            raise b.fail(n, f"W {list(self.w.shape)} / R {list(self.r.shape)} do not fit {nd} direction(s), "
                         f"hidden_size {H} and input size {self.inp}", "fix the model")
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

    # -- inputs ------------------------------------------------------------------------------------
    def steps(self, d: int, bias: np.ndarray) -> list:
        """``X W[d]^T + bias`` for every time step: a list of ``[batch, G*H]`` values."""
        e, x = self.e, self.x
        if self.layout and self.batch > 1:
            x = e.op("Transpose", [x], {"perm": [1, 0, 2]}, "x_seq_major")
        flat = e.op("Reshape", [x], {"shape": [self.seq * self.batch, self.inp]}, "x_flat")
        xw = e.op("Gemm", [flat, e.const(self.w[d], "W"), e.const(bias, "B")],
                  {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}, "xw")
        if self.seq == 1:
            return [xw]
        return e.op("Split", [xw], {"axis": 0, "split": [self.batch] * self.seq}, "xw_t", n_out=self.seq)

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
    def input_bias(self, d):
        H4 = 4 * self.H
        return self.bias[d, :H4] + self.bias[d, H4:]

    def cell(self, d, xw, state):
        e, H = self.e, self.H
        h, c = state
        g = xw if h is None else e.op("Add", [xw, self.gemm(h, self.r[d], "hr", d)], {}, "gates")
        s, cc = e.op("Split", [g], {"axis": 1, "split": [3 * H, H]}, "split", n_out=2)
        i, o, f = e.op("Split", [e.op("Sigmoid", [s], {}, "ifo")], {"axis": 1, "split": [H, H, H]}, "gate", n_out=3)
        ic = e.op("Mul", [i, e.op("Tanh", [cc], {}, "cand")], {}, "ic")
        c = ic if c is None else e.op("Add", [e.op("Mul", [f, c], {}, "fc"), ic], {}, "c")
        h = e.op("Mul", [o, e.op("Tanh", [c], {}, "tanh_c")], {}, "h")
        return [h, c]


class _Gru(_Rnn):
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


@converter("LSTM")
def _lstm(b, n, a):
    rnn = _Lstm(b, n, a)
    p = b.const(n.input[7]) if opt_input(n, 7) else None
    if opt_input(n, 7) and (p is None or p.any()):
        raise b.fail(n, "peephole weights P are not supported", "export the LSTM without peepholes (or with P = 0)")
    rnn.run(rnn.cell, [5, 6])


@converter("GRU")
def _gru(b, n, a):
    rnn = _Gru(b, n, a)
    rnn.run(rnn.cell, [5])
