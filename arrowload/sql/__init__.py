"""``al.sql``: SQL over bound tables.

:mod:`arrowload.sql.builder` turns a query into a plan (``parse_query``, ``build``); the
queries it does not lower to Filter / Project / Limit nodes run in DuckDB
(:mod:`arrowload.scan.duck`). This package's own import is free: it loads sqlglot only
when a query is built.
"""
