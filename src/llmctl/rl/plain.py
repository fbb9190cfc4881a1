"""Plain data by value: what crosses from the sandboxed code to the judge.

The python verifier never compares objects inside the process that ran the policy's code: the
child sends the values its expressions produced, encoded here as JSON, and the verdict is
reached elsewhere on values decoded into genuine builtin types. An object with a lying
``__eq__``, a subclass of ``int`` or ``str`` that overrides comparison, a value that is not data
at all (a class, a function, a generator) cannot cross: an instance of a builtin type is read
through the builtin type's own C methods (``int.__format__``, ``dict.items``, ...), which a
subclass cannot override, and anything else is refused with ``NotPlain``.

JSON, tagged where JSON has no type of its own: a list is a JSON array, ``str``/``bool``/None
are themselves, an ``int`` that JSON carries exactly is a number, and every other value is a
one-key object: ``{"i": hex}`` a big int, ``{"f": float.hex}`` a float (exact, inf and nan
too), ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"F": [...]}`` frozenset, ``{"d": [[k, v],
...]}`` dict, ``{"b": hex}`` bytes, ``{"B": hex}`` bytearray, ``{"c": [re, im]}`` complex,
``{"r": [start, stop, step]}`` range, ``{"q": [num, den]}`` Fraction, ``{"D": str}`` Decimal.
numpy scalars and arrays of numpy's own types travel as their ``.item()`` / ``.tolist()``.

This module is standard library only: the sandbox harness runs its source (it cannot import
llmctl), and the parent imports it to decode.
"""

import json
import sys

MAX_DEPTH = 100  # nesting of containers: deeper (or a container that holds itself) is refused
_SAFE_INT = 1 << 53  # JSON numbers beyond this lose precision in other readers; sent as hex


class NotPlain(ValueError):
    """A value that is not plain data (or too deep, or malformed on the way back)."""


def _hex_int(v):
    return int.__format__(v, "x")  # hex has no digit limit (sys.set_int_max_str_digits is for decimal)


def _numpy_plain(v):
    """A numpy scalar or array of numpy's own (unsubclassed) types as a builtin value, else None."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    t = type(v)
    if t is np.ndarray:
        return np.ndarray.tolist(v)
    if isinstance(t, type) and t.__module__ == "numpy" and issubclass(t, np.generic) and t is not np.object_:
        return np.generic.item(v)
    return None


def encode(value, depth=0):
    """``value`` as JSON-able data; raises NotPlain for anything that is not plain data."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    t = type(value)
    if value is None or t is bool:  # bool cannot be subclassed
        return value
    if issubclass(t, int):
        n = int(_hex_int(value), 16)
        return n if -_SAFE_INT < n < _SAFE_INT else {"i": _hex_int(value)}
    if issubclass(t, float):
        return {"f": float.hex(value)}
    if issubclass(t, str):
        return str.__str__(value)
    if issubclass(t, complex):
        re, im = complex.__getnewargs__(value)
        return {"c": [float.hex(re), float.hex(im)]}
    if issubclass(t, bytes):
        return {"b": bytes.hex(value)}
    if issubclass(t, bytearray):
        return {"B": bytearray.hex(value)}
    if t is range:
        return {"r": [encode(value.start, depth + 1), encode(value.stop, depth + 1), encode(value.step, depth + 1)]}
    if issubclass(t, list):
        return [encode(list.__getitem__(value, i), depth + 1) for i in range(list.__len__(value))]
    if issubclass(t, tuple):
        return {"t": [encode(tuple.__getitem__(value, i), depth + 1) for i in range(tuple.__len__(value))]}
    if issubclass(t, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in list(dict.items(value))]}
    if issubclass(t, frozenset):
        return {"F": [encode(x, depth + 1) for x in list(frozenset.__iter__(value))]}
    if issubclass(t, set):
        return {"s": [encode(x, depth + 1) for x in list(set.__iter__(value))]}
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    if fractions is not None and issubclass(t, fractions.Fraction):
        return {"q": [encode(object.__getattribute__(value, "_numerator"), depth + 1),
                      encode(object.__getattribute__(value, "_denominator"), depth + 1)]}
    if decimal is not None and issubclass(t, decimal.Decimal):
        return {"D": decimal.Decimal.__str__(value)}
    plain = _numpy_plain(value)
    if plain is not None:
        return encode(plain, depth + 1)
    raise NotPlain(f"a {_type_name(t)} is not plain data")


