"""``--auth-secret-env``, ``--auth-secret-file`` and ``--auth-requires-tls`` as a user runs them.

The secret reaches nsqd's auth check from a variable or a file (never from the command line,
where any user sees it in the process list); ``--auth-requires-tls`` refuses to send it over
plaintext (exit 1, one line, the auth check never asked) and sends it over TLS; a missing
variable or an unreadable file is one line naming the flag; the secret is never printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.brokers import running_nsqd
from support.tls import TestCA, make_test_ca

from nsq_sansio.server.options import Authorization, AuthRequest, AuthState

from .conftest import cli, one_line_error

pytestmark = pytest.mark.timeout(60)

SECRET = "cli-Planted-Secret-5e1d"


class AuthCheck:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, request: AuthRequest) -> AuthState | None:
        self.asked.append(request.secret)
        if request.secret != SECRET:
            return AuthState(identity="nobody")
        return AuthState(identity="cli", authorizations=(Authorization(topic=".*"),))


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def broker(test_ca: TestCA) -> Iterator[tuple[str, AuthCheck]]:
    check = AuthCheck()
    options = {"tls_cert": test_ca.cert_file, "tls_key": test_ca.key_file, "auth_check": check}
    with running_nsqd(**options) as (server, _):
        yield server.tcp_address, check


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "nsq-secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


def pub(address: str, *flags: str, one_line: bool = False) -> tuple[int, str]:
    """``pub`` of one message: its exit code and its last line (the only one when
    ``one_line``: nothing was tried, so the library logged nothing)."""
    result = cli("pub", "--topic", "auth", "--nsqd-tcp-address", address, *flags, input=b"one\n")
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert SECRET not in output
    if result.returncode and one_line:
        return result.returncode, one_line_error(result)
    assert "Traceback" not in output, output
    return result.returncode, output.strip().splitlines()[-1] if result.returncode else output


def test_the_secret_from_a_file(broker: tuple[str, AuthCheck], secret_file: str) -> None:
    address, check = broker
    code, output = pub(address, "--auth-secret-file", secret_file)
    assert code == 0, output
    assert check.asked == [SECRET]  # the trailing newline dropped


def test_the_secret_from_the_environment(
    broker: tuple[str, AuthCheck], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, check = broker
    monkeypatch.setenv("NSQ_PLANTED_SECRET", SECRET)
    code, output = pub(address, "--auth-secret-env", "NSQ_PLANTED_SECRET")
    assert code == 0, output
    assert check.asked == [SECRET]


def test_auth_requires_tls_refuses_plaintext_and_uses_tls(
    broker: tuple[str, AuthCheck], secret_file: str, test_ca: TestCA
) -> None:
    address, check = broker
    code, error = pub(address, "--auth-secret-file", secret_file, "--auth-requires-tls")
    assert code == 1
    assert "auth_requires_tls" in error and "not TLS" in error
    assert check.asked == []  # never sent
    code, output = pub(
        address,
        "--auth-secret-file",
        secret_file,
        "--auth-requires-tls",
        "--tls-root-ca-file",
        test_ca.ca_file,
    )
    assert code == 0, output
    assert check.asked == [SECRET]


def test_a_missing_variable_or_file_is_one_line(
    broker: tuple[str, AuthCheck], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address, check = broker
    monkeypatch.delenv("NSQ_NO_SUCH_SECRET", raising=False)
    code, error = pub(address, "--auth-secret-env", "NSQ_NO_SUCH_SECRET", one_line=True)
    assert code == 1, (
        error and "--auth-secret-env='NSQ_NO_SUCH_SECRET'" in error and "not set" in error
    )
    missing = tmp_path / "absent"
    code, error = pub(address, "--auth-secret-file", str(missing), one_line=True)
    assert code == 1 and "--auth-secret-file" in error and str(missing) in error
    empty = tmp_path / "empty"
    empty.write_text("\n")
    code, error = pub(address, "--auth-secret-file", str(empty), one_line=True)
    assert code == 1 and "is empty" in error
    assert check.asked == []


def test_two_sources_of_the_secret_are_a_usage_error(
    broker: tuple[str, AuthCheck], secret_file: str
) -> None:
    address, _ = broker
    result = cli(
        "pub",
        "--topic",
        "auth",
        "--nsqd-tcp-address",
        address,
        "--auth-secret-env",
        "X",
        "--auth-secret-file",
        secret_file,
        input=b"one\n",
    )
    assert result.returncode == 2
    assert b"not allowed with argument" in result.stderr
