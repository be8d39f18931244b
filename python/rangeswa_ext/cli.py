"""The `rangeswa` command: `rangeswa demo`, `rangeswa generate`, `rangeswa score`, `rangeswa sweep`,
`rangeswa judge`, `rangeswa report`, `rangeswa niah`, `rangeswa bench`, `rangeswa train-mini`."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from .bench import add_bench_parser
    from .demo import add_demo_parser
    from .eval.judge import add_judge_parser
    from .eval.niah import add_niah_parser
    from .eval.score import add_score_parser
    from .eval.sweep import add_sweep_parser
    from .generate import add_generate_parser
    from .mini.pipeline import add_train_mini_parser
    from .report import add_report_parser

    parser = argparse.ArgumentParser(prog="rangeswa", description="RangeSWA: long generation with diffusion LMs")
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_score_parser(sub)
    add_generate_parser(sub)
    add_sweep_parser(sub)
    add_judge_parser(sub)
    add_report_parser(sub)
    add_niah_parser(sub)
    add_train_mini_parser(sub)
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
