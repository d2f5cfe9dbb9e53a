"""Command-line values of the benchmark commands, parsed and checked in one place.

Each parser takes the text of one argument and returns its value, or raises
``argparse.ArgumentTypeError`` (argparse then exits with status 2 and a message naming the
option and the text), so a bad value is refused before any work starts:

* :func:`capacity` -- ``65536``, ``2**16`` or ``2^16``; 1 .. :data:`MAX_CAPACITY`.
* :func:`csv` -- ``a,b,c`` as a list, each part converted.
* :func:`grid_value` / :func:`grid_param` -- a parameter grid ``K=2,4,8`` as ``("K", [2, 4, 8])``.
* :func:`positive_int`, :func:`non_negative_int`, :func:`positive_float` -- counts and durations.
* :func:`run_id` -- one safe path component (:func:`check_run_id`).
* :func:`out_dir` -- a folder a run folder can be made in (:func:`check_out_dir`).

:func:`add_output_options` adds the options every command that writes a run folder has;
:func:`config_error` words a config's refusal (``ConfigError``, raised by a ``validate``
after parsing) as the option that sets the refused field, and exits the same way.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

__all__ = ["MAX_CAPACITY", "capacity", "csv", "config_value", "key_value", "grid_value", "grid_param", "positive_int", "non_negative_int",
           "positive_float", "check_run_id", "run_id", "check_out_dir", "out_dir", "add_output_options",
           "config_error"]

#: Largest capacity a command line may ask for: slot indices and ring tickets are int64.
MAX_CAPACITY = 2**62

_RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def capacity(text: str) -> int:
    """``65536``, ``2**16`` or ``2^16`` -> 65536, within 1 .. MAX_CAPACITY."""
    try:
        for op in ("**", "^"):
            if op in text:
                base, exp = (int(part) for part in text.split(op))
                # a huge exponent would take long to compute before being refused
                value = base**exp if 0 <= exp <= 64 and 0 <= base <= MAX_CAPACITY else 0
                break
        else:
            value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"capacity must be an integer or 2**N, got {text!r}") from None
    if value < 1 or value > MAX_CAPACITY:
        raise argparse.ArgumentTypeError(f"capacity must be between 1 and 2**62, got {text!r}")
    return value


def csv(convert=str):
    """A parser of comma-separated lists whose parts go through ``convert``."""
    def parse(text: str) -> list:
        return [convert(part.strip()) for part in text.split(",") if part.strip()]
    return parse


def grid_value(text: str):
    """A grid value: int (also 2**N), float, true/false, else the string.

    Typing against what the variants declare happens when the suite is expanded
    (``bench.scenarios.micro``), so ``K=abc`` is refused there with the variant's reason.
    """
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if "**" in text:
        return capacity(text)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a grid value must be finite, got {text!r}")
    return value


def grid_param(text: str) -> tuple[str, list]:
    """``K=2,4,8`` -> ``("K", [2, 4, 8])``."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parsed = [grid_value(v.strip()) for v in values.split(",") if v.strip()]
    if not sep or not key or not parsed:
        raise argparse.ArgumentTypeError(f"--param takes key=v1,v2,..., got {text!r}")
    return key, parsed


def _int_at_least(low: int):
    """argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    return parse


#: An integer >= 1 (counts of processes, values).
positive_int = _int_at_least(1)
#: An integer >= 0 (warm-ups, loops: 0 means pyperf's own calibration).
non_negative_int = _int_at_least(0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def config_value(text: str):
    """``3`` -> 3, ``1e-3`` -> 0.001, ``true`` -> True, ``64,64`` -> (64, 64), else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if "," in text:
        return tuple(config_value(p) for p in text.split(",") if p)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def key_value(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> ``(key, config_value(value))`` (``--param``, ``--set``); an
    ArgumentTypeError for text without ``=`` or a key."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), config_value(value.strip())


def check_run_id(value: str) -> str:
    """``value`` if it is one path component of ``[A-Za-z0-9._-]`` not starting with '.'.

    Raises ValueError naming ``--run-id`` otherwise: a run folder is always a direct child of
    the output folder (no ``..``, no absolute or nested paths, no hidden folders).
    """
    if not isinstance(value, str) or not _RUN_ID.fullmatch(value):
        raise ValueError(f"--run-id must be one path component of letters, digits, '.', '_' and '-' "
                         f"that does not start with '.', got {value!r}")
    return value


def run_id(text: str) -> str:
    """argparse type for ``--run-id`` (see :func:`check_run_id`)."""
    try:
        return check_run_id(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def check_out_dir(value) -> str:
    """``value`` if a run folder can be made under it: every part of the path that exists is
    a folder, and the deepest that exists is writable (the rest is created with the run).

    Raises ValueError naming ``--out``, the path and the part that is in the way otherwise, so
    a run is refused before any work instead of failing when it creates its folder.
    Cost: one ``stat`` per existing part of the path.
    """
    path = Path(str(value)).expanduser()
    for part in (path, *path.parents):
        if not part.exists():
            continue
        if not part.is_dir():
            raise ValueError(f"--out must be a folder (created when missing), got {str(value)!r}: {part} is a "
                             f"file, not a folder")
        if not os.access(part, os.W_OK | os.X_OK):
            raise ValueError(f"--out {str(value)!r}: cannot create folders in {part} (no write permission)")
        break
    return str(value)


def out_dir(text: str) -> str:
    """argparse type for ``--out`` (see :func:`check_out_dir`)."""
    try:
        return check_out_dir(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_output_options(parser: argparse.ArgumentParser, run_id_help: str) -> None:
    """Add ``--out``, ``--run-id`` (help ``run_id_help``), ``--machine`` and ``--no-progress``:
    where the run folder goes, its name, the machine label of its rows, and no progress bar."""
    parser.add_argument("--out", type=out_dir, default="results",
                        help="folder that receives <run_id>/ (default: results)")
    parser.add_argument("--run-id", type=run_id, help=run_id_help)
    parser.add_argument("--machine", help="machine label for the rows (default: host name)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_error(parser: argparse.ArgumentParser, err, fields, renamed: dict | None = None):
    """Exit with status 2 (``parser.error``): ``argument OPTION: err``, OPTION the option that
    sets ``err.field`` (``err`` an ``impl.rl.algorithms.base.ConfigError``).

    OPTION is ``renamed[field]`` where the command names the field differently, else
    ``--field-name`` (underscores as dashes) for a field in ``fields`` (the fields the
    command's own options set), else ``--set`` (a field only ``--set KEY=VALUE`` sets).
    """
    renamed = renamed or {}
    if err.field in renamed:
        option = renamed[err.field]
    elif err.field in fields:
        option = "--" + err.field.replace("_", "-")
    else:
        option = "--set"
    parser.error(f"argument {option}: {err}")
