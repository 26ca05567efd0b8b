"""clusters.yaml: parsing, validation messages with line and column, env interpolation, redaction."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from router import ClusterConfig, ConfigError, load_config, parse_config
from router.uris import redact_uri

GOOD = """\
database: feed
read_window: {clusters: 3, max_age: 400d}
write: {batch_size: 500}
clusters:
  - name: cluster_1
    uri: mongodb://127.0.0.1:27101
  - name: cluster_2
    uri: mongodb+srv://feed:${PW}@db2.example
    options: {serverSelectionTimeoutMS: 2000, tls: true, maxPoolSize: 50}
"""


def problems(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env=env or {})
    return [str(p) for p in info.value.problems]


def test_good_config_parses() -> None:
    """Every section is read into typed values; defaults fill the rest."""
    cfg = parse_config(GOOD, env={"PW": "s3cret"})
    assert [c.name for c in cfg.clusters] == ["cluster_1", "cluster_2"]
    assert cfg.clusters[1].uri == "mongodb+srv://feed:s3cret@db2.example"
    assert cfg.clusters[1].options == {"serverSelectionTimeoutMS": 2000, "tls": True, "maxPoolSize": 50}
    assert cfg.read_window.clusters == 3 and cfg.read_window.max_age == timedelta(days=400)
    assert cfg.batch_size == 500 and cfg.feed_collection == "feed" and cfg.metadata_collection == "metadata"


def test_password_never_in_repr() -> None:
    """A configured password does not appear in the config's repr."""
    cfg = parse_config(GOOD, env={"PW": "s3cret"})
    assert "s3cret" not in repr(cfg) and "feed:***@db2.example" in repr(cfg)
    assert cfg.clusters[1].display_uri == "mongodb+srv://feed:***@db2.example"


def test_env_default_and_missing() -> None:
    """${VAR:-default} falls back; a missing ${VAR} is an error at its line and column."""
    text = "clusters:\n  - name: a\n    uri: ${URI_A:-mongodb://h:1}\n  - name: b\n    uri: mongodb://u:${NOPE}@h:2\n"
    assert parse_config(text, env={"NOPE": "p"}).clusters[0].uri == "mongodb://h:1"
    assert parse_config(text, env={"URI_A": "mongodb://x:9", "NOPE": "p"}).clusters[0].uri == "mongodb://x:9"
    assert problems(text) == ["clusters.yaml:5:10: clusters[1].uri: environment variable NOPE is not set (got '${NOPE}')"]


