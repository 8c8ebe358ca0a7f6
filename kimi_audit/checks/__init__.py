"""Every check: pure functions from a loaded Checkpoint (and its expected layout) to Findings.

audit.py runs them all into one immutable AuditReport; values.py reads the small tensors' values
(through numerics/) for `audit --values`; gates.py adds the release gates; diff.py compares two
checkpoints. It imports sources/, format/, model/ and numerics/, never report/ or cli/.
"""
