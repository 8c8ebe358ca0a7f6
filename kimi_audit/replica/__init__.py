"""Full-scale header replicas of the family, written to disk for `demo`, the tests and the benchmarks.

models.py says what each release holds (config, shard names and count, which shard holds each tensor);
build.py writes it: sparse shards whose headers hold the whole layout, plus config.json and the index.
This stage writes files; it reads the expected layout from model/ and comes after every stage an audit uses.
"""
