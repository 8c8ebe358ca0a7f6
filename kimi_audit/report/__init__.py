"""Every renderer and every plain-data report: a rich table, JSON (and its plain data, `--json` and the
API's `to_dict`), JUnit XML, markdown, SARIF, HTML (html.py, svg.py, grid.py, html_verify.py), the params,
explain, tensor and rmsnorm output, the verify report's data and table.

Renderers are pure: report in, text or plain data out (the table writes to a rich Console). They import
earlier stages for the reports' types (and the layout, for the HTML grid) and nothing later; only cli/ and
the package-root API call them, and writing files and choosing the format is the CLI's business.
"""
