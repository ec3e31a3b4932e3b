"""Where a kernel's epilogue stage ("out": bias, activation, the output's own layout and dtype)
runs: inlined into the accumulator's write-back where it reads the accumulator element for
element, else under the kernel's parallel loop, on the tile that loop has just accumulated."""
from __future__ import annotations


def join(sch, out, at=None) -> bool:
    """Join ``out`` to the accumulator's write-back; False where it must stay a nest of its own.

    An output laid out differently from the accumulator (plain NCHW from NCHW16c; output channels
    padded to whole vectors, :func:`..kernels.conv.padded_channels`, of which it keeps k) cannot be
    inlined (:func:`covers_producers`). It is computed under the kernel's parallel loop ``at``
    where given, reading each tile while it is in cache, instead of in a nest of its own over the
    whole accumulator after the main loop. MTCNN-PNet's 3->10 conv at 238x318, its accumulator
    padded to 16 lanes: 3.3 ms with the nest of its own (a cold 4.8 MB accumulator, an index
    division per element), 0.7-1.0 ms under the row loop (1.0 ms before on 2-lane blocks). TVM 0.27
    cannot bound every such region: a 4-channel-blocked output of a 16-lane accumulator over
    several blocks reads ``acc[.., c4 // 4, .., c4 % 4 * 4 + ci]``, whose pattern its region
    analysis rejects; that output keeps the nest of its own."""
    if covers_producers(sch, out):
        try:
            sch.reverse_compute_inline(out)
            return True
        except Exception:  # noqa: BLE001 - TVM raises its own error types for an illegal inline
            pass
    if at is not None:
        try:
            sch.reverse_compute_at(out, at, preserve_unit_loops=True)
            return True
        except Exception:  # noqa: BLE001 - a region TVM cannot bound: the whole-tensor nest
            pass
    return False


def covers_producers(sch, blk) -> bool:
    """Whether ``blk`` has as many iterations as each buffer it reads from a producer block has
    elements. Reverse-inlining a consumer that reads only part of its producer (an accumulator padded
    to a register of 4 output channels, of which the output keeps 1: ``out[c] = f(acc[4c])``) is
    wrong in TVM 0.27: it solves the producer's index for the consumer's ``c = 0`` and drops the
    lane, so every padded lane's write-back stores into the same output element and the last one,
    a padding channel, wins (a one-channel int8 conv head returned its bias alone)."""
    n = 1
    for iv in sch.get(blk).iter_vars:
        n *= int(iv.dom.extent)
    read = {r.source for r in sch.get(blk).reads}
    for prod in sch.get_producers(blk):
        for w in sch.get(prod).writes:
            if w.source in read:
                size = 1
                for d in w.source.shape:
                    size *= int(d)
                if size != n:
                    return False
    return True
