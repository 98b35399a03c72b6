"""``auth_secret_env`` and ``auth_secret_file``: the AUTH secret read when the client is made.

One shape on every runtime (and the CLI's ``--auth-secret-env`` / ``--auth-secret-file``):
read once, a mistake is a ConfigError at once naming the variable or the path and never the
content, one trailing newline of a file dropped, at most one source of the secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.runtimes import Runtime

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError
from transports._common import read_auth_secret, split_options

PLANTED = "planted-in-a-file-3c9a"


def secret_in(tmp_path: Path, content: bytes) -> str:
    path = tmp_path / f"secret-{len(list(tmp_path.iterdir()))}"
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    ("content", "secret"),
    [
        (b"s3cret", b"s3cret"),
        (b"s3cret\n", b"s3cret"),
        (b"s3cret\r\n", b"s3cret"),
        (b"s3cret\n\n", b"s3cret\n"),  # one newline only: the rest is the secret's
        (b" \xffbinary\x00 ", b" \xffbinary\x00 "),
    ],
)
def test_a_file_holds_the_secret(tmp_path: Path, content: bytes, secret: bytes) -> None:
    assert read_auth_secret(file=secret_in(tmp_path, content)) == secret
    config, _ = split_options(None, {"auth_secret_file": Path(secret_in(tmp_path, content))})
    assert config.auth_secret == secret


def test_an_environment_variable_holds_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQ_TEST_SECRET", "from-the-env")
    config, _ = split_options(None, {"auth_secret_env": "NSQ_TEST_SECRET"})
    assert config.auth_secret == b"from-the-env"


def test_mistakes_name_the_source_never_the_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NSQ_UNSET_SECRET", raising=False)
    monkeypatch.setenv("NSQ_EMPTY_SECRET", "")
    oversized = secret_in(tmp_path, PLANTED.encode() * 5000)
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"auth_secret_env": "NSQ_UNSET_SECRET"},
            "'NSQ_UNSET_SECRET': that environment variable is not set",
        ),
        (
            {"auth_secret_env": "NSQ_EMPTY_SECRET"},
            "'NSQ_EMPTY_SECRET': that environment variable is empty",
        ),
        ({"auth_secret_env": ""}, "must name an environment variable"),
        ({"auth_secret_file": str(tmp_path / "absent")}, "cannot read it (No such file"),
        ({"auth_secret_file": str(tmp_path)}, "cannot read it (Is a directory"),
        ({"auth_secret_file": secret_in(tmp_path, b"\n")}, "is empty"),
        ({"auth_secret_file": oversized}, "holds more than 65536 bytes"),
    ]
    for options, expected in cases:
        with pytest.raises(ConfigError) as caught:
            split_options(None, options)
        assert expected in str(caught.value), caught.value
        assert PLANTED not in str(caught.value)


def test_one_source_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQ_TEST_SECRET", PLANTED)
    path = secret_in(tmp_path, PLANTED.encode())
    for options, config in (
        ({"auth_secret_env": "NSQ_TEST_SECRET", "auth_secret_file": path}, None),
        ({"auth_secret_env": "NSQ_TEST_SECRET", "auth_secret": "x"}, None),
        ({"auth_secret_file": path}, Config(auth_secret=b"x")),
    ):
        with pytest.raises(ConfigError, match="given more than once") as caught:
            split_options(config, options)
        assert PLANTED not in str(caught.value)


@pytest.mark.anyio
async def test_every_runtime_takes_them(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made, not started: what matters is the config each client ends up with."""
    monkeypatch.setenv("NSQ_TEST_SECRET", "from-the-env")
    path = secret_in(tmp_path, b"from-the-file\n")
    module = runtime.module
    consumer = module.Consumer("t", "c", nsqd=["127.0.0.1:4150"], auth_secret_file=path)
    producer = module.Producer(["127.0.0.1:4150"], auth_secret_env="NSQ_TEST_SECRET")
    assert consumer.config.auth_secret == b"from-the-file"
    assert producer.config.auth_secret == b"from-the-env"
    with pytest.raises(ConfigError, match="auth_secret_env"):
        module.Consumer("t", "c", nsqd=["127.0.0.1:4150"], auth_secret_env="NSQ_UNSET_SECRET")