def test_all_problems_reported_together_in_file_order() -> None:
    """Unknown keys, wrong types, duplicates and bad URIs all come back at once, sorted by line."""
    text = """\
database: feed
colections: {feed: x}
read_window: {clusters: 0, max_age: 12x}
write: {batch_size: many}
clusters:
  - name: c1
    uri: mongodb://h:1
  - name: c1
    uri: localhost
    bogus: 1
  - name: "bad name"
    uri: mongodb://h:1/
    options: {maxPoolSize: "x", tls: 1, wat: 2}
  - uri: mongodb://h:3
"""
    assert problems(text) == [
        "clusters.yaml:2:1: colections: unknown key (expected one of: celery, clients, clusters, collections, database, erasure, fanout, push, read, read_window, refresh_interval, rollover, timeout, write)",
        "clusters.yaml:3:25: read_window.clusters: must be at least 1 (got 0)",
        "clusters.yaml:3:37: read_window.max_age: must be a positive duration like 90d, 12h, 4w (got '12x')",
        "clusters.yaml:4:21: write.batch_size: must be an integer (got 'many')",
        "clusters.yaml:8:11: clusters[1].name: duplicate cluster name, already used by clusters[0] (got 'c1')",
        "clusters.yaml:9:10: clusters[1].uri: must be a mongodb:// or mongodb+srv:// URI (got 'localhost')",
        "clusters.yaml:10:5: clusters[1].bogus: unknown key (expected one of: database, name, options, uri)",
        "clusters.yaml:11:11: clusters[2].name: must be 1-64 letters, digits, '_', '.' or '-' (got 'bad name')",
        "clusters.yaml:12:10: clusters[2].uri: same deployment and database as clusters[0]: give one of them a database "
        "of its own (got 'mongodb://h:1/', database 'feed')",
        "clusters.yaml:13:28: clusters[2].options.maxPoolSize: must be int (got 'x')",
        "clusters.yaml:13:38: clusters[2].options.tls: must be bool (got 1)",
        "clusters.yaml:13:41: clusters[2].options.wat: unknown key (expected one of: "
        + ", ".join(sorted(__import__("router.config", fromlist=["DRIVER_OPTIONS"]).DRIVER_OPTIONS))
        + ")",
        "clusters.yaml:14:5: clusters[3].name: is required",
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "clusters.yaml: the file is empty; it needs at least a 'clusters' list"),
        ("- a\n- b\n", "clusters.yaml:1:1: must be a mapping (got a list)"),
        ("database: feed\n", "clusters.yaml:1:1: clusters: is required: a list of {name, uri} entries"),
        ("clusters: []\n", "clusters.yaml:1:11: clusters: must be a non-empty list (got a list)"),
        ("clusters: {a: 1}\n", "clusters.yaml:1:11: clusters: must be a non-empty list (got a mapping)"),
        ("clusters:\n  - name: a\n    uri: [1]\n", "clusters.yaml:3:10: clusters[0].uri: must be a single value (got a list)"),
        ("clusters: [\n", "clusters.yaml:2:1: not valid YAML"),
        ("database: feed\ndatabase: other\nclusters: [{name: a, uri: 'mongodb://h'}]\n", "clusters.yaml:2:1: database: duplicate key"),
        ("1: x\nclusters: [{name: a, uri: 'mongodb://h'}]\n", "clusters.yaml:1:1: <top>: keys must be strings (got '1')"),
        ("collections: {feed: a, metadata: a}\nclusters: [{name: a, uri: 'mongodb://h'}]\n",
         "clusters.yaml:1:34: collections.metadata: must differ from collections.feed (got 'a')"),
    ],
)
def test_structural_errors(text: str, expected: str) -> None:
    """Wrong shapes and broken YAML are reported with a position, never as a raw exception."""
    got = problems(text)
    assert got[0].startswith(expected), got


def test_password_redacted_in_errors() -> None:
    """An error about a URI carrying a password shows it redacted."""
    text = "clusters:\n  - {name: a, uri: 'mongodb://u:pw@h:1'}\n  - {name: b, uri: 'mongodb://u:pw@h:1'}\n"
    (msg,) = problems(text)
    assert "pw@" not in msg and "mongodb://u:***@h:1" in msg


SECRET = "S3cret-erasure-key-0123456789"


@pytest.mark.parametrize(("text", "expected"), [
    (f"erasure: {SECRET}\n", "clusters.yaml:4:10: erasure: must be a mapping (got a single value, not shown: it goes "
                              "under erasure.key)"),
    ("erasure: ${FEED_ERASURE_KEY}\n", "clusters.yaml:4:10: erasure: must be a mapping (got a single value, not shown"),
    (f"erasure:\n  {SECRET}\n", "clusters.yaml:5:3: erasure: must be a mapping (got a single value, not shown"),
    (f"erasure: {{{SECRET}: x}}\n", "clusters.yaml:4:11: erasure: an unknown key, not shown (expected one of: key)"),
    (f"erasure:\n  {SECRET}:\n", "clusters.yaml:5:3: erasure: an unknown key, not shown (expected one of: key)"),
    (f"erasure: {{? [{SECRET}] : x}}\n", "clusters.yaml:4:13: erasure: keys must be strings (got a list)"),
    ("erasure: {12345678901234567890: x}\n", "clusters.yaml:4:11: erasure: keys must be strings (got a single value)"),
    (f"erasure:\n  key: [{SECRET}]\n", "clusters.yaml:5:8: erasure.key: must be a single value (got a list)"),
])
def test_the_erasure_key_is_never_shown_wherever_it_was_written(text: str, expected: str) -> None:
    """An erasure key written one level up (as the erasure section's value, inline or on the next line), as a key of
    the section, or in a list: the problem says where and what kind of value, never the value (nor an environment
    variable's, once interpolated)."""
    yaml = "clusters:\n  - name: a\n    uri: mongodb://h:1\n" + text
    with pytest.raises(ConfigError) as raised:
        parse_config(yaml, env={"FEED_ERASURE_KEY": SECRET})
    assert str(raised.value).startswith(expected) or expected in str(raised.value), str(raised.value)
    assert SECRET not in str(raised.value) and "12345678901234567890" not in str(raised.value)


