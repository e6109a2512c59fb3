"""Secret redaction (redact): names, URLs, nested mappings and flat params."""

import collections
import copy

import pytest

from jupyter_trainfactory.redact import (
    CREDENTIAL_WORDS,
    MASK,
    is_secret_name,
    mask_url,
    redact_mapping,
    redact_params,
)

SECRET_NAMES = [
    "token",
    "HF_TOKEN",
    "apiToken",
    "api_token",
    "config.api_token",
    "config.db.password",
    "DB_PASSWORD",
    "passwd",
    "OPENAI_API_KEY",
    "api-key",
    "apikey",
    "APIKey",
    "privateKey",
    "ssh_private_key",
    "client_secret",
    "secrets",
    "aws secret access key",
    "credentials",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "gcp/credential",
    "passwords",
    "token2",
]
PLAIN_NAMES = [
    "key_dim",
    "num_keys",
    "monkey",
    "tokenizer",
    "max_tokens",
    "num_tokens",
    "tokens_per_second",
    "api",
    "key",
    "private",
    "api_version",
    "keyboard_layout",
    "passage",
    "PWD",
    "secretary",
    "lr",
    "",
    "flops_per_token",
    "spec.flops_per_token",
    "eos_token_id",
    "padTokenId",
    "max_token_len",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_names_with_a_credential_word_as_a_part_are_secrets(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_names_holding_a_credential_word_only_as_a_substring_are_not(name):
    assert not is_secret_name(name)


def test_credential_words_hold_the_plurals_except_tokens():
    assert {"secrets", "passwords", "credentials"} <= set(CREDENTIAL_WORDS)
    assert "tokens" not in CREDENTIAL_WORDS and "token" in CREDENTIAL_WORDS
    assert MASK == "***"


def test_is_secret_name_rejects_non_strings():
    with pytest.raises(TypeError):
        is_secret_name(3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://user:pass@host/x", "https://user:***@host/x"),
        ("https://TOKEN@github.com/x", "https://***@github.com/x"),
        ("git+https://u:p@h/r.git@v1", "git+https://u:***@h/r.git@v1"),
        (
            "pkg @ git+https://ghp_abc@github.com/o/r.git@v1",
            "pkg @ git+https://***@github.com/o/r.git@v1",
        ),
        ("https://u:p@ss@host:8080/x", "https://u:***@host:8080/x"),  # unescaped "@"
        ("https://h/x?token=abc&x=1", "https://h/x?token=***&x=1"),
        ("https://h/x?a=1&access_token=abc#frag", "https://h/x?a=1&access_token=***#frag"),
        ("https://h/x?api_key=k&max_tokens=5", "https://h/x?api_key=***&max_tokens=5"),
        ("https://h/x?sig=abc", "https://h/x?sig=abc"),  # not a credential word
        ("ssh://git@github.com/o/r.git", "ssh://git@github.com/o/r.git"),  # login user
        ("https://host/simple/pkg", "https://host/simple/pkg"),
        ("torch==2.3.0", "torch==2.3.0"),
        ("user:pass@host without a scheme", "user:pass@host without a scheme"),
        ("", ""),
    ],
)
def test_mask_url(text, expected):
    assert mask_url(text) == expected


def test_mask_url_masks_every_url_of_a_line_and_keeps_lines():
    text = (
        "--index-url https://u:p1@a.example/simple --extra-index-url https://t0k@b.example/s\n"
        "numpy==2.0.0\n"
        "pkg @ https://u:pw@host/pkg.whl\n"
    )
    assert mask_url(text) == (
        "--index-url https://u:***@a.example/simple --extra-index-url https://***@b.example/s\n"
        "numpy==2.0.0\n"
        "pkg @ https://u:***@host/pkg.whl\n"
    )


def test_mask_url_rejects_non_strings():
    with pytest.raises(TypeError):
        mask_url(b"https://u:p@h")


def test_redact_mapping_masks_nested_secrets_and_urls_without_mutating():
    data = {
        "lr": 0.1,
        "key_dim": 64,
        "api_token": "abc",
        "db": {"password": {"nested": "x"}, "host": "db.local"},
        "env": {"HF_TOKEN": "hf_x", "PATH": "/usr/bin"},
        "pip": ["numpy", "pkg @ https://u:pw@host/pkg.whl", {"secret": 1}],
        "shape": (1, "https://t@h/x"),
        3: "https://a:b@h/y",
    }
    original = copy.deepcopy(data)
    out, paths = redact_mapping(data, prefix="config")
    assert data == original
    assert out == {
        "lr": 0.1,
        "key_dim": 64,
        "api_token": MASK,
        "db": {"password": MASK, "host": "db.local"},
        "env": {"HF_TOKEN": MASK, "PATH": "/usr/bin"},
        "pip": ["numpy", "pkg @ https://u:***@host/pkg.whl", {"secret": MASK}],
        "shape": (1, "https://***@h/x"),
        3: "https://a:***@h/y",
    }
    assert paths == [
        "config.3",
        "config.api_token",
        "config.db.password",
        "config.env.HF_TOKEN",
        "config.pip.1",
        "config.pip.2.secret",
        "config.shape.1",
    ]


def test_redact_mapping_copies_deeply_and_paths_have_no_prefix_by_default():
    data = {"inner": {"values": [1, 2]}, "token": "t"}
    out, paths = redact_mapping(data)
    out["inner"]["values"].append(3)
    assert data["inner"]["values"] == [1, 2]
    assert paths == ["token"]


def test_redact_mapping_keeps_named_tuples():
    Pair = collections.namedtuple("Pair", "url size")
    out, paths = redact_mapping({"mirror": Pair("https://u:p@h/x", 3)})
    assert out == {"mirror": Pair("https://u:***@h/x", 3)} and type(out["mirror"]) is Pair
    assert paths == ["mirror.0"]


def test_redact_mapping_rejects_non_mappings():
    with pytest.raises(TypeError):
        redact_mapping([("token", "x")])


def test_redact_params():
    params = {
        "config.api_token": "abc",
        "config.key_dim": "64",
        "config.max_tokens": "128",
        "pip": "pkg @ https://u:p@h/x",
        "env.AWS_SECRET_ACCESS_KEY": "s",
    }
    original = dict(params)
    assert redact_params(params) == {
        "config.api_token": MASK,
        "config.key_dim": "64",
        "config.max_tokens": "128",
        "pip": "pkg @ https://u:***@h/x",
        "env.AWS_SECRET_ACCESS_KEY": MASK,
    }
    assert params == original


def test_empty_values_under_secret_names_are_not_reported():
    out, paths = redact_mapping({"api_token": None, "db": {"password": ""}, "hf_token": "x"})
    assert out == {"api_token": None, "db": {"password": ""}, "hf_token": "***"}
    assert paths == ["hf_token"]
