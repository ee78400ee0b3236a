"""Which file and record a file source's read failed at, once it has failed (its format looks:
formats/).

TensorFlow's reader and parser name neither (``DataLossError: corrupted record at 2534``, the
byte offset in a chunk; ``Name: <unknown>, Feature: x (data type: float) is required``): the
reads run inside tf.data, where raytf cannot catch them per file. When ``train_fn`` fails with
such an error, the worker reads the files its last pass over each TFRecord source was reading,
record by record, in order, for at most ``BUDGET_S`` seconds (inside the driver's grace period
for a failure's cause, so the failure still reaches it first), and adds the first bad record it
finds (its file, index and what is wrong) to the failure's message.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

logger = logging.getLogger(__name__)

BUDGET_S = 2.0  # how long a failed worker spends looking for the bad record (about 10^5 records here)
_SIGNS = (
    "corrupted record",
    "is required but could not be found",
    "Feature: ",
    "truncated record",
    "Could not parse example",
)


def looks_like_a_bad_record(error: BaseException) -> bool:
    return type(error).__name__ in ("DataLossError", "InvalidArgumentError") and any(
        sign in str(error) for sign in _SIGNS
    )


def explain(error: BaseException, cursors: dict[str, Any], budget_s: float = BUDGET_S) -> Optional[str]:
    """Where the bad record is, as a sentence, or None (not a record's error, or none found)."""
    if not looks_like_a_bad_record(error):
        return None
    deadline = time.monotonic() + budget_s
    for name, cursor in cursors.items():
        plan = getattr(cursor, "plan", None)
        if plan is None:
            continue
        from raytf._internal.data.formats import format_of

        for index in getattr(cursor, "files_read", ()):
            found = format_of(plan.source).bad_record(plan, plan.files[index], deadline)
            if found:
                return f"dataset {name!r}: {found}"
            if time.monotonic() > deadline:
                return f"dataset {name!r}: no bad record found in {budget_s:g} s of looking (its files: {plan.files[0]}, ...)"
    return None
