"""Session dates as chat archives spell them, read into UTC datetimes.

Explicit formats tried in order, then ISO 8601 through `datetime.fromisoformat`. Only
spellings with one reading are accepted: `08/05/2023` is 8 May in Europe and 5 August in
the US, so slashed day-month dates are refused (year-first `2023/05/08` is not ambiguous
and is accepted). A value without a zone is taken as UTC; one with an offset is converted.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_MONTH_DATES = ("%d %B %Y", "%d %B, %Y", "%B %d, %Y", "%B %d %Y")
_NUMERIC_DATES = ("%d.%m.%Y", "%Y/%m/%d")
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
)
_SLASHED_DAY_FIRST_OR_MONTH_FIRST = re.compile(r"^\d{1,2}/\d{1,2}/\d{2,4}\b")
# "p.m." and "1:56pm" are common in exports; strptime wants "PM" after a space.
_MERIDIEM = re.compile(r"(\d)\s*([ap])\.?\s?m\.?(?=\s|,|$)", re.IGNORECASE)


def parse(text: str) -> datetime:
    """`text` as an aware UTC datetime; ValueError naming what is accepted otherwise."""
    value = " ".join(str(text).split())
    if _SLASHED_DAY_FIRST_OR_MONTH_FIRST.match(value):
        raise ValueError(
            f"{text!r} is ambiguous (dd/mm/yyyy or mm/dd/yyyy?): write it as 2023-05-08 "
            "or 8 May 2023"
        )
    normal = _MERIDIEM.sub(lambda m: f"{m.group(1)} {m.group(2).upper()}M", value)
    for fmt in FORMATS:
        try:
            return datetime.strptime(normal, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    try:
        # ISO 8601: "Z", offsets, date-only and a space for the T (Python 3.11+).
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a date this reader knows; accepted are e.g. "
            + ", ".join(repr(e) for e in EXAMPLES)
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
