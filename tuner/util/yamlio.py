"""Safe YAML reading that refuses what a plain loader lets through."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from ..errors import AutotuneError
from .files import atomic_write_text


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool)):
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a plain value, not {type(key).__name__}",
                key_node.start_mark)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

MAX_YAML_BYTES = 1_000_000


def read_yaml(path: Path | str, what: str = "YAML file") -> Any:
    """Parse ``path`` with a safe, duplicate-refusing loader; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise AutotuneError(f"{what} {path} does not exist: check the path")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise AutotuneError(f"{what} {path} is larger than {MAX_YAML_BYTES} bytes: is it the right file?")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506
    except UnicodeDecodeError as exc:
        raise AutotuneError(f"{what} {path} is not UTF-8 text: {exc.reason}") from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise AutotuneError(f"{what} {path} is not valid YAML: {detail}") from None
    except RecursionError:
        raise AutotuneError(f"{what} {path} is nested too deeply to be a {what}: is it the right file?") from None


class _PlainDumper(yaml.SafeDumper):
    """A safe dumper that writes repeated objects out in full instead of as &anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# An enum with plain values (a trial's role) is written as its value, as JSON writes it.
_PlainDumper.add_multi_representer(Enum, lambda dumper, value: dumper.represent_data(value.value))

def dump_yaml(data: Any) -> str:
    """``data`` as block-style YAML text, keys in insertion order, no anchors."""
    return yaml.dump(data, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True)


def write_yaml(path: Path, data: Any) -> None:
    """Write ``data`` as block-style YAML, atomically (a temp file renamed over ``path``)."""
    atomic_write_text(path, dump_yaml(data))
