"""Strict reading of the safetensors format: the bytes a source gives, checked against the format's rules.

A shard's header (8-byte little-endian length + JSON) is parsed into typed columns and every violation
becomes a named Finding: header.py holds the entry points; msgspec decodes the common form into typed
Structs (decode.py), anything unusual goes through json.loads and the per-entry rules (strict.py), and
both share the column rules (columns.py). index.json is read the same way (index.py). This stage also
sizes the reads that fetch a header (estimate.py, fetch.py) and tables the tensors of a checkpoint's
headers (table.py). It imports sources/ and the shared modules, never a later stage.
"""