def _type_name(t):
    try:
        return str(type.__getattribute__(t, "__qualname__"))[:80]
    except BaseException:
        return "value"


def dumps(value):
    """One line of JSON (raises NotPlain)."""
    return json.dumps(encode(value), ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def _hex_float(s):
    if not isinstance(s, str):
        raise NotPlain("a float must come as a hex string")
    return float.fromhex(s)


def _int(x):
    if type(x) is int:
        return x
    if type(x) is dict and list(x) == ["i"] and isinstance(x["i"], str):
        return int(x["i"], 16)
    raise NotPlain("expected an int")


def decode(obj, depth=0):
    """The value ``encode`` made, in genuine builtin types; raises NotPlain on anything else."""
    if depth > MAX_DEPTH + 1:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    t = type(obj)
    if obj is None or t in (bool, int, str):
        return obj
    if t is list:
        return [decode(x, depth + 1) for x in obj]
    if t is not dict or len(obj) != 1:
        raise NotPlain(f"not an encoded value: {t.__name__}")
    (tag, body), = obj.items()
    try:
        return _DECODERS[tag](body, depth + 1)
    except KeyError as e:
        raise NotPlain(f"unknown tag {tag!r}") from e
    except (TypeError, ValueError, ArithmeticError) as e:
        if isinstance(e, NotPlain):
            raise
        raise NotPlain(f"malformed {tag!r}: {e}") from e


def _items(body, depth):
    if type(body) is not list:
        raise NotPlain("expected a list")
    return [decode(x, depth) for x in body]


def _dict(body, depth):
    out = {}
    for pair in _items(body, depth):
        if type(pair) is not list or len(pair) != 2:
            raise NotPlain("a dict entry must be [key, value]")
        out[pair[0]] = pair[1]  # an unhashable key raises TypeError: malformed
    return out


def _complex(body, depth):
    re, im = body
    return complex(_hex_float(re), _hex_float(im))


def _fraction(body, depth):
    import fractions

    num, den = (_int(x) for x in body)
    return fractions.Fraction(num, den)


def _decimal(body, depth):
    import decimal

    if not isinstance(body, str):
        raise NotPlain("a Decimal must come as a string")
    return decimal.Decimal(body)


def _range(body, depth):
    start, stop, step = (_int(x) for x in body)
    return range(start, stop, step)


def _bytes_of(kind):
    def make(body, depth):
        if not isinstance(body, str):
            raise NotPlain("bytes must come as hex")
        return kind(bytes.fromhex(body))
    return make


_DECODERS = {
    "i": lambda body, depth: int(body, 16) if isinstance(body, str) else _int(None),
    "f": lambda body, depth: _hex_float(body),
    "t": lambda body, depth: tuple(_items(body, depth)),
    "s": lambda body, depth: set(_items(body, depth)),
    "F": lambda body, depth: frozenset(_items(body, depth)),
    "d": _dict,
    "b": _bytes_of(bytes),
    "B": _bytes_of(bytearray),
    "c": _complex,
    "r": _range,
    "q": _fraction,
    "D": _decimal,
}


def loads(line):
    """A value from one line ``dumps`` wrote; raises NotPlain (never anything else) on bad input."""
    try:
        return decode(json.loads(line))
    except NotPlain:
        raise
    except (ValueError, RecursionError, TypeError) as e:  # bad JSON, a nesting json itself refuses
        raise NotPlain(f"unreadable value: {type(e).__name__}") from e
