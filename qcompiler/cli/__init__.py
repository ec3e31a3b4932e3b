"""The ``qcompile`` command line: flags → :mod:`qcompiler.driver` options → the driver.

    qcompile MODEL.onnx --target x86|arm|cuda --dtype fp32|fp16|int8 -o OUT     compile to an artifact
    qcompile inspect MODEL.onnx [--passes P]                                      IR, op histogram, parameters
    qcompile convert MODEL.onnx -o OUT.onnx [--passes P]                          IR after passes, as ONNX
    qcompile run OUT --input X.npy|X.npz [--output Y.npy]                         run an artifact
             [--rpc-tracker HOST:PORT --rpc-key KEY]                              ... on a remote board
    qcompile verify OUT --data X.npy|X.npz [--qdq F.onnx] [--samples N] [--json]  int8 parity with ONNX Runtime

Bad input of any kind is one line on stderr and exit code 2; nothing the user gave is modified and no
half-written output is left behind.
"""
from __future__ import annotations

import os
import sys

from ..errors import UserError
from .commands import COMMANDS
from .parser import build_parser

EXIT_USER_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "compile")            # `qcompile MODEL.onnx ...` is `qcompile compile ...`
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.list_passes:
            from ..passes import available_passes
            for name, info in available_passes().items():
                print(f"{name:<18} {info.doc.splitlines()[0] if info.doc else ''}")
            return 0
        if args.command is None:
            parser.print_help()
            return EXIT_USER_ERROR
        quiet = getattr(args, "quiet", False)

        def log(msg: str) -> None:
            if not quiet:
                from ..progress import erase
                erase()                       # the compile progress line, if one is drawn
                print(msg, file=sys.stderr)
        import warnings
        warnings.showwarning = lambda m, c, f, l, file=None, line=None: log(f"qcompile: warning: {m}")
        return COMMANDS[args.command](args, log)
    except UserError as e:
        print(f"qcompile: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("qcompile: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug in qcompiler: one line unless QCOMPILE_DEBUG is set
        if os.environ.get("QCOMPILE_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"qcompile: internal error: {type(e).__name__}: {msg} "
              "(set QCOMPILE_DEBUG=1 for a traceback and please report it)", file=sys.stderr)
        return 1


__all__ = ["main", "build_parser", "EXIT_USER_ERROR"]
