"""The one codec of the response types: `to_dict` and `from_dict`, driven by the
attrs class itself.

Encoding writes each object's fields as its class declares them (`Wire.wire_order`,
`wire_omit_none`, `wire_null_flags`), with a function generated once per class.

Decoding is `msgspec.convert(..., strict=False)`: unknown keys are ignored, a
missing field takes its default. Other OpenAI-compatible servers also send `null`
for fields that are never null here (`"index": null`, `"role": null`) and leave out
fields this side requires; when the direct conversion fails, the input is made
lenient first, generically: a `null` or missing field that cannot be null takes
its default, or for a required field the empty value of its type (0, "", [], an
object of defaults).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import attrs
import msgspec

JSON = dict[str, Any]
W = TypeVar("W", bound="Wire")


class Wire:
    """Base of the response types: generic `to_dict` / `from_dict`.

    A subclass states, once, only what its wire form does beyond its fields.
    """

    __slots__ = ()

    # The keys in the order they are written, when not the fields' order.
    wire_order: ClassVar[tuple[str, ...]] = ()
    # Fields left out while None (sluiceway extensions such as `stop_reason`).
    wire_omit_none: ClassVar[frozenset[str]] = frozenset()
    # {flag: field}: the bool field `flag` is not on the wire; while it is set,
    # `field` (in `wire_omit_none`) is written as null instead of left out, and
    # decoding sets it when `field` is present and null. Read by `from_dict` of the
    # class it is called on.
    wire_null_flags: ClassVar[Mapping[str, str]] = {}
    # What a missing or null field decodes to where that is not the constructor's
    # default (another server's model does not say it is owned by sluiceway).
    wire_decode_defaults: ClassVar[Mapping[str, Any]] = {}

    def to_dict(self) -> JSON:
        """The wire form: what OpenAI sends, `null` where it sends `null`."""
        return encode(self)

    @classmethod
    def from_dict(cls: type[W], d: Mapping[str, Any]) -> W:
        """Lenient: unknown keys ignored, null or missing fields take defaults."""
        return decode(cls, d)


# --- encoding ---------------------------------------------------------------


_Encoder = Callable[[Any], JSON]
_ENCODERS: dict[type, _Encoder] = {}


def _attrs_arm(tp: Any) -> tuple[type | None, bool]:
    """The attrs class a field's type holds (in an optional or a list), and whether
    it is a list of them."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        for arm in typing.get_args(tp):
            found = _attrs_arm(arm)
            if found[0] is not None:
                return found
        return None, False
    if origin is list:
        inner, _ = _attrs_arm(typing.get_args(tp)[0])
        return inner, True
    if isinstance(tp, type) and attrs.has(tp):
        return tp, False
    return None, False


def _encoder_for(cls: type) -> _Encoder:
    """The function that writes a `cls` as the wire has it: the keys in `wire_order`
    (else the fields' order), those of `wire_omit_none` left out while None.

    Generated from the class, as attrs generates `__init__`: it runs per chunk and
    per logprob, and a literal dict is several times faster than a loop over the
    fields (or `msgspec.to_builtins`, which writes a slotted attrs class's fields
    sorted by name, then reordering)."""
    encoder = _ENCODERS.get(cls)
    if encoder is not None:
        return encoder
    hints = typing.get_type_hints(cls)
    wire: Any = cls if issubclass(cls, Wire) else Wire
    fields = [f.name for f in attrs.fields(cls) if f.name not in wire.wire_null_flags]
    order = tuple(wire.wire_order) or tuple(fields)
    assert sorted(order) == sorted(fields), (cls, order)
    namespace: dict[str, Any] = {}
    items = []
    for i, name in enumerate(order):
        inner, many = _attrs_arm(hints[name])
        value = f"obj.{name}"
        if inner is not None:
            namespace[f"enc{i}"] = _encoder_for(inner)
            write = f"[enc{i}(x) for x in v{i}]" if many else f"enc{i}(v{i})"
            value = f"None if (v{i} := obj.{name}) is None else {write}"
        items.append(f"{name!r}: {value}")
    lines = ["def encode(obj):", f"    d = {{{', '.join(items)}}}"]
    kept_by = {field: flag for flag, field in wire.wire_null_flags.items()}
    for name in order:
        if name in wire.wire_omit_none:
            keep = f" and not obj.{kept_by[name]}" if name in kept_by else ""
            lines.append(f"    if d[{name!r}] is None{keep}:")
            lines.append(f"        del d[{name!r}]")
    lines.append("    return d")
    exec(compile("\n".join(lines), f"<wire encoder of {cls.__qualname__}>", "exec"), namespace)
    encoder = _ENCODERS[cls] = namespace["encode"]
    return encoder


