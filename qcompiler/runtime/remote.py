"""Run and time artifacts and kernels on remote boards registered with TVM's RPC tracker.

A device farm runs one ``python -m tvm.exec.rpc_tracker`` and, on every board,
``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``. A client asks the tracker for a
free board of a key; the tracker answers with that board's address, the client opens an RPC
session to it, uploads a library, loads it there and calls its functions on the board's devices
(tensors are copied over the socket). ::

    from qcompiler.runtime import remote
    board = remote.connect("10.0.0.5:9190", "rasp4", timeout=60)
    model = remote.load_remote(board, "OUT")         # checks the manifest and sha256, uploads model.so
    outs = remote.run_batches(model, "x.npy")        # the local batching rules, run on the board
    ms = remote.time_remote(model, outs_feed)        # the VM's time_evaluator there (median ms)

:func:`run_remote` does the last three in one call. The runs reuse
:func:`qcompiler.runtime.batches.run_batches`, so a local and a remote run of the same data slice
it the same way and return the same arrays (bit-identical for the same library on the same CPU).

Only the client side is here; it needs the TVM runtime (``tvm.rpc``) and nothing else. The
tracker needs ``tornado`` (and ``cloudpickle`` for ``tvm.exec``'s launchers) on the host that runs
it. The RPC protocol has no authentication: run trackers and servers on a trusted network only.
"""
from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import UserError
from . import CompiledModel
from .batches import run_batches
from .manifest import LIBRARY, read_manifest

__all__ = ["RemoteBoard", "RemoteModel", "parse_tracker", "connect", "load_remote", "run_remote",
           "time_remote", "run_batches"]

DEFAULT_TIMEOUT = 60.0


@dataclass
class RemoteBoard:
    """An RPC session to one board, as handed out by the tracker."""
    session: Any                  # tvm.rpc.RPCSession
    tracker: str                  # "HOST:PORT" of the tracker
    key: str                      # the device key asked for
    address: str                  # "HOST:PORT" of the board's RPC server

    def __str__(self) -> str:
        return f"board {self.address} (key '{self.key}', tracker {self.tracker})"


