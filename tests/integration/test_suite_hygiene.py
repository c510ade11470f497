"""The suite minds its own: a user's virtual host named in `EO_TEST_AMQP_URL` is never used
for the tests' queues nor deleted (issue 25: the suite deleted it, with everything in it)."""

from __future__ import annotations

import subprocess
from urllib.parse import urlsplit

import pika
import pytest

from tests.support.processes import leftovers, this_run, where_for
from tests.support.services import AMQP_ENV, discover

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively


def _rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=30, check=True).stdout


def test_a_users_vhost_in_the_tests_url_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    services = discover(postgres=False)
    base = urlsplit(services.amqp_url)
    services.close()
    if base.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("needs rabbitmqctl for the broker of EO_TEST_AMQP_URL")
    own = this_run("a-users-own", "-")
    _rabbitmqctl("add_vhost", own)
    try:
        _rabbitmqctl("set_permissions", "-p", own, base.username or "guest", ".*", ".*", ".*")
        users_url = base._replace(path=f"/{own}").geturl()
        params = pika.URLParameters(users_url)
        with pika.BlockingConnection(params) as conn:
            channel = conn.channel()
            channel.queue_declare("the-users-queue", durable=True)
            channel.basic_publish("", "the-users-queue", b"keep me")
        monkeypatch.setenv(AMQP_ENV, users_url)
        with where_for("eo_hygiene", "eo-hygiene") as where:
            tests_vhost = urlsplit(where.amqp_url).path.lstrip("/")
            assert tests_vhost not in (own, "")
        assert own in _rabbitmqctl("list_vhosts").split()
        with pika.BlockingConnection(params) as conn:
            kept = conn.channel().queue_declare("the-users-queue", passive=True)
            assert kept.method.message_count == 1
        assert not [x for x in leftovers(None, users_url) if tests_vhost in x]
    finally:
        _rabbitmqctl("delete_vhost", own)
