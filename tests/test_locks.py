"""The locks of runs and sweeps (dwg.pipeline.locks): asking whether a run is running never takes its lock, so probing
a run's lock as often as `status` may never makes executing that run fail; a whole smoke sweep runs to the end with
its status asked 20 times a second all along."""

import subprocess
import sys
import threading
from pathlib import Path
import time
from dwg.pipeline.locks import RunBusy, run_lock
from dwg.pipeline.status import status
from dwg.pipeline.sweep_checks import load_sweep
from dwg.pipeline.sweep import make_graph
from _sweep_helpers import states, sweep_cli

PROBE = "from dwg.pipeline.locks import lock_holder as probe"
PROBE_LOOP = """
import os, sys
print("ready", flush=True)
n = held = 0
while not os.path.exists(sys.argv[2]):
    seen = probe(sys.argv[1]) is not None
    if seen and not held:
        print("held", flush=True)
    held += seen
    n += 1
print(n, held, flush=True)
"""


def hammer(lock, cycles: int, probe_code: str = PROBE) -> dict:
    """Take and release the run lock `lock` `cycles` times while another process probes it in a tight loop
    (`probe_code` defines `probe(path)`): how often taking it failed, succeeded, was probed and was seen held. The first
    cycle holds the lock until the prober has seen it held, so the counts do not depend on the machine's speed."""
    code = probe_code + "\n" + PROBE_LOOP
    stop = Path(str(lock) + ".stop-probing")
    prober = subprocess.Popen([sys.executable, "-c", code, str(lock), str(stop)], stdout=subprocess.PIPE, text=True)
    assert prober.stdout.readline().strip() == "ready"
    busy = taken = 0
    for i in range(cycles):
        try:
            with run_lock(lock):
                taken += 1
                if i == 0:
                    assert prober.stdout.readline().strip() == "held"  # the prober saw this process hold it
        except RunBusy:
            busy += 1
    stop.touch()
    probes, held = map(int, prober.communicate(timeout=60)[0].split())
    return dict(busy=busy, taken=taken, probes=probes, held=held)


def test_probing_a_run_lock_never_makes_the_run_busy(tmp_path):
    "500 cycles of taking a run's lock beside a process probing it in a tight loop: never `RunBusy`."
    counts = hammer(tmp_path / "locks" / "models-abc.lock", 500)
    assert counts["busy"] == 0 and counts["taken"] == 500, counts
    assert counts["probes"] > 0 and counts["held"] > 0, counts  # both really ran, and the probe saw the lock held


def test_status_asked_all_through_a_smoke_sweep(tmp_path):
    "The smoke profile (real notebooks, tiny model) with `status` asked 20 times a second in this process: all done."
    rd = tmp_path / "runs"
    graph = make_graph(load_sweep("smoke"), rd)
    stop, seen, errors = threading.Event(), [], []

    def ask():
        while not stop.is_set():
            try:
                seen.append({i["state"] for items in status(rd, graph).values() for i in items})
            except Exception as e:  # any error is a finding: reported below
                errors.append(repr(e))
            time.sleep(0.05)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        r = sweep_cli("run", "--profile", "smoke", "--runs", rd, "--no-progress")
    finally:
        stop.set()
        asker.join()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "being executed by another process" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert {i["state"] for i in states(rd).values()} == {"done"}
    assert not errors, errors[:3]
    assert any("running" in s for s in seen), len(seen)  # status saw runs running (it asked every 50 ms)
