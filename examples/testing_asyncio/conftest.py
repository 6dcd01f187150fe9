# aiogroupq's fixtures: aiogroupq_server, aiogroupq_redis_url, aiogroupq_redis,
# aiogroupq_server_factory (only in the top-level conftest.py)
pytest_plugins = ["aiogroupq.testing.pytest_plugin"]
