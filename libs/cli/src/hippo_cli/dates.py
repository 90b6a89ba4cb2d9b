"""Session dates as chat archives spell them, read into UTC datetimes.

ISO 8601 through `datetime.fromisoformat`, then explicit formats tried in order, then
e-mail style (RFC 2822) and Unix time (seconds, or milliseconds from 13 digits). Chat
exports decorate dates, so a leading weekday ("Monday, 8 May 2023"), ordinals ("May 8th,
2023", "8th of May 2023"), square brackets ("[08.05.2023, 13:56:12]"), a dot after a
short month ("Sept. 8") and dashes around a month's name ("8-May-2023") are read past.

A trailing zone is read after a space: an offset ("+02:00", "-0500", "UTC+2", "GMT-03:30")
or a common abbreviation ("UTC", "CET", "PDT", `ZONES`). An abbreviation this reader does
not know, or one that names several zones ("IST"), is refused rather than read as UTC: a
session dated hours off lands on the wrong day.

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
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

Order = Literal["dmy", "mdy"]
ORDERS: tuple[Order, ...] = ("dmy", "mdy")

# Four-digit years before two-digit ones: "%y" would stop after "20" of "2023" and fail.
_MONTH_DATES = ("%d %B %Y", "%d %B, %Y", "%B %d, %Y", "%B %d %Y", "%d %B %y")
_NUMERIC_DATES = ("%d.%m.%Y", "%Y/%m/%d", "%Y.%m.%d", "%Y-%m-%d", "%d.%m.%y")
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
            out += [f"{time}, {date}", f"{time} {date}"]  # "13:56, 8 May 2023"
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
_OF_MONTH = re.compile(r"\b(\d{1,2}) of (?=[A-Za-z])", re.IGNORECASE)  # "8 of May"
# A short month with a dot, and September's four-letter short form, as %b reads them.
_SHORT_MONTH = re.compile(
    r"\b(jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.?(?=[\s,\-/]|$)", re.IGNORECASE
)
# "8-May-2023", "08/May/23": the month's name between dashes or slashes.
_NAMED_MONTH_DASHED = re.compile(r"^(\d{1,2})[-/]([A-Za-z]{3,9})[-/](\d{2,4})\b")
# A zone after a space: an offset, perhaps after UTC/GMT ("UTC+2", "+02:00", "-0500").
_OFFSET = re.compile(r"\s+(?:(?:UTC|GMT)\s*)?([+-])(\d{1,2})(?::?(\d{2}))?$", re.IGNORECASE)
_ZONE_NAME = re.compile(r"\s+\(?([A-Za-z]{1,5})\)?$")
# Abbreviations that name one offset in practice; CST is the US one, as RFC 2822 reads it.
_ZONE_TABLE = """Z=0 UT=0 UTC=0 GMT=0 WET=0 WEST=1 BST=1 CET=1 CEST=2 MET=1 MEST=2 EET=2 EEST=3
    MSK=3 EST=-5 EDT=-4 CST=-6 CDT=-5 MST=-7 MDT=-6 PST=-8 PDT=-7 AKST=-9 AKDT=-8 HST=-10
    JST=9 KST=9 HKT=8 SGT=8 AWST=8 ACST=9.5 ACDT=10.5 AEST=10 AEDT=11 NZST=12 NZDT=13"""
ZONES: dict[str, float] = {
    name: float(hours) for name, hours in (pair.split("=") for pair in _ZONE_TABLE.split())
}
_SEVERAL_ZONES = {"IST": "India, Ireland or Israel", "AST": "Atlantic or Arabia"}
_NOT_ZONES = {"AM", "PM", *(m[:3].upper() for m in _MONTHS)}
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
    value = _OF_MONTH.sub(r"\1 ", value)
    value = _SHORT_MONTH.sub(lambda m: m.group(1)[:3], value)
    return _NAMED_MONTH_DASHED.sub(r"\1 \2 \3", value)


def _zone(value: str, text: object) -> tuple[str, timezone | None]:
    """The value without a trailing zone, and that zone (None if it names none);
    ValueError for a zone name that is unknown or names several zones."""
    m = _OFFSET.search(value)
    if m and re.search(r"\d", value[: m.start()]):
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        if hours > 14 or minutes > 59:
            raise ValueError(f"{text!r}: {m.group(0).strip()!r} is not a UTC offset")
        sign = -1 if m.group(1) == "-" else 1
        return value[: m.start()], timezone(sign * timedelta(hours=hours, minutes=minutes))
    m = _ZONE_NAME.search(value)
    if not m or not re.search(r"\d", value[: m.start()]):
        return value, None
    name = m.group(1).upper()
    if name in _NOT_ZONES:
        return value, None
    if name in _SEVERAL_ZONES:
        raise ValueError(
            f"{text!r}: the zone {m.group(1)!r} names several ({_SEVERAL_ZONES[name]}): "
            "write the offset instead (+05:30)"
        )
    if name not in ZONES:
        if not m.group(1).isupper():  # "8 May 2023 noon": a word, not a zone
            return value, None
        raise ValueError(
            f"{text!r}: the zone {m.group(1)!r} is not one this reader knows: write the "
            "offset instead (+01:00)"
        )
    return value[: m.start()], timezone(timedelta(hours=ZONES[name]))


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
    rest, zone = _zone(value, text)
    when = _read(rest, order, text) or _rfc2822(str(text))
    if when is None:
        raise ValueError(
            f"{text!r} is not a date this reader knows; accepted are e.g. "
            + ", ".join(repr(e) for e in EXAMPLES)
        )
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone or UTC)
    return when.astimezone(UTC)


def _read(value: str, order: Order | None, text: object) -> datetime | None:
    """`value` (no trailing zone) as ISO 8601 or one of FORMATS; None if neither reads it.
    The result is naive unless ISO's own offset ("...T13:56:00+02:00") was in it."""
    try:
        # ISO 8601 first: "Z", offsets, date-only and a space for the T (Python 3.11+).
        return datetime.fromisoformat(value)
    except ValueError:
        pass
    normal = _MERIDIEM.sub(lambda m: f"{m.group(1)} {m.group(2).upper()}M", value)
    normal = _unslashed(normal, order, text)
    for fmt in FORMATS:
        try:
            return datetime.strptime(normal, fmt)
        except ValueError:
            continue
    return None
