"""RFC 3339 times as the API server parses them (``metav1.Time``, Go's ``time.Parse``).

Why it exists: a ``time`` field of a ``resource.k8s.io/v1`` object (``creationTimestamp``, a
device taint's ``timeAdded``, ...) decodes only if Go's ``time.Parse(time.RFC3339, ...)``
accepts it, and two spellings of one instant compare equal on update. :mod:`datetime` is both
stricter and laxer than Go here (year 0, offsets of 24 hours, one-digit hours), so the grammar
and the calendar arithmetic are written down on their own: the strict decoder
(:mod:`.strictdecode`) and the device-taint rules (:mod:`dra_driver.slices.taintrules`) share them.
"""

from __future__ import annotations

import re

# What Go's time.Parse(time.RFC3339, ...) accepts (metav1.Time.UnmarshalJSON): its fast path
# (parseRFC3339) or, when that fails, the general layout parser (time.parse). The general parser
# is the lenient one: the hour ("15", stdHour) may have one digit, the fraction after the seconds
# may start with ',' as well as '.', and the offset's range test is ``hr > 24`` / ``mm > 60``
# ("some people do write offsets of 24 hours or 60 minutes"). ASCII digits only, upper-case 'T'
# and 'Z', nothing after the zone. Fields are range-checked in time_instant.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]+))?(?:Z|([+-])([0-9]{2}):([0-9]{2}))"
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# The layout Go names in its parse error ("parsing time ... as ...").
LAYOUT = "2006-01-02T15:04:05Z07:00"


def time_instant(value: str) -> int | None:
    """The instant ``value`` names, in nanoseconds since 1970 UTC, if Go's
    ``time.Parse(time.RFC3339, value)`` accepts it, else None. Years 0000-9999 (year 0 is a
    leap year, as Go's ``isLeap`` has it), month 1-12, a day that the month has, hour 0-23,
    minute and second 0-59, offset hours up to 24 and offset minutes up to 60 (Go's ``parse``
    tests ``>``, not ``>=``); fractions are truncated to nanoseconds (``parseNanoseconds``).
    Two spellings of one instant are equal, as ``metav1.Time`` values are for
    ``apiequality.Semantic`` (``a.UTC() == b.UTC()``)."""
    match = _RFC3339.fullmatch(value)
    if not match:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, sign, off_h, off_m = match.groups()[6:]
    if not 1 <= month <= 12 or not 1 <= day <= _days_in(month, year):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    offset = 0
    if sign:
        if int(off_h) > 24 or int(off_m) > 60:
            return None
        offset = (int(off_h) * 60 + int(off_m)) * 60 * (1 if sign == "+" else -1)
    seconds = _days_since_epoch(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
    nanos = int((fraction or "0")[:9].ljust(9, "0"))
    return (seconds - offset) * 1_000_000_000 + nanos


def _days_in(month: int, year: int) -> int:
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 29 if month == 2 and leap else _DAYS_IN_MONTH[month - 1]


def _days_since_epoch(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 in the proleptic Gregorian calendar, year 0 included (which
    :mod:`datetime` cannot represent)."""
    before = sum(_days_in(m, year) for m in range(1, month)) + day - 1
    y = year - 1  # whole years before ``year``, counted from year 0 (a leap year)
    years = 365 * year + (y // 4 - y // 100 + y // 400 + 1 if year > 0 else 0)
    return years + before - 719528  # 719528: days from 0000-01-01 to 1970-01-01
