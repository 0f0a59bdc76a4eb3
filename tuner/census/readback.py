"""After a census has written, read back what it reports (issue 61: a SQLite WAL file
deleted mid-census left a database with no tables while the census printed "17 certified"
and exited 0, because its own connections still read the deleted file).

The check opens a fresh connection, so it reads what the next command will read."""

from __future__ import annotations

from sqlalchemy import create_engine, make_url, select
from sqlalchemy.exc import SQLAlchemyError

from nbx_tune.errors import StoreError
from nbx_tune.tuner.store.models import Certificate

CHUNK = 500  # seat ids per query: under every backend's limit on bound parameters


def verify_certificates(url, report) -> None:
    """Raise a StoreError unless every seat `report` calls certified or unscreened has a
    current certificate in the database at `url`, read through a new connection."""
    claimed = sorted({ln.id for ln in report.seats if ln.status in ("certified", "unscreened") and ln.id})
    if not claimed or _in_memory(url):
        return
    engine = create_engine(url)
    found = set()
    try:
        with engine.connect() as c:
            for i in range(0, len(claimed), CHUNK):
                found.update(c.execute(select(Certificate.seat_id).where(
                    Certificate.seat_id.in_(claimed[i:i + CHUNK]), Certificate.superseded_at.is_(None))).scalars())
    except SQLAlchemyError as e:
        raise StoreError(f"database {report.db}: the census reports {len(claimed)} certified seat(s), but reading "
                         f"them back failed ({str(getattr(e, 'orig', e)).splitlines()[0]}): the results are lost "
                         "(was the database or its -wal file deleted or moved?); run the census again") from None
    finally:
        engine.dispose()
    missing = [i for i in claimed if i not in found]
    if missing:
        raise StoreError(f"database {report.db}: the census reports {len(claimed)} certified seat(s), but "
                         f"{len(missing)} have no certificate when read back (seat {missing[0]} first): the "
                         "results are lost (was the database or its -wal file deleted or moved?); run the "
                         "census again")


def _in_memory(url) -> bool:
    """An in-memory SQLite database: nothing outlives the census's connections to read back."""
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and (u.database in (None, "", ":memory:")
                                                 or "mode=memory" in str(u))
