"""Where checkpoint bytes come from: a local directory or the Hugging Face Hub.

Every source implements `Source` (base.py): a few whole small files and byte ranges of shards, and the
optional capabilities (listed sizes, sparse holes, LFS digests, a local directory) answered by all.
`resolve_source` (resolve.py) is the one place what the user typed becomes a source. Above this package,
only verify/windows.py opens a checkpoint's files itself (read by pread, through files.open_regular like
every local file); writing is left to the stages that produce files, through kimi_audit.outputs.
"""

from kimi_audit.sources.base import RangeRead, Source
from kimi_audit.sources.local import LocalSource
from kimi_audit.sources.resolve import open_source, resolve_source

__all__ = ["LocalSource", "RangeRead", "Source", "open_source", "resolve_source"]
