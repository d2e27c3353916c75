"""What the auth callout reads before it judges a sign-in, read as the NVCF callout's Go code reads it (pure).

Two inputs, both from outside the callout's trust:

- The client's token (``connect_opts.auth_token``): base64url of ``{"account","pluginName","payload"}``,
  padded when its length is a multiple of 4 and unpadded otherwise, unmarshalled by encoding/json into a struct
  of three strings (``types.Request``). ``read_token`` gives the three strings or the refusal in the callout's
  words: ``failed to decode auth request: illegal base64 data at input byte N``, ``failed to unmarshal auth
  request: json: cannot unmarshal array into Go value of type types.Request``, ``... into Go struct field
  Request.payload of type string``. JSON ``null`` is an empty request (then ``plugin name not specified``); keys
  match their field without regard to case, the last one wins, unknown keys are ignored.
- nats-server's authorization request, a JWT: synadia's callout.go decodes it (nats-io/jwt: header, three
  chunks, at most 1 MiB, signed by its ``iss``) and answers only one issued by a server key naming itself
  (``iss`` = ``nats.server_id.id``) for the audience ``nats-authorization-request``; anything else is dropped
  unanswered with one ``bad request: ...`` line. ``read_authorization_request`` is that check. Neither checks
  ``exp``: nats-server times out a sign-in itself.

Approximated, and said here: encoding/json's syntax errors are worded for the common cases (``unexpected end of
JSON input``, ``invalid character 'x' looking for beginning of value``, ...), not every context Go names; and
JSON nested deeper than Python's parser goes (about 1,000 levels; Go's limit is 10,000) is read for its shape
only (the top-level kind and each top-level key's kind), which is all types.Request looks at.
"""

from __future__ import annotations

import base64
import json
import string
from typing import Any

from . import jwt

AUTH_REQUEST_AUDIENCE = "nats-authorization-request"
MAX_TOKEN_SIZE = 1024 * 1024  # nats-io/jwt's MaxTokenSize
MAX_DEPTH = 10_000  # encoding/json's maxNestingDepth
FIELDS = ("account", "pluginName", "payload")  # types.Request's JSON names
URL_ALPHABET = frozenset(string.ascii_letters + string.digits + "-_")
KINDS = {"{": "object", "[": "array", '"': "string", "t": "bool", "f": "bool", "n": "null"}


Field = tuple[str, str, str | None]  # a top-level key, its value's kind, and the value if it is a string


class TokenError(ValueError):
    """The input cannot be read; the text is the callout's reason."""


def read_token(token: str) -> tuple[str, str, str]:
    """(account, pluginName, payload) of a sign-in token, or TokenError with the reason that follows the
    callout's own ``failed to decode auth request: ``."""
    text = _b64url(token).decode("utf-8", errors="replace")  # encoding/json takes invalid UTF-8 in strings
    try:
        top, fields = _loaded(json.loads(text))
    except RecursionError:
        top, fields = shape(text)
    except json.JSONDecodeError as exc:
        raise TokenError(f"failed to unmarshal auth request: {_go_syntax(text, exc)}") from None
    if top not in ("object", "null"):
        raise _unmarshal(f"{top} into Go value of type types.Request")
    request = dict.fromkeys(FIELDS, "")
    for key, kind, value in fields:
        field = next((f for f in FIELDS if key.lower() == f.lower()), None)
        if field is None or kind == "null":
            continue
        if kind != "string":
            raise _unmarshal(f"{kind} into Go struct field Request.{field} of type string")
        request[field] = value or ""
    return request["account"], request["pluginName"], request["payload"]


def _unmarshal(what: str) -> TokenError:
    return TokenError(f"failed to unmarshal auth request: json: cannot unmarshal {what}")