def encode(obj: Any) -> JSON:
    """`obj`'s wire form as plain JSON values."""
    return _encoder_for(type(obj))(obj)


# --- decoding ---------------------------------------------------------------

_Lenient = Callable[[Any], Any]
_LENIENT: dict[Any, _Lenient] = {}
_ZERO: dict[Any, Callable[[], Any]] = {int: int, float: float, str: str, bool: bool}


def _admits_none(tp: Any) -> bool:
    if tp is None or tp is type(None) or tp is Any:
        return True
    origin = typing.get_origin(tp)
    return (origin is typing.Union or origin is types.UnionType) and any(
        _admits_none(arm) for arm in typing.get_args(tp)
    )


def _zero(tp: Any) -> Any:
    """The empty value of a required field's type."""
    origin = typing.get_origin(tp) or tp
    if origin in _ZERO:
        return _ZERO[origin]()
    if origin is list:
        return []
    if origin is dict:
        return {}
    if isinstance(tp, type) and attrs.has(tp):
        return _lenient_for(tp)({})
    raise TypeError(f"no empty value for {tp!r}")


def _lenient_for(tp: Any) -> _Lenient:
    """A function that makes a decoded JSON value acceptable as `tp`, where only
    nulls and missing fields are in the way."""
    fn = _LENIENT.get(tp)
    if fn is not None:
        return fn
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        inner, many = _attrs_arm(tp)
        fn = _lenient_for(list[inner] if many else inner) if inner else _same  # type: ignore[valid-type]
    elif origin is list:
        item = _lenient_for(typing.get_args(tp)[0])
        fn = _same if item is _same else _list_of(item)
    elif isinstance(tp, type) and attrs.has(tp):
        fn = _object_of(tp)
    else:
        fn = _same
    _LENIENT[tp] = fn
    return fn


def _same(value: Any) -> Any:
    return value


def _list_of(item: _Lenient) -> _Lenient:
    def lenient(value: Any) -> Any:
        return [item(v) for v in value] if isinstance(value, list) else value

    return lenient


def _decode_defaults(cls: type) -> Mapping[str, Any]:
    return cls.wire_decode_defaults if issubclass(cls, Wire) else {}


def _object_of(cls: type) -> _Lenient:
    hints = typing.get_type_hints(cls)
    decode_defaults = _decode_defaults(cls)
    plan = [
        (f.name, f.default is not attrs.NOTHING, _admits_none(hints[f.name]), hints[f.name])
        for f in attrs.fields(cls)
    ]

    def lenient(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # msgspec says what is wrong
        out = dict(value)
        for name, has_default, admits_none, tp in plan:
            v = out.get(name)
            if v is not None:
                out[name] = _lenient_for(tp)(v)
            elif name in decode_defaults:
                out[name] = decode_defaults[name]
            elif admits_none and name in out:
                pass  # an explicit null is kept
            elif has_default:
                out.pop(name, None)
            else:
                out[name] = _zero(tp)
        return out

    return lenient


_ALWAYS_LENIENT: dict[type, bool] = {}


def _always_lenient(cls: type) -> bool:
    """Whether `cls` or a type inside it has `wire_decode_defaults`, which msgspec
    alone would not apply."""
    found = _ALWAYS_LENIENT.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        inner = (_attrs_arm(hints[f.name])[0] for f in attrs.fields(cls))
        found = bool(_decode_defaults(cls)) or any(
            _always_lenient(t) for t in inner if t is not None
        )
        _ALWAYS_LENIENT[cls] = found
    return found


def decode(cls: type[W], d: Mapping[str, Any]) -> W:
    """`d` (decoded JSON) as a `cls`, leniently (see the module's description)."""
    if cls.wire_null_flags and isinstance(d, Mapping):
        flags = {
            flag: field in d and d[field] is None for flag, field in cls.wire_null_flags.items()
        }
        d = {**d, **flags}
    if not _always_lenient(cls):
        try:
            return msgspec.convert(d, cls, strict=False)
        except msgspec.ValidationError:
            pass  # nulls or missing fields in the way: made lenient below
    return msgspec.convert(_lenient_for(cls)(d), cls, strict=False)
