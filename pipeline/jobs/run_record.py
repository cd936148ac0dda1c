"""The run record: what defines a run, written into its folder when it starts (``run.json``).

``streamtrain run --resume DIR`` alone continues exactly the run recorded there: every
option not given again comes from the record; one given again must agree with it where
it defines the run (:data:`ROLES`), and may differ where it may change between sessions.
``streamtrain serve DIR`` and ``streamtrain predict --run DIR`` read the model's part of the
same file (:func:`pipeline.serve.predictor.read_description`).

Example:
    >>> sorted(name for name, role in ROLES.items() if role == SESSION)
    ['divergence_check', 'generation', 'max_batches', 'out', 'resume', 'timeout_s']
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

#: The record's file in a run's folder (``model.json`` before it; serving still reads that).
RECORD_FILE = "run.json"

DEFINES = "defines the run"  # recorded; given again on a resume, it must agree
KEPT = "kept, may change"  # recorded and kept on a resume unless given again
SESSION = "this session's own"  # never recorded: each session's bounds, and where it starts

#: Every :class:`~pipeline.jobs.run_config.RunConfig` field, by what it is to a resumed run.
#: ``tests/jobs/test_run_record.py`` fails for a field missing here: a new setting must say
#: whether it defines the run.
ROLES: dict[str, str] = {
    "dataset": DEFINES,
    "model": DEFINES,  # with the model's fingerprint, and its file's digest
    "algorithm": DEFINES,
    "communication_window": DEFINES,
    # When a gradient is computed, not what the state holds: a resume may change it.
    "sync_overlap": KEPT,
    "wire_dtype": DEFINES,  # the precision of every exchange, as much the run's as its window
    "batch_size": DEFINES,
    "workers": DEFINES,
    "topic": DEFINES,
    "own_topic": DEFINES,  # not an option: the run's own, from its start on
    "bootstrap": DEFINES,
    "broker_engine": DEFINES,
    "isolation_level": DEFINES,  # which records train
    "source": DEFINES,  # the query's checkpoint holds its offsets: one source for a run's life
    "seed": DEFINES,
    "data": DEFINES,  # a user's table: its file, how it is read and what it predicts
    "label": DEFINES,
    "schema": DEFINES,
    "format": DEFINES,
    "holdout": DEFINES,  # which records score and never train
    "schema_registry": DEFINES,
    "eval_data": KEPT,
    "keep_checkpoints": KEPT,
    # A checkpoint holds the whole center whatever the shards: a resume may change them.
    "ps_shards": KEPT,
    "on_poison": KEPT,  # what to do with a batch that cannot be read, decided anew each session
    "on_drift": KEPT,  # how the run reacts to a drift, decided anew each session
    "drift": KEPT,  # the drift signals' settings
    "max_rejected": KEPT,  # how much bad data a session puts up with
    "generation": SESSION,  # which kept checkpoint this session starts from
    "divergence_check": SESSION,  # turned off for one session at a time, after a look at the data
    "epochs": KEPT,  # a larger one extends the run
    "rate": KEPT,
    "until_accuracy": KEPT,
    "serve_port": KEPT,  # a resumed run serves again, on the same port unless given another
    "serve_max_age_s": KEPT,
    "metrics_port": KEPT,
    "producer_metrics_port": KEPT,
    "eval_every": KEPT,
    "eval_max": KEPT,
    "max_offsets_per_trigger": KEPT,
    # How batches are cut, never which records train: a resume may change it.
    "freshness_target_s": KEPT,
    "min_offsets_per_trigger": KEPT,
    "master": KEPT,
    "spark_conf": KEPT,
    # Its path only; the file may move, or its password rotate, between sessions.
    "kafka_conf": KEPT,
    "data_dir": KEPT,
    "max_batches": SESSION,
    "timeout_s": SESSION,
    "out": SESSION,
    "resume": SESSION,
}

#: Fields that are no option a resumed run could change (eval_max has no option).
_NOT_LISTED = ("out", "resume", "eval_max")
#: Settings that name files, recorded as absolute paths.
_PATHS = ("data_dir", "spark_conf", "kafka_conf")
#: The options whose name is not their field's.
_OPTION = {
    "communication_window": "window",
    "timeout_s": "timeout",
    "serve_max_age_s": "serve-max-age",
    "freshness_target_s": "freshness-target",
}


def option(field: str) -> str:
    """The command line's name of ``field``.

    >>> option("communication_window"), option("batch_size")
    ('--window', '--batch-size')
    """
    return "--" + _OPTION.get(field, field.replace("_", "-"))


def may_change() -> str:
    """The options a resumed run may be given differently, for ``--help``."""
    return ", ".join(
        option(f) for f, role in ROLES.items() if role != DEFINES and f not in _NOT_LISTED
    )


def model_source(source: str | None) -> str | None:
    """``--model`` with its file's path made absolute, so a resume from another folder finds it."""
    if source is None:
        return None
    path, sep, fn = source.partition(":")
    return f"{Path(path).resolve()}{sep}{fn}"