def _b64url(token: str) -> bytes:
    """Go's base64.URLEncoding when the length is a multiple of 4 (at most two "=" at the end), else
    RawURLEncoding; a refusal names the first byte it cannot take."""
    body = token
    if len(token) % 4 == 0:
        stripped = token.rstrip("=")
        body = stripped if len(token) - len(stripped) <= 2 else token[:-2]
    bad = next((i for i, c in enumerate(body) if c not in URL_ALPHABET), None)
    if bad is None and len(body) % 4 == 1:
        bad = len(body) - 1  # a lone last character carries too few bits for a byte
    if bad is not None:
        raise TokenError(f"failed to decode auth request: illegal base64 data at input byte {bad}")
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def _kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "bool"
    kinds: dict[type, str] = {dict: "object", list: "array", str: "string"}
    return kinds.get(type(value), "number")


def _loaded(value: Any) -> tuple[str, list[Field]]:
    items = value.items() if isinstance(value, dict) else ()
    return _kind(value), [(k, _kind(v), v if isinstance(v, str) else None) for k, v in items]


def shape(text: str) -> tuple[str, list[Field]]:
    """What _loaded gives, for JSON too deep for Python's parser: read in one pass, without recursion."""
    fields: list[Field] = []
    top, key, depth, awaiting, i = "", "", 0, False, 0
    while i < len(text):
        c = text[i]
        if c in " \t\r\n,":
            i += 1
            continue
        kind = KINDS.get(c, "number")
        top = top or kind
        is_value, awaiting = awaiting, False  # the token after a top-level key's ":" is its value
        if c == '"':
            read, i = _string(text, i)
            if depth == 1 and top == "object" and is_value:
                fields.append((key, "string", read))
            elif depth == 1:
                key = read
            continue
        if is_value:
            fields.append((key, kind, None))
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise TokenError(
                    f"failed to unmarshal auth request: invalid character '{c}' exceeded max depth"
                )
        elif c in "]}":
            depth -= 1
        elif c == ":" and depth == 1:
            awaiting = True
        i += 1
    return top, fields if top == "object" else []


def _string(text: str, at: int) -> tuple[str, int]:
    try:
        return json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined,no-any-return]
    except json.JSONDecodeError as exc:
        raise TokenError(f"failed to unmarshal auth request: {_go_syntax(text, exc)}") from None


def _go_syntax(text: str, exc: json.JSONDecodeError) -> str:
    """encoding/json's words for the common syntax errors (see the module's note)."""
    if exc.pos >= len(text.rstrip()):
        return "unexpected end of JSON input"
    after = "after object key:value pair" if text.lstrip().startswith("{") else "after array element"
    context = {
        "Expecting value": "looking for beginning of value",
        "Expecting property name enclosed in double quotes": "looking for beginning of object key string",
        "Expecting ':' delimiter": "after object key",
        "Expecting ',' delimiter": after,
        "Extra data": "after top-level value",
        "Invalid control character at": "in string literal",
    }.get(exc.msg, "looking for beginning of value")
    return f"invalid character {text[exc.pos]!r} {context}"


def read_authorization_request(token: str) -> dict[str, Any]:
    """The claims of nats-server's authorization request, if callout.go would answer it; else TokenError with
    its ``bad request: ...`` line."""
    if len(token) > MAX_TOKEN_SIZE:
        raise TokenError(
            f"bad request: error decoding auth request: token size {len(token)} exceeds maximum of "
            f"{MAX_TOKEN_SIZE} bytes: token too large"
        )
    try:
        claims = jwt.decode(token)
    except jwt.JwtError as exc:
        raise TokenError(f"bad request: error decoding auth request: {exc}") from None
    issuer, nats = str(claims.get("iss", "")), claims.get("nats")
    server = nats.get("server_id") if isinstance(nats, dict) else None
    server_id = server.get("id") if isinstance(server, dict) else None
    if not issuer.startswith("N"):
        raise TokenError(f'bad request: expected server: "{issuer}"')
    if issuer != server_id:
        # callout.go names the audience where it means the issuer; its words kept
        raise TokenError(
            f'bad request: issuers don\'t match: "{claims.get("aud", "")}" != "{server_id or ""}"'
        )
    if claims.get("aud") != AUTH_REQUEST_AUDIENCE:
        raise TokenError(f'bad request: unexpected audience: "{claims.get("aud", "")}"')
    return claims
