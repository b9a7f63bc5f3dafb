"""serving/protocol.py: every socket's one codec, requests typed and checked when read, and
errors that keep their kind from the process that made them to the front end that shows them;
and options.request_values, how a mount server reads a session's options."""

from __future__ import annotations

import pytest

from chromafs_fuse.access import Principal
from chromafs_fuse.errors import AccessDenied, ChromafsError, NotFound, Refused, Unavailable, UsageError, kind_of
from chromafs_fuse.options import CLIENT_ONLY, request_values
from chromafs_fuse.serving.protocol import (
    CONTROL_REQUESTS,
    FORKER_JOBS,
    MOUNT_SERVER_REQUESTS,
    AddView,
    BadRequest,
    Describe,
    OpenPodSession,
    OpenSession,
    OpenViewSession,
    RenewSession,
    RenewViewSession,
    ServePoolProcess,
    answer_of,
    decode,
    encode,
    error_line,
    ok_line,
    reader_fields,
    reader_principal,
)


@pytest.mark.parametrize(
    ("request_", "table"),
    [
        (
            OpenSession("/mnt/d", {"--site": "a", "-o": ["allow_other"], "--isolated": True}, "t.o.k"),
            MOUNT_SERVER_REQUESTS,
        ),
        (OpenSession("/mnt/d", {}, None), MOUNT_SERVER_REQUESTS),
        (
            OpenPodSession("/mnt/d", {"--site": "a"}, reader_fields(Principal.of(["b"], "s", 2e9))),
            MOUNT_SERVER_REQUESTS,
        ),
        (
            RenewSession("/mnt/d", {"--site": "a"}, reader_fields(Principal.of([], None, 2e9, "j", 1e9))),
            MOUNT_SERVER_REQUESTS,
        ),
        (RenewViewSession(".sessions/3", 2e9), CONTROL_REQUESTS),
        (AddView({"mountpoint": "/m", "session": {"site": "a"}}, True, ["b", "a"]), CONTROL_REQUESTS),
        (OpenViewSession("s/v", 1000, 1000, 1.5e9, True), CONTROL_REQUESTS),
        (OpenViewSession("s/v", 0, 0), CONTROL_REQUESTS),
        (Describe(), CONTROL_REQUESTS),
        (ServePoolProcess("/run/chromafs/classes", 3, 1 << 30, 65.0), FORKER_JOBS),
    ],
)
def test_a_request_reads_back_equal(request_: object, table: dict) -> None:
    line = encode(request_)  # type: ignore[arg-type]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line, table) == request_


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"argv please\n", "not a JSON line"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"argv": ["/m", "--site", "a"], "token": null, "cwd": "/"}\n', "unknown op None"),
        (b'{"op": "add", "path": "x"}\n', "unknown op 'add'"),  # a control request on the server's socket
        (b'{"op": "open_session", "options": {}}\n', "open_session without mountpoint"),
        (b'{"op": "open_session", "mountpoint": 5, "options": {}}\n', "open_session.mountpoint is not str"),
        (b'{"op": "open_session", "mountpoint": "/m", "options": []}\n', "open_session.options is not"),
        (b'{"op": "open_session", "mountpoint": "/m", "options": {}, "cwd": "/"}\n', "has no field 'cwd'"),
    ],
)
def test_a_line_that_is_not_a_request_of_the_socket_is_refused_as_usage(line: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says) as info:
        decode(line, MOUNT_SERVER_REQUESTS)
    assert kind_of(info.value) == "usage"


def test_types_are_checked_as_declared() -> None:
    with pytest.raises(BadRequest, match="uid is not int"):
        decode(b'{"op": "session", "path": "p", "uid": true, "gid": 0}', CONTROL_REQUESTS)
    with pytest.raises(BadRequest, match="expires_at is not float"):
        decode(b'{"op": "session", "path": "p", "uid": 0, "gid": 0, "expires_at": "soon"}', CONTROL_REQUESTS)
    with pytest.raises(BadRequest, match="groups is not list"):
        decode(b'{"op": "add", "config": {}, "authenticated": true, "groups": ["a", 1]}', CONTROL_REQUESTS)
    assert decode(b'{"op": "session", "path": "p", "uid": 0, "gid": 0, "expires_at": 5}', CONTROL_REQUESTS)


