"""The `rangeswa` command: `rangeswa demo`, `rangeswa generate`, `rangeswa score`, `rangeswa sweep`,
`rangeswa judge`, `rangeswa report`, `rangeswa niah`, `rangeswa ppl`, `rangeswa ruler`, `rangeswa bench`, `rangeswa check`,
`rangeswa train-mini`.

Every error a user can cause ends the command with one line on stderr and exit status 2: bad options
are refused by the parser before any work (`arguments`), and what goes wrong later (a missing file, an
output another process holds, a package of an extra that is not installed) is caught here.
"""

from __future__ import annotations

import argparse
import sys

from .arguments import COMMAND_EXTRAS, MissingExtra, Parser, missing_message


def version() -> str:
    """``rangeswa <version> (torch <version>, CPU kernels[ + CUDA kernels])``."""
    import torch

    from . import __version__, ops

    kernels = "CPU + CUDA kernels" if ops.CUDA_KERNELS else "CPU kernels"
    return f"rangeswa {__version__} (torch {torch.__version__}, {kernels})"


class _Version(argparse.Action):
    """``--version``, computed only when asked (it loads the extension)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version, torch's and the kernels built, "
                                                             "then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    from .bench import add_bench_parser
    from .check import add_check_parser
    from .demo import add_demo_parser
    from .eval.judge import add_judge_parser
    from .eval.niah import add_niah_parser
    from .eval.ppl import add_ppl_parser
    from .eval.ruler import add_ruler_parser
    from .eval.score import add_score_parser
    from .eval.sweep import add_sweep_parser
    from .generate import add_generate_parser
    from .mini.pipeline import add_train_mini_parser
    from .report import add_report_parser

    parser = Parser(prog="rangeswa", description="RangeSWA: long generation with diffusion LMs")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_check_parser(sub)
    add_score_parser(sub)
    add_generate_parser(sub)
    add_sweep_parser(sub)
    add_judge_parser(sub)
    add_report_parser(sub)
    add_niah_parser(sub)
    add_ppl_parser(sub)
    add_ruler_parser(sub)
    add_train_mini_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    command = f"rangeswa {args.command}"
    try:
        return int(args.func(args) or 0)
    except MissingExtra as err:
        message = str(err)
    except ImportError as err:  # an optional package imported deep inside, not checked up front
        top = (err.name or "").split(".")[0]
        if top in ("rangeswa_ext", "torch"):
            raise
        message = str(err)
        if isinstance(err, ModuleNotFoundError) and top:
            message = missing_message(command, top, COMMAND_EXTRAS.get(args.command))
    except (ValueError, OSError) as err:
        message = str(err)
    print(f"{command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