def test_load_config_reports_the_path(tmp_path: Path) -> None:
    """Errors from a file carry its path; a missing file is a ConfigError too."""
    path = tmp_path / "c.yaml"
    path.write_text("clusters:\n  - {name: a, uri: nope}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2:20: clusters\[0\].uri"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("mongodb://u:p@h:1/db", "mongodb://u:***@h:1/db"),
        ("mongodb+srv://u:p%40ss@h", "mongodb+srv://u:***@h"),
        ("mongodb://u@h", "mongodb://u@h"),
        ("mongodb://h:1", "mongodb://h:1"),
        ("mysql://u:pw@h", "mysql://u:***@h"),
        ("mongodb://u:p@ss@h/x?y=1", "mongodb://u:***@h/x?y=1"),
        ("failed: 'mongodb://u:pw@h:1' and mongodb://a:b@c", "failed: 'mongodb://u:***@h:1' and mongodb://a:***@c"),
    ],
)
def test_redact_uri(uri: str, shown: str) -> None:
    """Passwords are masked, user names and hosts kept."""
    assert redact_uri(uri) == shown


def test_sample_config_in_repo_is_valid() -> None:
    """The clusters.yaml shipped at the repo root loads."""
    cfg = load_config(Path(__file__).resolve().parents[2] / "clusters.yaml", env={})
    assert [c.name for c in cfg.clusters] == ["cluster_1", "cluster_2", "cluster_3"]


def test_rollover_section() -> None:
    """Rollover settings parse; standby names must be configured clusters."""
    text = GOOD + "rollover:\n  period: quarterly\n  lead_time: 10d\n  standby: [cluster_2]\n  anchor: 2024-01-01\n"
    ro = parse_config(text, env={"PW": "x"}).rollover
    assert ro is not None
    assert (ro.period, ro.lead_time, ro.standby) == ("quarterly", timedelta(days=10), ("cluster_2",))
    assert ro.anchor.isoformat() == "2024-01-01T00:00:00+00:00"
    assert parse_config(GOOD + "rollover: {period: 2w}\n", env={"PW": "x"}).rollover.period == "2w"  # type: ignore[union-attr]
    assert ro.layout == "copies"
    assert parse_config(GOOD + "rollover: {layout: buckets}\n", env={"PW": "x"}).rollover.layout == "buckets"  # type: ignore[union-attr]
    assert problems(GOOD + "rollover: {layout: heap}\n", env={"PW": "x"}) == [
        "clusters.yaml:10:20: rollover.layout: must be one of buckets, copies (got 'heap')"]


def test_rollover_problems() -> None:
    """Unknown standby names, bad periods and lead times longer than the period are all reported."""
    text = GOOD + "rollover:\n  period: fortnightly\n  lead_time: 40d\n  standby: [nope, cluster_2, cluster_2]\n  anchor: soon\n"
    assert problems(text, env={"PW": "x"}) == [
        "clusters.yaml:11:11: rollover.period: must be monthly, quarterly, yearly, or days/weeks like 30d, 2w (got 'fortnightly')",
        "clusters.yaml:13:13: rollover.standby[0]: must name a cluster listed under clusters (got 'nope')",
        "clusters.yaml:13:30: rollover.standby[2]: listed twice (got 'cluster_2')",
        "clusters.yaml:14:11: rollover.anchor: must be a date like 2024-01-01 (got 'soon')",
    ]
    lead = GOOD + "rollover: {period: monthly, lead_time: 30d}\n"
    assert problems(lead, env={"PW": "x"}) == ["clusters.yaml:10:40: rollover.lead_time: must be shorter than the period (got '30d')"]


