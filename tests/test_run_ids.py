"""The run id of every run of every packaged profile, against the ids recorded in tests/data/run_ids.json.

A run id hashes what decides a run's output; when it changes, every run of that profile (trained models included) is
redone. A refactoring must leave the ids alone. When a change is meant to alter what runs compute (a plan's definition,
a training default), record the new ids with `python tests/test_run_ids.py --record` and say why in the commit.
"""

import json
import sys
from pathlib import Path

import pytest

from dwg.pipeline.sweep import expand

RECORDED = Path(__file__).parent / "data" / "run_ids.json"
PROFILES = sorted(p.stem for p in (Path(__file__).parents[1] / "dwg" / "sweeps").glob("*.yaml"))


def profile_ids(profile: str) -> dict:
    "stage/id -> label of every run of a packaged profile."
    return {r.key: r.label for r in expand(profile)}


def test_every_profile_recorded():
    "Every packaged profile has recorded run ids, and none is recorded that no longer exists."
    assert sorted(json.loads(RECORDED.read_text())) == PROFILES


@pytest.mark.parametrize("profile", PROFILES)
def test_run_ids_unchanged(profile):
    "The profile's runs keep the ids they were recorded with."
    recorded = json.loads(RECORDED.read_text())[profile]
    now = profile_ids(profile)
    changed = sorted(set(recorded) ^ set(now))
    assert not changed, (
        f"{profile}: run ids changed ({len(changed)} of {len(recorded)}), e.g. "
        + ", ".join(f"{k} ({recorded.get(k) or now.get(k)})" for k in changed[:4])
        + ". If meant, record them: python tests/test_run_ids.py --record"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORDED.write_text(json.dumps({p: profile_ids(p) for p in PROFILES}, indent=1, sort_keys=True) + "\n")
    print(f"recorded the run ids of {len(PROFILES)} profiles in {RECORDED}")
