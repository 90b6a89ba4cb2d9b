"""Session dates as chat archives spell them, read into UTC datetimes.

Explicit formats tried in order, then ISO 8601 through `datetime.fromisoformat`, then
Unix time (seconds, or milliseconds from 13 digits). Chat exports decorate dates, so a
leading weekday ("Monday, 8 May 2023"), ordinals ("May 8th, 2023"), square brackets
("[08.05.2023, 13:56:12]") and a trailing "UTC" or "GMT" are read past.

Numeric day-month dates with slashes or dashes (`08/05/2023`, `5/8/23, 1:56 PM`,
`08-05-2023`) are 8 May in Europe and 5 August in the US. Alone such a date is refused,
unless its day is over 12 (`25/05/2023` has one reading) or the caller says which order
it uses (`order`: "dmy" or "mdy"). A whole file settles the order for all its dates at
once (`order_of`): one date with a field over 12 is enough, and a file that contradicts
itself is refused. A value without a zone is taken as UTC; one with an offset is
converted.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

Order = Literal["dmy", "mdy"]
ORDERS: tuple[Order, ...] = ("dmy", "mdy")

_MONTH_DATES = ("%d %B %Y", "%d %B, %Y", "%B %d, %Y", "%B %d %Y")
_NUMERIC_DATES = ("%d.%m.%Y", "%Y/%m/%d", "%Y.%m.%d")
_TIMES = ("%H:%M", "%H:%M:%S", "%I:%M %p", "%I:%M:%S %p", "%I %p")


def _formats() -> tuple[str, ...]:
    # %B is the full month name and %b the short one; both, so "8 Sep 2023" reads too.
    dates = [*_MONTH_DATES, *(d.replace("%B", "%b") for d in _MONTH_DATES), *_NUMERIC_DATES]
    out: list[str] = []
    for date in dates:
        out.append(date)
        for time in _TIMES:
            # LoCoMo's own "1:56 pm on 8 May, 2023" comes first: it is the common case.
            out += [f"{time} on {date}", f"{date}, {time}", f"{date} {time}", f"{date} at {time}"]
    return tuple(out)


FORMATS = _formats()
EXAMPLES = (
    "1:56 pm on 8 May, 2023",
    "2023-05-08T13:56:00Z",
    "2023-05-08 13:56+02:00",
    "2023-05-08",
    "08.05.2023, 13:56:00",
    "8 May 2023",
    "May 8, 2023 1:56 pm",
    "25/05/2023, 13:56",
    "1683554160",
)
_MONTHS = [datetime(2000, m, 1).strftime("%B") for m in range(1, 13)]  # as %B reads them
# A day-month date with slashes or dashes, then what follows it (a time, or nothing).
_SLASHED = re.compile(r"^(\d{1,2})([/-])(\d{1,2})\2(\d{4}|\d{2})(?=$|[\s,T])(.*)$")
_WEEKDAY = re.compile(
    r"^(?:mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:day|sday|nesday|rsday|urday)?\.?,?\s+",
    re.IGNORECASE,
)
_ORDINAL = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)\b", re.IGNORECASE)
_UTC_NAME = re.compile(r"\s+(?:UTC|GMT)$", re.IGNORECASE)
_OFFSET_AFTER_SPACE = re.compile(r"\s+([+-]\d{2}:?\d{2})$")
_UNIX = re.compile(r"^\d{9,13}(?:\.\d+)?$")
# "p.m." and "1:56pm" are common in exports; strptime wants "PM" after a space.
_MERIDIEM = re.compile(r"(\d)\s*([ap])\.?\s?m\.?(?=\s|,|$)", re.IGNORECASE)


def _rfc2822(text: str) -> datetime | None:
    """An e-mail style date ("Mon, 08 May 2023 13:56:12 +0000"), or None."""
    try:
        return email.utils.parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None


class AmbiguousDate(ValueError):
    """A day-month date that reads two ways, with nothing to say which."""


def _plain(text: object) -> str:
    """The value without the decorations exports add (module docstring)."""
    value = " ".join(str(text).split())
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1].strip()
    value = _WEEKDAY.sub("", value)
    value = _ORDINAL.sub(r"\1", value)
    return _UTC_NAME.sub("", value)


def _slashed(value: str) -> re.Match[str] | None:
    """A day-month date with slashes, or with dashes and a four-digit year ("23-05-08"
    may be year first)."""
    m = _SLASHED.match(value)
    return m if m and (m.group(2) == "/" or len(m.group(4)) == 4) else None


def _told(m: re.Match[str]) -> Order | None:
    """The order one slashed date shows by itself: "dmy" when its first field is over 12,
    "mdy" when its second is, None when both could be a month."""
    first, second = int(m.group(1)), int(m.group(3))
    if first > 12 >= second:
        return "dmy"
    if second > 12 >= first:
        return "mdy"
    return None


def order_of(values: Iterable[object]) -> Order | None:
    """The field order that the slashed day-month dates among `values` agree on: "dmy"
    when one has a first field over 12, "mdy" when one has a second field over 12, None
    when none tells. ValueError naming two values when they disagree."""
    seen: dict[Order, str] = {}
    for raw in values:
        m = _slashed(_plain(raw))
        told = _told(m) if m else None
        if told is not None:
            seen.setdefault(told, str(raw))
    if len(seen) == 2:
        raise ValueError(
            f"day-month dates in both orders: {seen['dmy']!r} is day first, "
            f"{seen['mdy']!r} month first"
        )
    return next(iter(seen), None)


def _unslashed(value: str, order: Order | None, text: object) -> str:
    """A slashed day-month date spelt with its month's name ("25/05/2023, 13:56" ->
    "25 May 2023, 13:56"), so the explicit formats read it."""
    m = _slashed(value)
    if m is None:
        return value
    order = order or _told(m)
    if order is None:
        raise AmbiguousDate(
            f"{text!r} is ambiguous (dd/mm/yyyy or mm/dd/yyyy?): write it as 2023-05-08 "
            "or 8 May 2023, or say which order the file uses (hippo replay --date-order "
            "dmy|mdy)"
        )
    first, second = int(m.group(1)), int(m.group(3))
    day, month = (first, second) if order == "dmy" else (second, first)
    year = int(m.group(4))
    if len(m.group(4)) == 2:  # as strptime's %y: 69-99 are 1969-1999, 00-68 2000-2068
        year += 1900 if year >= 69 else 2000
    if not 1 <= month <= 12:
        raise ValueError(f"{text!r}: there is no month {month}")
    rest = m.group(5)
    if rest.startswith("T"):  # "05/08/2023T13:56": read the time as ISO's
        rest = " " + rest[1:]
    return f"{day} {_MONTHS[month - 1]} {year}{rest}"


def parse(text: object, order: Order | None = None) -> datetime:
    """`text` as an aware UTC datetime; ValueError naming what is accepted otherwise
    (AmbiguousDate for a day-month date that reads two ways and no `order`)."""
    value = _plain(text)
    if _UNIX.match(value):
        seconds = float(value) / (1000 if len(value.split(".")[0]) >= 13 else 1)
        return datetime.fromtimestamp(seconds, UTC)
    normal = _MERIDIEM.sub(lambda m: f"{m.group(1)} {m.group(2).upper()}M", value)
    normal = _unslashed(normal, order, text)
    for fmt in FORMATS:
        try:
            return datetime.strptime(normal, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    when: datetime | None
    try:
        # ISO 8601: "Z", offsets, date-only and a space for the T (Python 3.11+); a space
        # before the offset too ("2023-05-08 13:56:00 +0200", as logs write it).
        when = datetime.fromisoformat(_OFFSET_AFTER_SPACE.sub(r"\1", value))
    except ValueError:
        when = _rfc2822(str(text))
    if when is None:
        raise ValueError(
            f"{text!r} is not a date this reader knows; accepted are e.g. "
            + ", ".join(repr(e) for e in EXAMPLES)
        )
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
