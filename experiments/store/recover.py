"""Copy what a damaged sqlite store still holds into a new one, with Python's sqlite3 alone.

``python -m experiments.store.recover DAMAGED [RECOVERED]`` (the way on that a damaged store's
one-line error names). The sqlite3 command line's ``.recover`` needs a build that Debian 12's
lacks, so the copy is made here, table by table, row by row:

* the damaged file (and its WAL) is copied aside first and only the copy is read; a header that
  no longer says "SQLite format 3" is written anew (page size found by trying the usual ones);
* the new store gets the damaged one's own schema (its tables, then its indexes and triggers once
  the rows are in), so MLflow's schema version travels with it;
* each table is read by rowid in chunks; where a chunk meets a damaged page, the rowids are read
  one by one; a row the new table refuses (a value broken by the damage) is counted; params, tags
  and metrics of a run whose own row was lost are left out and counted. Indexes are never read
  for rows: a damaged index loses nothing;
* what a table held is known apart from those reads (:func:`expected_rows`): the cell counts of
  its b-tree's leaf pages, whose headers survive damage to their cells, and the entry count of each
  of its indexes. Every row short of that is counted as not copied: a lookup by rowid into a page
  whose cells are damaged finds nothing, and says nothing.

Nothing is written where the output exists, and no store is written when no run could be read:
an empty store would look like a good one. Exit status 0 when everything was read, 1 when the
store was written with losses (each counted on its own line), 2 when nothing was written.
"""

from __future__ import annotations

import argparse
import mmap
import shutil
import sqlite3
import struct
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path

from experiments.data.cache import atomic_path

CHUNK = 512
# Rowids read one by one past a damaged page before the rest of a table is given up as
# unreadable (only where its last rowid cannot be read either).
GIVE_UP_AFTER = 1 << 16
PAGE_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536)
MAGIC = b"SQLite format 3\x00"
# The tables whose rows belong to a run (``run_uuid``): left out when the run's own row was lost.
RUN_TABLES = ("params", "tags", "metrics", "latest_metrics")


class RecoveryError(RuntimeError):
    """No store could be written; the message is one line."""


@dataclass
class Recovery:
    """What was copied and what was not, per table."""

    copied: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, int] = field(default_factory=dict)  # rowids SQLite could not read
    refused: dict[str, int] = field(default_factory=dict)  # rows the new table refused
    orphaned: dict[str, int] = field(default_factory=dict)  # rows of runs whose own row was lost
    unreadable_tail: dict[str, int] = field(default_factory=dict)  # table -> first rowid of a lost end
    header_rewritten: bool = False

    @property
    def complete(self) -> bool:
        lost = (self.unreadable, self.refused, self.orphaned, self.unreadable_tail)
        return not any(any(counts.values()) for counts in lost)

    def lines(self) -> list[str]:
        """One line per table with losses, then the totals."""
        out = ["the header was unreadable and was written anew"] if self.header_rewritten else []
        for table in sorted(set(self.unreadable) | set(self.refused) | set(self.orphaned) | set(self.unreadable_tail)):
            parts = [
                f"{self.unreadable.get(table, 0)} unreadable" if self.unreadable.get(table) else "",
                f"{self.refused.get(table, 0)} with broken values" if self.refused.get(table) else "",
                f"{self.orphaned.get(table, 0)} of runs whose row was lost" if self.orphaned.get(table) else "",
                f"every row from rowid {self.unreadable_tail[table]} on" if table in self.unreadable_tail else "",
            ]
            if any(parts):
                out.append(
                    f"{table}: {self.copied.get(table, 0)} rows copied, not copied: {', '.join(p for p in parts if p)}"
                )
        return out


def recover(damaged: Path, recovered: Path) -> Recovery:
    """Copy every readable row of ``damaged`` into the new store ``recovered`` (see the module
    docstring); raises :class:`RecoveryError` when nothing is written."""
    if not damaged.is_file():
        raise RecoveryError(f"{damaged} is not a file")
    if recovered.exists():
        raise RecoveryError(f"{recovered} exists; give a new path for the recovered store")
    with tempfile.TemporaryDirectory(prefix="mesh-recover-") as folder:
        source = Path(folder) / "damaged.db"
        shutil.copyfile(damaged, source)
        if Path(f"{damaged}-wal").is_file():
            shutil.copyfile(f"{damaged}-wal", f"{source}-wal")
        outcome = Recovery()
        outcome.header_rewritten = _mend_header(source)
        _checkpoint(source)  # the WAL's pages into the file, where expected_rows reads the b-trees
        with closing(sqlite3.connect(source)) as reader:
            schema = _schema(reader, damaged)
            expected = expected_rows(source, reader, schema)
            with atomic_path(recovered) as tmp, closing(sqlite3.connect(tmp)) as writer:
                _copy(reader, writer, schema, outcome, expected)
                if not outcome.copied.get("runs"):
                    raise RecoveryError(
                        f"no run of {damaged} could be read ({'; '.join(outcome.lines()) or 'its tables are empty'}); "
                        "no store was written"
                    )
    return outcome


