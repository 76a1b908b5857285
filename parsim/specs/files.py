"""The edge with the file system: input files read whole and checked, outputs written whole.

Reading (``read_text``, ``read_mapping``): a model, cluster, profile, plan, matrix or space
file must be a regular file of at most ``MAX_INPUT_BYTES``, UTF-8 text, one YAML (or JSON)
document without duplicate keys, nested at most ``MAX_DEPTH`` deep, with at most
``MAX_VALUES`` values once YAML aliases are followed (a "billion laughs" document is refused
before anything walks it), and mapping keys that are strings or integers. Any other file is
one SpecError naming what was read, the path and what is allowed.

Writing (``check_output_path``, ``output_file``, ``write_text``): an output path is checked
before the long work that produces it (``check_output_path``: not a directory, no file where a
parent directory must be, a parent we can create a file in), and written to a temporary file
in the same directory that is renamed over the target only once it is complete
(``os.replace`` is atomic within a filesystem, POSIX rename(2)), so a full disk or a crash
leaves the old file (or none) and never a partial one.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError

MAX_INPUT_BYTES = 64 * 2**20     # the largest calibrated profile today is ~30 KiB
MAX_DEPTH = 64                   # the deepest shipped file (a profile's tables) nests 5 levels
MAX_VALUES = 1_000_000           # values in a document, counting each use of a YAML alias


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a regular file (a leading byte-order mark dropped)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise SpecError(what, str(path), "a file, not a directory")
        if not path.is_file():
            raise SpecError(what, str(path), "an existing regular file")
        size = path.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise SpecError(what, str(path), f"a file of at most {MAX_INPUT_BYTES // 2**20} MiB (it has {size:,} bytes)")
        data = path.read_bytes()
    except OSError as e:
        raise SpecError(what, str(path), f"a readable file ({e.strerror or e.__class__.__name__})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(what, str(path), f"UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8; "
                        "is it a binary file?)") from None
    return text[1:] if text.startswith("\ufeff") else text


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (YAML 1.2, section 3.2.1.1:
    keys are unique; PyYAML would keep the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, f"unhashable key {key!r}",
                                                        key_node.start_mark) from None
            if duplicate:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int):
        super().__init__(key, line)
        self.key, self.line = key, line


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k, None)
        out[k] = v
    return out


def parse_document(text: str, what: str, source: str, as_json: bool = False) -> Any:
    """One YAML (or JSON) document, checked as the module docstring says."""
    kind = "JSON" if as_json else "YAML"
    try:
        if as_json:
            data = json.loads(text, object_pairs_hook=_json_pairs)
        else:
            data = yaml.load(text, Loader=_StrictLoader)   # noqa: S506 -- a SafeLoader subclass
    except _DuplicateKey as e:
        where = f" (line {e.line})" if e.line else ""
        raise SpecError(what, source, f"a {kind} file without repeated keys: {e.key!r} appears twice{where}") from None
    except RecursionError:
        raise SpecError(what, source, f"a {kind} file nested at most {MAX_DEPTH} levels deep") from None
    except (yaml.YAMLError, ValueError) as e:     # json.JSONDecodeError is a ValueError; so are
        detail = _problem(e)                      # integers past Python's 4300-digit limit
        raise SpecError(what, source, f"a valid {kind} file ({detail})") from None
    check_tree(data, what, source)
    return data


def _problem(e: Exception) -> str:
    """One line: what the parser found and where."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if problem and mark is not None:
        return f"{e.__class__.__name__}: {problem} at line {mark.line + 1}, column {mark.column + 1}"
    return f"{e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def check_tree(data: Any, what: str, source: str) -> None:
    """Depth, size and key types of a parsed document (iteratively: no recursion to exhaust)."""
    budget = MAX_VALUES
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise SpecError(what, source, f"a file of at most {MAX_VALUES:,} values (YAML aliases count each time "
                            "they are used)")
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise SpecError(what, source, f"a file nested at most {MAX_DEPTH} levels deep")
            if isinstance(node, dict):
                for k in node:
                    if isinstance(k, bool) or not isinstance(k, (str, int)):
                        raise SpecError(what, source, f"mapping keys that are names (found the key {k!r} of type "
                                        f"{type(k).__name__})")
                stack.extend((v, depth + 1) for v in node.values())
            else:
                stack.extend((v, depth + 1) for v in node)


def read_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML (or, for a ``.json`` path, JSON) file holding a mapping."""
    path = Path(path)
    data = parse_document(read_text(path, what), what, str(path), as_json=path.suffix == ".json")
    if not isinstance(data, dict):
        raise SpecError(what, str(path), "a file holding a mapping of keys to values")
    return data


def path_exists(path: str | Path) -> bool:
    """``Path.exists`` that answers False for names the OS refuses (too long, a NUL byte)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def finite_number(value: Any) -> bool:
    """True for an int or a finite float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


# ----------------------------------------------------------------------------------------- outputs

def finite_json(obj: Any, default=None) -> str:
    """``json.dumps`` with every non-finite float written as ``null``: JSON has no NaN or
    infinity (RFC 8259, section 6), and no NaN or inf may leave the program as a number."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if default is not None and not isinstance(x, (str, int, float, bool, type(None))):
            return clean(default(x))
        return x
    return json.dumps(clean(obj), allow_nan=False)


def check_output_path(path: str | Path, what: str = "out") -> Path:
    """Fail now, before the work that produces it, if ``path`` cannot be written: it is a
    directory, a parent is a file, or the nearest existing parent does not take a new file."""
    path = Path(path)
    if str(path) in ("", "."):
        raise SpecError(what, str(path), "a file path")
    if path.is_dir():
        raise SpecError(what, str(path), "a file path, not a directory")
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():
            raise SpecError(what, str(path), f"a path whose parent {parent} is not a dangling link")
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(what, str(path), f"a path under a directory ({parent} is a file)")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise SpecError(what, str(path), f"a path in a writable directory ({parent}: "
                        f"{e.strerror or e.__class__.__name__})") from None
    return path


def check_output_dir(path: str | Path, what: str = "out") -> Path:
    """As ``check_output_path``, for a directory that will be created (or already exists)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise SpecError(what, str(path), "a directory (it is a file)")
    if path.is_dir():
        check_output_path(path / ".parsim-write-check", what)
        return path
    return check_output_path(path, what)


@contextmanager
def output_file(path: str | Path, what: str = "out") -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers choose the same format) that
    becomes ``path`` when the block ends without an exception; otherwise it is removed. A
    failed write (a full disk) is a SpecError naming ``what`` and the path; nothing is left."""
    path = check_output_path(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise SpecError(what, str(path), f"a writable path ({e.strerror or e.__class__.__name__})") from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:       # the data is on the disk before the name points at it
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SpecError(what, str(path), f"a path with room to write it ({e.strerror or e.__class__.__name__}; "
                        "nothing was written)") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str, what: str = "out") -> Path:
    """Write ``text`` to ``path`` whole (``output_file``)."""
    with output_file(path, what) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes, what: str = "out") -> Path:
    with output_file(path, what) as tmp:
        tmp.write_bytes(data)
    return Path(path)
