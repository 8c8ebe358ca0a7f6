"""`verify`: every byte of a checkpoint read once, after the header audit (checks/).

read.py is the unit of work (one file read once: its sha256, each tensor's values scanned, each tensor's
sha256 when asked), windows.py how its bytes arrive (local pread into one buffer, or the Hub's ranged reads),
pool.py runs the files in a process pool or on Ray, references.py says what each sha256 is compared
with (HF cache blob names, the Hub's LFS sha256, a manifest: manifest.py), findings.py turns the results
into findings, run.py orchestrates (prepare, verify_files, finish_manifest) into result.VerifyReport.
It imports every stage up to checks/, never report/ or cli/ (report/verify_data.py and verify_table.py
render the VerifyReport).
"""
