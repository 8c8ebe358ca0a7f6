"""`download`: a checkpoint from the Hub at a pinned commit, whole or headers only (hub.py).

It reads the Hub only through the sources' public calls (HubSource, sources/hub_snapshot.py), fetches a
shard's header as the audit does (format/fetch.py), sizes it from the audit's own config and index
loaders (model/), and hashes a downloaded file as `verify` does (verify/read.py).
"""