def _schema(reader: sqlite3.Connection, damaged: Path) -> list[tuple[str, str, str]]:
    """(type, name, sql) of the damaged store's tables, indexes and triggers."""
    try:
        rows = reader.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    except sqlite3.DatabaseError as error:
        raise RecoveryError(f"the schema of {damaged} cannot be read ({error}); no store was written") from None
    schema = [(kind, name, sql) for kind, name, sql in rows if not name.startswith("sqlite_")]
    if not any(kind == "table" and name == "runs" for kind, name, _ in schema):
        raise RecoveryError(f"{damaged} has no runs table that can be read; no store was written")
    return schema


def _copy(
    reader: sqlite3.Connection, writer: sqlite3.Connection, schema: list, outcome: Recovery, expected: dict[str, int]
) -> None:
    tables = [(name, sql) for kind, name, sql in schema if kind == "table"]
    for _, sql in tables:
        writer.execute(sql)
    for name, _ in tables:
        _copy_table(reader, writer, name, outcome, expected.get(name))
    _drop_orphans(writer, outcome)
    for kind, _, sql in schema:
        if kind != "table":
            writer.execute(sql)
    writer.commit()


def _copy_table(
    reader: sqlite3.Connection, writer: sqlite3.Connection, table: str, outcome: Recovery, expected: int | None
) -> None:
    columns = [row[1] for row in writer.execute(f'PRAGMA table_info("{table}")')]
    names = ", ".join(f'"{c}"' for c in columns)
    insert = f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(columns))})'
    copied = refused = 0
    for rows in _readable_rows(reader, table, names, outcome):
        try:
            writer.executemany(insert, rows)
            copied += len(rows)
        except sqlite3.Error:
            for row in rows:
                try:
                    writer.execute(insert, row)
                    copied += 1
                except sqlite3.Error:
                    refused += 1
    outcome.copied[table] = copied
    if refused:
        outcome.refused[table] = refused
    if expected is not None and table not in outcome.unreadable_tail and expected >= copied + refused:
        # every row the table held and no read returned, whether its read failed or found nothing
        outcome.unreadable[table] = expected - copied - refused
        if not outcome.unreadable[table]:
            del outcome.unreadable[table]


