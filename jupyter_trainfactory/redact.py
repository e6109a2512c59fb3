"""Secret redaction: credentials in names and URLs never reach MLflow.

A name is a secret's name when one of :data:`CREDENTIAL_WORDS` is a whole part of it
(``HF_TOKEN``, ``apiToken``, ``config.db.password``), not merely a substring of it
(``key_dim``, ``tokenizer``, ``monkey`` stay visible), nor ``token`` as a quantity
(``flops_per_token``, ``eos_token_id``, ``max_token_len``). A value under such a name is
replaced by :data:`MASK`; credentials embedded in URLs (``https://user:pass@host``,
``https://TOKEN@host``, ``?access_token=...``) are masked wherever a text holds them.

Pure Python, no I/O.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CREDENTIAL_WORDS",
    "MASK",
    "is_secret_name",
    "mask_url",
    "redact_mapping",
    "redact_params",
]

#: Words that make a name a secret's name when they are a whole part of it (a word
#: with ``_`` matches as consecutive parts: ``OPENAI_API_KEY``, ``privateKey``). Plurals
#: count, except ``tokens``: ``max_tokens``, ``num_tokens`` and ``tokens_per_second`` are
#: token counts in language-model configs, not credentials (a credential is named in the
#: singular: ``HF_TOKEN``, ``api_token``). ``pwd`` is absent on purpose: ``PWD`` is the
#: working directory in every shell environment.
CREDENTIAL_WORDS: tuple[str, ...] = (
    "token",
    "secret",
    "secrets",
    "password",
    "passwords",
    "passwd",
    "api_key",
    "apikey",
    "credential",
    "credentials",
    "private_key",
)
#: What a redacted value, or the secret part of a URL, becomes.
MASK = "***"

_SEPARATORS = re.compile(r"[_\-./\s]+")
# Acronym before a capitalised word ("API" in "APIKey"), a capitalised or lower-case
# word, an all-capital run, a number.
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_CREDENTIAL_PARTS = tuple(tuple(word.split("_")) for word in CREDENTIAL_WORDS)
# scheme://authority then the rest up to whitespace or a quote (RFC 3986 scheme syntax).
_URL = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<authority>[^\s/?#'\"<>]*)(?P<rest>[^\s'\"<>]*)"
)
_QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&;#\s]+)=(?P<value>[^&;#\s]*)")
# Schemes whose userinfo without a colon is the login user, never a credential.
_LOGIN_USER_SCHEMES = frozenset({"ssh", "git+ssh", "ssh+git", "sftp", "scp"})


def _name_parts(name: str) -> list[str]:
    """Lower-case parts of ``name``, split on ``_ - . /``, whitespace and camelCase."""
    return [word.lower() for chunk in _SEPARATORS.split(name) for word in _WORD.findall(chunk)]


def is_secret_name(name: str) -> bool:
    """Whether ``name`` names a credential.

    Parameters
    ----------
    name : str
        A config key, environment variable or dotted parameter name
        (``"config.api_token"``, ``"HF_TOKEN"``, ``"privateKey"``).

    Returns
    -------
    bool
        True when a word of :data:`CREDENTIAL_WORDS` is a whole part of the name (parts
        split on ``_ - . /``, whitespace and camelCase boundaries, compared lower-case).

    Raises
    ------
    TypeError
        If ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"a name must be a string, got {type(name).__name__}.")
    parts = _name_parts(name)
    for word in _CREDENTIAL_PARTS:
        n = len(word)
        for i in range(len(parts) - n + 1):
            if tuple(parts[i : i + n]) == word and not _token_quantity(parts, i, word):
                return True
    return False


#: ``token`` between these words is a language-model quantity, not a credential:
#: ``flops_per_token``, ``eos_token_id``, ``max_token_len``.
_TOKEN_BEFORE = frozenset({"per"})
_TOKEN_AFTER = frozenset({"id", "ids", "count", "len", "length", "limit", "budget", "size"})


def _token_quantity(parts: list[str], i: int, word: tuple[str, ...]) -> bool:
    if word != ("token",):
        return False
    before = parts[i - 1] if i > 0 else ""
    after = parts[i + 1] if i + 1 < len(parts) else ""
    return before in _TOKEN_BEFORE or after in _TOKEN_AFTER


