"""Tests of pytest_arbiter/store/: the cache file's format (test_cache_file.py), the
loaded cache (test_cache.py), the fleet corpus's merge (test_corpus.py), atomic writes and
locks (test_artifacts.py), the pytest-benchmark export (test_benchmark_json.py), strict
JSON (test_strictjson.py) and safe text (test_safetext.py)."""