@pytest.mark.parametrize(
    "uri, reason",
    [
        ("mongodb://127.0.0.1:notaport/", "port 'notaport' of host '127.0.0.1' must be a number from 1 to 65535"),
        ("mongodb://127.0.0.1:99999/", "port '99999' of host '127.0.0.1' must be a number from 1 to 65535"),
        ("mongodb://[::1]:0/", "port '0' of host '::1' must be a number from 1 to 65535"),
        ("mongodb://a b:1/", "host 'a b' is not a host name or address"),
        ("mongodb://", "it names no host"),
        ("mongodb:///db", "it names no host"),
        ("mongodb://h:1/?notAnOption=1", "unknown URI option 'notAnOption'"),
        ("mongodb://h:1/?w=1&bogus=2", "unknown URI option 'bogus'"),
        ("mongodb://h:1/?serverSelectionTimeoutMS=soon", "URI option 'serverSelectionTimeoutMS' has a bad value 'soon'"),
        ("mongodb://h:1/?tls=maybe", "URI option 'tls' has a bad value 'maybe'"),
        ("mongodb://h:1/?retryWrites", "URI options are key=value pairs (got 'retryWrites')"),
        ("mongodb+srv://a.example:27017", "a mongodb+srv:// URI names exactly one host and no port"),
    ],
)
def test_malformed_uris_are_config_errors(uri: str, reason: str) -> None:
    """pymongo's own URI parser finds what a hand-written pattern missed, reported at the URI's line and column."""
    text = f"clusters:\n  - name: a\n    uri: '{uri}'\n"
    (msg,) = problems(text)
    assert msg.startswith("clusters.yaml:3:10: clusters[0].uri: ")
    assert reason in msg, msg


def test_malformed_uri_error_hides_the_password() -> None:
    """A URI rejected by the parser is shown with its password masked."""
    (msg,) = problems("clusters:\n  - {name: a, uri: 'mongodb://u:hunter2@h:99999/'}\n")
    assert "hunter2" not in msg and "u:***@h:99999" in msg


@pytest.mark.parametrize("uri", ["mongodb://[::1]:27017", "mongodb://%2Ftmp%2Fm.sock", "mongodb://h1,h2:27018/?replicaSet=rs",
                                 "mongodb+srv://feed:pw@db.example/?retryWrites=true"])
def test_valid_uris_pass(uri: str) -> None:
    """IPv6, unix sockets, several hosts and SRV names are accepted (no DNS is asked)."""
    assert parse_config(f"clusters:\n  - {{name: a, uri: '{uri}'}}\n", env={}).clusters[0].uri == uri


def test_deep_yaml_is_a_config_error() -> None:
    """A file nested thousands of levels deep is a ConfigError, not a RecursionError."""
    deep = "clusters: " + "[" * 5000 + "]" * 5000 + "\n"
    assert problems(deep) == ["clusters.yaml: nested too deeply to be a clusters.yaml"]


def test_celery_section() -> None:
    """The celery section: broker (with ${VAR}), visibility timeout, retries and backoff; defaults; masked repr."""
    text = GOOD + "celery:\n  broker: redis://:${REDIS_PW}@broker.example:6379/0\n  visibility_timeout: 10m\n  retries: 5\n  retry_backoff: 250ms\n"
    cfg = parse_config(text, env={"PW": "x", "REDIS_PW": "hunter2"})
    assert cfg.celery is not None
    assert cfg.celery.broker == "redis://:hunter2@broker.example:6379/0"
    assert (cfg.celery.visibility_timeout, cfg.celery.retries, cfg.celery.retry_backoff) == (
        timedelta(minutes=10), 5, timedelta(milliseconds=250))
    assert "hunter2" not in repr(cfg) and cfg.celery.display_broker == "redis://:***@broker.example:6379/0"
    plain = parse_config(GOOD + "celery: {broker: 'amqp://feed:pw@rabbit:5672//'}\n", env={"PW": "x"}).celery
    assert plain is not None and (plain.visibility_timeout, plain.retries, plain.retry_backoff) == (
        timedelta(hours=1), 3, timedelta(seconds=5))
    assert parse_config(GOOD, env={"PW": "x"}).celery is None


