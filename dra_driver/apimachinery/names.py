"""Kubernetes name rules (DNS labels and subdomains, C identifiers, qualified names, label
values, extended resource names), each returning the server's wording of what is wrong.

Why it exists: device names, pool names, driver names, attribute names, request names and taint
keys all follow one of these rules, and both the slice validator and the in-memory API's claim
and class checks must apply them exactly as the server does. Each function mirrors one function
of apimachinery's ``pkg/util/validation`` (named in its docstring) and returns the list of
messages that function returns (empty = valid), because the server can report several at once
(too long *and* bad characters). Messages use the v1.36 wording ("characters", not "bytes").
"""

from __future__ import annotations

import re

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Used with fullmatch: Go's ``^...$`` (no multi-line flag) ends at the end of the text, where
# Python's ``$`` would also match before a final newline ("gpu\n" is not a valid name).
_DNS_LABEL = re.compile(_LABEL)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

_DNS_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of "
    "alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used "
    "for validation is '[A-Za-z_][A-Za-z0-9_]*')"
)
_QUALIFIED_NAME_REGEX_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def max_len(limit: int) -> str:
    """``MaxLenError``."""
    return f"must be no more than {limit} characters"


def _too_long(value: str, limit: int) -> bool:
    """Go's ``len(value) > limit``: a length in bytes (UTF-8), not in characters."""
    return len(value.encode()) > limit


def dns_label(value: str) -> list[str]:
    """``IsDNS1123Label``: device names, request names, counter names.

    A valid subdomain that is not a label can only be wrong by its dots, and the server says so.
    """
    problems = []
    if _too_long(value, DNS_LABEL_MAX):
        problems.append(max_len(DNS_LABEL_MAX))
    if not _DNS_LABEL.fullmatch(value):
        dots = _DNS_SUBDOMAIN.fullmatch(value)
        problems.append("must not contain dots" if dots else _DNS_LABEL_MSG)
    return problems


def dns_subdomain(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: object names, node names, device class names, pool name parts."""
    problems = []
    if _too_long(value, DNS_SUBDOMAIN_MAX):
        problems.append(max_len(DNS_SUBDOMAIN_MAX))
    if not _DNS_SUBDOMAIN.fullmatch(value):
        problems.append(_DNS_SUBDOMAIN_MSG)
    return problems


def c_identifier(value: str) -> list[str]:
    """``IsCIdentifier``: the format only; callers check the length themselves."""
    return [] if _C_IDENTIFIER.fullmatch(value) else [_C_IDENTIFIER_MSG]


def qualified_name(value: str) -> list[str]:
    """``IsQualifiedName`` (what ``ValidateLabelName`` applies): label keys, taint and
    toleration keys, binding conditions. ``[prefix/]name``; an empty name part gets both the
    "must be non-empty" and the format message, as upstream."""
    parts = value.split("/")
    problems: list[str] = []
    if len(parts) > 2:
        return [
            f"a qualified name {_QUALIFIED_NAME_REGEX_MSG} with an optional DNS subdomain prefix "
            "and '/' (e.g. 'example.com/MyName')"
        ]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems += [f"prefix part {p}" for p in dns_subdomain(prefix)]
    name = parts[-1]
    if not name:
        problems.append("name part must be non-empty")
    elif _too_long(name, QUALIFIED_NAME_MAX):
        problems.append(f"name part {max_len(QUALIFIED_NAME_MAX)}")
    if not _QUALIFIED_NAME_PART.fullmatch(name):
        problems.append(f"name part {_QUALIFIED_NAME_REGEX_MSG}")
    return problems


def label_value(value: str) -> list[str]:
    """``IsValidLabelValue``: label values, taint and toleration values."""
    problems = []
    if _too_long(value, LABEL_VALUE_MAX):
        problems.append(max_len(LABEL_VALUE_MAX))
    if not _LABEL_VALUE.fullmatch(value):
        problems.append(_LABEL_VALUE_MSG)
    return problems


def is_extended_resource_name(value: str) -> bool:
    """``v1helper.IsExtendedResourceName``: not a native resource (no ``/``, or inside
    ``kubernetes.io/``), not ``requests.``-prefixed, and ``requests.<name>`` is a qualified
    name."""
    if "/" not in value or "kubernetes.io/" in value or value.startswith("requests."):
        return False
    return not qualified_name("requests." + value)