def _mask_query(rest: str) -> str:
    def repl(match: re.Match[str]) -> str:
        if not match["value"] or not is_secret_name(match["name"]):
            return match[0]
        return f"{match['sep']}{match['name']}={MASK}"

    query_at = rest.find("?")
    if query_at < 0:
        return rest
    return rest[:query_at] + _QUERY_PARAM.sub(repl, rest[query_at:])


def _mask_one_url(match: re.Match[str]) -> str:
    scheme, authority = match["scheme"], match["authority"]
    userinfo, at, host = authority.rpartition("@")  # a password may hold an unescaped "@"
    if at:
        user, colon, _password = userinfo.partition(":")
        if colon:
            userinfo = f"{user}:{MASK}"
        elif scheme[:-3].lower() not in _LOGIN_USER_SCHEMES:
            userinfo = MASK  # https://TOKEN@host: the whole userinfo is the credential
        authority = f"{userinfo}@{host}"
    return f"{scheme}{authority}{_mask_query(match['rest'])}"


def mask_url(text: str) -> str:
    """Mask credentials in every URL of ``text``.

    Parameters
    ----------
    text : str
        Any text: a URL, a pip requirement (``pkg @ git+https://u:p@host/r.git@v1``),
        ``pip freeze`` output (line breaks are kept).

    Returns
    -------
    str
        ``text`` with the password of ``user:password@`` userinfo, a whole userinfo
        without a colon (a token: ``https://TOKEN@github.com``; except for ``ssh``-like
        schemes, where it is the login user) and the value of each query parameter whose
        name :func:`is_secret_name` accepts (``?access_token=...``) replaced by
        :data:`MASK`. Text outside URLs, hosts, paths and revisions (``.git@v1``) is
        unchanged.

    Raises
    ------
    TypeError
        If ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"mask_url expects a string, got {type(text).__name__}.")
    return _URL.sub(_mask_one_url, text)


def _redact(value: Any, path: str, redacted: list[str]) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            item_path = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and is_secret_name(key) and item not in (None, ""):
                out[key] = MASK  # (None or "": nothing to hide)
                redacted.append(item_path)
            else:
                out[key] = _redact(item, item_path, redacted)
        return out
    if isinstance(value, (list, tuple)):
        items = [
            _redact(item, f"{path}.{i}" if path else str(i), redacted)
            for i, item in enumerate(value)
        ]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, str):
        masked = mask_url(value)
        if masked != value:
            redacted.append(path)
        return masked
    return copy.deepcopy(value)


def redact_mapping(data: Mapping[str, Any], prefix: str = "") -> tuple[dict, list[str]]:
    """A deep copy of ``data`` with its secrets masked.

    Parameters
    ----------
    data : mapping
        A config, environment or runtime-env mapping; nested mappings, lists and tuples
        are walked at any depth.
    prefix : str
        Prepended to every reported path as ``"prefix."`` (``"config"`` gives
        ``"config.api_token"``).

    Returns
    -------
    redacted : dict
        The copy: a value under a string key that :func:`is_secret_name` accepts is
        :data:`MASK` (whatever its type, a nested mapping included) and every other
        string has :func:`mask_url` applied. Non-string keys are kept and not tested;
        their values are still walked. ``data`` is not modified.
    paths : list of str
        Sorted dotted paths of what was masked, keys or list indices joined by ``.``
        (``["config.api_token", "config.urls.0"]``), masked URLs included.

    Raises
    ------
    TypeError
        If ``data`` is not a mapping.
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"redact_mapping expects a mapping, got {type(data).__name__}.")
    redacted: list[str] = []
    out = _redact(data, prefix, redacted)
    return out, sorted(redacted)


def redact_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Mask the secrets of flat MLflow params or tags.

    Parameters
    ----------
    params : mapping of str to str
        Dotted names to values (``{"config.api_token": "abc", "config.key_dim": "64"}``).

    Returns
    -------
    dict
        A new dict: :data:`MASK` for a value whose name :func:`is_secret_name` accepts
        (any dotted part counts), :func:`mask_url` of every other string value; other
        values unchanged.

    Raises
    ------
    TypeError
        If ``params`` is not a mapping.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"redact_params expects a mapping, got {type(params).__name__}.")
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(key, str) and is_secret_name(key):
            out[key] = MASK
        else:
            out[key] = mask_url(value) if isinstance(value, str) else value
    return out