def test_celery_problems() -> None:
    """Every problem of the celery section is reported with its position; a broker's password never shows."""
    text = GOOD + "celery:\n  broker: 'u:s3cret@localhost'\n  visibility_timeout: soon\n  retries: -1\n  queue: x\n"
    assert problems(text, env={"PW": "x"}) == [
        "clusters.yaml:11:11: celery.broker: must be a broker URL like redis://host:6379/0 or amqp://user:password@host:5672// "
        "(got '***@localhost')",
        "clusters.yaml:12:23: celery.visibility_timeout: must be a positive duration like 90d, 12h, 4w (got 'soon')",
        "clusters.yaml:13:12: celery.retries: must be at least 0 (got -1)",
        "clusters.yaml:14:3: celery.queue: unknown key (expected one of: broker, retries, retry_backoff, visibility_timeout)",
    ]
    assert problems(GOOD + "celery: {retries: 2}\n", env={"PW": "x"}) == [
        "clusters.yaml:10:9: celery.broker: is required: a Celery broker URL like redis://host:6379/0"]
    assert problems(GOOD + "celery: {broker: '${BROKER}'}\n", env={"PW": "x"})[0] == (
        "clusters.yaml:10:18: celery.broker: environment variable BROKER is not set (got '${BROKER}')")
    (msg,) = problems(GOOD + "celery: {broker: 'redis ://u:pw@h'}\n", env={"PW": "x"})
    assert msg.startswith("clusters.yaml:10:18: celery.broker: must be a broker URL") and "pw" not in msg, msg


def test_social_settings() -> None:
    """fanout.pull_threshold (absent: always push) and read.max_pull (default 1000) parse and are checked."""
    plain = parse_config(GOOD, env={"PW": "x"})
    assert (plain.pull_threshold, plain.max_pull) == (None, 1000)
    cfg = parse_config(GOOD + "fanout: {pull_threshold: 5000}\nread: {max_pull: 20}\n", env={"PW": "x"})
    assert (cfg.pull_threshold, cfg.max_pull) == (5000, 20)
    bad = GOOD + "fanout: {pull_threshold: 0}\nread: {max_pull: many}\n"
    messages = problems(bad, env={"PW": "x"})
    assert len(messages) == 2
    assert messages[0].startswith("clusters.yaml:10:") and "fanout.pull_threshold" in messages[0]
    assert messages[1].startswith("clusters.yaml:11:") and "read.max_pull" in messages[1]


def test_read_max_periods() -> None:
    """read.max_periods: absent or null is no budget; a positive int is the most periods one page asks."""
    assert parse_config(GOOD, env={"PW": "x"}).max_periods is None
    assert parse_config(GOOD + "read: {max_periods: null}\n", env={"PW": "x"}).max_periods is None
    assert parse_config(GOOD + "read: {max_periods: 32}\n", env={"PW": "x"}).max_periods == 32
    for bad in ("0", "-1", "lots"):
        messages = problems(GOOD + f"read: {{max_periods: {bad}}}\n", env={"PW": "x"})
        assert len(messages) == 1 and messages[0].startswith("clusters.yaml:10:") and "read.max_periods" in messages[0]


def test_periods_on_one_deployment_each_in_a_database_of_their_own() -> None:
    """Clusters may share a URI when each names its own database; the default is the top-level one."""
    config = parse_config(
        "database: feed\n"
        "clients: {idle_close: 90s}\n"
        "clusters:\n"
        "  - {name: a, uri: 'mongodb://h:1'}\n"
        "  - {name: b, uri: 'mongodb://h:1/', database: feed_b}\n"
        "  - {name: c, uri: 'mongodb://h:1', database: feed_c, options: {maxPoolSize: 5}}\n"
        "  - {name: d, uri: 'mongodb://h:1', options: {maxPoolSize: 5}}\n"
    )
    assert [config.database_for(c) for c in config.clusters] == ["feed", "feed_b", "feed_c", "feed"]
    assert config.database_for("b") == "feed_b"
    assert config.clusters[0].deployment == config.clusters[1].deployment != config.clusters[2].deployment
    assert config.clusters[2].deployment == config.clusters[3].deployment
    assert config.client_idle_close == timedelta(seconds=90)


