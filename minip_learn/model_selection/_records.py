"""Reading the files of a results folder strictly, and the fields each file declares.

Every file is read with :func:`read_json` (bounded nesting, no duplicate keys, NaN and
Infinity only where the writer writes them) and checked against its declared fields
(:data:`RECORD_FIELDS`, :data:`CONFIG_FIELDS`) and its file name: the parameters and
seed of a fit record reproduce its ``fit_id``.
"""

import datetime
import itertools
import json
import math
import numbers
import re
from pathlib import Path

from ._values import digest, slug

#: the scorers of :func:`~minip_learn.metrics.get_scorers`: numbers in every record
_DEFAULT_SCORES = ("exact_match", "token_accuracy", "solved", "max_abs_error")


#: Deepest nesting of arrays and objects a results file may have; checked on the text,
#: before it is parsed (a record is flat, a configuration two levels deep).
MAX_JSON_DEPTH = 32

_JSON_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_depth(text, limit=MAX_JSON_DEPTH):
    depth = 0
    for match in _JSON_BRACKETS.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"nested deeper than {limit} levels")
        elif char in "]}":
            depth -= 1


def _unique_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _check_text(value):
    """Raise a ValueError for a string (anywhere in ``value``) that is not Unicode text
    (an unpaired surrogate escape)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{value[:20]!r} is not Unicode text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_text(v)
    elif isinstance(value, list):
        for v in value:
            _check_text(v)


def read_json(text, *, nonfinite=False):
    """Parse the text of a results file strictly.

    Nesting deeper than :data:`MAX_JSON_DEPTH` is refused before parsing, and so are
    duplicate keys in an object, numbers out of the float range, strings that are not
    Unicode text and, unless ``nonfinite``, the constants ``NaN``, ``Infinity`` and
    ``-Infinity`` (which records write for non-finite scores and errors; a
    configuration never holds them).

    Parameters
    ----------
    text : str
    nonfinite : bool, default=False
        Accept ``NaN``, ``Infinity`` and ``-Infinity``.

    Returns
    -------
    object

    Raises
    ------
    ValueError
        Naming what is wrong.

    Examples
    --------
    >>> from minip_learn.model_selection._store import read_json
    >>> read_json('{"rank": 2, "max_abs_error": Infinity}', nonfinite=True)
    {'rank': 2, 'max_abs_error': inf}
    >>> read_json('{"rank": 2, "rank": 64}')
    Traceback (most recent call last):
    ...
    ValueError: duplicate key 'rank'
    """
    _check_depth(text)

    def constant(name):
        if not nonfinite:
            raise ValueError(f"{name} is not allowed in this file")
        return float(name)

    value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=constant,
                       parse_float=_finite_float)
    _check_text(value)
    return value


def read_json_file(path, *, nonfinite=False):
    """:func:`read_json` of the file ``path`` (a UTF-8 text)."""
    return read_json(Path(path).read_text(encoding="utf-8"), nonfinite=nonfinite)


# -- the declared fields of the files -----------------------------------------------------
def _is_int(v):
    return type(v) is int


def _is_text(v):
    return type(v) is str


def _is_number(v):
    return type(v) in (int, float)


def _is_time(v):
    return _is_number(v) and math.isfinite(v) and v >= 0


def _is_iso_time(v):
    try:
        datetime.datetime.fromisoformat(v)
    except (TypeError, ValueError):
        return False
    return True


def _is_sha256(v):
    return _is_text(v) and re.fullmatch(r"[0-9a-f]{64}", v) is not None


def _or_null(check):
    return lambda v: v is None or check(v)


#: The fields of a fit record: ``name -> (what it holds, check, required)``. Any other
#: field is a swept parameter, a score of the sweep's scorers (a number, ``NaN`` and
#: ``Infinity`` included) or a tag (any JSON value).
RECORD_FIELDS = {
    "fit_id": ("text: the stem of the file name after fit-", _is_text, True),
    "estimator": ("text: the estimator's class name", _is_text, True),
    "seed": ("an integer or null", _or_null(_is_int), True),
    "rank": ("an integer or null", _or_null(_is_int), False),
    "feature_map": ("text or null", _or_null(_is_text), False),
    "solved": ("true or false", lambda v: type(v) is bool, True),
    "n_epochs": ("an integer", _is_int, True),
    "train_max_error": ("a number (NaN and Infinity allowed)", _is_number, True),
    "fit_time": ("a finite number >= 0", _is_time, True),
    "fit_cpu_time": ("a finite number >= 0", _is_time, True),
    "score_time": ("a finite number >= 0", _is_time, True),
    "device": ("text", _is_text, True),
    "n_threads": ("an integer >= 1", lambda v: _is_int(v) and v >= 1, True),
    "ensemble": ("true or false", lambda v: type(v) is bool, True),
    "nonnegative": ("true, false or null", _or_null(lambda v: type(v) is bool), True),
    "theorem_applies": ("true, false or null", _or_null(lambda v: type(v) is bool), True),
    "certified_min_rank": ("an integer >= 0 or null",
                           _or_null(lambda v: _is_int(v) and v >= 0), True),
    "below_certified_bound": ("true, false or null",
                              _or_null(lambda v: type(v) is bool), True),
    "host": ("text", _is_text, True),
    "pid": ("an integer >= 0", lambda v: _is_int(v) and v >= 0, True),
    "finished_at": ("an ISO 8601 time", _is_iso_time, True),
    "config_id": ("text", _is_text, True),
    "minip_learn_version": ("text", _is_text, True),
    "estimator_sha256": ("64 lowercase hexadecimal digits", _is_sha256, False),
}

#: The fields of a run folder's ``config.json`` (all required, no others).
CONFIG_FIELDS = {
    "estimator": ("text: the estimator's class name", _is_text, True),
    "params": ("an object: the fixed parameters", lambda v: type(v) is dict, True),
    "data": ("text: the data's fingerprint", _is_text, True),
    "scoring": ("a list of text: the scorers' names",
                lambda v: type(v) is list and all(map(_is_text, v)), True),
    "config_id": ("text", _is_text, True),
    "minip_learn_version": ("text", _is_text, True),
    "repr": ("text: the estimator's repr", _is_text, True),
}

#: The fields of a keyed store's record that are about the file (the others are the
#: result's, any JSON values).
KEYED_FIELDS = {
    "key": ("text: the stem of the file name", _is_text, True),
    "config_id": ("text", _is_text, True),
    "minip_learn_version": ("text", _is_text, True),
    "estimator_sha256": ("64 lowercase hexadecimal digits", _is_sha256, False),
}

#: Record fields that a sweep computes (never a swept parameter).
_COMPUTED = frozenset(RECORD_FIELDS) - {"rank", "feature_map", "device"}


def show_value(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def table_problem(row, table, *, numbers=(), closed=False):
    """The first field of ``row`` that breaks ``table`` (see :data:`RECORD_FIELDS`), in
    words, or None. ``numbers``: other fields that must be numbers; ``closed``: no
    other field is allowed."""
    for name, (what, check, required) in table.items():
        if name not in row:
            if required:
                return f"field {name!r} is missing"
        elif not check(row[name]):
            return f"field {name!r} is {show_value(row[name])}, not {what}"
    for name in numbers:
        if name in table:
            continue
        if name not in row:
            return f"field {name!r} (a score) is missing"
        if not _is_number(row[name]):
            return f"field {name!r} is {show_value(row[name])}, not a number (a score)"
    if closed:
        extra = sorted(set(row) - set(table))
        if extra:
            return f"field {extra[0]!r} is not a field of this file"
    return None


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


#: Most candidate parameter fields :func:`key_problem` tries subsets of.
_MAX_KEY_CANDIDATES = 14


def key_problem(row, key, candidates, tried=None):
    """Why the parameters and seed of ``row`` do not give the fit key ``key``, or None.

    The parameters are a subset of the fields ``candidates`` (the swept parameters, or
    every field that could be one): the subset whose :func:`fit_key` hash with the
    row's seed is the key's (sets in ``tried`` first, and the one found added).
    """
    prefix, _, tag = key.rpartition("_")
    seed = row.get("seed")
    names = sorted(k for k in candidates if k in row and k != "seed")
    if len(names) > _MAX_KEY_CANDIDATES and len(prefix) < 55:
        # too many to try every subset: a number or a text among the parameters is
        # named in the key's readable part (when that is not cut at its 60 characters)
        names = [k for k in names if f"{k}=" in prefix or not (
            isinstance(row[k], (str, numbers.Number)) and not isinstance(row[k], bool))]
    if len(names) > _MAX_KEY_CANDIDATES:
        return (f"{len(names)} fields could be parameters; more than "
                f"{_MAX_KEY_CANDIDATES} cannot be checked against its fit_id")
    tried = [] if tried is None else tried
    subsets = itertools.chain(
        [t for t in tried if t <= set(names)],
        (frozenset(c) for n in range(len(names), -1, -1)
         for c in itertools.combinations(names, n)))
    for subset in subsets:
        params = {k: row[k] for k in subset}
        if digest({"params": params, "seed": seed}, 8) == tag:
            if subset not in tried:
                tried.append(subset)
            return None
    for k in names + ["seed"]:
        named = re.search(rf"(?:^|_){re.escape(k)}=(.+?)(?=_[A-Za-z][A-Za-z0-9_]*=|$)",
                          prefix)
        if named and slug(f"{k}={row.get(k)}") != f"{k}={named.group(1)}":
            return (f"field {k!r} is {show_value(row.get(k))}, but its file is the fit with "
                    f"{k}={named.group(1)}")
    shown = [f"{k}={show_value(row[k])}" for k in names] + [f"seed={show_value(seed)}"]
    return f"its {', '.join(shown)} do not give the fit_id of its file name ({key})"


def fixed_problem(row, fixed):
    """A field of ``row`` that contradicts the fixed parameters ``fixed`` (a
    configuration's ``params``), in words, or None."""
    if "rank" in fixed and "rank" in row and _canonical(row["rank"]) != _canonical(
            fixed["rank"]):
        return (f"field 'rank' is {show_value(row['rank'])}, but its configuration has "
                f"rank={show_value(fixed['rank'])}")
    return None


def parameter_fields(row, scoring, fixed):
    """The fields of a record that could be swept parameters (when the swept names are
    not known): neither computed by the fit, nor a score, nor a fixed parameter."""
    return [k for k in row if k not in _COMPUTED and k not in scoring
            and k not in _DEFAULT_SCORES and k not in fixed]


def config_problem(config):
    """What is wrong with a parsed ``config.json``, in words, or None."""
    if not isinstance(config, dict):
        return "not a JSON object"
    problem = table_problem(config, CONFIG_FIELDS, closed=True)
    if problem is None:
        ours = {k: config[k] for k in ("estimator", "params", "data", "scoring")}
        if digest(ours, 10) != config["config_id"]:
            problem = (f"its configuration does not give its config_id "
                       f"({config['config_id']})")
    return problem
