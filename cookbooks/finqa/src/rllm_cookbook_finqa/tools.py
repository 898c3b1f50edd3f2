"""The agent's four tools over one rollout's own in-memory SQLite database of financial tables.

Queries are read-only (an authorizer allows reading, nothing else) and time-limited (a progress
handler interrupts a statement past its deadline); the tables a query reads are recorded.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from rllm.sdk.tool_loop import Toolbox
from rllm_cookbook_finqa.calculator import CalculatorError, calculate

MAX_ROWS = 50
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_tables",
            "description": "List the financial tables in the database.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_table_schema",
            "description": "Columns of one table.",
            "parameters": {
                "type": "object",
                "properties": {"table": {"type": "string"}},
                "required": ["table"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "sql_query",
            "description": "Run one read-only SQLite SELECT statement.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic: numbers, + - * / % **, parentheses, abs round min max sqrt log.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
]

# Reading is allowed; so are the SELECT statement itself and SQL functions. Nothing else.
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


class FinanceDB:
    """One rollout's database. ``tables`` maps a name to ``{"columns": [...], "rows": [[...]]}``."""

    def __init__(self, tables: dict[str, dict[str, Any]], time_limit_s: float = 2.0) -> None:
        self.time_limit_s = time_limit_s
        self.accessed: list[str] = []
        self._conn = sqlite3.connect(":memory:")
        for name, table in tables.items():
            cols = ", ".join(f'"{c}"' for c in table["columns"])
            self._conn.execute(f'CREATE TABLE "{name}" ({cols})')
            marks = ", ".join("?" for _ in table["columns"])
            self._conn.executemany(f'INSERT INTO "{name}" VALUES ({marks})', table["rows"])
        self._conn.commit()
        self._conn.set_authorizer(self._authorize)
        self._deadline = 0.0
        self._conn.set_progress_handler(self._past_deadline, 1000)

    def close(self) -> None:
        self._conn.close()

    def _authorize(self, action: int, arg1: Any, arg2: Any, db: Any, trigger: Any) -> int:
        if (
            action == sqlite3.SQLITE_READ
            and arg1
            and arg1 not in ("sqlite_master", "sqlite_schema")
            and arg1 not in self.accessed
        ):
            self.accessed.append(arg1)
        return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY

    def _past_deadline(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0  # nonzero interrupts the statement

    def _select(self, sql: str, params: tuple = ()) -> list[tuple]:
        self._deadline = time.monotonic() + self.time_limit_s
        return self._conn.execute(sql, params).fetchmany(MAX_ROWS)

    def list_tables(self) -> str:
        rows = self._select("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return json.dumps([r[0] for r in rows])

    def get_table_schema(self, table: str) -> str:
        rows = self._select("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
        if not rows:
            return f"error: no table named {table!r}"
        if table not in self.accessed:
            self.accessed.append(table)
        return rows[0][0]

    def sql_query(self, query: str) -> str:
        try:
            cursor_rows = self._select(query)
        except sqlite3.DatabaseError as exc:  # denied writes, syntax errors, interrupted queries
            message = "query took longer than the time limit" if "interrupt" in str(exc) else str(exc)
            return f"error: {message}"
        except sqlite3.Warning as exc:  # e.g. more than one statement
            return f"error: {exc}"
        return json.dumps(cursor_rows)

    def calculator(self, expression: str) -> str:
        try:
            return repr(round(calculate(expression), 10))
        except CalculatorError as exc:
            return f"error: {exc}"

    def toolbox(self) -> Toolbox:
        """The four tools over this database; an SQLite error comes back to the model as text."""
        return Toolbox(
            TOOLS,
            {
                "list_tables": lambda args: self.list_tables(),
                "get_table_schema": lambda args: self.get_table_schema(str(args.get("table", ""))),
                "sql_query": lambda args: self.sql_query(str(args.get("query", ""))),
                "calculator": lambda args: self.calculator(str(args.get("expression", ""))),
            },
            model_errors=(sqlite3.Error,),
        )

    def call(self, name: str, arguments: str) -> str:
        """Run one tool call (OpenAI ``function.name`` and JSON ``arguments``); errors come back as text."""
        return self.toolbox().call_sync(name, arguments).result