def test_one_database_of_one_deployment_twice_is_refused_where_it_is_written() -> None:
    """Two entries on the same URI and options with the same database (named or by default) are a config error."""
    text = (
        "database: feed\n"
        "clusters:\n"
        "  - {name: a, uri: 'mongodb://h:1', database: p1}\n"
        "  - {name: b, uri: 'mongodb://h:1', database: p1}\n"
        "  - {name: c, uri: 'mongodb://h:1'}\n"
        "  - {name: d, uri: 'mongodb://h:1/', database: feed}\n"
        "  - {name: e, uri: 'mongodb://h:1', database: 'no.dots'}\n"
        "clients: {idle_close: soon}\n"
    )
    assert problems(text) == [
        "clusters.yaml:4:20: clusters[1].uri: same deployment and database as clusters[0]: give one of them a database "
        "of its own (got 'mongodb://h:1', database 'p1')",
        "clusters.yaml:6:20: clusters[3].uri: same deployment and database as clusters[2]: give one of them a database "
        "of its own (got 'mongodb://h:1/', database 'feed')",
        "clusters.yaml:7:47: clusters[4].database: must be a MongoDB database name (got 'no.dots')",
        "clusters.yaml:8:23: clients.idle_close: must be a positive duration like 90d, 12h, 4w (got 'soon')",
    ]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("uri: 'mongodb://h:1/?maxPoolSize=5&w=1'", "uri: 'mongodb://h:1/?w=1&maxPoolSize=5'"),
        ("uri: 'mongodb://h:1/?w=1'", "uri: 'mongodb://h:1?w=1'"),
        ("uri: 'mongodb://DB1.Example:1'", "uri: 'mongodb://db1.example:1'"),
        ("uri: 'mongodb://h'", "uri: 'mongodb://h:27017'"),
        ("uri: 'mongodb://h:1/?maxpoolsize=5'", "uri: 'mongodb://h:1/?maxPoolSize=5'"),
        ("uri: 'mongodb://a:1,b:2/?replicaSet=rs'", "uri: 'mongodb://b:2,a:1/?replicaSet=rs'"),
        ("uri: 'mongodb://h:1/?maxPoolSize=5'", "uri: 'mongodb://h:1', options: {maxPoolSize: 5}"),
        ("uri: 'mongodb://h:1/?socketTimeoutMS=2000'", "uri: 'mongodb://h:1', options: {socketTimeoutMS: 2000}"),
        ("uri: 'mongodb://h:1/?ssl=true'", "uri: 'mongodb://h:1', options: {tls: true}"),
    ],
    ids=["option order", "slash before options", "host case", "default port", "option name case", "host order",
         "option in the uri or options", "timeout in the uri or options", "option alias"],
)
def test_equivalent_uris_are_one_deployment(first: str, second: str) -> None:
    """URIs the driver reads as the same deployment are one: a second entry with the same database is refused where
    it is written, with the duplicate's message (it got a client of its own, then a MetadataError at start-up)."""
    text = f"clusters:\n  - {{name: a, {first}}}\n  - {{name: b, {second}}}\n"
    [message] = problems(text)
    assert message.startswith("clusters.yaml:3:") and "clusters[1].uri: same deployment and database as clusters[0]" in message
    ok = parse_config(text.replace("{name: b, ", "{name: b, database: other, "))
    assert ok.clusters[0].deployment == ok.clusters[1].deployment


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("mongodb://h:1", "mongodb://h:2"),
        ("mongodb://h:1/?maxPoolSize=5", "mongodb://h:1/?maxPoolSize=6"),
        ("mongodb://u:p@h:1", "mongodb://v:p@h:1"),
        ("mongodb://u:p@h:1/?authSource=a", "mongodb://u:p@h:1/?authSource=b"),
        ("mongodb://h:1", "mongodb+srv://h"),
    ],
)
def test_different_deployments_stay_apart(first: str, second: str) -> None:
    """Another host, port, option value, user or auth database is another deployment."""
    config = parse_config(f"clusters:\n  - {{name: a, uri: '{first}'}}\n  - {{name: b, uri: '{second}'}}\n")
    assert config.clusters[0].deployment != config.clusters[1].deployment


