"""Render an AuditReport: a rich table, JSON, JUnit XML, markdown.

Renderers are pure: report in, text out (the table writes to a rich Console). They import checks/ for
the report's types and nothing later; writing files and choosing the format is the CLI's business.
"""