def parse_tracker(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> (host, port); anything else is a UserError naming --rpc-tracker."""
    fix = "give the tracker as HOST:PORT, e.g. 127.0.0.1:9190"
    host, sep, port = str(text).strip().rpartition(":")
    host = host.strip("[]")                       # [::1]:9190
    if not sep or not host or not port.isdigit():
        raise UserError(f"'{text}' is not HOST:PORT", "--rpc-tracker", fix)
    if not 0 < int(port) < 65536:
        raise UserError(f"port {port} is out of range 1-65535", "--rpc-tracker", fix)
    return host, int(port)


@contextlib.contextmanager
def _socket_timeout(seconds: float):
    """New Python sockets (the tracker client's) time out after ``seconds``."""
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(old)


def _registered_keys(summary: dict) -> dict[str, int]:
    """key -> number of registered RPC servers, from a tracker summary."""
    keys: dict[str, int] = {}
    for item in summary.get("server_info", []):
        k = str(item.get("key", "")).split(":", 1)[-1]
        keys[k] = keys.get(k, 0) + 1
    return keys


def connect(tracker: str, key: str, timeout: float = DEFAULT_TIMEOUT) -> RemoteBoard:
    """Ask the tracker at ``tracker`` ("HOST:PORT") for a free board registered with ``key`` and
    open an RPC session to it, waiting at most ``timeout`` seconds for one to become free.

    UserErrors: a malformed HOST:PORT, a tracker that cannot be reached or is not a TVM RPC
    tracker, no free board with that key within the timeout, a board that cannot be reached."""
    from tvm.rpc import base, client
    host, port = parse_tracker(tracker)
    where = f"--rpc-tracker {host}:{port}"
    if not key:
        raise UserError("empty device key", "--rpc-key",
                        "give the key the boards' RPC servers registered with (rpc_server --key KEY)")
    if not timeout > 0:
        raise UserError(f"timeout must be positive, got {timeout}", "--rpc-timeout", "give seconds, e.g. 60")
    start_fix = ("start one with `python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port PORT`, or check "
                 "HOST:PORT")
    # TrackerSession retries a refused connection for 60 s: try once ourselves first
    try:
        socket.create_connection((host, port), timeout=min(timeout, 10.0)).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UserError(f"cannot reach an RPC tracker there ({reason})", where, start_fix) from None
    deadline = time.monotonic() + timeout
    try:
        with _socket_timeout(min(timeout, 10.0)):
            tracker_sess = client.TrackerSession((host, port))
        keys = _registered_keys(tracker_sess.summary())
    except (OSError, RuntimeError, ValueError) as e:
        raise UserError(f"not answering as a TVM RPC tracker ({e or type(e).__name__})", where,
                        start_fix) from None
    try:
        sock = tracker_sess._sock
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:                                     # the tracker answers once a board of `key` is free
            base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", 1])
            value = base.recvjson(sock)
        except OSError:                           # socket.timeout included
            value = None
        if value is None or value[0] != base.TrackerCode.SUCCESS:
            if key in keys:
                what = (f"none of the {keys[key]} board(s) registered with key '{key}' became free "
                        f"within {timeout:g} s")
                fix = "try again later, or give a longer --rpc-timeout"
            else:
                known = ", ".join(f"'{k}' ({n})" for k, n in sorted(keys.items())) or "none"
                what = f"no board is registered with key '{key}' (registered keys: {known})"
                fix = "give one of the registered keys with --rpc-key, or start `python -m " \
                      f"tvm.exec.rpc_server --tracker {host}:{port} --key {key}` on a board"
            raise UserError(what, where, fix)
        url, bport, matchkey = value[1]
    finally:
        tracker_sess.close()
    address = f"{url}:{bport}"
    try:
        sess = client.connect(url, bport, matchkey)
    except (OSError, RuntimeError) as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"the tracker gave board {address} for key '{key}', but connecting to it failed "
                        f"({msg})", where, "check that the board's RPC server is running and reachable "
                        "from this machine (rpc_server --custom-addr sets the address it reports)") from None
    return RemoteBoard(sess, f"{host}:{port}", key, address)


class RemoteModel(CompiledModel):
    """An artifact loaded on a board: the same interface as a local :class:`CompiledModel`.

    Calls go through the VM's stateful API (set_input / invoke_stateful / get_output): it returns
    tensors one at a time, which works over RPC also for models with several outputs."""

    def __init__(self, out_dir: Path, manifest: dict[str, Any], device, vm, board: RemoteBoard, rlib):
        super().__init__(out_dir, manifest, device, vm)
        self.board = board
        self._rlib = rlib                            # keep the remote module alive with the VM

    def __repr__(self) -> str:
        return super().__repr__().replace(f" on {self.device}:", f" on {self.device} of {self.board}:")

    def _set(self, arrays: list[np.ndarray]) -> tuple[str, dict[str, int] | None]:
        """Set the inputs of the function that runs ``arrays`` (a dynamic artifact's bucket);
        returns its name and the dynamic dims' sizes."""
        import tvm
        name, arrays, sizes = self.plan(arrays)
        self._vm.set_input(name, *[tvm.runtime.tensor(a, self.device) for a in arrays])
        return name, sizes

    def __call__(self, *arrays, **named) -> list[np.ndarray]:
        name, sizes = self._set(self.bind(*arrays, **named))
        self._vm.invoke_stateful(name)
        n = int(self._vm._get_output_arity(name))
        if n < 0:                                    # a single tensor, not a tuple
            return self.unpad([self._vm._get_output(name).numpy()], sizes)
        return self.unpad([self._vm._get_output(name, i).numpy() for i in range(n)], sizes)


def load_remote(board: RemoteBoard, out_dir: str | Path) -> RemoteModel:
    """Check ``OUT`` as :func:`qcompiler.runtime.load` does (format version, sha256 of model.so),
    upload model.so to the board, load it there and create the Relax VM on the board's CPU (or
    its GPU, for a cuda artifact)."""
    from tvm.runtime.vm import VirtualMachine
    out = Path(out_dir)
    manifest = read_manifest(out)
    where = f"{out} on {board}"
    sess = board.session
    cuda = manifest["target"]["family"] == "cuda"
    try:
        dev = sess.cuda(0) if cuda else sess.cpu(0)
        if cuda and not dev.exist:
            raise UserError("the board has no CUDA device", where,
                            "ask for a board with a GPU (--rpc-key), or compile for a CPU target")
        name = f"qcompiler-{manifest['library']['sha256'][:16]}-{LIBRARY}"
        sess.upload(str(manifest["library_path"]), target=name)
        rlib = sess.load_module(name)
        devices = [dev, sess.cpu(0)] if cuda else [dev]
        vm = VirtualMachine(rlib, devices)
    except UserError:
        raise
    except Exception as e:                           # TVMError / RuntimeError from the board
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"the board could not load {LIBRARY}: {msg}", where,
                        "compile the model for the board's CPU and TVM version (e.g. --target arm "
                        "--cpu cortex-a76 for an aarch64 board)") from None
    return RemoteModel(out, manifest, dev, vm, board, rlib)


