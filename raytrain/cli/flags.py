"""Argument types for the command line: each flag is checked as carefully as a job spec.

argparse calls these on the flag's text; an ArgumentTypeError becomes
`raytrain CMD: error: argument --FLAG: <message>` and exit code 2, so every message names the
value, what it must be, and how to fix it.

    parser.add_argument("--nodes", type=whole(at_least=1), default=8)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable


def whole(at_least: int = 1, at_most: int | None = None) -> Callable[[str], int]:
    """A whole number in [at_least, at_most]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number. To fix: give one such as {at_least}") from None
        if value < at_least or (at_most is not None and value > at_most):
            bounds = f"from {at_least} to {at_most}" if at_most is not None \
                else f"at least {at_least}"
            raise argparse.ArgumentTypeError(
                f"{value} is out of range. To fix: give a whole number {bounds}")
        return value

    parse.__name__ = "whole number"
    return parse


def number(above: float | None = None, at_least: float | None = None,
           at_most: float | None = None) -> Callable[[str], float]:
    """A finite number, greater than `above` or at least `at_least`, and at most `at_most`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number. To fix: give one such as 1.5") from None
        low_ok = (above is None or value > above) and (at_least is None or value >= at_least)
        if not math.isfinite(value) or not low_ok or (at_most is not None and value > at_most):
            parts = []
            if above is not None:
                parts.append(f"greater than {above:g}")
            if at_least is not None:
                parts.append(f"at least {at_least:g}")
            if at_most is not None:
                parts.append(f"at most {at_most:g}")
            raise argparse.ArgumentTypeError(
                f"{text} is out of range. To fix: give a number " + " and ".join(parts))
        return value

    parse.__name__ = "number"
    return parse


def existing_file(text: str) -> Path:
    """A path to a readable file."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"{text} is not a file{' (it does not exist)' if not path.exists() else ''}. "
            "To fix: give the path of an existing file")
    return path


port = whole(at_least=1, at_most=65535)


def notice_seconds(text: str) -> float | None:
    """Seconds of notice (0 to 3600), or 'cloud' (None): the offer's cloud's own notice."""
    if text.strip().lower() == "cloud":
        return None
    return number(at_least=0, at_most=3600)(text)