@pytest.mark.parametrize(
    "error",
    [
        NotFound("no collection 'mcpp'"),
        AccessDenied("token is for site 'x'"),
        UsageError("--cache-bytes: bad"),
        Unavailable("chroma down"),
        Refused("/m is already mounted"),
    ],
)
def test_an_error_keeps_its_kind_and_message_across_a_socket(error: ChromafsError) -> None:
    with pytest.raises(ChromafsError) as info:
        answer_of(error_line(error))
    assert type(info.value) is type(error) and info.value.message == error.message


def test_a_bug_crosses_as_internal_without_its_class_name() -> None:
    with pytest.raises(ChromafsError) as info:
        answer_of(error_line(KeyError("views")))
    assert kind_of(info.value) == "internal" and "KeyError" not in info.value.message
    assert answer_of(ok_line(path="a/b")) == {"ok": True, "path": "a/b"}
    assert answer_of(ok_line()) == {"ok": True}


# -- how a mount server reads a session's options ------------------------------------------------


def test_options_are_read_as_the_parser_reads_them_and_never_from_this_processs_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHROMAFS_REDIS_URL", "redis://the-servers-own:6379/0")
    monkeypatch.setenv("CHROMAFS_JWT_SECRET_FILE", "/the/servers/own")
    values = request_values({"--site": "a", "--cache-bytes": "5", "--backend-timeout": 2, "--push-pages": False})
    assert (values["site"], values["cache_bytes"], values["backend_timeout"], values["push_pages"]) == (
        "a",
        5,
        2.0,
        False,
    )
    assert values["redis_url"] is None and values["jwt_secret_file"] is None
    assert values["options"] == [] and values["preload"] == "auto"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({}, "required: --site"),
        ({"--site": "a", "--cache-bytes": "lots"}, "--cache-bytes: invalid int value: 'lots'"),
        ({"--site": "a", "--preload": "sometimes"}, "--preload: invalid choice: 'sometimes'"),
        ({"--site": "a", "--isolated": "yes"}, "--isolated takes no value"),
        ({"--site": "a", "-o": "allow_other"}, "-o wants a list of strings"),
        ({"--site": "a", "--sit": "b"}, "--sit: not an option"),
        ({"--site": "a", "--prefetch": "off"}, "--prefetch: not an option"),  # old names: the client's to map
        ({"--site": "a", "--ready-fd": 3}, "--ready-fd: not an option"),
    ],
)
def test_wrong_options_are_refused_naming_the_flag(given: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        request_values(given)


@pytest.mark.parametrize("flag", sorted(CLIENT_ONLY))
def test_a_request_never_carries_the_clients_own_options(flag: str) -> None:
    with pytest.raises(ValueError, match="not an option of a session request"):
        request_values({"--site": "a", flag: "x"})


def test_chromafs_searchs_light_encoder_writes_the_codecs_search() -> None:
    """`chromafs search` writes its request and reads the answer without this module (its start-up
    is a query's latency): the server reads the same request, the client the same answer."""
    from chromafs_fuse.cli.mount_request import answer_fields, encode_search
    from chromafs_fuse.serving.protocol import MOUNT_SERVER_REQUESTS, Search, decode, encode, error_line, ok_line

    options = {"--site": "acme", "--chroma-url": "http://c:8000", "--jwks-url": "https://idp/jwks"}
    line = encode_search(options, "rotate keys ✓", 3, "a.b.c", None, "lexical")
    search = Search(options, "rotate keys ✓", 3, "a.b.c", None, "lexical")
    assert decode(line, MOUNT_SERVER_REQUESTS) == search and decode(encode(search), MOUNT_SERVER_REQUESTS) == search
    assert answer_fields(ok_line(lines=["a.md:1-2: x"]))["lines"] == ["a.md:1-2: x"]
    with pytest.raises(NotFound, match="no site 'acmee'"):
        answer_fields(error_line(NotFound("no site 'acmee'")))


def test_a_verified_reader_reads_back_equal_and_a_reader_that_does_not_fit_is_refused() -> None:
    reader = Principal.of(["billing", "admin"], "system:serviceaccount:agents:doc", 2e9, "jti-1", 1.9e9)
    assert reader_principal(reader_fields(reader)) == reader
    good = reader_fields(reader)
    for bad in (
        {**good, "expires_at": None},  # a reader that never ends is not taken on a caller's word
        {**good, "groups": "admin"},
        {**good, "authenticated": True},
        {k: v for k, v in good.items() if k != "subject"},
    ):
        with pytest.raises(BadRequest, match="a reader is groups"):
            reader_principal(bad)