def model_digest(source: str | None) -> str | None:
    """SHA-256 of ``--model``'s file (None for the dataset's own model, or no such file)."""
    if source is None:
        return None
    path = Path(source.partition(":")[0])
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def read(folder: Path) -> dict[str, Any] | None:
    """The record in ``folder``, or None for a folder without one (a run older than records)."""
    path = folder / RECORD_FILE
    try:
        record: dict[str, Any] = json.loads(path.read_text())
        record["settings"]  # noqa: B018 -- a record without settings is no record
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is unreadable ({e}); restore it, or start a new run with another --out."
        ) from None
    return record


def _write(folder: Path, record: dict[str, Any]) -> None:
    tmp = folder / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(folder / RECORD_FILE)


def write(folder: Path, settings: dict[str, Any]) -> None:
    """Record a session's start: the settings that outlive it (a resume keeps what the record
    had beside them, the model's description included)."""
    record = read(folder) or {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    record["settings"] = {k: v for k, v in settings.items() if ROLES.get(k, SESSION) != SESSION}
    for name in _PATHS:
        if record["settings"].get(name) is not None:
            record["settings"][name] = str(Path(record["settings"][name]).resolve())
    record["settings"]["model"] = model_source(settings.get("model"))
    record["model_digest"] = model_digest(settings.get("model"))
    record["sessions"] = record.get("sessions", 0) + 1
    _write(folder, record)


def recorded_optimizer(folder: Path) -> Any:
    """The optimizer the run in ``folder`` described its model with (None: none recorded)."""
    return ((read(folder) or {}).get("spec") or {}).get("optimizer")


def describe_model(folder: Path, *, spec: Any, schema: Any, name: str) -> None:
    """Record the described model (what serving rebuilds); refuse one that differs from the
    model the run trained so far."""
    from pipeline.serve.predictor import description

    record = read(folder) or {"settings": {}}
    recorded = record.get("fingerprint")
    if recorded is not None and recorded != spec.fingerprint:
        raise ConfigError(
            f"The model differs from the one the run in {folder} trained: recorded fingerprint "
            f"{recorded} ({record.get('weights', 0):,} weights), now {spec.fingerprint} "
            f"({spec.size:,} weights). Restore that model (its code or file), or start a new run "
            "with another --out."
        )
    record.update(description(spec, schema, name), fingerprint=spec.fingerprint, weights=spec.size)
    _write(folder, record)


def _shown(value: Any) -> str:
    return "none (the default)" if value is None else str(value)


def resume_options(folder: Path, options: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The options to continue the run in ``folder`` with: the recorded ones, and those in
    ``given`` (options the command line or the environment set) where they may change.

    Raises:
        ConfigError: a given option that defines the run disagrees with the record (all such
            in one line), or the model's file changed since the run started.
    """
    record = read(folder)
    if record is None:
        log.warning(
            "%s has no %s (a run started before runs recorded their options): resuming with the "
            "options given, which must be the ones it started with",
            folder,
            RECORD_FILE,
        )
        return _older_options(folder, options, given)
    merged = dict(options)
    conflicts = []
    for name, value in record["settings"].items():
        if ROLES.get(name, SESSION) == SESSION:
            continue  # a setting this version no longer has
        if name not in given:
            merged[name] = value
        elif ROLES[name] == DEFINES and _normal(name, options.get(name)) != _normal(name, value):
            conflicts.append(
                f"recorded {option(name)} {_shown(value)}, given {_shown(options.get(name))}"
            )
    if conflicts:
        raise ConfigError(
            f"The run in {folder} {'; '.join(conflicts)}: drop those options to continue it as "
            "recorded, or start a new run with another --out."
        )
    digest = record.get("model_digest")
    if digest is not None and model_digest(merged.get("model")) != digest:
        raise ConfigError(
            f"The model file of the run in {folder} changed since it started ({merged['model']}, "
            "recorded by its SHA-256): restore it, or start a new run with another --out."
        )
    return merged


#: What a run wrote before it kept a record: its model's description, naming its data.
_OLDER_FILE = "model.json"


def _older_options(folder: Path, options: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The options of a run older than records: its dataset from its ``model.json`` (the
    model it trained was that dataset's), checked against one given, before anything starts."""
    path = folder / _OLDER_FILE
    try:
        schema = json.loads(path.read_text())["schema"]
        name = str(schema["name"])
    except FileNotFoundError:
        return options  # nothing to read the data off: the options given must be the run's
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is unreadable ({e}); restore it, or start a new run with another --out."
        ) from None
    if schema.get("table") is not None:
        if not (options.get("data") or options.get("topic")):
            raise ConfigError(
                f"The run in {folder} trained a table of yours ({name}, by {path.name}) and "
                f"recorded no options ({RECORD_FILE}): pass its --data FILE (or --topic) and "
                "--schema again to continue it."
            )
        return options
    if "dataset" in given and options.get("dataset") != name:
        raise ConfigError(
            f"The run in {folder} trained {name} ({path.name}), given --dataset "
            f"{options.get('dataset')}: drop --dataset to continue it, or start a new run with "
            "another --out."
        )
    log.info("%s: the run trained %s (%s)", folder, name, path.name)
    return {**options, "dataset": name}


def _normal(name: str, value: Any) -> Any:
    return model_source(value) if name == "model" else value