def expected_rows(source: Path, reader: sqlite3.Connection, schema: list[tuple[str, str, str]]) -> dict[str, int]:
    """table -> the rows it held, as far as can be known without reading them: the larger of the
    cell count of its b-tree's leaf pages (a page's header survives damage to its cells) and the
    entry count of any of its indexes that reads. A table with neither is left out."""
    tables = [name for kind, name, _ in schema if kind == "table"]
    indexes: dict[str, list[str]] = {}
    try:
        roots = dict(reader.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'").fetchall())
        for name, table in reader.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'"):
            indexes.setdefault(table, []).append(name)
    except sqlite3.DatabaseError:
        return {}
    expected = {}
    with source.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        pages = _Pages(data)
        for table in tables:
            counts = [n for n in [pages.leaf_cells(roots.get(table))] if n is not None]
            for index in indexes.get(table, []):
                with suppress(sqlite3.DatabaseError):
                    counts.append(reader.execute(f'SELECT count(*) FROM "{table}" INDEXED BY "{index}"').fetchone()[0])
            if counts:
                expected[table] = max(counts)
    return expected


class _Pages:
    """The b-tree pages of a database file (https://www.sqlite.org/fileformat.html, section 1.6)."""

    LEAF, INTERIOR = 0x0D, 0x05  # table b-tree pages

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        size = struct.unpack(">H", self.data[16:18])[0] if len(self.data) >= 100 else 0
        self.size = 65536 if size == 1 else size
        self.count = len(self.data) // self.size if self.size else 0

    def leaf_cells(self, root: int | None) -> int | None:
        """The cells of the leaf pages under ``root``; None where the tree cannot be walked (an
        interior page damaged: its children are unknown)."""
        if not root or not self.count:
            return None
        try:
            return self._walk(root)
        except (struct.error, IndexError):  # a pointer past the file's end
            return None

    def _walk(self, root: int) -> int | None:
        total, seen, todo = 0, set(), [root]
        while todo:
            page = todo.pop()
            if not 1 <= page <= self.count or page in seen:
                return None
            seen.add(page)
            start = (page - 1) * self.size
            head = start + (100 if page == 1 else 0)
            kind, cells = self.data[head], struct.unpack(">H", self.data[head + 3 : head + 5])[0]
            if kind == self.LEAF:
                total += cells
            elif kind == self.INTERIOR:
                todo.append(struct.unpack(">I", self.data[head + 8 : head + 12])[0])
                for i in range(cells):
                    pointer = struct.unpack(">H", self.data[head + 12 + 2 * i : head + 14 + 2 * i])[0]
                    if not 0 < pointer <= self.size - 4:
                        return None
                    todo.append(struct.unpack(">I", self.data[start + pointer : start + pointer + 4])[0])
            else:
                return None
        return total


def _checkpoint(source: Path) -> None:
    """Move the copy's WAL into its file, where it can be; a damaged copy may refuse (then the
    b-tree counts may be short and the index counts decide)."""
    with suppress(sqlite3.DatabaseError), closing(sqlite3.connect(source)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _readable_rows(reader: sqlite3.Connection, table: str, names: str, outcome: Recovery) -> Iterator[list[tuple]]:
    """Chunks of ``table``'s readable rows, in rowid order; unreadable rowids are counted in ``outcome``."""
    chunk = f'SELECT rowid, {names} FROM "{table}" WHERE rowid > ? ORDER BY rowid LIMIT {CHUNK}'
    one = f'SELECT {names} FROM "{table}" WHERE rowid = ?'
    last = _last_rowid(reader, table)
    after = -1  # rowids from 0 (MLflow's Default experiment is 0)
    while True:
        try:
            rows = reader.execute(chunk, (after,)).fetchall()
        except sqlite3.DatabaseError:
            rows = None
        if rows is not None:
            if not rows:
                return
            yield [row[1:] for row in rows]
            after = rows[-1][0]
            continue
        # A damaged page ahead: rowid by rowid until a chunk reads again (from 1, SQLite's first
        # automatic rowid, when nothing was read yet).
        failed, after = 0, max(after, 0)
        while True:
            after += 1
            if last is not None and after > last:
                return
            try:
                row = reader.execute(one, (after,)).fetchone()
            except sqlite3.DatabaseError:
                outcome.unreadable[table] = outcome.unreadable.get(table, 0) + 1
                failed += 1
                if last is None and failed >= GIVE_UP_AFTER:
                    outcome.unreadable[table] -= failed
                    outcome.unreadable_tail[table] = after - failed + 1
                    return
                continue
            if row is not None:
                yield [row]
            break


def _last_rowid(reader: sqlite3.Connection, table: str) -> int | None:
    try:
        return reader.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0] or 0
    except sqlite3.DatabaseError:
        return None


def _drop_orphans(writer: sqlite3.Connection, outcome: Recovery) -> None:
    """Rows of runs whose own row was lost: MLflow never shows them, so they are left out, counted."""
    tables = {row[0] for row in writer.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table in RUN_TABLES:
        if table in tables:
            gone = writer.execute(f'DELETE FROM "{table}" WHERE run_uuid NOT IN (SELECT run_uuid FROM runs)').rowcount
            if gone:
                outcome.orphaned[table] = gone
                outcome.copied[table] -= gone


def _mend_header(source: Path) -> bool:
    """Write a new 100-byte header over one that is not a SQLite header any more; whether it was."""
    with source.open("r+b") as file:
        if file.read(16) == MAGIC:
            return False
        size = source.stat().st_size
        wal = Path(f"{source}-wal").is_file()
        for page_size in PAGE_SIZES:
            file.seek(0)
            file.write(_header(page_size, size // page_size, wal))
            file.flush()
            if _schema_reads(source):
                return True
    return True  # none read: the schema check says so in its own line


def _header(page_size: int, pages: int, wal: bool) -> bytes:
    """A SQLite header (https://www.sqlite.org/fileformat.html, section 1.3) for a UTF-8 database
    without auto-vacuum or free pages."""
    version = 2 if wal else 1
    head = MAGIC + struct.pack(">HBBBBBB", page_size if page_size < 65536 else 1, version, version, 0, 64, 32, 32)
    head += struct.pack(">IIIIIIIIIIII", 1, pages, 0, 0, 1, 4, 0, 0, 1, 0, 0, 0)
    return head + bytes(20) + struct.pack(">II", 1, 3040001)


def _schema_reads(source: Path) -> bool:
    try:
        with closing(sqlite3.connect(source)) as connection:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return True
    except sqlite3.DatabaseError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.store.recover",
        description="Copy every readable experiment, run, param, tag and metric of a damaged MLflow sqlite "
        "store into a new store, and say what could not be read.",
    )
    parser.add_argument("damaged", type=Path, help="the damaged store, e.g. runs/mlflow.db")
    parser.add_argument(
        "recovered", type=Path, nargs="?", help="the new store (default: <name>-recovered.db beside it)"
    )
    args = parser.parse_args(argv)
    recovered = args.recovered or args.damaged.with_name(f"{args.damaged.stem}-recovered{args.damaged.suffix}")
    try:
        outcome = recover(args.damaged, recovered)
    except RecoveryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for line in outcome.lines():
        print(f"[recover] {line}", file=sys.stderr)
    print(
        f"[recover] {outcome.copied.get('runs', 0)} runs, {outcome.copied.get('params', 0)} params, "
        f"{outcome.copied.get('tags', 0)} tags and {outcome.copied.get('metrics', 0)} metric values copied to "
        f"{recovered}{'' if outcome.complete else ' (with the losses above)'}; use tracking.tracking_uri=sqlite:///{recovered.resolve()}"
    )
    return 0 if outcome.complete else 1


if __name__ == "__main__":
    sys.exit(main())