def time_remote(model: RemoteModel, inputs: Mapping[str, np.ndarray] | None = None, *, repeats: int = 10,
                min_repeat_ms: int = 50) -> float:
    """Median latency (ms) of one call on the board: the VM's ``time_evaluator`` run
    there (``repeats`` rounds of at least ``min_repeat_ms`` each, after a warm-up call), so the
    network is not timed. ``inputs`` (by input name; default: zeros, dynamic dims at their largest
    size) are copied over once."""
    dims = model.buckets.dims if model.buckets is not None else {}
    feed = dict(inputs or {s.name: np.zeros([dims[d][1] if isinstance(d, str) else d for d in s.shape], s.dtype)
                           for s in model.inputs})
    name, _ = model._set(model.bind(**feed))
    f = model._vm.time_evaluator("invoke_stateful", model.device, number=1, repeat=repeats,
                                 min_repeat_ms=min_repeat_ms)
    return float(np.median(f(name).results)) * 1e3


def first_run(model: CompiledModel, outputs_of: str | Path | np.ndarray | Mapping[str, np.ndarray]):
    """The inputs of the first run that :func:`run_batches` makes of ``data`` (for timing)."""
    from .batches import batch_plan, load_inputs, name_inputs
    if isinstance(outputs_of, (str, Path)):
        arrays = load_inputs(outputs_of, model.inputs)
    elif isinstance(outputs_of, np.ndarray):
        arrays = name_inputs({"": outputs_of}, model.inputs, str(model.out_dir))
    else:
        arrays = name_inputs(outputs_of, model.inputs, str(model.out_dir))
    feed = {}
    for s in model.inputs:
        mode, _ = batch_plan(s, arrays[s.name], str(model.out_dir))
        a = arrays[s.name]
        feed[s.name] = np.ascontiguousarray(a[0] if mode == "sample" else a[:s.shape[0]] if isinstance(s.shape[0], int)
                                            else a)
    return feed


def run_remote(board: RemoteBoard | Any, out_dir: str | Path,
               inputs: str | Path | np.ndarray | Mapping[str, np.ndarray], *, timing: bool = True
               ) -> tuple[dict[str, np.ndarray], float | None]:
    """Run every sample of ``inputs`` through the artifact ``out_dir`` on ``board``.

    ``board``: from :func:`connect`, or any ``tvm.rpc.RPCSession``. Returns ({output name: array}, the median latency in ms of one run on the board measured with
    the first run's inputs, or None without ``timing``)."""
    if not isinstance(board, RemoteBoard):           # a bare tvm.rpc.RPCSession
        board = RemoteBoard(board, "-", "-", "-")
    model = load_remote(board, out_dir)
    outs = run_batches(model, inputs)
    ms = time_remote(model, first_run(model, inputs)) if timing else None
    return outs, ms
