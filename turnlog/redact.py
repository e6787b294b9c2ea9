"""Passwords out of anything that names a URL, before it reaches a message or a log line.

Two functions, one rule: whatever a URL carries as a secret (the password of
its ``user:password@``, a secret query parameter such as ``?password=``) is
shown as ``***``; the rest (scheme, user, host, port, path) stays, so the
operator still sees which server is meant.

- :func:`redact_url` takes one URL (a string or a SQLAlchemy ``URL``): parsed
  by SQLAlchemy's ``make_url`` and rendered with ``hide_password=True``;
  a string that does not parse goes through :func:`redact`.
- :func:`redact` takes free text (an exception's message, a log line, a comma
  separated server list) and hides every ``scheme://user:password@`` and
  ``user:password@`` it finds, and every secret query parameter. It hides too
  much rather than too little: in a malformed URL it cannot tell where the
  password ends, so it hides up to the last ``@``.

Neither raises. Callers that show a value which may be a secret but is not a
URL at all (a mistyped ``TURNLOG_DATABASE_URL`` holding only a password, say)
should not show it: no pattern can tell a bare password from a word.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

__all__ = ["redact", "redact_url", "MASK", "SECRET_QUERY_PARAMETERS"]

MASK = "***"

#: Query parameters that hold secrets: libpq's and psycopg's (``password``, ``sslpassword``,
#: ``passfile``), and the usual names of tokens and keys in other URLs.
SECRET_QUERY_PARAMETERS = frozenset({
    "password", "sslpassword", "passfile", "passwd", "pwd", "secret", "token", "access_token", "api_key", "apikey",
    "sasl.password", "sasl_password", "ssl.key.password",
})

# scheme://[user]:password@ -- the password may hold anything but whitespace (even '@' or '/',
# unencoded in a malformed URL): hidden up to the last '@' of the same run of non-space characters.
_SCHEME_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*):\S*@")
# user:password@host without a scheme (a URL missing its '://'): the user starts after a separator.
_BARE_USERINFO = re.compile(r"(?P<head>(?:^|(?<=[\s/'\"(=,;]))[^\s:/@'\"(=,;]+):[^\s/@]*@")
_SECRET_QUERY = re.compile(
    r"(?P<head>[?&;](?:" + "|".join(re.escape(name) for name in sorted(SECRET_QUERY_PARAMETERS)) + r")=)[^&;#\s]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the password of every URL-like ``[scheme://]user:password@`` and the value of
    every secret query parameter (:data:`SECRET_QUERY_PARAMETERS`) replaced by ``***``."""
    text = _SCHEME_USERINFO.sub(rf"\g<head>:{MASK}@", text)
    text = _BARE_USERINFO.sub(rf"\g<head>:{MASK}@", text)
    return _SECRET_QUERY.sub(rf"\g<head>{MASK}", text)


def redact_url(url: str | URL) -> str:
    """One URL for a message or a log line, its password and secret query parameters shown as ``***``.

    A string SQLAlchemy parses is rendered by SQLAlchemy (``hide_password=True``), then passed
    through :func:`redact` for the query parameters and for a password holding an unencoded
    ``@`` (SQLAlchemy ends the password at the first ``@``, so the rest of it would show as
    the host). One it does not parse is passed through :func:`redact` alone.
    """
    if isinstance(url, str):
        text = url
        try:
            url = make_url(text)
        except (ArgumentError, ValueError, TypeError):  # ValueError: a port that is not a number
            return redact(text)
    return redact(url.render_as_string(hide_password=True))
