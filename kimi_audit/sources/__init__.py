"""Where checkpoint bytes come from: a local directory or the Hugging Face Hub.

Every source implements `Source` (base.py): a few whole small files and byte ranges of shards.
Nothing above this package opens files or sockets.
"""

from kimi_audit.sources.base import RangeRead, Source
from kimi_audit.sources.local import LocalSource
from kimi_audit.sources.resolve import open_source

__all__ = ["LocalSource", "RangeRead", "Source", "open_source"]