def test_the_database_in_the_uri_path_is_the_periods_database() -> None:
    """mongodb://h/feed_x names the period's database (it was ignored for the top-level one); a `database:` that
    contradicts it is refused, and so is a second entry for the same database by either spelling."""
    config = parse_config(
        "database: feed\n"
        "clusters:\n"
        "  - {name: a, uri: 'mongodb://h:1/feed_a'}\n"
        "  - {name: b, uri: 'mongodb://h:1/feed_b?w=1', database: feed_b}\n"
        "  - {name: c, uri: 'mongodb://h:1/'}\n"
    )
    assert [config.database_for(c) for c in config.clusters] == ["feed_a", "feed_b", "feed"]
    assert config.database_for("a") == "feed_a"
    assert problems(
        "clusters:\n"
        "  - {name: a, uri: 'mongodb://h:1/feed_a', database: feed_b}\n"
        "  - {name: b, uri: 'mongodb://h:1', database: feed_c}\n"
        "  - {name: c, uri: 'mongodb://h:1/feed_c'}\n"
        "  - {name: d, uri: 'mongodb://h:1/no.dots'}\n"
    ) == [
        "clusters.yaml:2:54: clusters[0].database: contradicts the database in the URI's path ('feed_a'): name one of "
        "them, or the same in both (got 'feed_b')",
        "clusters.yaml:4:20: clusters[2].uri: same deployment and database as clusters[1]: give one of them a database "
        "of its own (got 'mongodb://h:1/feed_c', database 'feed_c')",
        "clusters.yaml:5:20: clusters[3].uri: the URI's path must be a database name, the period's database (got 'no.dots')",
    ]
    with pytest.raises(ConfigError, match=r"clusters\['x'\].database: contradicts the database in the URI's path"):
        ClusterConfig(name="x", uri="mongodb://h:1/feed_a", database="feed_b")


def test_the_example_of_the_clusters_yaml_page_is_a_valid_file() -> None:
    """docs/operating/clusters-yaml.md's example loads as it reads: three clusters (two on one deployment, in their
    own databases), the rollover standby, the Celery broker, the live feeds' Redis and the erasure key, secrets from
    the environment."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operating" / "clusters-yaml.md").read_text()
    example = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    env = {"FEED_DB_PASSWORD": "db-secret", "FEED_ERASURE_KEY": "e" * 32, "REDIS_PASSWORD": "broker-secret"}
    config = parse_config(example, env=env)
    assert [c.name for c in config.clusters] == ["cluster_1", "cluster_5", "cluster_6"]
    assert config.clusters[2].database == "feed_2027_02" and config.rollover is not None
    assert config.rollover.standby == ("cluster_5",) and config.celery is not None
    assert config.celery.broker.startswith("redis://") and "secret" not in repr(config)
    assert config.push is not None and config.push.timeout.total_seconds() == 0.1
    assert config.push.display_redis == "redis://:***@redis.example:6379/0" and "broker-secret" in config.push.redis


def test_the_push_section() -> None:
    """push: the Redis URL (its password from the environment, never shown), the defaults, and every bad field at once."""
    config = parse_config("clusters: [{name: a, uri: 'mongodb://h:1'}]\npush: {redis: 'redis://:${PW}@r:6379/1'}\n",
                          env={"PW": "s3cret"})
    assert config.push is not None and config.push.redis == "redis://:s3cret@r:6379/1"
    assert (config.push.prefix, config.push.presence_ttl.total_seconds(), config.push.queue, config.push.catch_up,
            config.push.timeout.total_seconds()) == ("feedrouter", 30, 1000, 1000, 0.1)
    assert "s3cret" not in repr(config)
    text = ("clusters: [{name: a, uri: 'mongodb://h:1'}]\npush: {redis: 'http://u:pw@x', prefix: 'a b', queue: 0,\n"
            "  catch_up: 20000, presence_ttl: 1s, timeout: soon, extra: 1}\n")
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    message = str(info.value)
    for expected in ("push.redis: must be a redis://, rediss:// or unix:// URL (got 'http://u:***@x')",
                     "push.prefix: must be 1-64 letters", "push.queue: must be at least 1 (got 0)",
                     "push.catch_up: must be at most 10000 (got 20000)", "push.presence_ttl: must be at least 3s",
                     "push.timeout: must be a positive duration", "push.extra: unknown key"):
        assert expected in message, message
    assert "pw" not in message.replace("push", "")
    with pytest.raises(ConfigError, match="push.redis: is required"):
        parse_config("clusters: [{name: a, uri: 'mongodb://h:1'}]\npush: {prefix: x}\n")
