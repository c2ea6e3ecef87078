"""Slurm's hostlist syntax, in-process: `gpu[001-004,007]` <-> gpu001 ... gpu007.

The reconciler reads node lists for every watched job each tick; asking `scontrol show
hostnames` costs a process per list, so the syntax is parsed here instead. What Slurm
accepts (slurm/src/common/hostlist.c, and `man scontrol`, "hostlist expression"):
- a comma-separated list of expressions; commas inside brackets belong to the brackets;
- an expression may hold several bracket groups, expanded as a cartesian product with the
  first group outermost (`r[1-2]n[1-2]` -> r1n1, r1n2, r2n1, r2n2);
- a range `lo-hi` keeps the width of `lo`: `[08-10]` -> 08, 09, 10; `[8-10]` -> 8, 9, 10.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """A node list that is not valid Slurm hostlist syntax; the message quotes it."""


def _split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"hostlist {text!r}: nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"hostlist {text!r}: ']' without '['")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"hostlist {text!r}: '[' without ']'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_group(group: str, whole: str) -> list[str]:
    """The inside of one bracket group: `001-004,007` -> 001 002 003 004 007."""
    out: list[str] = []
    for item in group.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"hostlist {whole!r}: {item!r} is not a number or a range")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise HostlistError(f"hostlist {whole!r}: range {item!r} runs backwards")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_expression(expr: str) -> list[str]:
    # re.split with a capturing group alternates literal, group, literal, ...
    pieces = re.split(r"\[([^\]]*)\]", expr)
    choices = [
        [piece] if i % 2 == 0 else _expand_group(piece, expr) for i, piece in enumerate(pieces)
    ]
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand_hostlist(node_list: str) -> list[str]:
    """Every host of a Slurm hostlist, in Slurm's order (duplicates kept, as Slurm does)."""
    return [host for expr in _split_top_level(node_list) for host in _expand_expression(expr)]


def compress_hostlist(hosts: Iterable[str]) -> str:
    """The shortest-ish hostlist Slurm would print: hosts sharing a prefix and a number width
    become one bracket group of ranges; hosts without a trailing number come first, then by
    prefix and width, then number. Expanding it gives the same set of hosts back."""
    numbered: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for host in dict.fromkeys(hosts):
        match = _TRAILING_NUMBER.match(host)
        if match is None:
            plain.append(host)
        else:
            key = (match.group(1), len(match.group(2)))
            numbered.setdefault(key, []).append(int(match.group(2)))
    exprs = [*sorted(plain)]
    for (prefix, width), numbers in sorted(numbered.items()):
        ranges = _ranges(sorted(numbers))
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            exprs.append(f"{prefix}{ranges[0][0]:0{width}d}")
            continue
        inner = ",".join(
            f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in ranges
        )
        exprs.append(f"{prefix}[{inner}]")
    return ",".join(exprs)


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for n in numbers:
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], n)
        else:
            ranges.append((n, n))
    return ranges
