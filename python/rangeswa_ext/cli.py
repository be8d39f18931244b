"""The `rangeswa` command: `rangeswa bench`, `rangeswa score`, `rangeswa generate`, `rangeswa sweep`,
`rangeswa niah`."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from .bench import add_bench_parser
    from .eval.niah import add_niah_parser
    from .eval.score import add_score_parser
    from .eval.sweep import add_sweep_parser
    from .generate import add_generate_parser

    parser = argparse.ArgumentParser(prog="rangeswa", description="RangeSWA: long generation with diffusion LMs")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    add_score_parser(sub)
    add_generate_parser(sub)
    add_sweep_parser(sub)
    add_niah_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"rangeswa {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
