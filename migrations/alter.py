"""What the migrations in `versions/` repeat, one call each: a table with its integer id and
its single-column indexes, columns added to a table or dropped from it. Columns go through
Alembic's batch mode, since SQLite alters a table by copying it; that copy is refused while
a view reads the table, so a drop on SQLite sets the table's views aside and makes them
again from their own text."""

import sqlalchemy as sa
from alembic import op


def create_table(table: str, *columns: sa.Column, indexed: tuple[str, ...] = ()) -> None:
    """`table`: an integer primary key `id`, then `columns`; an index ix_<table>_<column> on
    each column named in `indexed`."""
    op.create_table(table, sa.Column("id", sa.Integer, primary_key=True), *columns)
    for column in indexed:
        op.create_index(f"ix_{table}_{column}", table, [column])


def add_columns(table: str, *columns: sa.Column) -> None:
    with op.batch_alter_table(table) as batch:
        for column in columns:
            batch.add_column(column)


def drop_columns(table: str, *names: str, in_place: bool = False) -> None:
    """in_place: SQLite drops each column with its own ALTER TABLE (3.35 and later) instead of
    copying the table, as a table other tables' rows point at must be (the copy's DROP TABLE
    would break their foreign keys); for a plain column with no index or constraint."""
    if in_place:
        for name in names:
            op.drop_column(table, name)
        return
    views = _sqlite_views_reading(table)
    for name, _sql in views:
        op.execute(f'DROP VIEW "{name}"')
    with op.batch_alter_table(table) as batch:
        for name in names:
            batch.drop_column(name)
    for _name, sql in views:
        op.execute(sql)


def _sqlite_views_reading(table: str) -> list[tuple[str, str]]:
    """(name, CREATE VIEW text) of the SQLite views whose text names `table`; none elsewhere
    (PostgreSQL alters a table in place)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return []
    return [tuple(r) for r in bind.execute(sa.text(
        "SELECT name, sql FROM sqlite_master WHERE type = 'view' AND sql LIKE :pattern"),
        {"pattern": f"%{table}%"})]
