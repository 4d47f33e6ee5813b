"""Kubernetes name rules (DNS labels and subdomains, C identifiers, label keys and values,
extended resource names), each returning the server's wording of what is wrong.

Why it exists: device names, pool names, driver names, attribute names, request names and taint
keys all follow one of these rules, and both the slice validator and the in-memory API's claim
and class checks must apply them exactly as the server does. Each function returns a list of
problems (empty = valid), because the server can report several at once (too long *and* bad
characters).
"""

from __future__ import annotations

import re

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
C_IDENTIFIER_MAX = 32
LABEL_VALUE_MAX = 63

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(rf"^{_LABEL}$")
_DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

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
_QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def max_len(limit: int) -> str:
    return f"must be no more than {limit} characters"


def dns_label(value: str) -> list[str]:
    """RFC 1123 label: device names, request names, counter names."""
    problems = []
    if len(value) > DNS_LABEL_MAX:
        problems.append(max_len(DNS_LABEL_MAX))
    if not _DNS_LABEL.match(value):
        problems.append(_DNS_LABEL_MSG)
    return problems


def dns_subdomain(value: str) -> list[str]:
    """RFC 1123 subdomain: object names, node names, device class names."""
    problems = []
    if len(value) > DNS_SUBDOMAIN_MAX:
        problems.append(max_len(DNS_SUBDOMAIN_MAX))
    if not _DNS_SUBDOMAIN.match(value):
        problems.append(_DNS_SUBDOMAIN_MSG)
    return problems


def c_identifier(value: str) -> list[str]:
    return [] if _C_IDENTIFIER.match(value) else [_C_IDENTIFIER_MSG]


def driver_name(value: str) -> list[str]:
    """A DRA driver name or attribute domain: a DNS subdomain compared case-insensitively."""
    return dns_subdomain(value.lower())


def label_key(value: str) -> list[str]:
    """A label key (``[prefix/]name``): taint keys, binding conditions."""
    prefix, sep, name = value.rpartition("/")
    problems: list[str] = []
    if sep and not prefix:
        problems.append("prefix part must be non-empty")
    elif sep:
        problems += [f"prefix part {p}" for p in dns_subdomain(prefix)]
    if value.count("/") > 1:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character, with an optional DNS subdomain prefix "
            "and '/'"
        ]
    if not name:
        problems.append("name part must be non-empty")
    else:
        if len(name) > 63:
            problems.append("name part must be no more than 63 characters")
        if not _QUALIFIED_NAME_PART.match(name):
            problems.append(_QUALIFIED_NAME_MSG)
    return problems


def label_value(value: str) -> list[str]:
    problems = []
    if len(value) > LABEL_VALUE_MAX:
        problems.append(max_len(LABEL_VALUE_MAX))
    if not _LABEL_VALUE.match(value):
        problems.append(_LABEL_VALUE_MSG)
    return problems


def is_extended_resource_name(value: str) -> bool:
    """``domain/name`` outside ``kubernetes.io`` whose quota form ``requests.<name>`` is valid."""
    if "/" not in value or "kubernetes.io/" in value or value.startswith("requests."):
        return False
    return not label_key("requests." + value)
