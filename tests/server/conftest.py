"""Fixtures for the `tern serve` end-to-end tests (helpers.py holds the rest).

  server        one server per test module, started with the module's SERVER_ARGS (a list of strings);
                at the module's end it must stop on SIGTERM with exit 0 and no sanitizer report
  start_server  a factory for servers owned by one test: start_server("--api-key", "k") -> Server
"""
import pytest

from helpers import Server


# ---- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(request):
    s = Server(getattr(request.module, "SERVER_ARGS", ()))
    yield s
    s.assert_clean_stop()


@pytest.fixture
def start_server():
    servers = []

    def start(*args, **kw):
        s = Server(args, **kw)
        servers.append(s)
        return s

    yield start
    problems = []
    for s in servers:
        problems += s.stop()
    assert not problems, "\n".join(problems)
